// `castor sample` and `castor export` through the real binary: text from llm.c/safetensors weights and from a run's
// checkpoint (tokenizer from the recorded data directory), llm.c export, and one-line errors on bad input.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "castor/autograd.h"
#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/serialize.h"
#include "castor/tokenizer.h"
#include "run_test_util.h"
#include "test_util.h"

namespace castor {
namespace {

namespace fs = std::filesystem;

const char* kText = "The jury said that the city had been run well. The jury also said, \"It is well.\"\n";

// A token directory with a char tokenizer of kText, a random GPT for it as llm.c .bin, and a run directory holding
// the same GPT as a checkpoint whose castor.config records n_head and the token directory (as the trainer's do).
struct Fixture {
  test::ScratchDir dir;
  std::string tok, bin, run;
  std::shared_ptr<models::GPT> model;
  data::Tokenizer tokenizer{data::CharTokenizer::from_text(kText, "text")};

  explicit Fixture(const std::string& name) : dir(name) {
    tok = dir + "/tok", bin = dir + "/m.bin", run = dir + "/run";
    fs::create_directories(tok);
    atomic_write_file(tok + "/tokenizer.json", tokenizer.record().dump());
    models::GPTConfig c;
    c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 32, c.vocab_size = 64;
    c.real_vocab_size = tokenizer.vocab_size();
    model = models::gpt(c, 3);
    formats::write_llmc_checkpoint(bin, *model);
    Json config = Json::Object{{"model", "gpt"}, {"n_head", 2}, {"data_dir", tok}};
    train::Checkpoint ck{
        model->state_dict(), {{"format", "pt"}, {"castor.model", "gpt"}, {"castor.config", config.dump()}}, {}, {}};
    train::write_checkpoint(run, 10, ck, 2);
  }

