// Multiple-choice task rendering against prompts worked by hand from lm-evaluation-harness's task definitions
// (tasks/hellaswag/utils.py's preprocess, tasks/mmlu/default's template and description, tasks/arc, tasks/piqa,
// tasks/winogrande/preprocess_winogrande.py), fewshot prefixes, format inference and one-line errors naming the line.
#include <gtest/gtest.h>

#include "castor/fs.h"
#include "castor/mc_task.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor::data {
namespace {

McDoc render(const std::string& row, McFormat f) { return render_mc_row(Json::parse(row), f, "t.jsonl: line 1"); }

struct Want {
  std::vector<std::string> contexts, continuations;
  int64_t gold;
};

void expect_doc(const McDoc& d, const Want& w) {
  EXPECT_EQ(d.contexts, w.contexts);
  EXPECT_EQ(d.continuations, w.continuations);
  EXPECT_EQ(d.gold, w.gold);
}

TEST(McTask, HellaSwagAsLmEvalPreprocessesIt) {
  // The activity label, ctx_a, ctx_b capitalized (Python's capitalize lowers the rest), endings preprocessed.
  expect_doc(render(R"({"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
                        "ctx_b": "then", "endings": [", the man adds wax.", ", a person sleds."], "label": 1})",
                    McFormat::HellaSwag),
             {{"Removing ice from car: Then, the man writes over the snow. Then"},
              {" , the man adds wax.", " , a person sleds."},
              1});
  // WikiHow: " [title]" -> ". ", "[...]" deleted, "  " -> " ", the ending stripped before its bracket goes (so a
  // leading space stays), capitalize on ctx_b lowering "BRUSH"; the label a string.
  expect_doc(render(R"({"activity_label": "Home and Garden",
                        "ctx_a": "[header] How to clean a grill [title] Scrub the grates.",
                        "ctx_b": "[step] use a BRUSH.",
                        "endings": ["[substeps] Rinse  it well. ", "  Dry it [title] now", "a [b c", "[a [b] c]]"],
                        "label": "2"})",
                    McFormat::HellaSwag),
             {{"Home and Garden: How to clean a grill. Scrub the grates. use a brush."},
              {"  Rinse it well.", " Dry it. now", " a [b c", "  c]]"},
              2});
  // Three spaces become two (Python's replace does not rescan); trailing spaces stripped; "HELLO World" -> "Hello
  // world".
  expect_doc(render(R"({"activity_label": "X", "ctx_a": "A  b   c", "ctx_b": "HELLO World ", "endings": ["e "],
                        "label": 0})",
                    McFormat::HellaSwag),
             {{"X: A b  c Hello world"}, {" e"}, 0});
  // A bracket across a newline is not a match.
  expect_doc(render(R"({"activity_label": "Y", "ctx_a": "a [b\nc] d", "ctx_b": "", "endings": ["z"], "label": 0})",
                    McFormat::HellaSwag),
             {{"Y: a [b\nc] d"}, {" z"}, 0});
}

