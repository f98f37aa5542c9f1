// The run directory under faults and misuse, driving the real `castor` binary: every error one line and
// non-zero, FIFOs, locks, interrupts, damaged checkpoints, resume validation, full disks, divergence.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/ops.h"
#include "castor/trainer.h"
#include "io/file_test_util.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {

namespace fs = std::filesystem;
using test::CastorProcess;
using test::expect_one_line_error;
using test::expect_same_checkpoint;
using test::run_castor;

namespace {

// A small deterministic synthetic run: 12 batches per epoch of a few milliseconds each, on one thread (so a
// loaded CI machine does not stall it in OpenMP barriers).
std::vector<std::string> train_args(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) {
  // clang-format off
  std::vector<std::string> a = {"train", "--data", "synthetic", "--synthetic-size", "192", "--batch-size", "16",
                                "--amp", "O1", "--dtype", "fp16", "--steps", std::to_string(steps), "--log-every",
                                "1", "--deterministic", "--threads", "1", "--out", out};
  // clang-format on
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string text_of(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  return std::string(b.begin(), b.end());
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(text_of(path));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Rewrites the newest checkpoint of `run` after `edit` changes its training state (with valid checksums).
template <class F>
void edit_state(const std::string& run, F&& edit) {
  std::string used;
  Checkpoint ck = read_checkpoint(run, &used);
  edit(ck);
  const int64_t step = std::stoll(fs::path(used).filename().string().substr(5));
  write_checkpoint(run, step, ck, /*keep=*/10);
}

// Waits until `path` holds at least `n` lines (while `p` runs).
void wait_for_lines(const CastorProcess& p, const std::string& path, size_t n) {
  ASSERT_TRUE(p.wait_until([&] { return fs::exists(path) && lines_of(path).size() >= n; }))
      << path << " never reached " << n << " lines";
}

// Fashion-MNIST files (IDX, uncompressed) in `dir`: `n_train` and `n_test` images of varied bytes, labels 0-9.
void write_fashion_mnist(const std::string& dir, uint32_t n_train, uint32_t n_test) {
  fs::create_directories(dir);
  auto idx = [&](const std::string& name, uint32_t magic, std::vector<uint32_t> dims, size_t payload) {
    std::vector<uint8_t> b;
    dims.insert(dims.begin(), magic);
    for (uint32_t v : dims)
      for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
    for (size_t i = 0; i < payload; ++i)
      b.push_back(static_cast<uint8_t>(magic == 0x801 ? i % 10 : (i * 37 + 11) % 251));
    test::write_bytes(dir + "/" + name, b);
  };
  idx("train-images-idx3-ubyte", 0x803, {n_train, 28, 28}, n_train * 784);
  idx("train-labels-idx1-ubyte", 0x801, {n_train}, n_train);
  idx("t10k-images-idx3-ubyte", 0x803, {n_test, 28, 28}, n_test * 784);
  idx("t10k-labels-idx1-ubyte", 0x801, {n_test}, n_test);
}

// The step of a checkpoint folder's name (step-0000000015 -> 15).
int64_t step_of(const std::string& checkpoint) {
  return std::stoll(fs::path(checkpoint).filename().string().substr(5));
}

class RunDir : public ::testing::Test {
 public:
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return run_castor(args, in_dir); }
};

}  // namespace

TEST_F(RunDir, OverflowingSizesAreOneLineErrors) {
  expect_one_line_error(castor({"train", "--data", "synthetic", "--synthetic-size", "4000000000000000"}),
                        {"--synthetic-size"});
  // A checkpoint whose recorded config holds such a size.
  ASSERT_EQ(castor(train_args("run", 2)).exit_code, 0);
  LoadedTensors model = load_safetensors(*latest_checkpoint(path("run")) + "/model.safetensors");
  Json cfg = Json::parse(model.metadata.at("castor.config"));
  cfg["synthetic_size"] = int64_t{4000000000000000};
  model.metadata["castor.config"] = cfg.dump();
  save_safetensors(path("huge.safetensors"), model.tensors, model.metadata);
  expect_one_line_error(castor({"eval", "--checkpoint", "huge.safetensors"}), {"huge.safetensors", "synthetic"});
}

TEST_F(RunDir, IncompleteOrOutOfRangeTrainingStateIsRefusedBeforeTraining) {
  ASSERT_EQ(castor(train_args("run", 3, {"--checkpoint-every", "1", "--keep", "10"})).exit_code, 0);
  const auto resume = [&](const std::function<void(Checkpoint&)>& edit, const std::vector<std::string>& parts) {
    fs::remove_all(path("copy"));
    fs::copy(path("run"), path("copy"), fs::copy_options::recursive);
    edit_state(path("copy"), edit);
    expect_one_line_error(castor({"train", "--resume", "copy", "--steps", "6"}), parts);
  };
  resume([](Checkpoint& c) { c.state.erase("progress.step"); }, {"progress.step", "copy"});
  resume([](Checkpoint& c) { c.state["rng.default"] = zeros({3}, DType::Int64); }, {"rng.default"});
  resume([](Checkpoint& c) { c.state["progress.step"] = full({}, std::nan(""), DType::Float64); },
         {"progress.step", "nan"});
  resume([](Checkpoint& c) { c.state["progress.step"] = scalar_tensor(-4, DType::Int64); }, {"progress.step", "-4"});
  resume([](Checkpoint& c) { c.state["progress.step"] = scalar_tensor(1, DType::Int64); }, {"position"});
  // Restored values as strictly as flags: a negative learning rate, an RNG state no generator reaches.
  resume([](Checkpoint& c) { c.state["amp.optimizer.0.group.0.lr"] = scalar_tensor(-5, DType::Float64); },
         {"group.0.lr", "-5"});
  resume([](Checkpoint& c) { c.state["rng.default"] = zeros({6}, DType::Int64); }, {"rng.default", "all zero"});
}

TEST_F(RunDir, LoaderThreadOutOfMemoryIsOneLine) {
  // Large enough for the data, too small for the loader thread's 98 MB batch.
  test::CastorRun limited = in_dir;
  limited.address_space_kib = 130000;
  CastorProcess p = run_castor({"train", "--data", "synthetic", "--synthetic-size", "8000", "--batch-size", "8000",
                                "--steps", "1", "--threads", "2", "--out", "run"},
                               limited);
  expect_one_line_error(p, {"out of memory"});
}

TEST_F(RunDir, FifosAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0);
  expect_one_line_error(castor({"info", "pipe"}), {"pipe", "not a regular file"});
  expect_one_line_error(castor(train_args("run", 1, {"--init", "pipe"})), {"--init", "pipe"});
  fs::create_directories(path("fmnist"));
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"})
    ASSERT_EQ(::mkfifo(path("fmnist/" + std::string(f)).c_str(), 0644), 0);
  expect_one_line_error(castor({"train", "--data-dir", "fmnist", "--out", "run2"}),
                        {"train-images-idx3-ubyte", "not a regular file"});
}

