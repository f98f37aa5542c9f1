// `castor train --init BASE --lora-rank R` end to end through the real binary: adapter-only checkpoints that name the
// base, bit-exact resume (also after SIGKILL), a changed base refused, merged and PEFT exports (checked by
// tests/oracle/peft_files.py's own reader), --init-lora from files that script lays out, and one-line errors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;
using test::CastorProcess;

// A scratch directory holding the test's character tokens, and the real binary run in it; `model` ("gpt" or "llama",
// test::tiny_lm_args) trained at learning rate `lr` and its base run trained for `base_steps` steps.
class LoraCliDir : public ::testing::Test {
 protected:
  LoraCliDir(std::string model, std::string lr, int64_t base_steps)
      : model_(std::move(model)), lr_(std::move(lr)), base_steps_(base_steps) {}
  void SetUp() override {
    CastorProcess p = test::make_grammar_tokens(in_dir);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    train_base(args("base", base_steps_, {"--eval-iters", "0"}));
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& a) { return test::run_castor(a, in_dir); }
  void expect_error(const std::vector<std::string>& a, const std::vector<std::string>& parts) {
    CastorProcess p = castor(a);
    EXPECT_NE(p.exit_code, 0);
    const std::string last = p.err.substr(p.err.rfind('\n', p.err.size() - 2) + 1);
    for (const std::string& part : parts) EXPECT_NE(last.find(part), std::string::npos) << part << " not in: " << p.err;
  }
  // Trains the base run (`a`: castor's arguments) and keeps its validation loss.
  void train_base(const std::vector<std::string>& a) {
    CastorProcess b = castor(a);
    ASSERT_EQ(b.exit_code, 0) << b.err;
    base_val_loss = Json::parse(b.out).at("val_loss").as_double();
  }
  // castor train of the one-layer model at its learning rate on the test's tokens, one thread, deterministic.
  std::vector<std::string> args(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) const {
    extra.insert(extra.begin(), {"--lr", lr_, "--log-every", "10", "--threads", "1", "--deterministic"});
    return test::tiny_lm_args(model_, out, steps, 8, extra);
  }
  // LoRA of rank 4 (alpha 16) on `targets` of the base `init`, checkpoints every 10 steps.
  std::vector<std::string> lora_args(const std::string& out, int64_t steps, const std::string& init,
                                     const std::string& targets, std::vector<std::string> extra = {}) const {
    std::vector<std::string> lora = {"--init",         init,    "--lora-rank", "4",    "--lora-alpha",       "16",
                                     "--lora-targets", targets, "--schedule",  "none", "--checkpoint-every", "10"};
    lora.insert(lora.end(), extra.begin(), extra.end());
    return args(out, steps, lora);
  }
  // After a LoRA run (`lora`: its arguments, 10 steps) the base's checkpoint changes by one bit: resuming,
  // evaluating, sampling and exporting (merged as `merged_format`, merged safetensors, PEFT) the run are each refused
  // in one line naming the base, and nothing is written.
  void expect_a_changed_base_refused(const std::vector<std::string>& lora, const std::string& merged_format) {
    ASSERT_EQ(castor(lora).exit_code, 0);
    const std::string base = latest_checkpoint(path("base")).value() + "/model.safetensors";
    std::vector<uint8_t> bytes = read_file(base);
    bytes.back() ^= 1;  // the last weight's lowest bit
    atomic_write_file(base, bytes);
    using Args = std::vector<std::string>;
    for (const Args& a : {Args{"train", "--resume", "run", "--steps", "20"}, Args{"eval", "run"},
                          Args{"sample", "--checkpoint", "run", "--prompt", "the "},
                          Args{"export", "--checkpoint", "run", "--merge-lora", merged_format, "--out", "m.bin"},
                          Args{"export", "--checkpoint", "run", "--merge-lora", "--safetensors", "--out", "m.st"},
                          Args{"export", "--checkpoint", "run", "--peft", "p"}})
      test::expect_one_line_error(castor(a), {base, "changed since the run started"});
    for (const char* f : {"m.bin", "m.st", "p/adapter_model.safetensors", "run/checkpoints/step-0000000020"})
      EXPECT_FALSE(fs::exists(path(f))) << f;
  }