TEST(McTask, MmluArcPiqaWinograndeAndPlainRows) {
  const McDoc m = render(R"({"question": "  What is 2+2? ", "subject": "high_school_mathematics",
                             "choices": ["3", "4", " 5", "6 "], "answer": 1})",
                         McFormat::Mmlu);
  expect_doc(m, {{"What is 2+2?\nA. 3\nB. 4\nC.  5\nD. 6 \nAnswer:"}, {" A", " B", " C", " D"}, 1});
  EXPECT_EQ(m.subject, "high_school_mathematics");
  EXPECT_EQ(m.choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ(render(R"({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "C"})", McFormat::Mmlu).gold, 2);
  // ARC: AI2's layout (question.stem, question.choices) and Hugging Face's (choices {text, label}, numeric labels).
  expect_doc(render(R"({"id": "x", "question": {"stem": "Which is a gas?", "choices": [{"text": "Ice", "label": "A"},
                        {"text": "Steam", "label": "B"}, {"text": "Rock", "label": "C"}]}, "answerKey": "B"})",
                    McFormat::Arc),
             {{"Question: Which is a gas?\nAnswer:"}, {" Ice", " Steam", " Rock"}, 1});
  expect_doc(render(R"({"question": "Q?", "choices": {"text": ["a", "b", "c", "d"], "label": ["1", "2", "3", "4"]},
                        "answerKey": "4"})",
                    McFormat::Arc),
             {{"Question: Q?\nAnswer:"}, {" a", " b", " c", " d"}, 3});
  // PIQA: the goal as it is (a trailing space kept inside the prompt).
  expect_doc(render(R"({"goal": "How do I open a jar? ", "sol1": "Twist the lid.", "sol2": "Hit it.", "label": 0})",
                    McFormat::Piqa),
             {{"Question: How do I open a jar? \nAnswer:"}, {" Twist the lid.", " Hit it."}, 0});
  // Winogrande: a context per option (the sentence to the blank, filled), the rest stripped after " ".
  const McDoc w = render(R"({"sentence": "The trophy doesn't fit into the suitcase because the _ is too large.",
                             "option1": "trophy", "option2": "suitcase", "answer": "1"})",
                         McFormat::Winogrande);
  expect_doc(w, {{"The trophy doesn't fit into the suitcase because the trophy",
                  "The trophy doesn't fit into the suitcase because the suitcase"},
                 {" is too large."},
                 0});
  EXPECT_EQ(w.choices, w.contexts);
  EXPECT_EQ(mc_fewshot_example(w), "The trophy doesn't fit into the suitcase because the trophy is too large.");
  expect_doc(render(R"({"sentence": "Sam gave _'s  book.", "option1": "Ann", "option2": "Bo", "answer": 2})",
                    McFormat::Winogrande),
             {{"Sam gave Ann", "Sam gave Bo"}, {" 's  book."}, 1});
  expect_doc(render(R"({"context": "2+2=", "choices": ["4", "5"], "label": 0})", McFormat::Choices),
             {{"2+2="}, {" 4", " 5"}, 0});
  EXPECT_EQ(code_points("caf\xc3\xa9"), 4);  // Python's len(): characters, not bytes
}

TEST(McTask, InfersTheLayoutFromTheFields) {
  const std::pair<const char*, McFormat> rows[] = {
      {R"({"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": ["d"], "label": 0})", McFormat::HellaSwag},
      {R"({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 0, "subject": "s"})", McFormat::Mmlu},
      {R"({"question": {"stem": "q", "choices": []}, "answerKey": "A"})", McFormat::Arc},
      {R"({"goal": "g", "sol1": "a", "sol2": "b", "label": 0})", McFormat::Piqa},
      {R"({"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "1"})", McFormat::Winogrande},
      {R"({"context": "c", "choices": ["a"], "label": 0})", McFormat::Choices}};
  for (const auto& [row, f] : rows) EXPECT_EQ(infer_mc_format(Json::parse(row)), f) << row;
  EXPECT_FALSE(infer_mc_format(Json::parse(R"({"text": "x"})")));
  EXPECT_EQ(parse_mc_format("winogrande"), McFormat::Winogrande);
  test::expect_error([] { parse_mc_format("boolq"); }, {"--task-format", "boolq", "hellaswag|mmlu"});
}

