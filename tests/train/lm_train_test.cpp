// `castor train --model gpt` (and --model llama) end to end through the real binary on a small character corpus the
// test tokenizes: it learns, reports validation loss and perplexity, resumes bit for bit, evaluates its checkpoints,
// writes weights nanoGPT's model loads strictly, samples, and refuses mismatched models, flags and data in one line.
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
#include "castor/token_file.h"
#include "castor/lm_batch.h"
#include "castor/functional.h"
#include "castor/autograd.h"
#include "castor/llama.h"
#include "castor/llmc.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "castor/tokenizer.h"
#include "castor/token_file.h"
#include "io/file_test_util.h"
#include "test_util.h"
#include "train/metrics.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;
using test::CastorProcess;
using test::run_castor;

class LmTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    CastorProcess p = test::make_grammar_tokens(in_dir);
    ASSERT_EQ(p.exit_code, 0) << p.err;
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return run_castor(args, in_dir); }
  // A one-layer GPT (tiny_lm_args) on the test's tokens, one thread, deterministic.
  static std::vector<std::string> train_args(const std::string& out, int64_t steps,
                                             std::vector<std::string> extra = {}) {
    return lm_args("gpt", out, steps, std::move(extra));
  }
  // A one-layer Llama (4 heads over 2 key/value heads) on the test's tokens, one thread, deterministic.
  static std::vector<std::string> llama_args(const std::string& out, int64_t steps,
                                             std::vector<std::string> extra = {}) {
    return lm_args("llama", out, steps, std::move(extra));
  }
  static std::vector<std::string> lm_args(const std::string& model, const std::string& out, int64_t steps,
                                          std::vector<std::string> extra) {
    extra.insert(extra.begin(),
                 {"--warmup-steps", "5", "--lr", "3e-3", "--log-every", "10", "--threads", "1", "--deterministic"});
    return test::tiny_lm_args(model, out, steps, 8, extra);
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

// A language model's run speaks of tokens, validation loss and perplexity everywhere: summary.json, metrics.jsonl,
// metrics.csv, report.html and castor info; castor help train says it trains language models too.
TEST_F(LmTrain, ReportsTokensValidationLossAndPerplexityEverywhere) {
  CastorProcess p = castor(train_args("run", 20, {"--eval-every", "10", "--log-every", "5"}));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const Json s = summary_of(p);
  for (const char* key : {"test_accuracy", "test_loss", "train_images_per_sec"}) EXPECT_EQ(s.find(key), nullptr) << key;
  for (const char* key : {"val_loss", "val_perplexity", "train_tokens_per_sec"}) EXPECT_NE(s.find(key), nullptr) << key;
  const std::vector<uint8_t> saved = read_file(path("run/summary.json"));
  EXPECT_EQ(Json::parse(std::string(saved.begin(), saved.end())).find("test_accuracy"), nullptr);
  int evaluations = 0, rates = 0;
  for (const Json& r : read_metrics(path("run"))) {
    for (const char* key : {"test_accuracy", "test_loss", "images_per_sec"})
      EXPECT_EQ(r.find(key), nullptr) << r.dump();
    evaluations += r.find("val_loss") != nullptr && r.find("val_perplexity") != nullptr;
    rates += r.find("tokens_per_sec") != nullptr;
  }
  EXPECT_EQ(evaluations, 2);  // step 10, and the end
  EXPECT_GE(rates, 4);
  const std::vector<uint8_t> csv = read_file(path("run/metrics.csv"));
  const std::string header(csv.begin(), std::find(csv.begin(), csv.end(), '\n'));
  EXPECT_EQ(header,
            "step,epoch,loss,loss_avg,lr,loss_scale,skipped,tokens_per_sec,peak_memory_bytes,train_loss,"
            "val_loss,val_perplexity,skipped_steps");
  const std::vector<uint8_t> html = read_file(path("run/report.html"));
  const std::string report(html.begin(), html.end());
  for (const char* want : {"Validation perplexity", "tokens/s", "Train vs validation loss"})
    EXPECT_NE(report.find(want), std::string::npos) << want;
  for (const char* unwanted : {"Test accuracy", "images/s", "test loss"})
    EXPECT_EQ(report.find(unwanted), std::string::npos) << unwanted;
  CastorProcess info = castor({"info", "run"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("val loss "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("perplexity"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find("test accuracy"), std::string::npos) << info.out;
  CastorProcess help = castor({"help", "train"});
  EXPECT_NE(help.out.find("Trains image classifiers and GPT language models"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("rows of --block-size tokens"), std::string::npos);
  EXPECT_NE(help.out.find("an llm.c .bin"), std::string::npos);
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
  ASSERT_EQ(
      castor({"tokenize", "--tokenizer", "char", "--input", "big.txt", "--out", "bigval", "--val-fraction", "0.95"})
          .exit_code,
      0);
  auto args = train_args("run", 20, {"--log-every", "1"});
  std::replace(args.begin(), args.end(), std::string("tok"), std::string("bigval"));
  CastorProcess p(args, in_dir);
  const std::string last = path("run/checkpoints/step-0000000020/COMMIT");
  p.wait_until([&] { return fs::exists(last); });
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
  save_safetensors(path("batch.safetensors"),
                   {{"x", tensor(v, Shape{2, 16}, DType::Int64)}, {"y", tensor(v, Shape{2, 16}, DType::Int64)}});
  const std::string cfg = detail::cat("{\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, \"block_size\": 16, ",
                                      "\"vocab_size\": ", vocab, ", \"bias\": true}");
  ASSERT_TRUE(test::run_oracle("gpt_oracle.py", {"grads", cfg, path("weights.safetensors"), path("batch.safetensors"),
                                                 path("out.safetensors")}));
  EXPECT_TRUE(std::isfinite(load_safetensors(path("out.safetensors")).tensors.at("loss").item()));
}

// nanoGPT's evaluation size: --eval-iters batches of --batch-size rows, spread evenly over the validation split,
// during training (here 2 x 4 rows: the summary's loss is theirs, computed here from the checkpoint); --eval-interval
// is --eval-every; castor eval covers the whole split, and --dtype float32 evaluates a bf16 run in float32.
TEST_F(LmTrain, EvalItersAndIntervalAreNanoGpts) {
  CastorProcess p = castor(
      train_args("run", 20, {"--amp", "O0", "--batch-size", "4", "--eval-iters", "2", "--eval-interval", "10"}));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<uint8_t> bytes = read_file(path("run/config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(config.at("eval_every").as_int(), 10);
  EXPECT_EQ(config.at("eval_iters").as_int(), 2);
  int evaluations = 0;
  for (const Json& r : read_metrics(path("run"))) evaluations += r.find("val_loss") != nullptr;
  EXPECT_EQ(evaluations, 2);  // step 10 (--eval-interval) and the end
  // The 8 rows k * n / 8 of the n rows of 16 tokens, through the checkpoint's model in float32.
  const Checkpoint ck = read_checkpoint(path("run"));
  const formats::GPTWeights w = formats::gpt_weights_from_safetensors(ck.model, ck.model_meta, 0, "run");
  auto model = models::gpt(w.config);
  model->load_state_dict(w.state);
  model->eval();
  const data::TokenFile val(path("tok/val.bin"));
  const int64_t n = (val.size() - 1) / 16;
  ASSERT_GT(n, 8);
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < 8; ++k) rows.push_back(k * n / 8);
  const data::LmBatch b = data::eval_rows(val, 16, rows, 0);
  double want = 0;
  {
    NoGradGuard no_grad;
    const Tensor logits = (*model)(b.x);
    want = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.y.reshape({-1})).item();
  }
  const double got = summary_of(p).at("val_loss").as_double();
  EXPECT_NEAR(got, want, 1e-5 * want);
  // castor eval: the whole split, another figure.
  CastorProcess e = castor({"eval", "run"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_GT(std::fabs(summary_of(e).at("val_loss").as_double() - got), 1e-4);
  // A bf16 run (O1) evaluated in float32: the float32 model's loss over the whole split.
  ASSERT_EQ(castor(train_args("bf16", 10)).exit_code, 0);
  CastorProcess f32 = castor({"eval", "bf16", "--dtype", "float32"});
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  const Checkpoint bk = read_checkpoint(path("bf16"));
  const formats::GPTWeights bw = formats::gpt_weights_from_safetensors(bk.model, bk.model_meta, 0, "bf16");
  auto bmodel = models::gpt(bw.config);
  bmodel->load_state_dict(bw.state);
  bmodel->eval();
  double sum = 0, count = 0;
  for (int64_t i = 0; i < data::eval_batch_count(val, 64, 16); ++i) {
    NoGradGuard no_grad;
    const data::LmBatch eb = data::eval_batch(val, 64, 16, i);
    const Tensor logits = (*bmodel)(eb.x);
    sum += F::cross_entropy(logits.reshape({-1, logits.size(-1)}), eb.y.reshape({-1}), F::Reduction::Sum).item();
    count += static_cast<double>(eb.y.numel());
  }
  EXPECT_NEAR(summary_of(f32).at("val_loss").as_double(), sum / count, 1e-5 * sum / count);
  // --eval-iters is a language model's flag.
  CastorProcess image = castor({"train", "--eval-iters", "5", "--out", "img"});
  EXPECT_EQ(image.exit_code, 1);
  EXPECT_NE(image.err.find("--eval-iters: applies to language models only"), std::string::npos) << image.err;
}

// Setup's Brown tokens are found from any working directory (the scratch directory here), for training and for
// sampling a run that used them; with $CASTOR_SETUP_DIR pointing elsewhere the error names --data-dir, and a new run
// that fails before its first step leaves no run directory.
TEST_F(LmTrain, SetupDataFromAnyDirectoryAndNoRunDirectoryLeftOnEarlyFailure) {
  ASSERT_TRUE(fs::exists(std::string(CASTOR_SOURCE_DIR) + "/data/brown-char/train.bin")) << "run scripts/setup.sh";
  CastorProcess p = castor({"train", "--model", "gpt", "--data", "brown-char", "--n-layer", "1", "--n-embd", "32",
                            "--steps", "2", "--eval-iters", "1", "--threads", "1", "--out", "run"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  CastorProcess s = castor({"sample", "--checkpoint", "run", "--prompt", "The", "--tokens", "5"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out.rfind("The", 0), 0u) << s.out;
  const test::CastorRun elsewhere{scratch.path().string(), {"CASTOR_SETUP_DIR=/nonexistent"}};
  CastorProcess missing = test::run_castor({"train", "--model", "gpt", "--data", "brown-char", "--out", "run2"},
                                           elsewhere);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/data/brown-char/train.bin is missing"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("--data-dir"), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(path("run2")));
  CastorProcess bad_init = castor(
      {"train", "--model", "gpt", "--data", "tokens", "--data-dir", "tok", "--init", "missing.bin", "--out", "run3"});
  EXPECT_EQ(bad_init.exit_code, 1);
  EXPECT_NE(bad_init.err.find("--init missing.bin"), std::string::npos) << bad_init.err;
  EXPECT_FALSE(fs::exists(path("run3")));
  // A directory that was there before is left, as are runs that got going.
  fs::create_directories(path("mine"));
  EXPECT_EQ(castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "nowhere", "--out", "mine"}).exit_code,
            1);
  EXPECT_TRUE(fs::exists(path("mine")));
  EXPECT_TRUE(fs::exists(path("run/checkpoints")));
}

// Start-up without the GEMM-peak probe: a machine's peak is measured once, after the first run's training, and
// cached ($XDG_CACHE_HOME/castor/gemm_peak.json); the next run reads it. The summary's tokens/s is the steady rate
// (after the first 3 steps), the whole run's beside it, and MFU is tokens/s x FLOP per token / the cached peak.
TEST_F(LmTrain, GemmPeakIsCachedAndTheSummaryRateIsSteady) {
  const test::CastorRun cached{scratch.path().string(), {"XDG_CACHE_HOME=" + path("cache")}};
  CastorProcess first = test::run_castor(train_args("a", 12), cached);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("GEMM peak is measured after training"), std::string::npos) << first.err;
  const std::vector<uint8_t> bytes = read_file(path("cache/castor/gemm_peak.json"));
  const Json cache = Json::parse(std::string(bytes.begin(), bytes.end()));
  ASSERT_EQ(cache.as_object().size(), 1u) << cache.dump();
  const double peak = cache.as_object().begin()->second.as_double();
  EXPECT_NE(cache.as_object().begin()->first.find("bfloat16 | 1 threads"), std::string::npos) << cache.dump();
  CastorProcess second = test::run_castor(train_args("b", 12), cached);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("measured once and cached"), std::string::npos) << second.err;
  for (const CastorProcess* p : {&first, &second}) {
    const Json s = summary_of(*p);
    const double steady = s.at("train_tokens_per_sec").as_double(),
                 whole = s.at("train_tokens_per_sec_whole_run").as_double();
    EXPECT_GT(steady, 0);
    EXPECT_GT(whole, 0);
    // 1 layer of 32, vocabulary V, block 16: 6 N + 12 L C T FLOP per token (nanoGPT's estimate_mfu), N without wpe.
    const Checkpoint ck = read_checkpoint(path("a"));
    double n = 0;
    for (const auto& [name, t] : ck.model)
      if (name != "transformer.wpe.weight" && name != "lm_head.weight") n += static_cast<double>(t.numel());
    EXPECT_NEAR(s.at("mfu").as_double(), steady * (6 * n + 12.0 * 32 * 16) / peak, 1e-6 * s.at("mfu").as_double());
  }
  // A cached peak below what a run reaches (one measured while other processes held the cores) is measured again
  // after the run, the cache keeping the best figure seen: utilisation above 1 is never reported.
  const std::string key = cache.as_object().begin()->first;
  Json stale = cache;
  stale[key] = 1000.0;  // FLOP/s
  atomic_write_file(path("cache/castor/gemm_peak.json"), stale.dump());
  CastorProcess third = test::run_castor(train_args("c", 12), cached);
  ASSERT_EQ(third.exit_code, 0) << third.err;
  const Json s = summary_of(third);
  ASSERT_TRUE(s.find("mfu")) << s.dump();
  EXPECT_GT(s.at("mfu").as_double(), 0);
  EXPECT_LE(s.at("mfu").as_double(), 1);
  const std::vector<uint8_t> after = read_file(path("cache/castor/gemm_peak.json"));
  EXPECT_GT(Json::parse(std::string(after.begin(), after.end())).at(key).as_double(), 1e6);
}

// castor export --nanogpt writes nanoGPT's ckpt.pt: PyTorch 1.13 loads it with torch.load, also with
// weights_only=True; nanoGPT's model built from its model_args loads its model strictly and samples the same greedy
// tokens as castor sample (past the block, nanoGPT's sliding window); train.py's resume loads its AdamW state (the
// run's hyperparameters and moments) and steps (tests/oracle/nanogpt_oracle.py).
TEST_F(LmTrain, NanoGptCheckpointLoadsInPyTorchAndSamplesAsCastor) {
  ASSERT_EQ(castor(train_args("run", 20, {"--eval-every", "10"})).exit_code, 0);
  CastorProcess e = castor({"export", "--nanogpt", "--checkpoint", "run", "--out", "nano"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const Json summary = Json::parse(e.out);
  EXPECT_EQ(summary.at("out").as_string(), "nano/ckpt.pt");
  EXPECT_TRUE(summary.at("optimizer").as_bool());
  const std::string prompt = "the jury", tokens = "40";  // 8 + 40 tokens: past the block of 16
  CastorProcess s = castor(
      {"sample", "--checkpoint", "run", "--prompt", prompt, "--tokens", tokens, "--temperature", "0"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  std::string ids;
  for (uint32_t t : tok.encode(prompt)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  ASSERT_TRUE(
      test::run_oracle("nanogpt_oracle.py", {"ckpt", path("nano/ckpt.pt"), ids, tokens, path("o.safetensors")}));
  const StateDict o = load_safetensors(path("o.safetensors")).tensors;
  const std::vector<int64_t> got = o.at("tokens").to_vector<int64_t>();
  EXPECT_EQ(s.out, tok.decode(std::vector<uint32_t>(got.begin(), got.end())) + "\n");
  EXPECT_EQ(o.at("iter_num").to_vector<int64_t>(), std::vector<int64_t>{20});
  EXPECT_EQ(o.at("model_args.block_size").to_vector<int64_t>(), std::vector<int64_t>{16});
  EXPECT_EQ(o.at("model_args.vocab_size").to_vector<int64_t>(), std::vector<int64_t>{tok.vocab_size()});
  // best_val_loss: the lowest evaluation the run logged (steps 10 and 20).
  double best = 1e9;
  for (const Json& r : read_metrics(path("run")))
    for (const char* key : {"val_loss", "test_loss"})
      if (const Json* v = r.find(key)) best = std::min(best, v->as_double());
  ASSERT_LT(best, 1e9);
  EXPECT_NEAR(o.at("best_val_loss").item(), best, 1e-6 * best);
  // The AdamW state: the run's group settings and moments.
  const Checkpoint ck = read_checkpoint(path("run"));
  const std::vector<double> groups = o.at("optimizer_groups").to_vector<double>();
  EXPECT_DOUBLE_EQ(groups[0], ck.state.at("amp.optimizer.0.group.0.lr").item());
  EXPECT_EQ(std::vector<double>(groups.begin() + 1, groups.end()), (std::vector<double>{0.9, 0.99, 1e-8, 0.1, 0.0}));
  EXPECT_EQ(o.at("optimizer_step").item(), 20);
  const Tensor v = ck.state.at("amp.optimizer.0.state.0.0.exp_avg_sq").reshape({-1}).narrow(0, 0, 8);
  EXPECT_TRUE(test::close(o.at("optimizer_exp_avg_sq0"), v.to(DType::Float64), 0, 0));
}

// --init FILE in llm.c's format: the run takes the file's sizes and starts from its weights; a size flag that
// disagrees with the file is one line.
TEST_F(LmTrain, InitFromAnLlmcCheckpoint) {
  const std::vector<uint8_t> record = read_file(path("tok/castor_tokens.json"));
  models::GPTConfig g;
  g.n_layer = 2, g.n_head = 2, g.n_embd = 16, g.block_size = 16;
  g.vocab_size = Json::parse(std::string(record.begin(), record.end())).at("vocab_size").as_int();
  const auto model = models::gpt(g, 21);
  formats::write_llmc_checkpoint(path("init.bin"), *model);
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

// What the data can get wrong is found before step 1, in one line naming the file or flag, with nothing trained or
// written: a validation split of 0 tokens or shorter than one window, --block-size longer than a split, a token id
// past the vocabulary far into a file (only the first 2^20 tokens used to be checked), token files of another
// tokenize than tokenizer.json, and a resume on data tokenized again with another vocabulary.
TEST_F(LmTrain, BadDataIsFoundBeforeTheFirstStep) {
  auto folder = [&](const std::string& name, const std::vector<uint32_t>& train, const std::vector<uint32_t>& val) {
    fs::create_directories(path(name));
    data::write_token_file(path(name + "/train.bin"), train, 2);
    data::write_token_file(path(name + "/val.bin"), val, 2);
    atomic_write_file(path(name + "/tokenizer.json"),
                      std::string_view("{\"tokenizer\": \"char\", \"vocab_size\": 5, \"chars\": \"abcde\"}"));
  };
  std::vector<uint32_t> ok(4000), far((size_t{1} << 20) + 100);
  for (size_t i = 0; i < ok.size(); ++i) ok[i] = static_cast<uint32_t>(i % 5);
  for (size_t i = 0; i < far.size(); ++i) far[i] = static_cast<uint32_t>(i % 5);
  far[far.size() - 3] = 7;
  folder("empty_val", ok, {});
  folder("short_val", ok, std::vector<uint32_t>(16, 1));
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
  EXPECT_NE(p.err.find("tok/castor_tokens.json holds the vocabulary [char, 29 tokens, vocab_checksum "),
            std::string::npos)
      << p.err;
  EXPECT_NE(p.err.find("run/checkpoints/step-0000000005 was trained in [char, 24 tokens, vocab_checksum "),
            std::string::npos)
      << p.err;
}

// Paths that are not valid UTF-8 cannot be recorded in config.json: refused up front naming the flag (a run used to
// train every step and then fail writing its summary, never to be resumed).
TEST_F(LmTrain, PathsThatAreNotUtf8AreRefusedUpFront) {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--out", "run\xff"}, {"--data-dir", "tok\xfe"}}) {
    auto args = train_args("run", 5);
    if (flag == "--out")
      args.back() = value;
    else
      std::replace(args.begin(), args.end(), std::string("tok"), value);
    CastorProcess p = castor(args);
    EXPECT_EQ(p.exit_code, 1) << flag;
    EXPECT_NE(p.err.find("castor train: error: " + flag + " "), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("\\xf"), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("not valid UTF-8"), std::string::npos) << p.err;
    EXPECT_FALSE(fs::exists(path("run\xff")));
  }
}

// --model llama: it learns, records its kind and sizes, resumes bit for bit, castor eval gives the final validation
// loss, castor info names the model, and castor sample prints what the library's generate draws from the
// checkpoint's Llama (built from the recorded settings) with the run's tokenizer.
TEST_F(LmTrain, LlamaTrainsResumesEvaluatesAndSamples) {
  const std::vector<std::string> extra = {"--schedule", "none", "--checkpoint-every", "10", "--eval-iters", "0"};
  CastorProcess p = castor(llama_args("full", 150, extra));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const double val = summary_of(p).at("val_loss").as_double();
  EXPECT_LT(val, 0.6 * std::log(20.0)) << p.err;  // far below a uniform guess over the ~20 characters
  ASSERT_EQ(castor(llama_args("cut", 140, extra)).exit_code, 0);
  CastorProcess r = castor({"train", "--resume", "cut", "--steps", "150"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("full"), path("cut"));
  const std::vector<uint8_t> bytes = read_file(path("full/config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(config.at("model").as_string(), "llama");
  EXPECT_EQ(config.at("n_kv_head").as_int(), 2);
  EXPECT_EQ(config.at("multiple_of").as_int(), 32);
  EXPECT_EQ(config.at("untied").as_bool(), false);
  CastorProcess e = castor({"eval", "full"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NEAR(summary_of(e).at("val_loss").as_double(), val, 1e-6);
  CastorProcess info = castor({"info", "full"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("llama"), std::string::npos) << info.out;
  CastorProcess s = castor({"sample", "--checkpoint", "full", "--prompt", "the jury", "--tokens", "40", "--seed", "3"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 1, c.n_heads = 4, c.n_kv_heads = 2, c.multiple_of = 32, c.max_seq_len = 16;
  data::Tokenizer tok = data::Tokenizer::load(path("tok"));
  c.vocab_size = tok.vocab_size();
  auto model = models::llama(c);
  model->load_state_dict(train::read_checkpoint(path("full")).model);
  model->eval();
  std::vector<int64_t> ids;
  for (uint32_t t : tok.encode("the jury")) ids.push_back(t);
  std::vector<uint32_t> text;
  // (sample's defaults: temperature 0.8, top-k 200, run.c's top-p 0.9)
  for (int64_t t : models::generate(*model, ids, 40, 0.8, 200, 3, models::Window::Sliding, 0.9))
    text.push_back(static_cast<uint32_t>(t));
  EXPECT_EQ(s.out, tok.decode(text) + "\n");
  // Past the block size (16) by a cached window too.
  s = castor({"sample", "--checkpoint", "full", "--tokens", "40", "--window", "cached", "--temperature", "0"});
  EXPECT_EQ(s.exit_code, 0) << s.err;
}

// Every opt level and 16-bit type trains a Llama from the command line: the loss falls below its start.
TEST_F(LmTrain, LlamaTrainsAtEveryOptLevel) {
  for (const char* amp : {"O0", "O1", "O2", "O3"}) {
    for (const char* dtype : {"bf16", "fp16"}) {
      const bool o0 = std::string(amp) == "O0";
      if (o0 && std::string(dtype) == "fp16") continue;
      SCOPED_TRACE(std::string(amp) + " " + dtype);
      const std::string out = std::string("run_") + amp + dtype;
      std::vector<std::string> extra = {"--amp", amp, "--log-every", "1"};
      if (!o0) extra.insert(extra.end(), {"--dtype", dtype});
      CastorProcess p = castor(llama_args(out, 60, extra));
      ASSERT_EQ(p.exit_code, 0) << p.err;
      const std::vector<Json> lines = read_metrics(path(out));
      ASSERT_GE(lines.size(), 60u);
      EXPECT_LT(lines[59].at("loss").as_double(), 0.75 * lines[0].at("loss").as_double());
    }
  }
}

// Flags that do not fit a Llama (or a GPT) are one-line errors naming the flag, before anything is written.
TEST_F(LmTrain, LlamaFlagErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {llama_args("x", 5, {"--n-kv-head", "3"}), {"--n-kv-head 3", "--n-head 4"}},
      {llama_args("x", 5, {"--n-embd", "36"}), {"--n-embd 36", "--n-head 4", "odd"}},
      {llama_args("x", 5, {"--n-embd", "30"}), {"--n-embd 30", "--n-head 4"}},
      {llama_args("x", 5, {"--no-bias"}), {"--bias", "GPT models only", "llama"}},
      {llama_args("x", 5, {"--vocab-size", "100"}), {"--vocab-size 100", "tokenizer"}},
      {llama_args("x", 5, {"--rope-theta", "0"}), {"--rope-theta"}},
      {train_args("x", 5, {"--n-kv-head", "1"}), {"--n-kv-head", "Llama models only", "gpt"}},
      {train_args("x", 5, {"--untied"}), {"--untied", "Llama models only"}},
      {train_args("x", 5, {"--multiple-of", "8"}), {"--multiple-of", "Llama models only"}},
      {{"train", "--model", "llama-260k", "--data", "fashion-mnist", "--out", "x"}, {"--data fashion-mnist"}}};
  for (const auto& [args, parts] : cases) {
    test::expect_one_line_error(castor(args), parts);
    EXPECT_FALSE(fs::exists(path("x")));
  }
}

// `castor eval FILE --model gpt|llama` of weights without castor metadata takes their sizes from the tensors' shapes,
// and what no shape holds from flags named in one line (--n-head; a Llama's --block-size). GPT: the loss PyTorch
// (tests/oracle/lm_eval_oracle.py) computes on the same weights and windows; Llama: the loss the run's own checkpoint
// evaluates to in float32.
TEST_F(LmTrain, EvalTakesTheSizesOfWeightsWithoutMetadata) {
  ASSERT_EQ(castor(train_args("gpt", 5)).exit_code, 0);
  const StateDict gpt = read_checkpoint(path("gpt")).model;
  save_safetensors(path("gpt.safetensors"), gpt);
  const std::vector<std::string> eval_gpt = {"eval",   "gpt.safetensors", "--model",    "gpt",
                                             "--data", "tokens",          "--data-dir", "tok"};
  CastorProcess no_heads = castor(eval_gpt);
  EXPECT_EQ(no_heads.exit_code, 1);
  EXPECT_NE(no_heads.err.find("gpt.safetensors: the number of heads is not recorded in the file; give it (--n-head)"),
            std::string::npos)
      << no_heads.err;
  std::vector<std::string> with_heads = eval_gpt;
  with_heads.insert(with_heads.end(), {"--n-head", "2"});
  CastorProcess e = castor(with_heads);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const std::string config = detail::cat(
      "{\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, \"block_size\": 16, \"vocab_size\": ",
      gpt.at("transformer.wte.weight").size(0), ", \"bias\": true, \"seq_len\": 16}");
  ASSERT_TRUE(test::run_oracle("lm_eval_oracle.py",
                               {config, path("gpt.safetensors"), path("tok/val.bin"), path("gpt_loss.safetensors")}));
  const double want = load_safetensors(path("gpt_loss.safetensors")).tensors.at("loss").item();
  EXPECT_NEAR(Json::parse(e.out).at("val_loss").as_double(), want, 1e-5 * want) << e.out;

  ASSERT_EQ(castor(llama_args("llama", 5)).exit_code, 0);
  save_safetensors(path("llama.safetensors"), read_checkpoint(path("llama")).model);
  std::vector<std::string> eval_llama = {"eval",   "llama.safetensors", "--model", "llama",    "--data",
                                         "tokens", "--data-dir",        "tok",     "--n-head", "4"};
  CastorProcess no_block = castor(eval_llama);
  EXPECT_EQ(no_block.exit_code, 1);
  EXPECT_NE(no_block.err.find("context length is not recorded in the file; give it (--block-size)"), std::string::npos)
      << no_block.err;
  eval_llama.insert(eval_llama.end(), {"--block-size", "16"});
  CastorProcess l = castor(eval_llama);
  ASSERT_EQ(l.exit_code, 0) << l.err;
  CastorProcess run = castor({"eval", "llama", "--dtype", "float32"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(Json::parse(l.out).at("val_loss").as_double(), Json::parse(run.out).at("val_loss").as_double());
}

// Plain (non-terminal) progress lines carry the elapsed time and the ETA; a warmup as long as the schedule says the
// learning rate never reaches --lr; `castor help train` lists the defaults of each job (nanoGPT's recipe for a GPT,
// docs/llama.md's for a Llama).
TEST_F(LmTrain, PlainLinesWarmupNoteAndJobDefaults) {
  CastorProcess p = castor(train_args("run", 4, {"--warmup-steps", "4", "--log-every", "2"}));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("note: --warmup-steps 4 is not below the schedule's 4 steps"), std::string::npos) << p.err;
  for (const char* step : {"\nstep 2/4  loss ", "\nstep 4/4  loss "}) {
    const size_t at = p.err.find(step);
    ASSERT_NE(at, std::string::npos) << p.err;
    const std::string line = p.err.substr(at + 1, p.err.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find("  elapsed 0:00:"), std::string::npos) << line;
    EXPECT_NE(line.find("  eta 0:00:"), std::string::npos) << line;
  }
  CastorProcess quiet = castor(train_args("run2", 4, {"--warmup-steps", "3"}));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("--warmup-steps"), std::string::npos) << quiet.err;

  CastorProcess help = castor({"help", "train"});
  ASSERT_EQ(help.exit_code, 0);
  auto row = [&](const std::string& flag) {
    const size_t at = help.out.find("\n  " + flag + " ", help.out.find("Defaults that depend on the job"));
    return at == std::string::npos ? std::string() : help.out.substr(at + 1, help.out.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(help.out.find("image           --model gpt     --model llama"), std::string::npos) << help.out;
  for (const auto& [flag, cells] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{{"--warmup-steps", {"100", "50"}},
                                                                     {"--steps", {"2000", "500"}},
                                                                     {"--lr", {"0.002"}},
                                                                     {"--batch-size", {"12"}},
                                                                     {"--data", {"brown-char", "brown-bpe"}}}) {
    const std::string r = row(flag);
    ASSERT_FALSE(r.empty()) << flag << " in\n" << help.out;
    for (const std::string& cell : cells) EXPECT_NE(r.find(" " + cell), std::string::npos) << cell << " in " << r;
  }
}

// --data-dir without --data trains on that token folder, and the banner, config.json and the summary say so (--data
// tokens), not the family's default corpus; `castor help` names the Hugging Face directories --init, --tokenizer and
// --tokenizer-dir take.
TEST_F(LmTrain, DataDirAloneIsRecordedAsTokensAndHelpNamesHuggingFaceDirectories) {
  std::vector<std::string> args = train_args("run", 2);
  const auto data = std::find(args.begin(), args.end(), "--data");
  ASSERT_NE(data, args.end());
  args.erase(data, data + 2);  // (--data tokens)
  CastorProcess p = castor(args);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("castor train: gpt on tokens"), std::string::npos) << p.err;
  const Json config = Json::parse(test::read_text(path("run/config.json")));
  EXPECT_EQ(config.at("data"), Json("tokens"));
  EXPECT_EQ(config.at("data_dir"), Json(absolute_path(path("tok"))));
  for (const auto& [command, flag] : std::vector<std::pair<std::string, std::string>>{{"train", "--init"},
                                                                                      {"sample", "--init"},
                                                                                      {"sample", "--tokenizer-dir"},
                                                                                      {"tokenize", "--tokenizer"},
                                                                                      {"eval", "--init"}}) {
    const std::string help = castor({"help", command}).out;
    const size_t at = help.find("\n  " + flag + " ");
    ASSERT_NE(at, std::string::npos) << command << " " << flag;
    const std::string entry = help.substr(at, help.find("\n  -", at + 1) - at);
    EXPECT_NE(entry.find("Hugging Face"), std::string::npos) << command << ": " << entry;
  }
  EXPECT_NE(castor({"help"}).out.find("Hugging Face"), std::string::npos);
}

// --recompute blocks trains the same run bit for bit (checkpoints, losses) at O1 bf16 with dropout; --recompute auto
// takes none under a roomy --memory-budget, and a budget neither choice fits is a one-line error naming the smallest
// that would.
TEST_F(LmTrain, RecomputeTrainsTheSameRunAndAutoFollowsTheBudget) {
  for (const char* model : {"gpt", "llama"}) {
    SCOPED_TRACE(model);
    const std::vector<std::string> extra = {"--amp", "O1", "--dtype", "bf16", "--dropout", "0.1"};
    auto with = [&](const std::string& out, std::vector<std::string> more) {
      std::vector<std::string> e = extra;
      e.insert(e.end(), more.begin(), more.end());
      return lm_args(model, out, 6, e);
    };
    const std::string plain = std::string(model) + "_plain", blocks = std::string(model) + "_blocks";
    CastorProcess a = castor(with(plain, {}));
    ASSERT_EQ(a.exit_code, 0) << a.err;
    CastorProcess b = castor(with(blocks, {"--recompute", "blocks"}));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(summary_of(a).at("val_loss").as_double(), summary_of(b).at("val_loss").as_double());
    test::expect_same_checkpoint(path(plain), path(blocks));
    CastorProcess roomy = castor(with(std::string(model) + "_roomy", {"--recompute", "auto", "--memory-budget", "64"}));
    ASSERT_EQ(roomy.exit_code, 0) << roomy.err;
    EXPECT_NE(roomy.err.find("recompute auto: none"), std::string::npos) << roomy.err;
    CastorProcess tight = castor(with("x", {"--recompute", "auto", "--memory-budget", "0.000001"}));
    EXPECT_NE(tight.exit_code, 0);
    EXPECT_NE(tight.err.find("--memory-budget 1e-06: the run needs about"), std::string::npos) << tight.err;
    EXPECT_NE(tight.err.find("the smallest budget that fits is"), std::string::npos) << tight.err;
  }
}

// The 8-bit first moments (uint8 codes) in a run's newest checkpoint.
size_t codes_in(const std::string& run) {
  size_t n = 0;
  for (const auto& [k, t] : read_checkpoint(run).state)
    n += k.find(".exp_avg_code") != std::string::npos && t.dtype() == DType::UInt8;
  return n;
}

// 8-bit AdamW at O1 (bfloat16, emulated on CPUs without its units): a GPT 64 wide (its attention and MLP weights
// keep 8-bit moments) trains 200 steps with a loss curve within 1% of 32-bit AdamW's (50-step means; the paper's
// claim), each logged loss within 2%; a run resumed from a checkpoint ends bit for bit where the uninterrupted run
// does.
TEST_F(LmTrain, AdamW8bitLossCurveFollowsAdamWAndResumesBitExact) {
  const std::vector<std::string> o1 = {"--amp", "O1", "--n-embd", "64", "--log-every", "10"};
  auto losses = [&](const std::string& out) {
    std::vector<double> l;
    std::ifstream in(path(out + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (const Json j = Json::parse(line); j.find("loss") && j.find("step")) l.push_back(j.at("loss").as_double());
    return l;
  };
  std::vector<std::string> eight = o1, full = o1;
  eight.insert(eight.end(), {"--optimizer", "adamw8bit"});
  full.insert(full.end(), {"--optimizer", "adamw"});
  ASSERT_EQ(castor(train_args("a32", 200, full)).exit_code, 0);
  CastorProcess p = castor(train_args("a8", 200, eight));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(codes_in(path("a8")), 4u);  // c_attn, attn.c_proj (64 x 64 = 4096), mlp.c_fc, mlp.c_proj; not wte, wpe
  const std::vector<double> a = losses("a32"), b = losses("a8");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  // the curve, as 50-step means of the logged losses (one batch each), within 1%; each logged loss within 2%
  for (size_t k = 0; k < a.size(); k += 5) {
    double x = 0, y = 0;
    for (size_t j = k; j < k + 5; ++j) x += a[j], y += b[j];
    EXPECT_NEAR(y, x, 0.01 * x) << "steps " << 10 * k << "-" << 10 * k + 49;
  }
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(b[k], a[k], 0.02 * a[k]) << "logged step " << k;
  EXPECT_LT(b.back(), 0.7 * b.front());  // it learns
  // resume
  eight.insert(eight.end(), {"--schedule", "none", "--checkpoint-every", "10"});
  ASSERT_EQ(castor(train_args("whole", 30, eight)).exit_code, 0);
  ASSERT_EQ(castor(train_args("cut", 20, eight)).exit_code, 0);
  CastorProcess r = castor({"train", "--resume", "cut", "--steps", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::expect_same_checkpoint(path("whole"), path("cut"));
}

// Switching a run between adamw and adamw8bit on resume takes --convert-optimizer-state, which converts the moments;
// without it, or between other optimizers, a one-line error names both.
TEST_F(LmTrain, SwitchingToAndFrom8bitOnResumeConverts) {
  const std::vector<std::string> extra = {"--n-embd", "64", "--checkpoint-every", "5"};
  ASSERT_EQ(castor(train_args("run", 5, extra)).exit_code, 0);
  test::expect_one_line_error(castor({"train", "--resume", "run", "--steps", "10", "--optimizer", "adamw8bit"}),
                              {"--optimizer adamw8bit", "the run's adamw", "--convert-optimizer-state"});
  test::expect_one_line_error(
      castor({"train", "--resume", "run", "--steps", "10", "--optimizer", "sgd", "--convert-optimizer-state"}),
      {"--optimizer sgd", "the run's adamw", "only adamw and adamw8bit"});
  test::expect_one_line_error(castor(train_args("new", 5, {"--convert-optimizer-state"})),
                              {"--convert-optimizer-state", "--resume only"});
  CastorProcess to8 = castor(
      {"train", "--resume", "run", "--steps", "10", "--optimizer", "adamw8bit", "--convert-optimizer-state"});
  ASSERT_EQ(to8.exit_code, 0) << to8.err;
  EXPECT_EQ(codes_in(path("run")), 4u);
  const std::vector<uint8_t> bytes = read_file(path("run/config.json"));
  EXPECT_EQ(Json::parse(std::string(bytes.begin(), bytes.end())).at("optimizer").as_string(), "adamw8bit");
  ASSERT_EQ(castor({"train", "--resume", "run", "--steps", "15"}).exit_code, 0);  // (now an 8-bit run)
  CastorProcess back = castor(
      {"train", "--resume", "run", "--steps", "20", "--optimizer", "adamw", "--convert-optimizer-state"});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(codes_in(path("run")), 0u);
}

}  // namespace
}  // namespace castor::train
