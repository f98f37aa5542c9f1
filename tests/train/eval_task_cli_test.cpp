// Evaluation tasks through the CLI: castor train --eval-task logs the task's scores at each evaluation, --keep-best
// keeps the checkpoint of the best one in RUN/best whatever --keep prunes (castor eval of it gives the logged score
// again), --early-stop ends the run by the rule replayed from metrics.jsonl, castor info names the best; castor eval
// --task's truncation note, the fewshot settings it records beside the scores, and its one-line errors naming the
// line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "castor/fs.h"
#include "castor/json.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

class EvalTaskCli : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_grammar_text(path("text.txt"), 1500, 6, 11, /*capitalized=*/false);
    // Rows in the grammar's words: a context and 3 choices, the gold one the sentence's own continuation.
    atomic_write_file(path("task.jsonl"),
                      R"({"context": "the jury said", "choices": ["the report.", "jury the", "said said"], "label": 0}
{"context": "the report", "choices": ["said the jury.", "report report", "the the"], "label": 0}
{"context": "the", "choices": ["jury", "said", "."], "label": 0}
{"context": "the jury", "choices": ["the.", "said the report.", "jury jury"], "label": 1}
{"context": "the report said", "choices": ["said", "the jury.", "."], "label": 1}
{"context": "the jury said the", "choices": ["said", "jury", "report."], "label": 2}
)");
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return test::run_castor(args, in_dir); }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

std::vector<Json> records(const std::string& path) {
  std::vector<Json> out;
  const std::string text = test::read_text(path);
  for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
    nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) out.push_back(Json::parse(text.substr(pos, nl - pos)));
  }
  return out;
}

TEST_F(EvalTaskCli, TrainLogsTheTaskKeepsTheBestAndStopsEarly) {
  CastorProcess t = castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "text.txt", "--out",
                            "tok", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::vector<std::string> args = {"train",
                                         "--model",
                                         "gpt",
                                         "--data",
                                         "tokens",
                                         "--data-dir",
                                         "tok",
                                         "--n-layer",
                                         "1",
                                         "--n-head",
                                         "2",
                                         "--n-embd",
                                         "32",
                                         "--block-size",
                                         "16",
                                         "--batch-size",
                                         "8",
                                         "--steps",
                                         "120",
                                         "--lr",
                                         "2e-2",
                                         "--eval-iters",
                                         "1",
                                         "--eval-every",
                                         "8",
                                         "--threads",
                                         "1",
                                         "--precision",
                                         "32",
                                         "--keep",
                                         "1",
                                         "--eval-task",
                                         "task.jsonl",
                                         "--keep-best",
                                         "task_acc_norm_tokens",
                                         "--early-stop",
                                         "4",
                                         "--out",
                                         "run"};
  CastorProcess run = castor(args);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // Replays the rule on the logged evaluations (in order; an epoch end at an evaluated step is the same one).
  double best = -1;
  int64_t best_step = -1, stale = 0, stop = 120, evaluations = 0, last_step = -1;
  for (const Json& r : records(path("run/metrics.jsonl"))) {
    if (!r.find("val_loss")) continue;
    ASSERT_TRUE(r.find("task_acc") && r.find("task_acc_norm_tokens")) << r.dump();
    const int64_t step = r.at("step").as_int();
    if (step == last_step) continue;
    last_step = step, ++evaluations;
    const double v = r.at("task_acc_norm_tokens").as_double();
    if (v > best) {
      best = v, best_step = step, stale = 0;
    } else if (++stale == 4) {
      stop = step;
      break;
    }
  }
  EXPECT_GE(evaluations, 4);
  const Json summary = Json::parse(test::read_text(path("run/summary.json")));
  EXPECT_EQ(summary.at("steps").as_int(), stop) << run.err;
  EXPECT_EQ(summary.find("stopped_early") != nullptr, stop < 120);
  const Json kept = Json::parse(test::read_text(path("run/best/best.json")));
  EXPECT_EQ(kept.at("metric").as_string(), "task_acc_norm_tokens");
  EXPECT_EQ(kept.at("step").as_int(), best_step);
  EXPECT_DOUBLE_EQ(kept.at("value").as_double(), best);
  // The kept weights score the logged value again (float32 both times), though --keep 1 pruned the step's own
  // checkpoint unless it is the last.
  const test::CastorRun one_thread{scratch.path().string(), {"OMP_NUM_THREADS=1"}};
  CastorProcess ev = test::run_castor({"eval", "run/best", "--task", "task.jsonl"}, one_thread);
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_DOUBLE_EQ(Json::parse(ev.out).at("acc_norm_tokens,none").as_double(), best);
  char name[32];
  std::snprintf(name, sizeof(name), "run/checkpoints/step-%010lld", static_cast<long long>(best_step));
  EXPECT_EQ(file_exists(path(name)), best_step == stop) << "--keep 1 prunes the best step's own checkpoint";
  CastorProcess info = castor({"info", "run"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("best"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find(detail::cat("at step ", best_step)), std::string::npos) << info.out;
  EXPECT_NE(test::read_text(path("run/report.html")).find("Benchmark task"), std::string::npos);
  // Flags that cannot work are refused before training.
  test::expect_one_line_error(castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--steps",
                                      "1", "--keep-best", "task_acc", "--out", "run2"}),
                              {"--keep-best task_acc", "val_loss"});
  test::expect_one_line_error(castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--steps",
                                      "1", "--early-stop", "2", "--out", "run3"}),
                              {"--early-stop", "--keep-best"});
}

