// What `castor` shows people: output on a 60- and 100-column terminal (a real pty, through script(1)), epochs numbered
// from 1 everywhere, no loss scale where there is no loss scaling, resume and interrupt messages, a new run directory
// per run, help/version/env/completion, `castor info` and its --tensors, and --profile's table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "castor/fs.h"
#include "castor/json.h"
#include "castor/train_config.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// Runs `castor ARGS` (each already shell-quoted as needed) in `dir` on a pseudo-terminal `columns` wide; returns
// what the terminal received, each carriage return and newline a line break, the clear-to-end escape removed.
std::vector<std::string> terminal_lines(const std::string& dir, const std::string& args, int columns) {
  std::string text;
  EXPECT_EQ(test::run_command(test::on_terminal(dir, args, columns), &text), 0) << text;
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\x1b[K") == 0) {
      i += 2;
    } else if (text[i] == '\r' || text[i] == '\n') {
      if (!line.empty()) lines.push_back(line);
      line.clear();
    } else {
      line += text[i];
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

using test::read_text;

const std::string kSmallRun =
    "train --data synthetic --synthetic-size 128 --batch-size 16 --steps 8 --log-every 2 "
    "--threads 2";

}  // namespace

// Every line fits a 60-column terminal (progress, start and epoch lines alike); the bar and the epoch line agree on
// "epoch 1/1", as metrics.jsonl does; a bf16 run (no loss scaling) shows no scale, an fp16 run does.
TEST(Terminal, SixtyColumnsEpochsFromOneAndNoScaleWithoutScaling) {
  const test::ScratchDir dir("terminal_60");
  const std::vector<std::string> lines = terminal_lines(dir, kSmallRun + " --precision bf16-mixed --out bf", 60);
  ASSERT_GE(lines.size(), 3u);
  bool bar = false, summary = false;
  for (const std::string& l : lines) {
    EXPECT_LE(l.size(), 59u) << l;
    EXPECT_EQ(l.find("scale"), std::string::npos) << l;
    bar |= l.find("epoch 1/1  step 8/8") != std::string::npos;
    summary |= l.rfind("epoch 1/1  test acc", 0) == 0;
  }
  EXPECT_TRUE(bar && summary);
  for (const std::string& l : terminal_lines(dir, kSmallRun + " --precision 16-mixed --out fp", 100))
    EXPECT_LE(l.size(), 99u) << l;
  const std::vector<std::string> wide = terminal_lines(dir, kSmallRun + " --precision 16-mixed --out fp16", 160);
  EXPECT_NE(wide.back().find("  scale "), std::string::npos) << wide.back();
  std::istringstream metrics(read_text(dir + "/bf/metrics.jsonl"));
  for (std::string l; std::getline(metrics, l);) EXPECT_EQ(Json::parse(l).at("epoch").as_int(), 1) << l;
}

TEST(Terminal, ResumeSaysWhereAndAnInterruptedRunHasNoMadeUpAccuracy) {
  const test::ScratchDir dir("terminal_resume");
  const test::CastorRun run{dir, {"OMP_WAIT_POLICY=passive"}};
  const std::vector<std::string> flags = {
      "train", "--data", "synthetic", "--synthetic-size", "128", "--batch-size", "16", "--threads", "2", "--out", "r"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), flags.begin(), flags.end());
    return extra;
  };
  ASSERT_EQ(test::run_castor(with({"--steps", "4", "--checkpoint-every", "4"}), run).exit_code, 0);
  auto resumed = test::run_castor(with({"--steps", "6", "--resume", "r"}), run);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming from step 4 (checkpoint r/checkpoints/step-"), std::string::npos) << resumed.err;

  // Interrupted in its first epoch (4096 images of 16 a step), before any evaluation: test_accuracy is null.
  test::CastorProcess p({"train", "--data", "synthetic", "--synthetic-size", "4096", "--batch-size", "16", "--threads",
                         "2", "--log-every", "1", "--out", "i"},
                        run);
  p.wait_until([&] { return fs::exists(dir + "/i/metrics.jsonl") && fs::file_size(dir + "/i/metrics.jsonl") > 0; });
  p.signal(SIGINT);
  p.wait();
  ASSERT_EQ(p.exit_code, 128 + SIGINT) << p.err;
  const Json summary = Json::parse(p.out);
  ASSERT_NE(summary.find("test_accuracy"), nullptr) << p.out;
  EXPECT_TRUE(summary.at("test_accuracy").is_null()) << p.out;
}

// Without --out each run gets its own runs/<date>-<time>-<model>-<precision>, named on stderr and in the JSON.
TEST(Terminal, EachRunWithoutOutGetsANewDirectory) {
  const test::ScratchDir dir("terminal_default_out");
  const test::CastorRun run{dir, {"OMP_WAIT_POLICY=passive"}};
  const std::vector<std::string> args = {"train", "--data",  "synthetic", "--synthetic-size", "64", "--batch-size",
                                         "16",    "--steps", "1",         "--threads",        "2",  "--precision",
                                         "32"};
  auto a = test::run_castor(args, run), b = test::run_castor(args, run);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const std::string out_a = Json::parse(a.out).at("out").as_string(), out_b = Json::parse(b.out).at("out").as_string();
  EXPECT_NE(out_a, out_b);
  EXPECT_EQ(out_a.rfind("runs/", 0), 0u) << out_a;
  EXPECT_NE(out_a.find("-simplecnn-32-true"), std::string::npos) << out_a;
  EXPECT_NE(a.err.find(out_a), std::string::npos) << a.err;
  EXPECT_TRUE(fs::exists(dir + "/" + out_a + "/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/" + out_b + "/config.json"));
}

