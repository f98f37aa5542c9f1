// `castor train --model gpt` end to end through the real binary on a small character corpus the test tokenizes:
// it learns, reports validation loss and perplexity, resumes bit for bit, evaluates its checkpoints, writes
// weights nanoGPT's model loads strictly, and refuses mismatched models and data in one line.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llmc.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "castor/token_file.h"
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

// The last step is checkpointed before the final evaluation, so a SIGKILL during that evaluation (long here: a
// validation split of millions of tokens) loses nothing and `--resume` finishes the run with the report an
// uninterrupted run writes. It used to checkpoint after the evaluation, losing every step since the last checkpoint.
TEST_F(LmTrain, SigkillDuringTheFinalEvaluationLosesNothing) {
  const std::vector<uint8_t> text = read_file(path("text.txt"));
  {
    std::ofstream big(path("big.txt"), std::ios::binary);
    for (int i = 0; i < 60; ++i)
      big.write(reinterpret_cast<const char*>(text.data()), static_cast<std::streamsize>(text.size()));
  }
  ASSERT_EQ(castor({"tokenize", "--tokenizer", "char", "--input", "big.txt", "--out", "bigval", "--val-fraction",
                    "0.95"}).exit_code,
            0);
  auto args = train_args("run", 20, {"--log-every", "1"});
  std::replace(args.begin(), args.end(), std::string("tok"), std::string("bigval"));
  CastorProcess p(args, in_dir);
  const std::string last = path("run/checkpoints/step-0000000020/COMMIT");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(last) && std::chrono::steady_clock::now() < deadline && ::waitpid(p.pid(), nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  p.signal(SIGKILL);
  p.wait();
  ASSERT_EQ(p.killed_by, SIGKILL) << "finished before the kill: " << p.err;
  ASSERT_TRUE(fs::exists(last)) << "the last step was not checkpointed before the final evaluation";
  const std::vector<uint8_t> m = read_file(path("run/metrics.jsonl"));
  ASSERT_EQ(std::string(m.begin(), m.end()).find("test_loss"), std::string::npos)
      << "the kill came after the evaluation";
  EXPECT_FALSE(fs::exists(path("run/summary.json")));
  CastorProcess r = castor({"train", "--resume", "run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::replace(args.begin(), args.end(), std::string("run"), std::string("ref"));
  CastorProcess ref = castor(args);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_EQ(summary_of(r).at("val_loss").as_double(), summary_of(ref).at("val_loss").as_double());
  EXPECT_EQ(summary_of(r).at("steps").as_int(), 20);
  EXPECT_TRUE(fs::exists(path("run/report.html")) && fs::exists(path("run/summary.json")));
  test::expect_same_checkpoint(path("run"), path("ref"));
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
    CastorProcess p = castor(args);
    EXPECT_EQ(p.exit_code, 1) << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
  }
}

// What the data can get wrong is found before step 1, in one line naming the file or flag, with nothing trained or
// written: a validation split of 0 tokens or shorter than one window, --block-size longer than a split, a token id
// past the vocabulary far into a file (only the first 2^20 tokens used to be checked), token files of another
// tokenize than tokenizer.json, and a resume on data tokenized again with another vocabulary.
TEST_F(LmTrain, BadDataIsFoundBeforeTheFirstStep) {
  auto folder = [&](const std::string& name, const std::vector<uint16_t>& train, const std::vector<uint16_t>& val) {
    fs::create_directories(path(name));
    data::write_token_file(path(name + "/train.bin"), train);
    data::write_token_file(path(name + "/val.bin"), val);
    atomic_write_file(path(name + "/tokenizer.json"),
                      std::string_view("{\"tokenizer\": \"char\", \"vocab_size\": 5, \"chars\": \"abcde\"}"));
  };
  std::vector<uint16_t> ok(4000), far((size_t{1} << 20) + 100);
  for (size_t i = 0; i < ok.size(); ++i) ok[i] = static_cast<uint16_t>(i % 5);
  for (size_t i = 0; i < far.size(); ++i) far[i] = static_cast<uint16_t>(i % 5);
  far[far.size() - 3] = 7;
  folder("empty_val", ok, {});
  folder("short_val", ok, std::vector<uint16_t>(16, 1));
  folder("far_bad", far, ok);
  auto train = [&](const std::string& dir, std::vector<std::string> extra = {}) {
    auto args = train_args("run_" + dir, 5, std::move(extra));
    std::replace(args.begin(), args.end(), std::string("tok"), dir);
    return castor(args);
  };
  for (const auto& [dir, want] : std::vector<std::pair<std::string, std::string>>{
           {"empty_val", "empty_val/val.bin: 0 tokens, fewer than one window of --block-size 16 + 1"},
           {"short_val", "short_val/val.bin: 16 tokens, fewer than one window of --block-size 16 + 1"},
           {"far_bad", "far_bad/train.bin: token 7 at position 1048673 is outside the vocabulary of 5"}}) {
    CastorProcess p = train(dir);
    EXPECT_EQ(p.exit_code, 1) << dir;
    EXPECT_NE(p.err.find(want), std::string::npos) << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
    EXPECT_FALSE(latest_checkpoint(path("run_" + dir))) << dir;
  }
  CastorProcess p = train("tok", {"--block-size", "9000"});  // longer than the validation split (~6,000 tokens)
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.err.find("tok/val.bin: "), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("fewer than one window of --block-size 9000 + 1"), std::string::npos) << p.err;
  // Token files of another tokenize than the vocabulary beside them.
  fs::copy(path("tok"), path("mixed"), fs::copy_options::recursive);
  fs::copy_file(path("empty_val/train.bin"), path("mixed/train.bin"), fs::copy_options::overwrite_existing);
  p = train("mixed");
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.err.find("mixed/train.bin: 4000 tokens, but"), std::string::npos) << p.err;
  // A resume on data tokenized again with another vocabulary.
  ASSERT_EQ(castor(train_args("run", 5)).exit_code, 0);
  {
    std::ofstream more(path("text.txt"), std::ios::app);
    more << "Zebras! Quick?\n";
  }
  ASSERT_EQ(castor({"tokenize", "--tokenizer", "char", "--input", "text.txt", "--out", "tok"}).exit_code, 0);
  p = castor({"train", "--resume", "run", "--steps", "10"});
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.err.find("tok/tokenizer.json: a vocabulary of 29 tokens, but run/checkpoints/step-0000000005 was trained "
                       "on one of 24"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("tokenized again since?"), std::string::npos) << p.err;
}

// Paths that are not valid UTF-8 cannot be recorded in config.json: refused up front naming the flag (a run used to
// train every step and then fail writing its summary, never to be resumed).
TEST_F(LmTrain, PathsThatAreNotUtf8AreRefusedUpFront) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--out", "run\xff"}, {"--data-dir", "tok\xfe"}}) {
    auto args = train_args("run", 5);
    if (flag == "--out") args.back() = value;
    else std::replace(args.begin(), args.end(), std::string("tok"), value);
    CastorProcess p = castor(args);
    EXPECT_EQ(p.exit_code, 1) << flag;
    EXPECT_NE(p.err.find("castor train: error: " + flag + " "), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("\\xf"), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("not valid UTF-8"), std::string::npos) << p.err;
    EXPECT_FALSE(fs::exists(path("run\xff")));
  }
}

}  // namespace
}  // namespace castor::train