  // castor eval's float32 validation loss of a run or a weights file (`extra`: flags a weights file needs).
  double eval_loss(const std::string& what, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"eval", what, "--dtype", "float32"};
    a.insert(a.end(), extra.begin(), extra.end());
    CastorProcess e = castor(a);
    EXPECT_EQ(e.exit_code, 0) << e.err;
    return e.exit_code == 0 ? Json::parse(e.out).at("val_loss").as_double() : 0.0;
  }
  // castor sample's greedy text (`from`: --checkpoint RUN, or --init FILE and its flags).
  std::string greedy(std::vector<std::string> from) {
    std::vector<std::string> a = {"sample", "--temperature", "0", "--tokens", "24", "--prompt", "the "};
    a.insert(a.end(), from.begin(), from.end());
    CastorProcess s = castor(a);
    EXPECT_EQ(s.exit_code, 0) << s.err;
    return s.out;
  }

  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
  double base_val_loss = 0;

 private:
  std::string model_, lr_;
  int64_t base_steps_;
};

// A one-layer GPT with 2 heads; LoRA on c_attn and c_proj of the base run.
class LoraCli : public LoraCliDir {
 protected:
  LoraCli() : LoraCliDir("gpt", "3e-3", 30) {}
  std::vector<std::string> lora_args(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) const {
    return LoraCliDir::lora_args(out, steps, "base", "c_attn,c_proj", std::move(extra));
  }
};