TEST_F(RunDir, SecondRunOnTheSameOutIsRefusedAtOnce) {
  CastorProcess first(train_args("run", 100000), in_dir);
  wait_for_lines(first, path("run/metrics.jsonl"), 1);
  CastorProcess second = castor(train_args("run", 5));
  expect_one_line_error(second, {"run is in use by pid " + std::to_string(first.pid())});
  CastorProcess resumer = castor({"train", "--resume", "run"});
  first.signal(SIGKILL);
  first.wait();
  EXPECT_EQ(resumer.exit_code, 1) << resumer.err;
  EXPECT_NE(resumer.err.find("in use by pid"), std::string::npos) << resumer.err;
}

TEST_F(RunDir, NewRunIntoAnotherRunsOutRefusesUnlessOverwrite) {
  ASSERT_EQ(castor(train_args("run", 4)).exit_code, 0);
  const std::string metrics = text_of(path("run/metrics.jsonl"));
  expect_one_line_error(castor(train_args("run", 2, {"--lr", "0.01"})), {"--resume run", "--overwrite"});
  EXPECT_EQ(text_of(path("run/metrics.jsonl")), metrics);  // nothing touched
  ASSERT_EQ(castor(train_args("run", 2, {"--lr", "0.01", "--overwrite"})).exit_code, 0);
  // Only the new run's checkpoint is left, so eval reports the new model.
  EXPECT_EQ(fs::path(*latest_checkpoint(path("run"))).filename(), "step-0000000002");
  int folders = 0;  // (besides the HEAD file)
  for (const auto& e : fs::directory_iterator(path("run/checkpoints"))) folders += e.is_directory();
  EXPECT_EQ(folders, 1);
  EXPECT_EQ(lines_of(path("run/metrics.jsonl")).size(), 3u);  // 2 steps + 1 epoch line
}