TEST(Terminal, HelpVersionEnvCompletionInfoAndProfile) {
  const test::ScratchDir dir("terminal_cli");
  const test::CastorRun run{dir, {"OMP_WAIT_POLICY=passive"}};
  auto help = test::run_castor({"help"}, run);
  EXPECT_EQ(help.exit_code, 0);
  // Each command, and in the one-liners every model family, LoRA and each file format castor reads or writes.
  for (const char* cmd : {"train", "eval", "info", "env", "completion", "Llama", "GPT", "LoRA", "llm.c", "llama2.c",
                          "nanoGPT", "safetensors", "PEFT"})
    EXPECT_NE(help.out.find(cmd), std::string::npos) << cmd << " in " << help.out;
  EXPECT_NE(test::run_castor({"help", "train"}, run).out.find("--grad-accum"), std::string::npos);
  EXPECT_EQ(test::run_castor({"-V"}, run).out, test::run_castor({"--version"}, run).out);
  const std::string env = test::run_castor({"env"}, run).out;
  for (const char* key : {"castor   ", "cpu      ", "ISA", "oneDNN   2.", "dispatching to ", "threads  ",
                          "mpi      Open MPI", "openmp   idle threads: OMP_WAIT_POLICY=passive\n"})
    EXPECT_NE(env.find(key), std::string::npos) << key << " in " << env;
  // Without a wait policy of the user's, castor runs itself with a bounded spin (tools/castor.cpp).
  const test::CastorRun unset{dir, {}, 0, "env"};
  const std::string bounded = test::run_castor({"-u", "OMP_WAIT_POLICY", "-u", "GOMP_SPINCOUNT",
                                                std::string(CASTOR_BINARY_DIR) + "/castor", "env"},
                                               unset)
                                  .out;
  EXPECT_NE(bounded.find("openmp   idle threads: GOMP_SPINCOUNT=3000\n"), std::string::npos) << bounded;
  const std::string chosen = test::run_castor({"-u", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT=7",
                                               std::string(CASTOR_BINARY_DIR) + "/castor", "env"},
                                              unset)
                                 .out;
  EXPECT_NE(chosen.find("openmp   idle threads: GOMP_SPINCOUNT=7\n"), std::string::npos) << chosen;

  // Values of the enumerated flags complete in bash; the zsh script is the same function under bashcompinit.
  std::ofstream(dir + "/castor.bash") << test::run_castor({"completion", "bash"}, run).out;
  std::ofstream(dir + "/probe.sh")
      << "source '" << dir << "/castor.bash'\n"
      << "COMP_WORDS=(castor train --precision bf); COMP_CWORD=3; _castor; echo ${COMPREPLY[@]}\n"
      << "COMP_WORDS=(castor train --data f); _castor; echo ${COMPREPLY[@]}\n"
      << "COMP_WORDS=(castor train --model res); _castor; echo ${COMPREPLY[@]}\n";
  std::string out;
  ASSERT_EQ(test::run_command("bash '" + dir + "/probe.sh'", &out), 0) << out;
  EXPECT_EQ(out, "bf16-mixed bf16 bf16-true\nfashion-mnist folder\nresnet18 resnet9\n");
  const std::string zsh = test::run_castor({"completion", "zsh"}, run).out;
  EXPECT_EQ(zsh.rfind("#compdef castor\n", 0), 0u) << zsh;
  EXPECT_NE(zsh.find("bashcompinit"), std::string::npos);

  // info: a short summary by default, every tensor with --tensors.
  auto train = test::run_castor({"train", "--data", "synthetic", "--synthetic-size", "128", "--batch-size", "16",
                                 "--steps", "3", "--threads", "2", "--out", "r", "--profile"},
                                run);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::string info = test::run_castor({"info", "r"}, run).out;
  for (const char* key : {"model       simplecnn", "precision   bf16-mixed", "step        3",
                          "metrics     test accuracy", "checkpoints step-"})
    EXPECT_NE(info.find(key), std::string::npos) << key << " in " << info;
  EXPECT_EQ(info.find("conv1.weight"), std::string::npos) << info;
  EXPECT_NE(test::run_castor({"info", "--tensors", "r"}, run).out.find("conv1.weight  float32[32, 3, 3, 3]"),
            std::string::npos);

  // --profile: the columns line up under the header whatever the op names' lengths, and the evaluation's
  // forward passes are not counted (cross_entropy ran once per training step: 3 times).
  std::istringstream err(train.err);
  std::string line;
  size_t calls_end = std::string::npos;
  bool saw_cross_entropy = false;
  while (std::getline(err, line)) {
    if (line.rfind("op ", 0) == 0) {
      calls_end = line.find("calls") + 5;
      continue;
    }
    if (calls_end == std::string::npos || line.size() < calls_end) continue;
    EXPECT_NE(line[calls_end - 1], ' ') << line;  // the count's last digit under "calls"' last letter
    EXPECT_EQ(line[calls_end], ' ') << line;
    if (line.rfind("cross_entropy ", 0) == 0 && line.find("forward") != std::string::npos) {
      saw_cross_entropy = true;
      EXPECT_EQ(std::stoi(line.substr(calls_end - 8, 8)), 3) << line;
    }
  }
  EXPECT_TRUE(saw_cross_entropy) << train.err;
}

}  // namespace castor::train
