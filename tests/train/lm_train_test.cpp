// `castor train --model gpt` end to end through the real binary on a small character corpus the test tokenizes:
// it learns, reports validation loss and perplexity, resumes bit for bit, evaluates its checkpoints, writes
// weights nanoGPT's model loads strictly, and refuses mismatched models and data in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llmc.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "io/file_test_util.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;
using test::CastorProcess;
using test::run_castor;

class LmTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    // A learnable text: sentences drawn from a small grammar.
    const char* subjects[] = {"the jury", "a clerk", "the city", "his wife", "the court"};
    const char* verbs[] = {"said", "found", "saw", "asked", "heard"};
    const char* objects[] = {"the report.", "no evidence.", "the man.", "a letter.", "the news."};
    Generator gen(3);
    std::ofstream text(path("text.txt"));
    for (int i = 0; i < 3000; ++i)
      text << subjects[gen.next_u64() % 5] << " " << verbs[gen.next_u64() % 5] << " " << objects[gen.next_u64() % 5]
           << (i % 8 == 7 ? "\n" : " ");
    text.close();
    CastorProcess p = castor({"tokenize", "--tokenizer", "char", "--input", "text.txt", "--out", "tok",
                              "--val-fraction", "0.1"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args, double seconds = 120) {
    return run_castor(args, in_dir, seconds);
  }
  // A one-layer GPT on the test's tokens, one thread, deterministic.
  static std::vector<std::string> train_args(const std::string& out, int64_t steps,
                                             std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--n-layer", "1",
                                  "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "8",
                                  "--steps", std::to_string(steps), "--warmup-steps", "5", "--lr", "3e-3",
                                  "--log-every", "10", "--threads", "1", "--deterministic", "--out", out};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static Json summary_of(const CastorProcess& p) { return Json::parse(p.out); }

  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

TEST_F(LmTrain, LearnsAndReportsValidationLossAndPerplexity) {
  CastorProcess p = castor(train_args("run", 150));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const Json s = summary_of(p);
  const double val = s.at("val_loss").as_double(), chance = std::log(20.0);
  EXPECT_LT(val, chance) << p.err;  // far below a uniform guess over the ~20 characters
  EXPECT_NEAR(s.at("val_perplexity").as_double(), std::exp(val), 1e-9);
  EXPECT_GT(s.at("train_tokens_per_sec").as_double(), 0);
  EXPECT_NE(p.err.find("val loss"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("tok/s"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("GEMM peak"), std::string::npos) << p.err;
  // The recorded settings are nanoGPT's recipe where not given.
  const std::vector<uint8_t> bytes = read_file(path("run/config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(config.at("optimizer").as_string(), "adamw");
  EXPECT_EQ(config.at("schedule").as_string(), "warmup-cosine");
  EXPECT_DOUBLE_EQ(config.at("weight_decay").as_double(), 0.1);
  EXPECT_DOUBLE_EQ(config.at("beta2").as_double(), 0.99);
  EXPECT_DOUBLE_EQ(config.at("clip_grad_norm").as_double(), 1.0);
  // castor eval of the run: the same validation loss.
  CastorProcess e = castor({"eval", "run"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NEAR(summary_of(e).at("val_loss").as_double(), val, 1e-6);
}

// Random windows are a pure function of (seed, batch number): a run stopped and resumed equals one run through.
TEST_F(LmTrain, ResumeIsBitExact) {
  for (const char* order : {"random", "sequential"}) {
    SCOPED_TRACE(order);
    const std::string a = std::string("full_") + order, b = std::string("cut_") + order;
    const std::vector<std::string> extra = {"--schedule", "none", "--data-order", order, "--checkpoint-every", "10"};
    ASSERT_EQ(castor(train_args(a, 30, extra)).exit_code, 0);
    ASSERT_EQ(castor(train_args(b, 20, extra)).exit_code, 0);
    CastorProcess r = castor({"train", "--resume", b, "--steps", "30"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::expect_same_checkpoint(path(a), path(b));
  }
}

// The checkpoint's model.safetensors loads strictly into nanoGPT's model (tests/oracle/gpt_oracle.py's twin), which
// computes the same loss on a batch as Castor's forward did.
TEST_F(LmTrain, CheckpointsLoadStrictlyIntoNanoGpt) {
  ASSERT_EQ(castor(train_args("run", 10, {"--amp", "O0"})).exit_code, 0);
  const Checkpoint ck = read_checkpoint(path("run"));
  const int64_t vocab = ck.model.at("transformer.wte.weight").size(0);
  save_safetensors(path("weights.safetensors"), ck.model);
  Generator gen(1);
  std::vector<double> v(2 * 16);
  for (double& x : v) x = std::floor(gen.next_double() * vocab);
  save_safetensors(path("batch.safetensors"), {{"x", tensor(v, Shape{2, 16}, DType::Int64)},
                                              {"y", tensor(v, Shape{2, 16}, DType::Int64)}});
  const std::string cfg = detail::cat("{\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, \"block_size\": 16, ",
                                      "\"vocab_size\": ", vocab, ", \"bias\": true}");
  ASSERT_TRUE(test::run_oracle("gpt_oracle.py", {"grads", cfg, path("weights.safetensors"), path("batch.safetensors"),
                                                 path("out.safetensors")}));
  EXPECT_TRUE(std::isfinite(load_safetensors(path("out.safetensors")).tensors.at("loss").item()));
}

// --init FILE in llm.c's format: the run takes the file's sizes and starts from its weights; a size flag that
// disagrees with the file is one line.
TEST_F(LmTrain, InitFromAnLlmcCheckpoint) {
  const std::vector<uint8_t> record = read_file(path("tok/tokenizer.json"));
  models::GPTConfig g;
  g.n_layer = 2, g.n_head = 2, g.n_embd = 16, g.block_size = 16;
  g.vocab_size = Json::parse(std::string(record.begin(), record.end())).at("vocab_size").as_int();
  const auto model = models::gpt(g, 21);
  models::write_llmc_checkpoint(path("init.bin"), *model);
  CastorProcess p = castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--init", "init.bin",
                            "--steps", "1", "--lr", "1e-9", "--amp", "O0", "--threads", "1", "--out", "run"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const Checkpoint ck = read_checkpoint(path("run"));
  EXPECT_EQ(ck.model.at("transformer.h.1.ln_2.weight").numel(), 16);
  EXPECT_TRUE(test::close(ck.model.at("transformer.wpe.weight"), model->wpe->weight, 0, 1e-6));
  CastorProcess bad = castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--init", "init.bin",
                              "--n-layer", "3", "--out", "bad"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--n-layer 3: --init init.bin holds 2"), std::string::npos) << bad.err;
}

TEST_F(LmTrain, MismatchedModelAndDataAreOneLineErrors) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train", "--model", "gpt", "--data", "fashion-mnist", "--out", "x"},
        std::vector<std::string>{"train", "--model", "simplecnn", "--data", "brown-char", "--out", "x"},
        std::vector<std::string>{"train", "--model", "gpt", "--data", "tokens", "--out", "x"},
        std::vector<std::string>{"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--n-embd", "30",
                                 "--n-head", "4", "--out", "x"},
        std::vector<std::string>{"train", "--model", "gpt", "--data", "tokens", "--data-dir", "nowhere", "--out",
                                 "x"}}) {
    test::expect_one_line_error(castor(args), {});
  }
}

}  // namespace
}  // namespace castor::train