TEST_F(LoraCli, CheckpointsHoldTheAdaptersAndResumeBitExact) {
  CastorProcess full = castor(lora_args("full", 30, {"--eval-iters", "0"}));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_LT(Json::parse(full.out).at("val_loss").as_double(), base_val_loss);
  const Checkpoint ck = read_checkpoint(path("full"));
  ASSERT_EQ(ck.model.size(), 6u);  // c_attn, attn.c_proj, mlp.c_proj: lora_A and lora_B each
  for (const auto& [k, t] : ck.model) EXPECT_NE(k.find(".lora_"), std::string::npos) << k;
  EXPECT_EQ(ck.model.at("transformer.h.0.attn.c_attn.lora_B.weight").shape(), (Shape{96, 4}));
  EXPECT_EQ(ck.model_meta.at("castor.lora_base"),
            absolute_path(path("base/checkpoints/step-0000000030/model.safetensors")));
  ASSERT_EQ(castor(lora_args("cut", 20)).exit_code, 0);
  CastorProcess r = castor({"train", "--resume", "cut", "--steps", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("full"), path("cut"));
  // eval and sample take the run (sample: its base with the adapters merged).
  CastorProcess e = castor({"eval", "full"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(Json::parse(e.out).at("val_loss").as_double(), Json::parse(full.out).at("val_loss").as_double());
  CastorProcess s = castor({"sample", "--checkpoint", "full", "--prompt", "the ", "--tokens", "20"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out.rfind("the ", 0), 0u);
  EXPECT_GE(s.out.size(), 24u);  // the prompt and 20 one-character tokens
}

// As full runs: a LoRA run killed at any moment resumes from its newest checkpoint to the same state (at O2: 16-bit
// adapters with float32 masters).
TEST_F(LoraCli, SigkillThenResumeIsBitExact) {
  ASSERT_EQ(castor(lora_args("ref", 400, {"--amp", "O2"})).exit_code, 0);
  CastorProcess p(lora_args("run", 400, {"--amp", "O2", "--log-every", "1"}), in_dir);
  const std::string mid = path("run/checkpoints/step-0000000020/COMMIT");
  p.wait_until([&] { return fs::exists(mid); });
  p.signal(SIGKILL);
  p.wait();
  ASSERT_EQ(p.killed_by, SIGKILL) << "finished before the kill: " << p.err;
  ASSERT_FALSE(fs::exists(path("run/checkpoints/step-0000000400"))) << "the kill came after the last step";
  CastorProcess r = castor({"train", "--resume", "run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("ref"), path("run"));
}

TEST_F(LoraCli, AChangedBaseIsRefused) { expect_a_changed_base_refused(lora_args("run", 10), "--llmc"); }

// --merge-lora: llm.c's file of the base with the adapters merged evaluates as the run did (in float32); --peft: the
// files PEFT writes, read by the test's own reader; --init-lora reads them back, and files the script lays out.
TEST_F(LoraCli, ExportsMergedAndPeftAndReadsPeftBack) {
  ASSERT_EQ(castor(lora_args("run", 20, {"--rslora"})).exit_code, 0);
  expect_error({"export", "--checkpoint", "run", "--llmc", "--out", "m.bin"}, {"--merge-lora: missing", "LoRA run"});
  CastorProcess m = castor({"export", "--checkpoint", "run", "--merge-lora", "--llmc", "--out", "m.bin"});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  CastorProcess merged = castor({"eval", "m.bin", "--model", "gpt", "--data", "tokens", "--data-dir", "tok"});
  CastorProcess adapted = castor({"eval", "run", "--dtype", "float32"});
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  ASSERT_EQ(adapted.exit_code, 0) << adapted.err;
  EXPECT_NEAR(Json::parse(merged.out).at("val_loss").as_double(), Json::parse(adapted.out).at("val_loss").as_double(),
              1e-5);
  // The same code path merges into safetensors, a plain GPT's file with the run's settings.
  CastorProcess ms = castor({"export", "--checkpoint", "run", "--merge-lora", "--safetensors", "--out", "m.st"});
  ASSERT_EQ(ms.exit_code, 0) << ms.err;
  EXPECT_NEAR(eval_loss("m.st"), Json::parse(adapted.out).at("val_loss").as_double(), 1e-5);
  EXPECT_EQ(greedy({"--init", "m.st"}), greedy({"--checkpoint", "run"}));
  CastorProcess pe = castor({"export", "--checkpoint", "run", "--peft", "peft"});
  ASSERT_EQ(pe.exit_code, 0) << pe.err;
  const std::string p = "base_model.model.transformer.h.0.";
  const std::string expected = detail::cat(
      "{\"config\": {\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 16.0, \"use_rslora\": true, "
      "\"target_modules\": [\"c_attn\", \"c_proj\"], \"fan_in_fan_out\": false, \"bias\": \"none\", "
      "\"base_model_name_or_path\": \"",
      absolute_path(path("base/checkpoints/step-0000000030/model.safetensors")), "\"}, \"shapes\": {\"", p,
      "attn.c_attn.lora_A.weight\": [4, 32], \"", p, "attn.c_attn.lora_B.weight\": [96, 4], \"", p,
      "attn.c_proj.lora_A.weight\": [4, 32], \"", p, "attn.c_proj.lora_B.weight\": [32, 4], \"", p,
      "mlp.c_proj.lora_A.weight\": [4, 128], \"", p, "mlp.c_proj.lora_B.weight\": [32, 4]}}");
  ASSERT_TRUE(test::run_oracle("peft_files.py", {"check", path("peft"), expected}));
  // Read back: the same adapters train from where the run's were.
  CastorProcess back = castor(args("back", 1, {"--init", "base", "--init-lora", "peft", "--lr", "1e-30"}));
  ASSERT_EQ(back.exit_code, 0) << back.err;
  const Checkpoint a = read_checkpoint(path("run")), b = read_checkpoint(path("back"));
  for (const auto& [k, t] : a.model) EXPECT_TRUE(test::bit_equal(b.model.at(k), t)) << k;
  // Files laid out by the script (rank 2 on c_attn): loaded as written; a shape that does not fit is refused.
  ASSERT_TRUE(test::run_oracle("peft_files.py", {"write", path("laid"), "32", "2"}));
  ASSERT_EQ(castor(args("laid_run", 1, {"--init", "base", "--init-lora", "laid", "--lr", "1e-30"})).exit_code, 0);
  const StateDict written = load_safetensors(path("laid/adapter_model.safetensors")).tensors;
  const Checkpoint l = read_checkpoint(path("laid_run"));
  ASSERT_EQ(l.model.size(), 2u);
  for (const auto& [k, t] : l.model) EXPECT_TRUE(test::bit_equal(t, written.at("base_model.model." + k))) << k;
  ASSERT_TRUE(test::run_oracle("peft_files.py", {"write", path("bad"), "32", "2", "bad"}));
  expect_error(args("bad_run", 1, {"--init", "base", "--init-lora", "bad"}),
               {"--init-lora bad/adapter_model.safetensors", "lora_B.weight is float32[96, 3]", "adapter is [96, 2]"});
  EXPECT_FALSE(fs::exists(path("bad_run")));
}

TEST_F(LoraCli, BadInputIsAOneLineErrorAndWritesNothing) {
  expect_error(args("x", 5, {"--lora-rank", "4"}), {"--lora-rank: needs --init"});
  expect_error(args("x", 5, {"--init", "base", "--lora-alpha", "4"}), {"--lora-alpha: needs --lora-rank"});
  expect_error(args("x", 5, {"--init", "base", "--lora-rank", "-1"}), {"--lora-rank"});
  expect_error(args("x", 5, {"--init", "base", "--lora-rank", "33"}),
               {"--lora-rank 33", "larger than transformer.h.0.attn.c_attn's dimensions (96, 32)"});
  expect_error(args("x", 5, {"--init", "base", "--lora-rank", "4", "--lora-targets", "wq,wv"}),
               {"--lora-targets wq,wv", "\"wq\", \"wv\" match no Linear layer", "valid names: c_attn, c_fc, c_proj"});
  EXPECT_FALSE(fs::exists(path("x")));
  ASSERT_EQ(castor(lora_args("run", 10)).exit_code, 0);
  expect_error(args("x", 5, {"--init", "run", "--lora-rank", "4"}), {"--init run", "adapters only", "--merge-lora"});
  expect_error({"export", "--checkpoint", "base", "--peft", "p"}, {"--peft", "not a LoRA run"});
  std::ofstream(path("keep.bin")) << "good";
  expect_error({"export", "--checkpoint", "run", "--llmc", "--out", "keep.bin"}, {"--merge-lora: missing"});
  const std::vector<uint8_t> kept = read_file(path("keep.bin"));
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "good");
}

// --peft DIR is written whole, as every export directory: never through a symbolic link, never over a run directory or
// a directory holding other files; an earlier export is replaced. A merged export never replaces the run's own base.
// --init-lora refuses what would silently compute otherwise than PEFT: r 0 (no adapters at all); per-module
// rank_pattern / alpha_pattern that are no ranks, no alphas or no regular expressions, or ranks the files' adapters
// have not (PEFT's matching itself: HfCli.PeftRankAndAlphaPatternsAreTakenAsPeftTakesThem); PEFT's empty ones are
// taken.
TEST_F(LoraCli, PeftExportsAreOwnedDirectoriesAndPeftFilesArePeftsMath) {
  ASSERT_EQ(castor(lora_args("run", 10)).exit_code, 0);
  fs::create_directory(path("empty"));
  fs::create_directory_symlink("empty", path("link"));
  fs::create_directory(path("proj"));
  std::ofstream(path("proj/README.md")) << "mine";
  test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--peft", "link"}),
                              {"--peft: link: is a symbolic link"});
  test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--format", "peft", "--out", "link"}),
                              {"--out: link: is a symbolic link"});
  test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--peft", "proj"}),
                              {"--peft: proj holds files a PEFT export does not (README.md)"});
  test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--peft", "base"}),
                              {"--peft: base: a Castor run directory"});
  EXPECT_TRUE(fs::is_empty(path("empty")));
  EXPECT_TRUE(fs::exists(path("proj/README.md")));
  for (int i = 0; i < 2; ++i) ASSERT_EQ(castor({"export", "--checkpoint", "run", "--peft", "peft"}).exit_code, 0);
  // The run's base, merged over: refused, the base as it was (the run still merges and resumes).
  const std::string base = latest_checkpoint(path("base")).value() + "/model.safetensors";
  const std::vector<uint8_t> base_bytes = read_file(base);
  for (const char* format : {"--safetensors", "--llmc"})
    test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--merge-lora", format, "--out", base}),
                                {"--out: " + base});
  EXPECT_EQ(read_file(base), base_bytes);
  // adapter_config.json edited: r 0, per-module patterns; empty patterns (as PEFT writes them) are fine.
  const std::vector<uint8_t> bytes = read_file(path("peft/adapter_config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  const auto edited = [&](const std::string& key, const Json& value) {
    Json c = config;
    c[key] = value;
    atomic_write_file(path("peft/adapter_config.json"), c.dump(2));
    return castor(args("x", 1, {"--init", "base", "--init-lora", "peft", "--lr", "1e-30"}));
  };
  test::expect_one_line_error(edited("r", Json(0)), {"--init-lora", "adapter_config.json", "\"r\" 0", "positive"});
  test::expect_one_line_error(edited("rank_pattern", Json::Object{{"c_attn", 0}}),
                              {"adapter_config.json", "\"rank_pattern\" \"c_attn\": 0 is not a positive integer rank"});
  test::expect_one_line_error(edited("alpha_pattern", Json::Object{{"c_(attn", 32}}),
                              {"adapter_config.json", "alpha_pattern key \"c_(attn\" is not a regular expression"});
  test::expect_one_line_error(edited("alpha_pattern", Json::Array{}), {"adapter_config.json", "\"alpha_pattern\" []"});
  test::expect_one_line_error(
      edited("rank_pattern", Json::Object{{"transformer.h.0.attn.c_proj", 2}}),
      {"--init-lora peft/adapter_model.safetensors",
       "transformer.h.0.attn.c_proj.lora_A.weight is float32[4, 32], the model's adapter is [2, "
       "32]"});
  EXPECT_FALSE(fs::exists(path("x")));
  EXPECT_EQ(edited("rank_pattern", Json::Object{}).exit_code, 0);
}

// Python's format(n, ",d"), as PEFT prints its counts.
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i)
    out += ((i > 0 && (digits.size() - i) % 3 == 0) ? "," : "") + digits.substr(i, 1);
  return out;
}