  // What `castor sample` should print: the prompt and its continuation by the library's generate (top_p: castor
  // sample's default, run.c's 0.9).
  std::string expected(const std::string& prompt, int64_t tokens, double temperature, int64_t top_k, uint64_t seed,
                       double top_p = 0.9) {
    std::vector<int64_t> ids;
    for (uint32_t t : tokenizer.encode(prompt)) ids.push_back(t);
    std::vector<uint32_t> out;
    for (int64_t t : models::generate(*model, ids, tokens, temperature, top_k, seed, models::Window::Sliding, top_p))
      out.push_back(t);
    return tokenizer.decode(out) + "\n";
  }
};

test::CastorProcess castor(const Fixture& f, const std::vector<std::string>& args) {
  return test::run_castor(args, {.dir = f.dir});
}

TEST(SampleCli, PrintsThePromptAndItsContinuation) {
  Fixture f("sample_cli");
  // Greedy from the llm.c file with an explicit tokenizer.
  auto p = castor(f, {"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--prompt", "The jury", "--tokens", "40",
                      "--temperature", "0"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, f.expected("The jury", 40, 0.0, 0, 0));
  EXPECT_EQ(p.out.rfind("The jury", 0), 0u);
  // Sampled from the run directory (tokenizer from its recorded data_dir), seeded: the same text twice.
  const std::vector<std::string> args = {"sample", "--checkpoint",  f.run, "--prompt", "The jury", "--tokens",
                                         "60",     "--temperature", "0.8", "--top-k",  "5",        "--seed",
                                         "1"};
  p = castor(f, args);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, f.expected("The jury", 60, 0.8, 5, 1));
  EXPECT_EQ(castor(f, args).out, p.out);
  auto other = args;
  other.back() = "2";
  EXPECT_NE(castor(f, other).out, p.out);
}

// GPT-2's tokenizer (data/brown, made by scripts/setup.sh) and llm.c's padded vocabulary: an empty prompt starts from
// <|endoftext|>, and the padding rows, made to dominate every position, never come out (decoding one would fail).
TEST(SampleCli, Gpt2TokenizerAndPaddedVocabulary) {
  const test::ScratchDir dir("sample_cli_gpt2");
  const std::string brown = std::string(CASTOR_SOURCE_DIR) + "/data/brown";
  ASSERT_TRUE(file_exists(brown + "/train.bin")) << brown << ": run scripts/setup.sh";
  fs::create_directories(dir);
  models::GPTConfig c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = 50304, c.real_vocab_size = 50257;
  auto model = models::gpt(c, 4);
  {
    NoGradGuard no_grad;
    model->ln_f->bias.narrow(0, 0, 1).fill_(5.0);
    model->wte->weight.narrow(0, 50257, 47).narrow(1, 0, 1).fill_(10.0);
  }
  {
    models::KVCache cache(*model);  // forward_cached: lm_head's every row, padding included
    const Tensor logits = models::forward_cached(*model, tensor({50256, 464}, DType::Int64).reshape({1, 2}), cache);
    ASSERT_GE(argmax(logits.select(1, 1), 1).to_vector<int64_t>()[0], 50257);  // an unmasked argmax would pick padding
  }
  formats::write_llmc_checkpoint(dir + "/gpt2.bin", *model);
  data::Tokenizer tok = data::Tokenizer::load(brown);
  for (const std::string prompt : {"", "The jury"}) {
    auto p = test::run_castor({"sample", "--init", "gpt2.bin", "--tokenizer-dir", brown, "--prompt", prompt, "--tokens",
                               "20", "--temperature", "1.0", "--top-k", "0", "--seed", "7"},
                              {.dir = dir});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    std::vector<int64_t> ids;
    for (uint32_t t : tok.encode(prompt)) ids.push_back(t);
    if (ids.empty()) ids.push_back(data::Gpt2Tokenizer::kEot);
    const std::vector<int64_t> seq = models::generate(*model, ids, 20, 1.0, 0, 7, models::Window::Sliding, 0.9);
    for (int64_t t : seq) EXPECT_LT(t, 50257);
    std::vector<uint32_t> text(seq.begin() + (prompt.empty() ? 1 : 0), seq.end());
    EXPECT_EQ(p.out, tok.decode(text) + "\n") << "prompt '" << prompt << "'";
  }
}

// The trainer's own GPT checkpoints: `castor train --model gpt` on a small character corpus, then `castor sample
// --checkpoint RUN` (n_head and the token directory from the run's castor.config) and `castor export --llmc`.
// A GPT whose greedy text depends on its context (weights 5x GPT-2's init), vocabulary exactly the tokenizer's (no
// padding, so nanoGPT's model is the same function), block 16.
std::shared_ptr<models::GPT> context_gpt(int64_t vocab_size, uint64_t seed) {
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = vocab_size;
  auto model = models::gpt(c, seed);
  NoGradGuard no_grad;
  for (Tensor& p : model->parameters())
    if (p.dim() == 2) p.mul_(5.0);
  model->eval();
  return model;
}

std::string comma_list(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t t : ids) out += (out.empty() ? "" : ",") + std::to_string(t);
  return out;
}

// --window sliding (the default) is nanoGPT's generate: greedy tokens identical to nanoGPT's GPT.generate (PyTorch,
// float32, tests/oracle/nanogpt_oracle.py) for 200 tokens past the block; --window cached differs past the block and
// is the library's cached generate; help says what each does.
TEST(SampleCli, SlidingWindowIsNanoGptsGenerate) {
  Fixture f("sample_cli_sliding");
  auto model = context_gpt(f.tokenizer.vocab_size(), 12);
  save_safetensors(f.dir + "/m.safetensors", model->state_dict());
  std::vector<int64_t> prompt;
  for (uint32_t t : f.tokenizer.encode("The jury")) prompt.push_back(t);
  const int64_t tokens = 16 - 8 + 200;  // 200 tokens past the block of 16
  const std::string cfg = detail::cat(
      "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"block_size\": 16, "
      "\"vocab_size\": ",
      f.tokenizer.vocab_size(), ", \"bias\": true}");
  ASSERT_TRUE(test::run_oracle("nanogpt_oracle.py", {"generate", cfg, f.dir + "/m.safetensors", comma_list(prompt),
                                                     std::to_string(tokens), f.dir + "/want.safetensors"}));
  const std::vector<int64_t> want =
      load_safetensors(f.dir + "/want.safetensors").tensors.at("tokens").to_vector<int64_t>();
  ASSERT_EQ(want.size(), prompt.size() + tokens);
  EXPECT_EQ(models::generate(*model, prompt, tokens, 0.0, 0, 0, models::Window::Sliding), want);
  std::vector<uint32_t> text(want.begin(), want.end());
  auto sample = [&](const std::string& window) {
    return castor(f, {"sample", "--init", "m.safetensors", "--n-head", "2", "--tokenizer-dir", "tok", "--prompt",
                      "The jury", "--tokens", std::to_string(tokens), "--temperature", "0", "--window", window});
  };
  const test::CastorProcess sliding = sample("sliding");
  ASSERT_EQ(sliding.exit_code, 0) << sliding.err;
  EXPECT_EQ(sliding.out, f.tokenizer.decode(text) + "\n");
  const std::vector<int64_t> cached = models::generate(*model, prompt, tokens, 0.0, 0, 0, models::Window::Cached);
  ASSERT_NE(cached, want);  // past the block the windows differ
  EXPECT_TRUE(std::equal(want.begin(), want.begin() + 16, cached.begin()));
  std::vector<uint32_t> cached_text(cached.begin(), cached.end());
  EXPECT_EQ(sample("cached").out, f.tokenizer.decode(cached_text) + "\n");
  const test::CastorProcess help = castor(f, {"help", "sample"});
  for (const char* word : {"--window", "sliding (nanoGPT's generate", "cached (the KV cache"})
    EXPECT_NE(help.out.find(word), std::string::npos) << word << " in\n" << help.out;
  EXPECT_NE(sample("slide").exit_code, 0);
}

TEST(SampleCli, SamplesAndExportsWhatCastorTrainWrote) {
  const test::ScratchDir dir("sample_cli_trained");
  fs::create_directories(dir);
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 400; ++i) text << kText;
  }
  const test::CastorRun in_dir{dir};
  auto p = test::run_castor({"tokenize", "--tokenizer", "char", "--input", "text.txt", "--out", "tok"}, in_dir);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor({"train", "--model",  "gpt", "--data",    "tokens", "--data-dir",   "tok", "--n-layer",
                        "1",     "--n-head", "2",   "--n-embd",  "32",     "--block-size", "16",  "--batch-size",
                        "8",     "--steps",  "40",  "--threads", "1",      "--out",        "run"},
                       in_dir);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<std::string> args = {"sample",   "--checkpoint", "run",    "--prompt", "The jury",
                                         "--tokens", "30",           "--seed", "5"};
  p = test::run_castor(args, in_dir);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  // The same text as the library's generate on the checkpoint's weights with the run's tokenizer.
  const train::Checkpoint ck = train::read_checkpoint(dir + "/run");
  formats::GPTWeights w = formats::gpt_weights_from_safetensors(ck.model, ck.model_meta, 0, "run");
  EXPECT_EQ(w.config.n_head, 2);
  data::Tokenizer tok = data::Tokenizer::load(dir + "/tok");
  w.config.real_vocab_size = tok.vocab_size();
  auto model = models::gpt(w.config);
  model->load_state_dict(w.state);
  std::vector<int64_t> ids;
  for (uint32_t t : tok.encode("The jury")) ids.push_back(t);
  std::vector<uint32_t> out;
  for (int64_t t : models::generate(*model, ids, 30, 0.8, 200, 5, models::Window::Sliding, 0.9)) out.push_back(t);
  EXPECT_EQ(p.out, tok.decode(out) + "\n");
  p = test::run_castor({"export", "--llmc", "--checkpoint", "run", "--out", "run.bin"}, in_dir);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const formats::GPTWeights e = formats::read_llmc_checkpoint(dir + "/run.bin");
  EXPECT_EQ(e.config.real_vocab_size, tok.vocab_size());
  for (const auto& [name, t] : w.state) EXPECT_TRUE(test::bit_equal(e.state.at(name), t)) << name;
}