TEST(McTask, FewshotPrefixesAsLmEvalBuildsThem) {
  const test::ScratchDir dir("mc_task_fewshot");
  atomic_write_file(dir.file("dev.jsonl"),
                    R"({"question": "1+1?", "subject": "high_school_math", "choices": ["2", "3", "4", "5"], "answer": 0}
{"question": "Capital?", "subject": "geography", "choices": ["a", "b", "c", "d"], "answer": 1}

{"question": "2*3?", "subject": "high_school_math", "choices": ["5", "7", "8", "6"], "answer": 3}
)");
  atomic_write_file(dir.file("test.jsonl"),
                    R"({"question": "3-1?", "subject": "high_school_math", "choices": ["2", "1", "0", "3"], "answer": 0}
{"question": "River?", "subject": "geography", "choices": ["e", "f", "g", "h"], "answer": 2}
{"question": "unused", "subject": "geography", "choices": ["e", "f", "g", "h"], "answer": 2}
)");
  McTaskOptions opt;
  opt.num_fewshot = 1, opt.fewshot_file = dir.file("dev.jsonl"), opt.limit = 2;
  McTask t = read_mc_task(dir.file("test.jsonl"), opt);
  EXPECT_EQ(t.format, McFormat::Mmlu);
  ASSERT_EQ(t.docs.size(), 2u);
  EXPECT_EQ(t.docs[0].contexts[0],
            "The following are multiple choice questions (with answers) about high school math.\n\n"
            "1+1?\nA. 2\nB. 3\nC. 4\nD. 5\nAnswer: A\n\n"
            "3-1?\nA. 2\nB. 1\nC. 0\nD. 3\nAnswer:");
  EXPECT_EQ(t.docs[1].contexts[0],
            "The following are multiple choice questions (with answers) about geography.\n\n"
            "Capital?\nA. a\nB. b\nC. c\nD. d\nAnswer: B\n\n"
            "River?\nA. e\nB. f\nC. g\nD. h\nAnswer:");
  EXPECT_EQ(t.docs[1].line, 2);
  // The second math example is the dev file's fourth line (a blank line skipped); geography has one only.
  opt.num_fewshot = 2, opt.limit = 1;
  t = read_mc_task(dir.file("test.jsonl"), opt);
  EXPECT_NE(t.docs[0].contexts[0].find("Answer: A\n\n2*3?\nA. 5\nB. 7\nC. 8\nD. 6\nAnswer: D\n\n3-1?"),
            std::string::npos);
  opt.limit = 2;
  test::expect_error([&] { read_mc_task(dir.file("test.jsonl"), opt); },
                     {"dev.jsonl", "1 rows of subject geography", "--num-fewshot 2"});
  opt.fewshot_file.clear();
  test::expect_error([&] { read_mc_task(dir.file("test.jsonl"), opt); }, {"--fewshot-file"});
}

// Row i of a layout for the fewshot cases (a few words varying with i; MMLU's subject alternating over two;
// HellaSwag's WikiHow brackets, " [title]" and a ctx_b to capitalize; Winogrande's blank mid-sentence, its answer a
// string as published).
Json fewshot_row(const std::string& format, int i) {
  const std::string w = "w" + std::to_string(i);
  if (format == "hellaswag")
    return Json::Object{{"ind", i},
                        {"activity_label", "Doing " + w},
                        {"ctx_a", " [header] How to " + w + " [title] Find it."},
                        {"ctx_b", i % 2 ? "tHEN" : ""},
                        {"endings", Json::Array{"[step] a " + w, "b  [substeps] c", " d ", "e [x"}},
                        {"label", std::to_string(i % 4)}};
  if (format == "winogrande")
    return Json::Object{{"sentence", "The " + w + " beat _ because it  was fast. "},
                        {"option1", "Ann"},
                        {"option2", "Bo " + w},
                        {"answer", i % 3 ? "1" : "2"}};
  if (format == "piqa") return Json::Object{{"goal", "do " + w}, {"sol1", "a " + w}, {"sol2", "b"}, {"label", i % 2}};
  if (format == "arc")
    return Json::Object{
        {"question", "Q " + w + "?"},
        {"choices", Json::Object{{"text", Json::Array{"x" + w, "y", "z"}}, {"label", Json::Array{"A", "B", "C"}}}},
        {"answerKey", std::string(1, static_cast<char>('A' + i % 3))}};
  if (format == "mmlu")
    return Json::Object{{"question", " q " + w + " "},
                        {"subject", i % 3 ? "college_physics" : "world_religions"},
                        {"choices", Json::Array{"1", w, "3", "4"}},
                        {"answer", i % 4}};
  return Json::Object{{"context", "c " + w}, {"choices", Json::Array{w, "n"}}, {"label", i % 2}};
}