TEST_F(RunDir, ResumeOfACheckpointFolderContinuesItsRun) {
  ASSERT_EQ(castor(train_args("run", 4, {"--checkpoint-every", "2"})).exit_code, 0);
  CastorProcess p = castor({"train", "--resume", "run/checkpoints/step-0000000002", "--steps", "6"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step-0000000002/checkpoints")));
  EXPECT_EQ(fs::path(*latest_checkpoint(path("run"))).filename(), "step-0000000006");
  fs::create_directories(path("loose"));
  fs::copy(path("run/checkpoints/step-0000000006"), path("loose/step-0000000006"), fs::copy_options::recursive);
  expect_one_line_error(castor({"train", "--resume", "loose/step-0000000006"}), {"outside a run directory", "--init"});
}

TEST_F(RunDir, ResumingAFinishedRunChangesNothing) {
  ASSERT_EQ(castor(train_args("run", 4)).exit_code, 0);
  const std::string report = text_of(path("run/report.html")), metrics = text_of(path("run/metrics.jsonl"));
  CastorProcess p = castor({"train", "--resume", "run"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("already complete at step 4"), std::string::npos) << p.err;  // stdout: the JSON only
  EXPECT_EQ(p.out.find("test_accuracy"), std::string::npos) << p.out;
  EXPECT_EQ(text_of(path("run/report.html")), report);
  EXPECT_EQ(text_of(path("run/metrics.jsonl")), metrics);
}

// The first signal finishes the step, checkpoints it and exits 128 + signal; resuming then ends bit-identical
// to a run never interrupted. Runs one signal of the three per call.
void interrupt_and_resume(RunDir* t, int sig, const std::string& name) {
  const std::string run = name, full = name + "_full";
  const std::vector<std::string> extra = {"--synthetic-size", "1024"};  // 64 batches per epoch: no epoch end
  CastorProcess p(train_args(run, 60, extra), t->in_dir);
  wait_for_lines(p, t->in_dir.dir + "/" + run + "/metrics.jsonl", 3);
  p.signal(sig);
  p.wait();
  EXPECT_EQ(p.exit_code, 128 + sig) << p.err;
  const size_t at = p.err.find("interrupted at step ");
  ASSERT_NE(at, std::string::npos) << p.err;
  const int64_t step = std::stoll(p.err.substr(at + 20));
  EXPECT_NE(p.err.find("; continue with: castor train --resume " + run + "\n"), std::string::npos) << p.err;
  auto latest = latest_checkpoint(t->in_dir.dir + "/" + run);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(),
            "step-" + std::string(10 - std::to_string(step).size(), '0') + std::to_string(step));
  ASSERT_LT(step, 60) << "finished before the signal came";
  CastorProcess r = run_castor({"train", "--resume", run}, t->in_dir);  // its recorded settings alone
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(run_castor(train_args(full, 60, extra), t->in_dir).exit_code, 0);
  expect_same_checkpoint(t->in_dir.dir + "/" + full, t->in_dir.dir + "/" + run);
}

TEST_F(RunDir, SigintCheckpointsAndResumesBitExact) { interrupt_and_resume(this, SIGINT, "int"); }
TEST_F(RunDir, SigtermCheckpointsAndResumesBitExact) { interrupt_and_resume(this, SIGTERM, "term"); }
TEST_F(RunDir, SighupCheckpointsAndResumesBitExact) { interrupt_and_resume(this, SIGHUP, "hup"); }

TEST_F(RunDir, SecondSignalExitsAtOnce) {
  CastorProcess p({"train", "--data", "synthetic", "--synthetic-size", "4096", "--batch-size", "1024", "--steps",
                   "1000", "--log-every", "1", "--out", "run"},
                  in_dir);
  wait_for_lines(p, path("run/metrics.jsonl"), 1);
  // Both signals arrive while the process is stopped, so they come one right after the other however loaded the
  // machine is (they used to be 2 ms apart, which a loaded machine stretched past the step and its checkpoint).
  p.signal(SIGSTOP);
  ASSERT_TRUE(p.wait_until([&] {  // (stopped: state T in /proc/PID/stat, after "PID (castor) ")
    std::string stat;
    std::getline(std::ifstream("/proc/" + std::to_string(p.pid()) + "/stat"), stat);
    const size_t at = stat.rfind(')') + 2;
    return at < stat.size() && stat[at] == 'T';
  }));
  p.signal(SIGINT);
  p.signal(SIGTERM);
  p.signal(SIGCONT);
  p.wait();
  // Two threads may take the two signals at once; whichever comes second ends the process, with its status.
  EXPECT_TRUE(p.exit_code == 128 + SIGTERM || p.exit_code == 128 + SIGINT) << p.exit_code << " " << p.err;
  EXPECT_EQ(p.err.find("interrupted at step"), std::string::npos) << p.err;
}

TEST_F(RunDir, FullDiskLosesWholeMetricsLinesAndReportsThem) {
  test::CastorRun full_disk = in_dir;
  full_disk.env = {"CASTOR_FAIL_WRITES=metrics.jsonl:3:2"};  // the 3rd and 4th metrics lines hit a full disk
  CastorProcess p = run_castor(train_args("run", 6), full_disk);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("metrics.jsonl: a metrics line was lost at step 3"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("metrics.jsonl: a metrics line was lost at step 4"), std::string::npos) << p.err;
  const std::vector<std::string> lines = lines_of(path("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 5u);  // 6 step lines + 1 epoch line, 2 lost
  for (const std::string& l : lines) EXPECT_NO_THROW(Json::parse(l)) << l;
  EXPECT_EQ(Json::parse(lines[2]).at("step").as_int(), 5);
  EXPECT_NE(p.out.find("\"lost_metric_lines\":2"), std::string::npos) << p.out;
}

// Under a file-size limit (ulimit -f, a quota) a checkpoint that does not fit is a failed write, not SIGXFSZ: one line
// naming the file and the limit, exit 1, no temp folder left, and the previous checkpoint intact (the run resumes
// from it once the limit is lifted).
TEST_F(RunDir, AFileSizeLimitFailsTheCheckpointCleanly) {
  ASSERT_EQ(castor(train_args("run", 2)).exit_code, 0);
  const std::string first = latest_checkpoint(path("run")).value();
  const auto model_bytes = fs::file_size(first + "/model.safetensors");
  test::CastorRun limited = in_dir;
  limited.file_size_bytes = static_cast<long>(model_bytes / 2);
  CastorProcess p = run_castor(train_args("run", 4, {"--resume", "run"}), limited);
  EXPECT_EQ(p.killed_by, 0) << "killed by signal " << p.killed_by;
  const std::string err = p.err.substr(p.err.rfind('\n', p.err.size() - 2) + 1);
  EXPECT_EQ(p.exit_code, 1) << p.err;
  EXPECT_NE(err.find("castor train: error: "), std::string::npos) << p.err;
  EXPECT_NE(err.find("model.safetensors: write failed: File too large"), std::string::npos) << p.err;
  EXPECT_EQ(latest_checkpoint(path("run")).value(), first);
  for (const auto& e : fs::directory_iterator(path("run/checkpoints")))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_NO_THROW(read_checkpoint(first));
  ASSERT_EQ(castor(train_args("run", 4, {"--resume", "run"})).exit_code, 0);
}

TEST_F(RunDir, BadDataAndPathsAreFoundBeforeTheFirstStep) {
  // Fashion-MNIST files with 16 training images and an empty test set.
  write_fashion_mnist(path("fmnist"), 16, 0);
  expect_one_line_error(castor({"train", "--data-dir", "fmnist", "--batch-size", "4", "--out", "run"}),
                        {"--data-dir fmnist", "test set is empty"});
  EXPECT_FALSE(fs::exists(path("run/metrics.jsonl")));
  // A `checkpoints` path that is a file.
  fs::create_directories(path("run2"));
  test::write_bytes(path("run2/checkpoints"), {1, 2, 3});
  expect_one_line_error(castor(train_args("run2", 4)), {"run2/checkpoints", "not a writable directory"});
  EXPECT_FALSE(fs::exists(path("run2/metrics.jsonl")));
}

TEST_F(RunDir, ResumeRefusesSettingsThatChangeTheComputation) {
  ASSERT_EQ(castor(train_args("run", 3)).exit_code, 0);
  expect_one_line_error(
      castor({"train", "--resume", "run", "--lr", "0.5", "--weight-decay", "0.1", "--data-dir", "elsewhere",
              "--augment", "standard", "--init", "w.safetensors", "--threads", "3", "--steps", "8"}),
      {"--lr 0.5 (recorded 0.001)", "--weight-decay", "--data-dir", "--augment", "--init", "--threads 3 (recorded 1)"});
  // What does not change the computation may change; the rest comes from the recording.
  CastorProcess p = castor(
      {"train", "--resume", "run", "--steps", "5", "--log-every", "2", "--keep", "3", "--checkpoint-every", "1"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("\"steps\":5"), std::string::npos) << p.out;
  EXPECT_NE(p.err.find("on synthetic"), std::string::npos) << p.err;
}

TEST_F(RunDir, ExtendingAScheduleSaysWhatHappensPastItsEnd) {
  ASSERT_EQ(castor(train_args("cos", 4, {"--schedule", "cosine"})).exit_code, 0);
  CastorProcess p = castor({"train", "--resume", "cos", "--steps", "6"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("the cosine schedule was set for 4 steps"), std::string::npos) << p.err;
  ASSERT_EQ(castor(train_args("one", 4, {"--schedule", "onecycle"})).exit_code, 0);
  expect_one_line_error(castor({"train", "--resume", "one", "--steps", "6"}), {"onecycle", "step 4"});
  // Warmup-cosine does what nanoGPT's get_lr does past lr_decay_iters: min_lr, held; the note says so (it used to
  // say the rate keeps dropping 10x every third of the length, the step schedule's behaviour).
  ASSERT_EQ(
      castor(train_args("wc", 4,
                        {"--schedule", "warmup-cosine", "--warmup-steps", "1", "--lr", "0.01", "--min-lr", "0.002"}))
          .exit_code,
      0);
  p = castor({"train", "--resume", "wc", "--steps", "7"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("the warmup-cosine schedule was set for 4 steps and keeps it; past step 4 the learning rate "
                       "stays at --min-lr"),
            std::string::npos)
      << p.err;
  int held = 0;
  for (const std::string& line : lines_of(path("wc/metrics.jsonl"))) {
    const Json r = Json::parse(line);
    const Json* lr = r.find("lr");
    if (!lr || r.at("step").as_int() < 4) continue;
    EXPECT_DOUBLE_EQ(lr->as_double(), 0.002) << line;  // set after step s: the rate of step s + 1
    ++held;
  }
  EXPECT_EQ(held, 4);  // steps 4..7
}

TEST_F(RunDir, DamagedCheckpointsAreDetectedAndResumeFallsBack) {
  ASSERT_EQ(castor(train_args("full", 8)).exit_code, 0);
  ASSERT_EQ(castor(train_args("run", 6, {"--checkpoint-every", "3"})).exit_code, 0);
  const std::string newest = path("run/checkpoints/step-0000000006");
  // A flipped bit: eval and info of that checkpoint refuse it, naming the file.
  std::vector<uint8_t> bytes = read_file(newest + "/model.safetensors");
  bytes[bytes.size() - 5] ^= 0x10;
  test::write_bytes(newest + "/model.safetensors", bytes);
  expect_one_line_error(castor({"eval", "--checkpoint", "run/checkpoints/step-0000000006"}),
                        {"model.safetensors", "damaged"});
  expect_one_line_error(castor({"info", "run/checkpoints/step-0000000006"}), {"model.safetensors", "damaged"});
  // Truncated instead: resume falls back to step 3 with a warning, and ends as if nothing had happened.
  bytes.resize(bytes.size() / 2);
  test::write_bytes(newest + "/model.safetensors", bytes);
  CastorProcess p = castor({"train", "--resume", "run", "--steps", "8"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("warning: "), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("step-0000000003"), std::string::npos) << p.err;
  expect_same_checkpoint(path("full"), path("run"));
}

TEST_F(RunDir, StaleTempFoldersAreRemovedOnStart) {
  ASSERT_EQ(castor(train_args("run", 2)).exit_code, 0);
  fs::create_directories(path("run/checkpoints/step-0000000009.tmp4242"));
  test::write_bytes(path("run/checkpoints/step-0000000009.tmp4242/model.safetensors"), {1, 2});
  // Killed between its two renames: the step's only copy is the .old folder, which is put back.
  fs::rename(path("run/checkpoints/step-0000000002"), path("run/checkpoints/step-0000000002.old4242"));
  ASSERT_EQ(castor({"train", "--resume", "run", "--steps", "3"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step-0000000009.tmp4242")));
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step-0000000002.old4242")));
  EXPECT_TRUE(fs::exists(path("run/checkpoints/step-0000000003/COMMIT")));
}

TEST_F(RunDir, DivergenceStopsTheRunAndKeepsTheLastFiniteCheckpoint) {
  CastorProcess p = castor({"train", "--data",  "synthetic", "--synthetic-size",   "192", "--batch-size",
                            "16",    "--amp",   "O0",        "--optimizer",        "sgd", "--lr",
                            "1e30",  "--steps", "30",        "--checkpoint-every", "1",   "--keep",
                            "1",     "--out",   "run"});
  expect_one_line_error(p, {"diverged at step"});
  auto latest = latest_checkpoint(path("run"));
  ASSERT_TRUE(latest.has_value()) << "the first step's checkpoint is finite";
  for (const auto& [k, t] : read_checkpoint(*latest).model)
    if (is_floating(t.dtype())) {
      EXPECT_TRUE(isfinite_all(t)) << k;
    }
  expect_one_line_error(castor({"train", "--lr", "inf"}), {"--lr", "finite"});
  expect_one_line_error(castor({"train", "--weight-decay", "inf"}), {"--weight-decay", "finite"});
}

TEST_F(RunDir, InfoEscapesControlCharactersAndErrorsEscapePaths) {
  save_safetensors(path("evil.safetensors"), {{"w", zeros({2})}}, {{"note", "\x1b[2J\x1b[31mred\x07"}});
  CastorProcess p = castor({"info", "evil.safetensors"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out.find('\x1b'), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("\\x1b[2J\\x1b[31mred\\x07"), std::string::npos) << p.out;
  CastorProcess bad = castor({"info", "caf\xff.safetensors"});
  expect_one_line_error(bad, {"caf\\xff.safetensors"});
  EXPECT_EQ(bad.err.find('\xff'), std::string::npos);
}

TEST_F(RunDir, PruningKeepsTheHeadAndResumeWritesANewOne) {
  ASSERT_EQ(castor(train_args("run", 30, {"--checkpoint-every", "10", "--keep", "10"})).exit_code, 0);
  // The newest checkpoint damaged: the resume falls back to step 20 and its step 27 becomes the head, which
  // --keep 1 keeps (the damaged step 30 is no longer in the run's lineage).
  const std::string newest = path("run/checkpoints/step-0000000030/model.safetensors");
  std::vector<uint8_t> bytes = read_file(newest);
  bytes.resize(bytes.size() / 2);
  test::write_bytes(newest, bytes);
  CastorProcess p = castor({"train", "--resume", "run", "--keep", "1", "--steps", "27"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("step-0000000020"), std::string::npos) << p.err;
  ASSERT_TRUE(fs::exists(path("run/checkpoints/step-0000000027/COMMIT")));
  EXPECT_NO_THROW(read_checkpoint(path("run/checkpoints/step-0000000027")));
  EXPECT_EQ(step_of(*latest_checkpoint(path("run"))), 27);
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step-0000000020")));
  CastorProcess e = castor({"eval", "run"});
  EXPECT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.err.find("warning"), std::string::npos) << e.err;  // the head is intact: nothing passed over
}

TEST_F(RunDir, ReadersUseTheHeadNotTheHighestStep) {
  ASSERT_EQ(castor(train_args("full", 20)).exit_code, 0);
  ASSERT_EQ(castor(train_args("run", 30, {"--checkpoint-every", "10", "--keep", "10"})).exit_code, 0);
  ASSERT_EQ(castor({"train", "--resume", "run/checkpoints/step-0000000010", "--steps", "15"}).exit_code, 0);
  // eval and info of the run read step 15, the head, not the abandoned step 30.
  CastorProcess of_run = castor({"eval", "run"}), of_head = castor({"eval", "run/checkpoints/step-0000000015"});
  ASSERT_EQ(of_run.exit_code, 0) << of_run.err;
  ASSERT_EQ(of_head.exit_code, 0) << of_head.err;
  const auto loss = [](const std::string& out) { return Json::parse(out).at("test_loss").as_double(); };
  EXPECT_EQ(loss(of_run.out), loss(of_head.out));
  EXPECT_NE(loss(of_run.out), loss(castor({"eval", "run/checkpoints/step-0000000030"}).out));
  std::string used;
  read_checkpoint(path("run"), &used);
  EXPECT_EQ(step_of(used), 15);
  // A later resume continues from step 15 too, and ends as a run of 20 steps never interrupted.
  CastorProcess r = castor({"train", "--resume", "run", "--steps", "20"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("already complete"), std::string::npos) << r.err;
  expect_same_checkpoint(path("full"), path("run"));
}

TEST_F(RunDir, ResumeOfACheckpointFolderWithATrailingSlash) {
  ASSERT_EQ(castor(train_args("run", 4, {"--checkpoint-every", "2"})).exit_code, 0);
  CastorProcess p = castor({"train", "--resume", "run/checkpoints/step-0000000002/", "--steps", "6"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(step_of(*latest_checkpoint(path("run"))), 6);
}

TEST_F(RunDir, SymlinksInARunDirectoryAreRefusedAndNeverFollowed) {
  test::write_bytes(path("victim"), {'k', 'e', 'e', 'p'});
  const std::vector<std::string> names = {".castor.lock", "metrics.jsonl", "metrics.csv", "config.json",
                                          "summary.json"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const std::string run = "run" + std::to_string(i);
    fs::create_directories(path(run));
    fs::create_symlink("../victim", path(run + "/" + name));
    expect_one_line_error(castor(train_args(run, 2)), {name, "symbolic link"});
    EXPECT_EQ(text_of(path("victim")), "keep") << name;
  }
  // Not followed even when planted after the check (the lock and metrics files are opened with O_NOFOLLOW).
  EXPECT_THROW(AppendFile(path("run2/metrics.csv"), /*truncate=*/true), Error);
  EXPECT_THROW(FileLock(path("run0/.castor.lock")), Error);
  EXPECT_EQ(text_of(path("victim")), "keep");
}

// Nor a FIFO or a folder where a run writes a file (report.html, summary.json, checkpoints/HEAD): refused before the
// first step naming it, also with --overwrite (which would have deleted the folder); an empty --out names the flag.
TEST_F(RunDir, OnlyRegularFilesWhereARunWritesItsFiles) {
  fs::create_directories(path("run1/report.html"));
  test::write_bytes(path("run1/report.html/keep"), {'k'});
  fs::create_directories(path("run2"));
  ASSERT_EQ(::mkfifo(path("run2/summary.json").c_str(), 0644), 0);
  fs::create_directories(path("run3/checkpoints/HEAD"));
  for (const auto& [run, want] :
       std::vector<std::pair<std::string, std::string>>{{"run1", "report.html: is a directory"},
                                                        {"run2", "summary.json: is a FIFO"},
                                                        {"run3", "checkpoints/HEAD: is a directory"}}) {
    for (const bool overwrite : {false, true}) {
      CastorProcess p = castor(
          train_args(run, 2, overwrite ? std::vector<std::string>{"--overwrite"} : std::vector<std::string>{}));
      expect_one_line_error(p, {"--out " + run, want, "only a regular file or a missing path"});
    }
  }
  EXPECT_TRUE(fs::exists(path("run1/report.html/keep")));
  EXPECT_EQ(fs::symlink_status(path("run2/summary.json")).type(), fs::file_type::fifo);
  expect_one_line_error(castor(train_args("", 2)), {"--out: empty"});
}

TEST_F(RunDir, ForeignFilesAreRefusedUnlessOverwrite) {
  fs::create_directories(path("mine"));
  for (const char* f : {"config.json", "report.html", "metrics.csv", "summary.json"})
    test::write_bytes(path("mine/") + f, {'m', 'i', 'n', 'e'});
  // Refused the second time as the first: the refusal leaves no lock file that would pass the directory for a run's.
  for (int attempt = 0; attempt < 2; ++attempt)
    expect_one_line_error(castor(train_args("mine", 2)), {"not a Castor run", "config.json", "report.html",
                                                          "metrics.csv", "summary.json", "--overwrite"});
  for (const char* f : {"config.json", "report.html", "metrics.csv", "summary.json"})
    EXPECT_EQ(text_of(path("mine/") + f), "mine") << f;
  EXPECT_FALSE(fs::exists(path("mine/checkpoints")));
  EXPECT_FALSE(fs::exists(path("mine/.castor.lock")));
  ASSERT_EQ(castor(train_args("mine", 2, {"--overwrite"})).exit_code, 0);
  EXPECT_NO_THROW(Json::parse(text_of(path("mine/config.json"))));
  // A Castor run directory (it has a lock file) stopped before its first metrics line is simply started again.
  fs::remove_all(path("mine/checkpoints"));
  fs::remove(path("mine/metrics.jsonl"));
  EXPECT_EQ(castor(train_args("mine", 2)).exit_code, 0);
}

TEST_F(RunDir, RunsNeedNothingOutsideThemButTheData) {
  // --init from a file that is gone afterwards: eval and resume read the checkpoints only.
  ASSERT_EQ(castor(train_args("src", 1)).exit_code, 0);
  fs::copy_file(*latest_checkpoint(path("src")) + "/model.safetensors", path("w.safetensors"));
  const std::string checksum = checksum64_hex(read_file(path("w.safetensors")));
  ASSERT_EQ(castor(train_args("run", 2, {"--init", "w.safetensors", "--checkpoint-every", "1"})).exit_code, 0);
  const Json config = Json::parse(text_of(path("run/config.json")));
  EXPECT_EQ(config.at("init").as_string(), absolute_path(path("w.safetensors")));
  EXPECT_EQ(config.at("init_checksum").as_string(), checksum);
  fs::remove(path("w.safetensors"));
  CastorProcess e = castor({"eval", "run"});
  EXPECT_EQ(e.exit_code, 0) << e.err;
  CastorProcess r = castor({"train", "--resume", "run", "--steps", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A relative --data-dir is recorded absolute: the run resumes from another working directory, and the same
  // directory spelled differently is not a different setting.
  write_fashion_mnist(path("data/fmnist"), 16, 8);
  const std::vector<std::string> fm = {"--data-dir", "data/fmnist",     "--batch-size", "4", "--threads",
                                       "1",          "--deterministic", "--log-every",  "1"};
  std::vector<std::string> args = {"train", "--steps", "2", "--out", "fm"};
  args.insert(args.end(), fm.begin(), fm.end());
  ASSERT_EQ(castor(args).exit_code, 0);
  EXPECT_EQ(Json::parse(text_of(path("fm/config.json"))).at("data_dir").as_string(),
            absolute_path(path("data/fmnist")));
  fs::create_directories(path("elsewhere"));
  test::CastorRun elsewhere = in_dir;
  elsewhere.dir = path("elsewhere");
  CastorProcess moved = run_castor({"train", "--resume", "../fm", "--steps", "3"}, elsewhere);
  EXPECT_EQ(moved.exit_code, 0) << moved.err;
  CastorProcess respelled = castor({"train", "--resume", "fm", "--data-dir", "./data//fmnist/", "--steps", "4"});
  EXPECT_EQ(respelled.exit_code, 0) << respelled.err;
}

TEST_F(RunDir, StaticLossScaleThatOverflowsEveryStepStops) {
  for (const char* scale : {"1e10", "1e300"}) {
    CastorProcess p = castor(train_args(std::string("run") + scale, 100, {"--loss-scale", scale}));
    expect_one_line_error(p, {"20 steps in a row", "static loss scale", "--loss-scale dynamic"});
    EXPECT_NE(p.err.find("stopped at step 20"), std::string::npos) << p.err;
  }
}

TEST_F(RunDir, ThreadCountsAreBoundedAlsoWhenRestored) {
  expect_one_line_error(castor(train_args("big", 2, {"--threads", "100000"})), {"--threads", "at most 1024"});
  ASSERT_EQ(castor(train_args("run", 2)).exit_code, 0);
  edit_state(path("run"), [](Checkpoint& c) {
    Json cfg = Json::parse(c.state_meta.at("config"));
    cfg["threads"] = int64_t{100000};
    c.state_meta["config"] = cfg.dump();
  });
  expect_one_line_error(castor({"train", "--resume", "run", "--steps", "4"}),
                        {"--threads", "at most 1024, got 100000", "recorded"});
}

TEST_F(RunDir, ConfigFilesAreReadOnlyIfRegularAndSmall) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0);
  expect_one_line_error(castor({"train", "--config", "pipe"}), {"--config", "pipe", "not a regular file"});
  expect_one_line_error(castor({"train", "--config", "/dev/zero"}), {"--config", "/dev/zero", "not a regular file"});
  test::write_bytes(path("huge.toml"), std::vector<uint8_t>((1 << 20) + 1, '#'));
  expect_one_line_error(castor({"train", "--config", "huge.toml"}), {"--config", "huge.toml", "limit"});
}

TEST_F(RunDir, ARunsConfigJsonIsAConfigFile) {
  ASSERT_EQ(castor(train_args("run", 3, {"--lr", "0.01", "--weight-decay", "0.001", "--schedule", "cosine"})).exit_code,
            0);
  CastorProcess p = castor({"train", "--config", "run/config.json", "--out", "again"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  // The same settings; only the start time may differ.
  Json again = Json::parse(text_of(path("again/config.json"))), run = Json::parse(text_of(path("run/config.json")));
  again["started"] = run["started"];
  EXPECT_EQ(again.dump(2), run.dump(2));
  expect_same_checkpoint(path("run"), path("again"));
}

TEST_F(RunDir, InfoReadsAFilesHeaderNotItsData) {
  // A 4 GiB tensor in a sparse file, listed under a 512 MiB address-space limit.
  const std::string header = R"({"w":{"dtype":"F32","shape":[1073741824],"data_offsets":[0,4294967296]}})";
  std::vector<uint8_t> bytes(8);
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  test::write_bytes(path("big.safetensors"), bytes);
  fs::resize_file(path("big.safetensors"), bytes.size() + (uint64_t{1} << 32));
  test::CastorRun limited = in_dir;
  limited.address_space_kib = 512 * 1024;
  CastorProcess p = run_castor({"info", "--tensors", "big.safetensors"}, limited);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("w  float32[1073741824]  1073741824"), std::string::npos) << p.out;
}

TEST_F(RunDir, ResumeAfterTheLastStepWithoutAReportFinishesIt) {
  // As a kill during the final evaluation leaves it: the last step's checkpoint, no report or summary.
  ASSERT_EQ(castor(train_args("run", 4, {"--checkpoint-every", "1"})).exit_code, 0);
  const std::string summary = text_of(path("run/summary.json"));
  fs::remove(path("run/report.html"));
  fs::remove(path("run/summary.json"));
  CastorProcess p = castor({"train", "--resume", "run"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.err.find("already complete"), std::string::npos) << p.err;
  EXPECT_TRUE(fs::exists(path("run/report.html")));
  const Json before = Json::parse(summary), after = Json::parse(text_of(path("run/summary.json")));
  EXPECT_EQ(after.at("steps").as_int(), 4);
  EXPECT_EQ(after.at("test_accuracy").as_double(), before.at("test_accuracy").as_double());
  EXPECT_EQ(after.at("test_loss").as_double(), before.at("test_loss").as_double());
  // Killed after the last step's checkpoint but before the epoch end's (epoch 0, batch 12 of 12), with the report of
  // an earlier completion still there: the resume takes the epoch end and checkpoints as the uninterrupted run did.
  ASSERT_EQ(castor(train_args("epoch", 12, {"--checkpoint-every", "1", "--keep", "10"})).exit_code, 0);
  fs::copy(path("epoch"), path("epoch_whole"), fs::copy_options::recursive);
  edit_state(path("epoch"), [](Checkpoint& c) {
    c.state["progress.epoch"] = scalar_tensor(0, DType::Int64);
    c.state["progress.batch"] = scalar_tensor(12, DType::Int64);
  });
  CastorProcess e = castor({"train", "--resume", "epoch"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.err.find("already complete"), std::string::npos) << e.err;
  expect_same_checkpoint(path("epoch_whole"), path("epoch"));
}

TEST_F(RunDir, SigintDuringTheFinalEvaluationStillWritesTheReport) {
  // 2 steps, then an evaluation of 5000 test images (seconds): the signal comes during it.
  CastorProcess p(train_args("run", 2, {"--synthetic-size", "20000"}), in_dir);
  wait_for_lines(p, path("run/metrics.jsonl"), 2);
  p.signal(SIGINT);
  p.wait();
  EXPECT_EQ(p.exit_code, 0) << p.err;  // the run was complete: report and summary written
  EXPECT_TRUE(fs::exists(path("run/report.html")));
  EXPECT_TRUE(fs::exists(path("run/summary.json")));
  EXPECT_NE(castor({"train", "--resume", "run"}).err.find("already complete at step 2"), std::string::npos);
}

TEST_F(RunDir, InfoRacingPruningSeesWholeCheckpoints) {
  CastorProcess run(train_args("run", 100000, {"--checkpoint-every", "1", "--keep", "1"}), in_dir);
  if (!run.wait_until([&] { return latest_checkpoint(path("run")).has_value(); })) {
    run.wait();
    FAIL() << "ended before its first checkpoint: " << run.err;
  }
  int failures = 0;
  std::string first;
  for (int i = 0; i < 40; ++i) {
    CastorProcess info = castor({"info", "run"});
    if (info.exit_code != 0 && failures++ == 0) first = info.err;
  }
  run.signal(SIGKILL);
  run.wait();
  EXPECT_EQ(failures, 0) << first;
}

// Kills a checkpointing run at random moments, resumes it each time, and compares the end with an uninterrupted
// run byte for byte. CASTOR_SOAK_ROUNDS sets the number of kills (default 3 in CI).
TEST_F(RunDir, SigkillSoakResumesByteIdentical) {
  const char* env = std::getenv("CASTOR_SOAK_ROUNDS");
  const int rounds = env ? std::atoi(env) : 3;
  const std::vector<std::string> extra = {"--checkpoint-every", "1"};
  ASSERT_EQ(castor(train_args("full", 36, extra)).exit_code, 0);
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  // Killed before its first checkpoint, the run starts over (its metrics lines make --overwrite necessary).
  auto start_or_resume = [&] {
    if (latest_checkpoint(path("run"))) return std::vector<std::string>{"train", "--resume", "run"};
    std::vector<std::string> a = train_args("run", 36, extra);
    a.push_back("--overwrite");
    return a;
  };
  for (int r = 0; r < rounds; ++r) {
    CastorProcess p(start_or_resume(), in_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 400));
    p.signal(SIGKILL);
    p.wait();
  }
  CastorProcess last = castor(start_or_resume());
  ASSERT_EQ(last.exit_code, 0) << last.err;
  expect_same_checkpoint(path("full"), path("run"));
}

// Kills runs resumed from an older checkpoint (so their first checkpoint moves the head back and prunes many at once)
// at random moments, then resumes the head to the end: byte-identical to an uninterrupted run each time.
TEST_F(RunDir, SigkillSoakDuringResumeFromAnOlderCheckpointAndPruning) {
  const char* env = std::getenv("CASTOR_SOAK_ROUNDS");
  const int rounds = env ? std::atoi(env) : 3;
  ASSERT_EQ(castor(train_args("full", 36, {"--checkpoint-every", "1"})).exit_code, 0);
  ASSERT_EQ(castor(train_args("run", 36, {"--checkpoint-every", "1", "--keep", "40"})).exit_code, 0);
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::string> older;  // the complete checkpoints below the head
    const std::string head = fs::path(*latest_checkpoint(path("run"))).filename().string();
    for (const auto& e : fs::directory_iterator(path("run/checkpoints"))) {
      const std::string name = e.path().filename().string();
      if (name.find('.') == std::string::npos && name < head && fs::exists(e.path() / "COMMIT")) older.push_back(name);
    }
    const std::string from = older.empty() ? head : older[rng() % older.size()];
    CastorProcess p({"train", "--resume", "run/checkpoints/" + from, "--keep", "2"}, in_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
    p.signal(SIGKILL);
    p.wait();
    CastorProcess last = castor({"train", "--resume", "run", "--keep", "40"});
    ASSERT_EQ(last.exit_code, 0) << last.err;
    expect_same_checkpoint(path("full"), path("run"));
  }
}

}  // namespace castor::train