TEST_F(EvalTaskCli, EvalTruncatesLongRowsAndNamesTheLineOfBadOnes) {
  CastorProcess t = castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "text.txt", "--out",
                            "tok", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  CastorProcess run = castor(
      {"train", "--model",   "gpt", "--data",       "tokens", "--data-dir",   "tok", "--n-layer", "1", "--n-head",
       "2",     "--n-embd",  "32",  "--block-size", "16",     "--batch-size", "4",   "--steps",   "1", "--eval-iters",
       "1",     "--threads", "1",   "--out",        "run"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::string long_context;
  for (int i = 0; i < 12; ++i) long_context += "the jury said the report. ";
  atomic_write_file(path("long.jsonl"),
                    "{\"context\": \"" + long_context + "the\", \"choices\": [\"jury\", \"report\"], \"label\": 0}\n");
  CastorProcess ev = castor({"eval", "run", "--task", "long.jsonl"});
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_EQ(Json::parse(ev.out).at("truncated").as_int(), 2);
  EXPECT_NE(ev.err.find("cut from the left"), std::string::npos) << ev.err;
  // The fewshot settings beside the scores (lm-eval's n-shot, fewshot_seed and sampler): the defaults, then as given.
  const Json plain = Json::parse(ev.out);
  EXPECT_EQ(plain.at("num_fewshot").as_int(), 0);
  EXPECT_EQ(plain.at("fewshot_seed").as_int(), 1234);
  EXPECT_EQ(plain.at("fewshot_sampler").as_string(), "default");
  std::string rows;
  for (const char* c : {"the jury", "the report", "said the", "the"})
    rows += std::string("{\"context\": \"") + c + "\", \"choices\": [\"jury\", \"report\"], \"label\": 1}\n";
  atomic_write_file(path("shots.jsonl"), rows);
  for (const char* sampler : {"first_n", "default"}) {
    CastorProcess fs = castor({"eval", "run", "--task", "shots.jsonl", "--num-fewshot", "2", "--fewshot-file",
                               "shots.jsonl", "--fewshot-seed", "7", "--fewshot-sampler", sampler});
    ASSERT_EQ(fs.exit_code, 0) << fs.err;
    const Json got = Json::parse(fs.out);
    EXPECT_EQ(got.at("num_fewshot").as_int(), 2);
    EXPECT_EQ(got.at("fewshot_seed").as_int(), 7);
    EXPECT_EQ(got.at("fewshot_sampler").as_string(), sampler);
    EXPECT_EQ(got.at("samples").as_int(), 4);
  }
  test::expect_one_line_error(castor({"eval", "run", "--task", "shots.jsonl", "--fewshot-seed", "9223372036854775808"}),
                              {"--fewshot-seed 9223372036854775808", "2^63 - 1"});
  atomic_write_file(path("longchoice.jsonl"),
                    "{\"context\": \"the\", \"choices\": [\"jury\"], \"label\": 0}\n"
                    "{\"context\": \"the\", \"choices\": [\"" +
                        long_context +
                        "\"], "
                        "\"label\": 0}\n");
  test::expect_one_line_error(castor({"eval", "run", "--task", "longchoice.jsonl"}),
                              {"longchoice.jsonl: line 2: choice 0", "longer than the model's context of 16"});
  atomic_write_file(path("nolabel.jsonl"), "\n{\"context\": \"the\", \"choices\": [\"jury\"]}\n");
  test::expect_one_line_error(castor({"eval", "run", "--task", "nolabel.jsonl"}),
                              {"nolabel.jsonl: line 2", "no \"label\""});
  atomic_write_file(path("empty.jsonl"), "");
  test::expect_one_line_error(castor({"eval", "run", "--task", "empty.jsonl"}), {"empty.jsonl", "no rows"});
  atomic_write_file(path("short.txt"), "the jury");
  test::expect_one_line_error(castor({"eval", "run", "--text", "short.txt", "--ctx", "8"}),
                              {"--text", "2 x --ctx = 16"});
  test::expect_one_line_error(castor({"eval", "run", "--num-fewshot", "1"}), {"--num-fewshot", "--task"});
}

}  // namespace
}  // namespace castor::train