std::string jsonl(const std::string& format, const std::vector<int>& ids) {
  std::string out;
  for (int i : ids) out += fewshot_row(format, i).dump() + "\n";
  return out;
}

// The fewshot prompts equal lm-evaluation-harness's (tests/oracle/fewshot_oracle.py: its ContextSampler and
// FirstNSampler over Python's random.Random(seed)): drawn in row order from one generator (MMLU: one a subject), one
// more drawn where lm-eval passes the evaluated row (HellaSwag, PIQA and Winogrande always, plain rows from their own
// file) and the row dropped wherever drawn (ARC from its own file too), on both of random.sample's branches (k = 6
// from 100 rows: rejection; otherwise a pool); HellaSwag's examples preprocessed as its rows, Winogrande's the
// sentence with the gold option filled in, " " and the rest, before each choice's partial sentence.
TEST(McTask, FewshotExamplesAreDrawnAsLmEvalDrawsThem) {
  struct Case {
    std::string format;
    std::vector<int> docs, shots;  // row ids; shots empty: the task file is the fewshot file
    int64_t n;
    uint64_t seed;
    std::string sampler;  // "" : the task's
    bool eval_doc;
    int64_t limit;
  };
  std::vector<int> train40, train100;
  for (int i = 0; i < 40; ++i) train40.push_back(100 + i);
  for (int i = 0; i < 100; ++i) train100.push_back(100 + i);
  std::vector<int> own = train40;
  own.insert(own.begin() + 2, 103);  // (a row twice: where it is evaluated both are dropped, one example fewer)
  std::vector<int> first20(train40.begin(), train40.begin() + 20);
  const Case cases[] = {{"piqa", {1, 2, 103, 4, 5, 6, 7, 8, 9, 10, 11, 12}, train40, 3, 1234, "", true, 12},
                        {"hellaswag", {1, 2, 3, 104, 5, 6, 7, 8, 9, 10}, train40, 3, 1234, "", true, 10},
                        {"hellaswag", {1, 2, 3}, train40, 2, 99, "first_n", true, 3},
                        {"winogrande", {1, 2, 105, 4, 5, 6, 7, 8, 9, 10, 11, 12}, train40, 5, 1234, "", true, 12},
                        {"winogrande", {1, 2}, train40, 1, 5, "", true, 2},
                        {"arc", first20, {}, 5, 1234, "", false, 20},  // (the row itself drawn: dropped, not redrawn)
                        {"arc", {1, 2, 3, 4, 5, 6, 7, 8}, train40, 2, 1234, "", false, 8},
                        {"mmlu", {1, 2, 3, 4, 5, 6, 7}, train40, 2, 1234, "default", false, 7},
                        {"mmlu", {1, 2, 3, 4}, train40, 3, 1234, "", false, 4},
                        {"choices", train40, {}, 5, 7, "", true, 20},
                        {"choices", {1, 2, 3, 4, 5, 6}, train100, 6, 1234, "", false, 6},
                        {"piqa", {1, 103, 3}, own, 4, 1234, "first_n", true, 3}};
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format + " case " + std::to_string(k));
    const test::ScratchDir dir("mc_task_fewshot_draws_" + std::to_string(k++));
    atomic_write_file(dir.file("task.jsonl"), jsonl(c.format, c.docs));
    atomic_write_file(dir.file("shots.jsonl"), jsonl(c.format, c.shots.empty() ? c.docs : c.shots));
    Json::Array docs, shots;
    for (int i : c.docs) docs.push_back(fewshot_row(c.format, i));
    for (int i : c.shots.empty() ? c.docs : c.shots) shots.push_back(fewshot_row(c.format, i));
    const std::string sampler = !c.sampler.empty() ? c.sampler : c.format == "mmlu" ? "first_n" : "default";
    atomic_write_file(dir.file("case.json"), Json(Json::Object{{"format", c.format},
                                                               {"docs", docs},
                                                               {"fewshot", shots},
                                                               {"num_fewshot", c.n},
                                                               {"seed", static_cast<int64_t>(c.seed)},
                                                               {"sampler", sampler},
                                                               {"eval_doc", c.eval_doc},
                                                               {"limit", c.limit}})
                                                 .dump());
    ASSERT_TRUE(test::run_oracle("fewshot_oracle.py", {dir.file("case.json"), dir.file("out.json")}));
    const Json want = Json::parse(test::read_text(dir.file("out.json")));
    McTaskOptions opt;
    opt.format = parse_mc_format(c.format);
    opt.num_fewshot = c.n, opt.fewshot_seed = c.seed, opt.limit = c.limit;
    opt.fewshot_file = dir.file(c.shots.empty() ? "task.jsonl" : "shots.jsonl");
    if (!c.sampler.empty()) opt.sampler = parse_fewshot_sampler(c.sampler);
    const McTask t = read_mc_task(dir.file("task.jsonl"), opt);
    EXPECT_EQ(t.sampler, parse_fewshot_sampler(sampler));
    ASSERT_EQ(t.docs.size(), want.as_array().size());
    for (size_t i = 0; i < t.docs.size(); ++i) {
      const Json::Array& contexts = want.as_array()[i].as_array();
      ASSERT_EQ(t.docs[i].contexts.size(), contexts.size()) << i;
      for (size_t j = 0; j < contexts.size(); ++j) EXPECT_EQ(t.docs[i].contexts[j], contexts[j].as_string()) << i;
    }
  }
}