TEST(SampleCli, ExportWritesTheCheckpointInLlmcFormat) {
  Fixture f("export_cli");
  auto p = castor(f, {"export", "--llmc", "--checkpoint", f.run, "--out", "out.bin"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("\"format\":\"llmc\""), std::string::npos) << p.out;
  // V from the run's tokenizer; the same bytes as the library writes from the model.
  const formats::GPTWeights w = formats::read_llmc_checkpoint(f.dir + "/out.bin");
  EXPECT_EQ(w.config.real_vocab_size, f.tokenizer.vocab_size());
  EXPECT_TRUE(read_file(f.dir + "/out.bin") == read_file(f.bin));
}

// A subnormal --temperature (1e-310) samples greedily, as documented, instead of drawing from NaN probabilities;
// weights holding NaN or inf are refused in one line naming the file before any text is printed.
TEST(SampleCli, TinyTemperaturesAreGreedyAndNonFiniteWeightsNameTheFile) {
  Fixture f("sample_cli_nonfinite");
  const std::vector<std::string> base = {"sample",   "--init",   f.bin, "--tokenizer-dir", f.tok, "--prompt",
                                         "The jury", "--tokens", "30",  "--temperature"};
  auto args = base;
  args.push_back("1e-310");
  auto p = castor(f, args);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, f.expected("The jury", 30, 0.0, 0, 0));
  for (double bad : {std::nan(""), HUGE_VAL}) {
    auto model = models::gpt(f.model->config(), 3);
    {
      NoGradGuard no_grad;
      model->h->named_parameters().begin()->second.narrow(0, 0, 1).fill_(bad);
    }
    formats::write_llmc_checkpoint(f.dir + "/bad.bin", *model);
    args = base;
    args[2] = f.dir + "/bad.bin";
    args.push_back("0.8");
    p = castor(f, args);
    EXPECT_EQ(p.exit_code, 1) << p.out;
    EXPECT_NE(p.err.find(f.dir + "/bad.bin: "), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("holds NaN or infinite values"), std::string::npos) << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
    EXPECT_EQ(p.out, "");
  }
}

