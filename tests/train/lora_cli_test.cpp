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

class LoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CastorProcess p = test::make_grammar_tokens(in_dir);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    CastorProcess b = castor(args("base", 30, {"--eval-iters", "0"}));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    base_val_loss = Json::parse(b.out).at("val_loss").as_double();
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& a, double seconds = 120) {
    return test::run_castor(a, in_dir, seconds);
  }
  // A one-layer GPT on the test's tokens, one thread, deterministic.
  static std::vector<std::string> args(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--lr", "3e-3", "--log-every", "10", "--threads", "1", "--deterministic"});
    return test::tiny_lm_args("gpt", out, steps, 8, extra);
  }
  static std::vector<std::string> lora_args(const std::string& out, int64_t steps,
                                            std::vector<std::string> extra = {}) {
    std::vector<std::string> lora = {"--init",       "base", "--lora-rank",        "4",
                                     "--lora-alpha", "16",   "--lora-targets",     "c_attn,c_proj",
                                     "--schedule",   "none", "--checkpoint-every", "10"};
    lora.insert(lora.end(), extra.begin(), extra.end());
    return args(out, steps, lora);
  }
  void expect_error(const std::vector<std::string>& a, const std::vector<std::string>& parts) {
    CastorProcess p = castor(a);
    EXPECT_NE(p.exit_code, 0);
    const std::string last = p.err.substr(p.err.rfind('\n', p.err.size() - 2) + 1);
    for (const std::string& part : parts) EXPECT_NE(last.find(part), std::string::npos) << part << " not in: " << p.err;
  }

  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
  double base_val_loss = 0;
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(mid) && std::chrono::steady_clock::now() < deadline && ::waitpid(p.pid(), nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  p.signal(SIGKILL);
  p.wait();
  ASSERT_EQ(p.killed_by, SIGKILL) << "finished before the kill: " << p.err;
  ASSERT_FALSE(fs::exists(path("run/checkpoints/step-0000000400"))) << "the kill came after the last step";
  CastorProcess r = castor({"train", "--resume", "run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("ref"), path("run"));
}

TEST_F(LoraCli, AChangedBaseIsRefused) {
  ASSERT_EQ(castor(lora_args("run", 10)).exit_code, 0);
  const std::string base = path("base/checkpoints/step-0000000030/model.safetensors");
  std::vector<uint8_t> bytes = read_file(base);
  bytes.back() ^= 1;  // the last weight's lowest bit
  atomic_write_file(base, bytes);
  using Args = std::vector<std::string>;
  for (const Args& a : {Args{"train", "--resume", "run", "--steps", "20"}, Args{"eval", "run"},
                        Args{"sample", "--checkpoint", "run", "--prompt", "the "},
                        Args{"export", "--checkpoint", "run", "--merge-lora", "--llmc", "--out", "m.bin"}})
    expect_error(a, {base, "changed since the run started"});
  EXPECT_FALSE(fs::exists(path("m.bin")));
}

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

}  // namespace
}  // namespace castor::train