TEST(McTask, BadRowsAreOneLineErrorsNamingTheLine) {
  const test::ScratchDir dir("mc_task_errors");
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"", {"empty.jsonl", "no rows"}},
      {"{\"context\": \"c\", \"choices\": [\"a\"], \"label\": 0}\n\n{\"context\": \"c\", \"choices\": [\"a\"]",
       {"line 3", "not JSON"}},
      {R"({"context": "c", "choices": ["a", "b"]})", {"line 1", "no \"label\""}},
      {R"({"context": "c", "choices": ["a", "b"], "label": 2})",
       {"line 1", "\"label\" 2", "out of range for 2 choices"}},
      {R"({"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": ["d"], "label": "x"})",
       {"line 1", "not a label"}},
      {R"({"sentence": "no blank", "option1": "x", "option2": "y", "answer": "1"})", {"line 1", "no blank"}},
      {R"({"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "E"})",
       {"line 1", "\"answerKey\" E is not one of"}},
      {R"({"text": "x"})", {"line 1", "not a known task layout", "--task-format"}},
      {R"([1, 2])", {"line 1", "not a known task layout"}},
  };
  int i = 0;
  for (const auto& [text, parts] : cases) {
    const std::string path = dir.file(i++ == 0 ? "empty.jsonl" : "t" + std::to_string(i) + ".jsonl");
    atomic_write_file(path, text);
    SCOPED_TRACE(text);
    std::vector<std::string> want = parts;
    want.push_back(path);
    test::expect_error([&] { read_mc_task(path, {}); }, want);
  }
  // A row of another layout than the one given.
  atomic_write_file(dir.file("mixed.jsonl"), "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}\n");
  McTaskOptions opt;
  opt.format = McFormat::Mmlu;
  test::expect_error([&] { read_mc_task(dir.file("mixed.jsonl"), opt); }, {"mixed.jsonl: line 1", "no \"choices\""});
}

}  // namespace
}  // namespace castor::data