// `--tokens 1000000000` prints each token as it is drawn (it used to print nothing until the end while the sequence
// grew in memory): the text appears while the process runs, and is the start of what the library generates.
TEST(SampleCli, TextIsPrintedAsItIsGenerated) {
  Fixture f("sample_cli_stream");
  test::CastorProcess p({"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--prompt", "The jury", "--tokens",
                         "1000000000", "--temperature", "0"},
                        {.dir = f.dir});
  const std::string want = f.expected("The jury", 100, 0.0, 0, 0);
  std::string seen;
  p.wait_until([&] { return (seen = p.out_so_far()).size() >= 100; });
  p.signal(SIGKILL);
  p.wait();
  ASSERT_GE(seen.size(), 100u) << "printed nothing while generating: '" << seen << "' " << p.err;
  EXPECT_EQ(seen.substr(0, 100), want.substr(0, 100));
}

// `castor export --out` (llm.c's file, one safetensors file) replaces only a regular file or a missing path (as root
// it used to replace /dev/null): a FIFO, a directory and symbolic links (to a file, dangling) are refused in one line
// naming the flag and the path, and left as they were; an empty --out names the flag.
TEST(SampleCli, ExportReplacesNothingButARegularFile) {
  Fixture f("export_cli_targets");
  ASSERT_EQ(::mkfifo((f.dir + "/pipe").c_str(), 0644), 0);
  fs::create_directory(f.dir + "/folder");
  atomic_write_file(f.dir + "/victim", std::string_view("keep"));
  fs::create_symlink("victim", f.dir + "/link");
  fs::create_symlink("nowhere", f.dir + "/dangling");
  for (const auto& [name, kind] : std::vector<std::pair<std::string, std::string>>{{"pipe", "a FIFO"},
                                                                                   {"folder", "a directory"},
                                                                                   {"link", "a symbolic link"},
                                                                                   {"dangling", "a symbolic link"}}) {
    for (const char* format : {"--llmc", "--safetensors"}) {
      auto p = castor(f, {"export", format, "--checkpoint", f.run, "--out", name});
      EXPECT_EQ(p.exit_code, 1) << format << " " << name << ": " << p.err;
      EXPECT_NE(p.err.find("castor export: error: --out: " + name + ": is " + kind), std::string::npos) << p.err;
      EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
    }
  }
  EXPECT_EQ(fs::symlink_status(f.dir + "/pipe").type(), fs::file_type::fifo);
  EXPECT_TRUE(fs::is_directory(f.dir + "/folder") && fs::is_empty(f.dir + "/folder"));
  EXPECT_TRUE(fs::is_symlink(f.dir + "/link") && fs::is_symlink(f.dir + "/dangling"));
  EXPECT_FALSE(fs::exists(f.dir + "/nowhere"));
  EXPECT_EQ(read_file(f.dir + "/victim"), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
  auto p = castor(f, {"export", "--llmc", "--checkpoint", f.run, "--out", ""});
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.err.find("--out: empty"), std::string::npos) << p.err;
  // Any regular path is written, also one that is not UTF-8 (the summary line shows its bytes as \xNN).
  p = castor(f, {"export", "--llmc", "--checkpoint", f.run, "--out", "out\xff.bin"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("\"out\":\"out\\\\xff.bin\""), std::string::npos) << p.out;
  EXPECT_TRUE(fs::is_regular_file(f.dir + "/out\xff.bin"));
}

// The names in `dir` that start with `prefix`, sorted.
std::vector<std::string> names_starting(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Under a file-size limit (ulimit -f, a quota) an export is a failed write, not SIGXFSZ: one line naming the file and
// the limit, exit 1, no temp file left, and the earlier export it would have replaced intact.
TEST(SampleCli, ExportPastAFileSizeLimitFailsCleanly) {
  Fixture f("export_cli_fsize");
  for (const char* format : {"--llmc", "--safetensors"}) {
    const std::string out = std::string("m") + (format + 2);
    auto p = castor(f, {"export", format, "--checkpoint", f.run, "--out", out});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    const std::vector<uint8_t> before = read_file(f.dir + "/" + out);
    ASSERT_GT(before.size(), 64u << 10);
    test::CastorRun limited{.dir = f.dir};
    limited.file_size_bytes = 32 << 10;
    p = test::run_castor({"export", format, "--checkpoint", f.run, "--out", out}, limited);
    EXPECT_EQ(p.killed_by, 0) << "killed by signal " << p.killed_by;
    test::expect_one_line_error(p, {out, "File too large", "ulimit -f"});
    EXPECT_EQ(read_file(f.dir + "/" + out), before) << out;
    EXPECT_EQ(names_starting(f.dir, out), std::vector<std::string>{out}) << "a temp file was left";
  }
}

// --format nanogpt writes the directory --out (ckpt.pt): replaced only when it holds nothing but an earlier export's
// ckpt.pt, never through a symbolic link, never a run directory; and no export replaces its own source or a file in a
// run's checkpoint.
TEST(SampleCli, ExportsReplaceOnlyTheirOwnOutputs) {
  Fixture f("export_cli_owned");
  fs::create_directory(f.dir + "/empty");
  fs::create_directory_symlink("empty", f.dir + "/link");
  fs::create_directory(f.dir + "/proj");
  atomic_write_file(f.dir + "/proj/notes.txt", std::string_view("mine"));
  for (const auto& [out, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"link", {"--out: link: is a symbolic link"}},
           {"proj", {"--out: proj holds files a nanoGPT export does not (notes.txt)"}},
           {"run", {"--out: run: a Castor run directory (it holds checkpoints)"}}})
    test::expect_one_line_error(castor(f, {"export", "--nanogpt", "--checkpoint", f.run, "--out", out}), parts);
  EXPECT_TRUE(fs::is_empty(f.dir + "/empty"));
  EXPECT_EQ(names_starting(f.dir + "/proj", ""), std::vector<std::string>{"notes.txt"});
  for (int i = 0; i < 2; ++i) {  // (the second replaces the first)
    auto p = castor(f, {"export", "--nanogpt", "--checkpoint", f.run, "--out", "ck"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_EQ(names_starting(f.dir + "/ck", ""), std::vector<std::string>{"ckpt.pt"});
  }
  const std::string model = "run/checkpoints/step-0000000010/model.safetensors";
  const std::vector<uint8_t> before = read_file(f.dir + "/" + model);
  test::expect_one_line_error(castor(f, {"export", "--safetensors", "--checkpoint", f.run, "--out", model}),
                              {"--out: " + model + " is inside", "which this export reads"});
  test::expect_one_line_error(castor(f, {"export", "--safetensors", "--checkpoint", "m.bin", "--out", "m.bin"}),
                              {"--out: m.bin is m.bin", "which this export reads"});
  EXPECT_EQ(read_file(f.dir + "/" + model), before);
}

// A checkpoint whose castor.config metadata is damaged JSON (its checksums intact: written so) is named by sample,
// export, eval and info in one line, instead of "invalid JSON at offset N".
TEST(SampleCli, DamagedRecordedConfigNamesTheFile) {
  Fixture f("sample_cli_damaged_config");
  const std::string run = f.dir + "/damaged";
  train::write_checkpoint(run, 1,
                          {f.model->state_dict(), {{"format", "pt"}, {"castor.config", "{\"model\": gpt"}}, {}, {}}, 2);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"sample", "--checkpoint", run, "--tokenizer-dir", f.tok},
        std::vector<std::string>{"export", "--llmc", "--checkpoint", run, "--out", "x.bin"},
        std::vector<std::string>{"eval", "--checkpoint", run}, std::vector<std::string>{"info", run}}) {
    auto p = castor(f, args);
    EXPECT_EQ(p.exit_code, 1) << args[0] << ": " << p.err;
    EXPECT_NE(p.err.find("/model.safetensors: metadata castor.config: "), std::string::npos)
        << args[0] << ": " << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
  }
}

