// Multiple-choice task rows (castor/mc_task.h) rendered as lm-evaluation-harness's task definitions render them:
// tasks/hellaswag/utils.py, tasks/mmlu/default, tasks/arc, tasks/piqa, tasks/winogrande/preprocess_winogrande.py.
#include "castor/mc_task.h"

#include <filesystem>
#include <map>

#include "castor/check.h"
#include "castor/fs.h"
#include "text/py_random.h"

namespace castor::data {

namespace {

struct FormatName {
  McFormat format;
  const char* name;
};
constexpr FormatName kFormats[] = {{McFormat::HellaSwag, "hellaswag"},
                                   {McFormat::Mmlu, "mmlu"},
                                   {McFormat::Arc, "arc"},
                                   {McFormat::Piqa, "piqa"},
                                   {McFormat::Winogrande, "winogrande"},
                                   {McFormat::Choices, "choices"}};

// Python's str.isspace() over ASCII (str.strip()'s default set).
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

std::string strip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// Python's str.capitalize() over ASCII letters: the first upper case, the rest lower case.
std::string capitalize(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Every occurrence of `from` replaced by `to`, left to right without overlaps (Python's str.replace).
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, from.size()) == from) {
      out += to, i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// HellaSwag's preprocess: strip, " [title]" -> ". ", each "[...]" (within a line, shortest) deleted, "  " -> " ".
std::string hellaswag_preprocess(std::string_view text) {
  const std::string s = replace_all(strip(text), " [title]", ". ");
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '[') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != ']' && s[j] != '\n') ++j;
      if (j < s.size() && s[j] == ']') {
        i = j + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return replace_all(out, "  ", " ");
}

const Json& field(const Json& row, const char* key, const std::string& where) {
  const Json* v = row.find(key);
  CASTOR_CHECK(v && !v->is_null(), where, ": no \"", key, "\"");
  return *v;
}

const std::string& text_field(const Json& row, const char* key, const std::string& where) {
  const Json& v = field(row, key, where);
  CASTOR_CHECK(v.is_string(), where, ": \"", key, "\" is a ", v.type_name(), ", not a string");
  return v.as_string();
}

std::vector<std::string> text_list(const Json& v, const char* key, const std::string& where) {
  CASTOR_CHECK(v.is_array() && !v.as_array().empty(), where, ": \"", key, "\" is not a list of strings");
  std::vector<std::string> out;
  for (const Json& s : v.as_array()) {
    CASTOR_CHECK(s.is_string(), where, ": \"", key, "\" holds a ", s.type_name(), ", not a string");
    out.push_back(s.as_string());
  }
  return out;
}

// A label: an integer, or a string of one ("3"); `letters` also takes "A", "B", ... (MMLU's answer in some copies);
// `base` 1 for Winogrande's "1"/"2". Checked against the number of choices.
int64_t label_field(const Json& row, const char* key, int64_t n_choices, const std::string& where, int64_t base = 0,
                    bool letters = false) {
  const Json& v = field(row, key, where);
  int64_t label = -1;
  bool ok = false;
  if (v.is_int()) {
    label = v.as_int(), ok = true;
  } else if (v.is_string()) {
    const std::string& s = v.as_string();
    if (letters && s.size() == 1 && s[0] >= 'A' && s[0] <= 'Z') {
      label = s[0] - 'A' + base, ok = true;
    } else if (!s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos) {
      label = std::stoll(s), ok = true;
    }
  }
  CASTOR_CHECK(ok, where, ": \"", key, "\" is not a label (", printable(v.dump()), ")");
  label -= base;
  CASTOR_CHECK(label >= 0 && label < n_choices, where, ": \"", key, "\" ", printable(v.dump()), " is out of range for ",
               n_choices, " choices");
  return label;
}

// One context shared by the choices, each continued after " ".
void shared_context(McDoc& d, std::string context, std::vector<std::string> choices) {
  d.contexts = {std::move(context)};
  for (const std::string& c : choices) d.continuations.push_back(" " + c);
  d.choices = std::move(choices);
}

}  // namespace

const char* mc_format_name(McFormat f) {
  for (const FormatName& n : kFormats)
    if (n.format == f) return n.name;
  CASTOR_ASSERT(false, "a task format without a name: ", static_cast<int>(f));
}

std::vector<std::string> mc_format_names() {
  std::vector<std::string> names;
  for (const FormatName& n : kFormats) names.push_back(n.name);
  return names;
}

McFormat parse_mc_format(const std::string& name, const std::string& flag) {
  std::string all;
  for (const FormatName& n : kFormats) {
    if (name == n.name) return n.format;
    all += (all.empty() ? "" : "|") + std::string(n.name);
  }
  throw Error(detail::cat(flag, ": expected ", all, ", got '", printable(name), "'"));
}

std::optional<McFormat> infer_mc_format(const Json& row) {
  if (!row.is_object()) return std::nullopt;
  auto has = [&](const char* key) { return row.find(key) != nullptr; };
  if (has("ctx_a") || has("endings")) return McFormat::HellaSwag;
  if (has("answerKey")) return McFormat::Arc;
  if (has("goal") && has("sol1")) return McFormat::Piqa;
  if (has("sentence") && has("option1")) return McFormat::Winogrande;
  if (has("question") && has("choices") && has("answer")) return McFormat::Mmlu;
  if (has("context") && has("choices")) return McFormat::Choices;
  return std::nullopt;
}

namespace {

// An ARC row: its question and lettered (or numbered) choices, the gold one named by answerKey.
void arc_row(const Json& row, const std::string& where, McDoc& d) {
  // AI2's files: question {stem, choices [{text, label}]}; Hugging Face's: question, choices {text [], label []}.
  const Json& q = field(row, "question", where);
  std::string stem;
  std::vector<std::string> texts, labels;
  if (q.is_object()) {
    stem = text_field(q, "stem", where);
    const Json& cs = field(q, "choices", where);
    CASTOR_CHECK(cs.is_array() && !cs.as_array().empty(), where, ": \"question.choices\" is not a list");
    for (const Json& c : cs.as_array()) {
      CASTOR_CHECK(c.is_object(), where, ": a choice is not an object {text, label}");
      texts.push_back(text_field(c, "text", where));
      labels.push_back(text_field(c, "label", where));
    }
  } else {
    stem = text_field(row, "question", where);
    const Json& cs = field(row, "choices", where);
    CASTOR_CHECK(cs.is_object(), where, ": \"choices\" is not an object {text, label}");
    texts = text_list(field(cs, "text", where), "choices.text", where);
    labels = text_list(field(cs, "label", where), "choices.label", where);
    CASTOR_CHECK(texts.size() == labels.size(), where, ": ", texts.size(), " choice texts, ", labels.size(), " labels");
  }
  const std::string& key = text_field(row, "answerKey", where);
  d.gold = -1;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == key) d.gold = static_cast<int64_t>(i);
  CASTOR_CHECK(d.gold >= 0, where, ": \"answerKey\" ", printable(key), " is not one of the choices' labels");
  shared_context(d, "Question: " + stem + "\nAnswer:", std::move(texts));
}

}  // namespace

