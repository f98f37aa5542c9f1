// The training job end to end: exact resume in process, time-based checkpoints, eval/info, and bad input.
#include <gtest/gtest.h>
#include <filesystem>

#include "castor/checkpoint.h"
#include "castor/autograd.h"
#include "castor/fs.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/ops.h"
#include "castor/trainer.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {

namespace fs = std::filesystem;
using test::expect_same_checkpoint;

namespace {

std::vector<std::string> base_flags(const std::string& out, const std::string& amp, int64_t steps) {
  // clang-format off
  return {"--data", "synthetic", "--synthetic-size", "192", "--batch-size", "16", "--amp", amp, "--dtype",
          amp == "O2" ? "bf16" : "fp16", "--steps", std::to_string(steps), "--log-every", "4", "--deterministic",
          "--threads", "2", "--out", out};
  // clang-format on
}

// Runs the castor binary; returns its exit status and stderr.
std::pair<int, std::string> run_cli(const std::vector<std::string>& args) {
  test::CastorProcess p = test::run_castor(args, {test::scratch_dir()});
  return {p.exit_code, p.err};
}

}  // namespace

class ResumeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ResumeTest, ResumedRunEqualsUninterruptedBitForBit) {
  const std::string amp = GetParam();
  const test::ScratchDir full("resume_full_" + amp);
  const test::ScratchDir part("resume_part_" + amp);
  run_train(parse_train_flags(base_flags(full, amp, 12)));
  run_train(parse_train_flags(base_flags(part, amp, 5)));  // stops mid-epoch, mid growth interval
  auto flags = base_flags(part, amp, 12);
  flags.insert(flags.end(), {"--resume", part});
  Json resumed = run_train(parse_train_flags(flags));
  EXPECT_EQ(resumed.at("steps").as_int(), 12);
  expect_same_checkpoint(full, part);
}

INSTANTIATE_TEST_SUITE_P(Levels, ResumeTest, ::testing::Values("O1", "O2"));

TEST(Trainer, Fp16RunSkipsOverflowingStepsAndStillLearns) {
  const test::ScratchDir out("fp16_skips");
  auto flags = base_flags(out, "O1", 24);
  Json r = run_train(parse_train_flags(flags));
  EXPECT_GT(r.at("skipped_steps").as_int(), 0);  // the initial scale 65536 overflows at first
  EXPECT_LT(r.at("final_loss_scale").as_double(), 65536.0);
  EXPECT_GT(r.at("test_accuracy").as_double(), 0.3);  // 10 classes: chance is 0.1
  for (const char* f : {"config.json", "metrics.jsonl", "report.html"}) EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
}

TEST(Trainer, CheckpointsByTimeWithinAnEpoch) {
  const test::ScratchDir out("by_time");
  auto flags = base_flags(out, "O1", 10);  // 12 batches per epoch: no epoch end before step 10
  flags.insert(flags.end(), {"--checkpoint-minutes", "1e-6", "--keep", "100"});
  run_train(parse_train_flags(flags));
  int64_t count = 0;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) count += fs::exists(e.path() / "COMMIT");
  EXPECT_EQ(count, 10);  // every step is past the (tiny) interval
}

TEST(Trainer, EvalAndInfoReadACheckpoint) {
  const test::ScratchDir out("eval_info");
  Json r = run_train(parse_train_flags(base_flags(out, "O1", 8)));
  const std::string ckpt = *latest_checkpoint(out);
  Json e = run_eval(parse_eval_flags({"--checkpoint", ckpt}));
  EXPECT_DOUBLE_EQ(e.at("test_accuracy").as_double(), r.at("test_accuracy").as_double());
  Json from_file = run_eval(parse_eval_flags({ckpt + "/model.safetensors"}));
  EXPECT_DOUBLE_EQ(from_file.at("test_accuracy").as_double(), r.at("test_accuracy").as_double());
  const std::string info = run_info({"--tensors", ckpt});
  EXPECT_NE(info.find("conv1.weight  float32[32, 3, 3, 3]"), std::string::npos) << info;
  EXPECT_NE(info.find("opt_level = O1"), std::string::npos) << info;
  // An image classifier takes no language model's adapter (refused before its weights load, naming the model).
  try {
    run_eval(parse_eval_flags({ckpt, "--lora", out}));
    ADD_FAILURE() << "--lora of an image classifier was taken";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--lora: " + ckpt + " is a simplecnn, not a language model"),
              std::string::npos)
        << err.what();
  }
}