TEST(SampleCli, BadInputIsOneLineAndNothingWritten) {
  Fixture f("sample_cli_bad");
  save_safetensors(f.dir + "/plain.safetensors", f.model->state_dict());
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"sample", "--prompt", "x"}, "--checkpoint: missing"},
      {{"sample", "--init", f.bin}, "--tokenizer-dir: missing"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--prompt", "The judge"}, "--prompt: "},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--prompt", ""}, "--prompt: empty"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--temperature", "-1"}, "--temperature: must be"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--tokens", "many"}, "--tokens: invalid value 'many'"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--bogus"}, "unknown flag"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.tok, "--threads", "2000"}, "--threads: must be at most 1024"},
      {{"sample", "--init", f.dir + "/plain.safetensors", "--tokenizer-dir", f.tok}, "number of heads is not recorded"},
      {{"sample", "--init", f.dir + "/missing.bin", "--tokenizer-dir", f.tok}, "missing.bin"},
      {{"sample", "--init", f.bin, "--tokenizer-dir", f.dir}, "castor_tokens.json"},
      {{"export", "--checkpoint", f.run, "--out", "x.bin"}, "--format: missing"},
      {{"export", "--llmc", "--nanogpt", "--checkpoint", f.run, "--out", "x.bin"}, "--llmc excludes --nanogpt"},
      {{"export", "--llmc", "--checkpoint", f.run, "--out", "no/such/dir/x.bin"}, "no/such/dir/x.bin"},
      {{"export", "--llmc", "--checkpoint", f.tok, "--out", "x.bin"}, f.tok},
  };
  for (const auto& [args, want] : cases) {
    auto p = castor(f, args);
    test::expect_one_line_error(p, {want});
    EXPECT_EQ(p.out, "");
  }
  EXPECT_FALSE(fs::exists(f.dir + "/x.bin"));
  // An image classifier's run is not a language model's (a GPT's or a Llama's).
  const std::string image_run = f.dir + "/image_run";
  train::write_checkpoint(image_run, 1,
                          {models::simple_cnn(1, 28, 28)->state_dict(), {{"castor.model", "simplecnn"}}, {}, {}}, 2);
  auto p = castor(f, {"sample", "--checkpoint", image_run, "--tokenizer-dir", f.tok});
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.err.find("a simplecnn checkpoint, not a language model's"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace castor