McDoc render_mc_row(const Json& row, McFormat format, const std::string& where) {
  CASTOR_CHECK(row.is_object(), where, ": a ", row.type_name(), ", not a JSON object");
  McDoc d;
  switch (format) {
    case McFormat::HellaSwag: {
      const std::string ctx = text_field(row, "ctx_a", where) + " " + capitalize(text_field(row, "ctx_b", where));
      std::vector<std::string> endings = text_list(field(row, "endings", where), "endings", where);
      for (std::string& e : endings) e = hellaswag_preprocess(e);
      d.gold = label_field(row, "label", static_cast<int64_t>(endings.size()), where);
      shared_context(d, hellaswag_preprocess(text_field(row, "activity_label", where) + ": " + ctx),
                     std::move(endings));
      break;
    }
    case McFormat::Mmlu: {
      const std::vector<std::string> c = text_list(field(row, "choices", where), "choices", where);
      CASTOR_CHECK(c.size() == 4, where, ": \"choices\" has ", c.size(), " entries; MMLU's prompt has A-D");
      d.gold = label_field(row, "answer", 4, where, 0, /*letters=*/true);
      if (const Json* s = row.find("subject"); s && s->is_string()) d.subject = s->as_string();
      shared_context(d,
                     strip(text_field(row, "question", where)) + "\nA. " + c[0] + "\nB. " + c[1] + "\nC. " + c[2] +
                         "\nD. " + c[3] + "\nAnswer:",
                     {"A", "B", "C", "D"});
      break;
    }
    case McFormat::Arc: arc_row(row, where, d); break;
    case McFormat::Piqa: {
      d.gold = label_field(row, "label", 2, where);
      shared_context(d, "Question: " + text_field(row, "goal", where) + "\nAnswer:",
                     {text_field(row, "sol1", where), text_field(row, "sol2", where)});
      break;
    }
    case McFormat::Winogrande: {
      const std::string& s = text_field(row, "sentence", where);
      const size_t blank = s.find('_');
      CASTOR_CHECK(blank != std::string::npos, where, ": \"sentence\" has no blank \"_\"");
      for (const char* key : {"option1", "option2"})
        d.contexts.push_back(s.substr(0, blank) + text_field(row, key, where));
      d.continuations = {" " + strip(std::string_view(s).substr(blank + 1))};
      d.choices = d.contexts;
      d.gold = label_field(row, "answer", 2, where, /*base=*/1);
      break;
    }
    case McFormat::Choices: {
      std::vector<std::string> c = text_list(field(row, "choices", where), "choices", where);
      d.gold = label_field(row, "label", static_cast<int64_t>(c.size()), where);
      shared_context(d, text_field(row, "context", where), std::move(c));
      break;
    }
  }
  return d;
}