TEST(Trainer, BadInputIsOneLineAndNonZero) {
  const test::ScratchDir out("bad_input");
  auto expect_error = [](std::vector<std::string> args, const std::string& needle) {
    auto [rc, err] = run_cli(args);
    EXPECT_EQ(rc, 1) << err;
    EXPECT_NE(err.find(needle), std::string::npos) << err;
    size_t error_lines = 0;
    for (size_t at = err.find("error:"); at != std::string::npos; at = err.find("error:", at + 1)) ++error_lines;
    EXPECT_EQ(error_lines, 1u) << err;
    EXPECT_EQ(err.back(), '\n');
    EXPECT_EQ(err.find('\n', err.find("error:")), err.size() - 1) << "the error is not one line: " << err;
  };
  expect_error({"train", "--data-dir", "/nonexistent", "--steps", "1"}, "/nonexistent");
  expect_error({"train", "--amp", "O9"}, "--amp");
  expect_error({"train", "--frobnicate"}, "--frobnicate");
  expect_error({"info", out + "/missing.safetensors"}, "missing.safetensors");
  expect_error({"eval", "--checkpoint", out}, out);
  // A checkpoint from another model or precision setting.
  auto flags = base_flags(out, "O1", 2);
  run_train(parse_train_flags(flags));
  std::vector<std::string> other = {"train"};
  auto f2 = base_flags(out, "O2", 4);
  other.insert(other.end(), f2.begin(), f2.end());
  other.insert(other.end(), {"--resume", out});
  expect_error(other, "amp");
  // An unwritable output location.
  expect_error({"train", "--data", "synthetic", "--steps", "1", "--out", "/proc/castor"}, "--out");
}

}  // namespace castor::train

namespace castor::train {

TEST(Trainer, TrainsOnCifar10BinaryFiles) {
  // CIFAR-10 cannot be downloaded here: write a tiny dataset in its binary format (label byte + 3x32x32).
  const test::ScratchDir dir("cifar_bin");
  const test::ScratchDir out("cifar_run");
  test::write_tiny_cifar10(dir);
  Json r = run_train(parse_train_flags({"--data", "cifar10", "--data-dir", dir, "--batch-size", "10", "--epochs", "2",
                                        "--augment", "standard", "--out", out, "--log-every", "5"}));
  EXPECT_EQ(r.at("steps").as_int(), 20);
  EXPECT_GT(r.at("test_accuracy").as_double(), 0.2);
  Json cfg = Json::parse(std::string(reinterpret_cast<const char*>(read_file(out + "/config.json").data()),
                                     read_file(out + "/config.json").size()));
  EXPECT_EQ(cfg.at("normalization").at("mean").as_array().size(), 3u);
}

TEST(Trainer, InitLoadsPyTorchNamedWeights) {
  const test::ScratchDir first("init_src");
  const test::ScratchDir second("init_dst");
  run_train(parse_train_flags(base_flags(first, "O1", 4)));
  const std::string weights = *latest_checkpoint(first) + "/model.safetensors";
  // With a negligible learning rate, one step from --init leaves the weights where the file put them.
  auto flags = base_flags(second, "O0", 1);
  flags.insert(flags.end(), {"--init", weights, "--optimizer", "sgd", "--momentum", "0", "--lr", "1e-30"});
  run_train(parse_train_flags(flags));
  StateDict a = load_safetensors(weights).tensors, b = read_checkpoint(second).model;
  for (const auto& [k, t] : a) EXPECT_TRUE(test::close(b.at(k), t, 0, 1e-20)) << k;
  // A file whose tensors do not fit the model is an error naming the file.
  StateDict bad = a;
  bad["fc2.weight"] = zeros({3, 3});
  save_safetensors(second + "/bad.safetensors", bad);
  flags.back() = "1e-3";
  flags[flags.size() - 7] = second + "/bad.safetensors";
  flags.insert(flags.begin(), "--overwrite");  // the same --out again
  const std::string msg = test::error_of([&] { run_train(parse_train_flags(flags)); });
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fc2.weight"), std::string::npos) << msg;
}

}  // namespace castor::train

namespace castor::train {

TEST(Trainer, CheckpointLoadsIntoThePyTorchTwin) {
  const test::ScratchDir out("torch_twin");
  run_train(parse_train_flags(base_flags(out, "O2", 6)));  // O2: the file holds the float32 master weights
  const std::string weights = *latest_checkpoint(out) + "/model.safetensors";
  auto model = models::make_model("simplecnn", 3, 32, 32, 10);
  model->load_state_dict(load_safetensors(weights).tensors, /*strict=*/true);
  model->eval();
  Generator gen(11);
  Tensor input = randn({4, 3, 32, 32}, DType::Float32, &gen);
  Tensor logits;
  {
    NoGradGuard no_grad;
    logits = (*model)(input);
  }
  save_safetensors(out + "/input.safetensors", {{"input", input}});
  ASSERT_TRUE(test::run_oracle("models_oracle.py", {"safetensors", "simplecnn", "3", "32", "32", "10", weights,
                                                    out + "/input.safetensors", out + "/torch_logits.safetensors"}));
  EXPECT_TRUE(
      test::close(logits, load_safetensors(out + "/torch_logits.safetensors").tensors.at("logits"), 1e-4, 1e-5));
}

}  // namespace castor::train