// LoRA bookkeeping: an adapter on the tied lm_head is refused (its merge would change the embedding too); the counts
// PEFT's print_trainable_parameters prints (the base checkpoint's values, lm_head being wte, plus the adapters') in the
// banner, summary and castor info; the base run's --keep pruning leaves the checkpoint a LoRA run is built on; a moved
// base is named with --lora-base by eval, sample, export and train --resume (a wrong file is refused by its
// checksum); --merge-lora of a plain run and --peft into a run directory are refused.
TEST_F(LoraCli, TiedTargetsCountsPruningMovedBaseAndExportRefusals) {
  expect_error(LoraCliDir::lora_args("x", 5, "base", "lm_head"),
               {"--lora-targets lm_head", "lm_head shares its weight with transformer.wte.weight (tied)"});
  EXPECT_FALSE(fs::exists(path("x")));

  CastorProcess run = castor(lora_args("run", 10, {"--eval-iters", "0"}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string base_ck = latest_checkpoint(path("base")).value();
  int64_t trainable = 0, all = 0;
  for (const auto& [k, t] : read_checkpoint(path("run")).model) trainable += t.numel();
  for (const auto& [k, t] : read_checkpoint(base_ck).model)
    if (k != "lm_head.weight") all += t.numel();
  all += trainable;
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%.4f", 100.0 * static_cast<double>(trainable) / static_cast<double>(all));
  const std::string counts = "trainable params: " + grouped(trainable) + " || all params: " + grouped(all) +
                             " || trainable%: " + percent;
  EXPECT_NE(run.err.find(counts + "\n"), std::string::npos) << counts << " in " << run.err;
  EXPECT_EQ(Json::parse(run.out).at("trainable_params").as_int(), trainable);
  EXPECT_EQ(Json::parse(run.out).at("all_params").as_int(), all);
  CastorProcess info = castor({"info", "run"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("parameters  " + counts + "\n"), std::string::npos) << info.out;
  const double evaluated = eval_loss("run");
  const std::string text = greedy({"--checkpoint", "run"});

  // The base run goes on with --keep 1: its checkpoint the LoRA run is built on stays.
  CastorProcess more = castor(
      {"train", "--resume", "base", "--steps", "50", "--checkpoint-every", "10", "--keep", "1"});
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_TRUE(fs::exists(base_ck + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(path("base/checkpoints/step-0000000040")));  // pruned as before
  EXPECT_EQ(eval_loss("run"), evaluated);

  // The base moved: each command says so, and takes --lora-base.
  fs::rename(path("base"), path("moved"));
  const std::string moved = path("moved/checkpoints/") + fs::path(base_ck).filename().string() + "/model.safetensors";
  test::expect_one_line_error(castor({"eval", "run"}), {"is missing", "--lora-base"});
  EXPECT_EQ(eval_loss("run", {"--lora-base", moved}), evaluated);
  EXPECT_EQ(greedy({"--checkpoint", "run", "--lora-base", moved}), text);
  CastorProcess m = castor(
      {"export", "--checkpoint", "run", "--merge-lora", "--safetensors", "--out", "m.st", "--lora-base", moved});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_NEAR(eval_loss("m.st"), evaluated, 1e-5);
  CastorProcess resumed = castor({"train", "--resume", "run", "--steps", "20", "--lora-base", moved});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(read_checkpoint(path("run")).model_meta.at("castor.lora_base"), absolute_path(moved));
  const std::string other = latest_checkpoint(path("moved")).value() + "/model.safetensors";
  test::expect_one_line_error(castor({"eval", "run", "--lora-base", other}), {other, "changed since the run started"});
  test::expect_one_line_error(castor(args("y", 5, {"--init", "moved", "--lora-rank", "4", "--lora-base", moved})),
                              {"--lora-base: re-points a resumed LoRA run's base"});

  test::expect_one_line_error(
      castor({"export", "--checkpoint", "moved", "--merge-lora", "--safetensors", "--out", "p.st"}),
      {"--merge-lora: moved is not a LoRA run's checkpoint"});
  EXPECT_FALSE(fs::exists(path("p.st")));
  test::expect_one_line_error(castor({"export", "--checkpoint", "run", "--peft", "moved", "--lora-base", moved}),
                              {"--peft: moved: a Castor run directory"});
  EXPECT_FALSE(fs::exists(path("moved/adapter_model.safetensors")));
}

// LoRA on Llama bases (grouped-query attention: 4 query heads over 2 key/value heads): a Castor Llama run trained for
// 60 steps as the base, far enough that its greedy text is words and short enough that LoRA changes it.
class LlamaLoraCli : public LoraCliDir {
 protected:
  LlamaLoraCli() : LoraCliDir("llama", "1e-2", 60) {}
  // The run's merged exports (safetensors, llama2.c v0 and v1) evaluate as the run does in float32 and give its greedy
  // text, as `castor sample --init` and `castor eval` read them.
  void expect_merged_exports_match(const std::string& run) {
    const double adapted = eval_loss(run);
    const std::string text = greedy({"--checkpoint", run});
    EXPECT_GE(text.size(), 28u);  // the prompt and 24 one-character tokens
    const std::string st = run + "-merged.safetensors";
    CastorProcess m = castor({"export", "--checkpoint", run, "--merge-lora", "--safetensors", "--out", st});
    ASSERT_EQ(m.exit_code, 0) << m.err;
    EXPECT_EQ(Json::parse(m.out).at("model").as_string(), "llama");
    EXPECT_NEAR(eval_loss(st), adapted, 1e-5);
    EXPECT_EQ(greedy({"--init", st}), text);
    for (const char* version : {"0", "1"}) {
      SCOPED_TRACE(detail::cat("llama2.c v", version));
      const std::string bin = detail::cat(run, "-merged-v", version, ".bin");
      CastorProcess e = castor(
          {"export", "--checkpoint", run, "--merge-lora", "--llama2c", "--version", version, "--out", bin});
      ASSERT_EQ(e.exit_code, 0) << e.err;
      EXPECT_EQ(Json::parse(e.out).at("n_kv_heads").as_int(), 2);
      EXPECT_NEAR(eval_loss(bin, {"--data-dir", "tok"}), adapted, 1e-5);
      EXPECT_EQ(greedy({"--init", bin, "--tokenizer-dir", "tok"}), text);
    }
  }
};

// wq,wv of a Castor Llama run: adapter-only checkpoints (GQA shapes), bit-exact resume, info, eval, sample, merged
// exports in every format Castor writes for a Llama, PEFT files read back with --init-lora, and the merged safetensors
// file as the base of another LoRA run and of a plain one (its recorded sizes taken).
TEST_F(LlamaLoraCli, TrainsResumesSamplesAndExports) {
  CastorProcess full = castor(lora_args("full", 30, "base", "wq,wv", {"--eval-iters", "0"}));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_LT(Json::parse(full.out).at("val_loss").as_double(), base_val_loss);
  const Checkpoint ck = read_checkpoint(path("full"));
  ASSERT_EQ(ck.model.size(), 4u);
  EXPECT_EQ(ck.model.at("layers.0.attention.wq.lora_A.weight").shape(), (Shape{4, 32}));
  EXPECT_EQ(ck.model.at("layers.0.attention.wq.lora_B.weight").shape(), (Shape{32, 4}));
  EXPECT_EQ(ck.model.at("layers.0.attention.wv.lora_B.weight").shape(), (Shape{16, 4}));  // 2 kv heads of 8
  EXPECT_EQ(ck.model_meta.at("castor.lora_base"),
            absolute_path(path("base/checkpoints/step-0000000060/model.safetensors")));
  ASSERT_EQ(castor(lora_args("cut", 20, "base", "wq,wv")).exit_code, 0);
  CastorProcess r = castor({"train", "--resume", "cut", "--steps", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("full"), path("cut"));
  CastorProcess info = castor({"info", "full"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("model       llama, 4 tensors"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("castor.lora_base = "), std::string::npos) << info.out;
  CastorProcess e = castor({"eval", "full"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(Json::parse(e.out).at("val_loss").as_double(), Json::parse(full.out).at("val_loss").as_double());
  expect_merged_exports_match("full");
  // The merged model differs from the base (the adapters were trained) and names no LoRA setting.
  CastorProcess minfo = castor({"info", "full-merged.safetensors"});
  ASSERT_EQ(minfo.exit_code, 0) << minfo.err;
  EXPECT_EQ(minfo.out.find("lora_base"), std::string::npos) << minfo.out;
  EXPECT_NE(greedy({"--checkpoint", "base"}), greedy({"--checkpoint", "full"}));
  // PEFT: the files name the adapted layers; --init-lora reads the same adapters back.
  CastorProcess pe = castor({"export", "--checkpoint", "full", "--peft", "peft"});
  ASSERT_EQ(pe.exit_code, 0) << pe.err;
  const std::vector<uint8_t> bytes = read_file(path("peft/adapter_config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(config.at("target_modules"), Json(Json::Array{"wq", "wv"}));
  EXPECT_EQ(config.at("r").as_int(), 4);
  const StateDict peft = load_safetensors(path("peft/adapter_model.safetensors")).tensors;
  ASSERT_EQ(peft.size(), 4u);
  for (const auto& [k, t] : ck.model) EXPECT_TRUE(test::bit_equal(peft.at("base_model.model." + k), t)) << k;
  CastorProcess back = castor(args("back", 1, {"--init", "base", "--init-lora", "peft", "--lr", "1e-30"}));
  ASSERT_EQ(back.exit_code, 0) << back.err;
  const Checkpoint b = read_checkpoint(path("back"));
  ASSERT_EQ(b.model.size(), 4u);
  for (const auto& [k, t] : ck.model) EXPECT_TRUE(test::bit_equal(b.model.at(k), t)) << k;
  // A safetensors file as the base: the merged model fine-tuned again.
  CastorProcess stacked = castor(lora_args("stacked", 10, "full-merged.safetensors", "wk,wo"));
  ASSERT_EQ(stacked.exit_code, 0) << stacked.err;
  EXPECT_EQ(read_checkpoint(path("stacked")).model_meta.at("castor.lora_base"),
            absolute_path(path("full-merged.safetensors")));
  expect_merged_exports_match("stacked");
  // A plain run from the merged file takes its recorded sizes (a size flag that differs names both).
  const std::vector<std::string> plain = {"train",      "--model",   "llama",   "--data", "tokens",
                                          "--data-dir", "tok",       "--steps", "1",      "--eval-iters",
                                          "1",          "--threads", "1",       "--init", "full-merged.safetensors"};
  std::vector<std::string> a = plain;
  a.insert(a.end(), {"--out", "plain"});
  CastorProcess p = castor(a);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<uint8_t> recorded = read_file(path("plain/config.json"));
  const Json plain_config = Json::parse(std::string(recorded.begin(), recorded.end()));
  EXPECT_EQ(plain_config.at("n_embd").as_int(), 32);
  EXPECT_EQ(plain_config.at("n_kv_head").as_int(), 2);
  EXPECT_EQ(plain_config.at("block_size").as_int(), 16);
  EXPECT_EQ(plain_config.at("lora_rank").as_int(), 0);
  a = plain;
  a.insert(a.end(), {"--n-kv-head", "4", "--out", "conflict"});
  test::expect_one_line_error(castor(a), {"--n-kv-head 4: --init full-merged.safetensors holds 2"});
}

// A llama2.c model.bin as the base, every linear layer but the output adapted: resume, eval and the merged exports.
TEST_F(LlamaLoraCli, Llama2cBaseAllLinear) {
  CastorProcess x = castor({"export", "--checkpoint", "base", "--llama2c", "--version", "1", "--out", "base.bin"});
  ASSERT_EQ(x.exit_code, 0) << x.err;
  CastorProcess full = castor(lora_args("full", 20, "base.bin", "all-linear", {"--eval-iters", "0"}));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_LT(Json::parse(full.out).at("val_loss").as_double(), base_val_loss);
  const Checkpoint ck = read_checkpoint(path("full"));
  EXPECT_EQ(ck.model.size(), 14u);  // wq, wk, wv, wo, w1, w2, w3: lora_A and lora_B each (not the output layer)
  EXPECT_EQ(ck.model.at("layers.0.attention.wk.lora_B.weight").shape(), (Shape{16, 4}));
  EXPECT_EQ(ck.model.at("layers.0.feed_forward.w2.lora_A.weight").shape(), (Shape{4, 96}));
  EXPECT_EQ(ck.model_meta.at("castor.lora_base"), absolute_path(path("base.bin")));
  ASSERT_EQ(castor(lora_args("cut", 10, "base.bin", "all-linear")).exit_code, 0);
  CastorProcess r = castor({"train", "--resume", "cut", "--steps", "20"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("full"), path("cut"));
  expect_merged_exports_match("full");
}

// A tied Llama's output shares tok_embeddings' weight: an adapter there is refused, naming --untied.
TEST_F(LlamaLoraCli, TiedOutputIsRefused) {
  expect_error(lora_args("x", 5, "base", "output"),
               {"--lora-targets output", "output shares its weight with tok_embeddings.weight (tied)", "--untied"});
  EXPECT_FALSE(fs::exists(path("x")));
}

TEST_F(LlamaLoraCli, AChangedBaseIsRefused) {
  expect_a_changed_base_refused(lora_args("run", 10, "base", "wq,wv"), "--llama2c");
}

}  // namespace
}  // namespace castor::train