std::string mc_fewshot_example(const McDoc& doc) {
  if (doc.contexts.size() > 1) return doc.contexts[doc.gold] + doc.continuations[0];
  return doc.contexts[0] + doc.continuations[doc.gold];
}

int64_t for_each_jsonl_row(const std::string& path,
                           const std::function<void(const Json&, int64_t, const std::string&)>& fn) {
  const std::vector<uint8_t> bytes = read_file(path);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  int64_t rows = 0;
  size_t pos = 0;
  for (int64_t line = 1; pos < text.size(); ++line) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view row = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = detail::cat(path, ": line ", line);
    Json j;
    try {
      j = Json::parse(row);
    } catch (const Error& e) {
      throw Error(detail::cat(where, ": not JSON: ", e.what()));
    }
    fn(j, line, where);
    ++rows;
  }
  return rows;
}

namespace {

// The rows of a task file in `format` (inferred from the first row when not given), up to `limit` (0: all).
std::vector<McDoc> read_rows(const std::string& path, std::optional<McFormat>& format, int64_t limit) {
  std::vector<McDoc> docs;
  struct Stop {};
  try {
    for_each_jsonl_row(path, [&](const Json& row, int64_t line, const std::string& where) {
      if (limit > 0 && static_cast<int64_t>(docs.size()) >= limit) throw Stop{};
      if (!format) {
        format = infer_mc_format(row);
        CASTOR_CHECK(
            format, where,
            ": not a known task layout (HellaSwag ctx_a/ctx_b/endings/label, MMLU question/choices/answer, ARC "
            "question/answerKey, PIQA goal/sol1/sol2/label, Winogrande sentence/option1/option2/answer, or "
            "context/choices/label); give --task-format");
      }
      McDoc d = render_mc_row(row, *format, where);
      d.line = line, d.row = row.dump();
      docs.push_back(std::move(d));
    });
  } catch (const Stop&) {
  }
  CASTOR_CHECK(!docs.empty(), path, ": no rows (an empty task file)");
  return docs;
}

}  // namespace

const char* fewshot_sampler_name(FewshotSampler s) { return s == FewshotSampler::FirstN ? "first_n" : "default"; }

FewshotSampler parse_fewshot_sampler(const std::string& name, const std::string& flag) {
  for (FewshotSampler s : {FewshotSampler::Random, FewshotSampler::FirstN})
    if (name == fewshot_sampler_name(s)) return s;
  throw Error(detail::cat(flag, ": ", printable(name), " is not a sampler (default or first_n, lm-eval's)"));
}

namespace {

// Whether lm-eval's fewshot_context hands the sampler the evaluated row (`fewshot_split == test_split`): HellaSwag's,
// PIQA's and Winogrande's configurations set neither split (None == None), ARC's test split is "test" and MMLU's
// fewshot split "dev"; plain rows, as a task whose fewshot split is its test split when the files are one.
bool passes_eval_doc(McFormat f, const std::string& task_file, const std::string& fewshot_file) {
  switch (f) {
    case McFormat::HellaSwag:
    case McFormat::Piqa:
    case McFormat::Winogrande: return true;
    case McFormat::Arc:
    case McFormat::Mmlu: return false;
    case McFormat::Choices: break;
  }
  std::error_code ec;
  return std::filesystem::equivalent(task_file, fewshot_file, ec);
}

// The fewshot examples of `doc` from `pool` (lm-eval's ContextSampler.get_context): k = n + 1 rows where lm-eval
// hands the sampler the evaluated row (`eval_doc`), else n, drawn at random (random.Random.sample) or the pool's first
// k (first_n); then every row equal to `doc` (`x != doc`, the rows as read) dropped and the first n kept, fewer where
// the row was drawn twice.
std::vector<const McDoc*> fewshot_examples(const McDoc& doc, const std::vector<const McDoc*>& pool, int64_t n,
                                           FewshotSampler sampler, bool eval_doc, PyRandom& rnd,
                                           const std::string& file, const std::string& subject) {
  const std::string rows = subject.empty() ? " rows" : " rows of subject " + subject;
  const int64_t k = eval_doc ? n + 1 : n;
  CASTOR_CHECK(k <= static_cast<int64_t>(pool.size()), file, ": ", pool.size(), rows, ", fewer than the ", k,
               " lm-eval draws for --num-fewshot ", n, eval_doc ? " (one more, the evaluated row dropped)" : "");
  std::vector<const McDoc*> drawn;
  if (sampler == FewshotSampler::FirstN) {
    drawn.assign(pool.begin(), pool.begin() + k);
  } else {
    for (int64_t i : rnd.sample(static_cast<int64_t>(pool.size()), k)) drawn.push_back(pool[i]);
  }
  std::vector<const McDoc*> out;
  for (const McDoc* d : drawn)
    if (static_cast<int64_t>(out.size()) < n && d->row != doc.row) out.push_back(d);
  return out;
}

}  // namespace

McTask read_mc_task(const std::string& path, const McTaskOptions& opt) {
  McTask task;
  task.path = path;
  std::optional<McFormat> format = opt.format;
  task.docs = read_rows(path, format, opt.limit);
  task.format = *format;
  if (opt.num_fewshot > 0)
    CASTOR_CHECK(!opt.fewshot_file.empty(), "--num-fewshot ", opt.num_fewshot,
                 ": give the rows to take the examples from (--fewshot-file)");
  const std::vector<McDoc> shots = opt.num_fewshot > 0 ? read_rows(opt.fewshot_file, format, 0) : std::vector<McDoc>();
  const bool mmlu = task.format == McFormat::Mmlu;
  const FewshotSampler sampler = opt.sampler.value_or(mmlu ? FewshotSampler::FirstN : FewshotSampler::Random);
  task.sampler = sampler;
  const bool eval_doc = passes_eval_doc(task.format, path, opt.fewshot_file);
  // Per subject (MMLU's per-subject tasks, each with its dev rows and its own generator; one for the other tasks).
  std::map<std::string, std::vector<const McDoc*>> pools;
  std::map<std::string, PyRandom> generators;
  for (const McDoc& s : shots) pools[mmlu ? s.subject : ""].push_back(&s);
  for (McDoc& d : task.docs) {
    const std::string key = mmlu ? d.subject : "";
    std::string p;
    if (mmlu && !d.subject.empty())
      p = "The following are multiple choice questions (with answers) about " + replace_all(d.subject, "_", " ") +
          ".\n\n";
    if (opt.num_fewshot > 0) {
      PyRandom& rnd = generators.try_emplace(key, opt.fewshot_seed).first->second;
      for (const McDoc* s :
           fewshot_examples(d, pools[key], opt.num_fewshot, sampler, eval_doc, rnd, opt.fewshot_file, key))
        p += mc_fewshot_example(*s) + "\n\n";
    }
    for (std::string& c : d.contexts) c = p + c;
  }
  return task;
}

int64_t code_points(std::string_view utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace castor::data
