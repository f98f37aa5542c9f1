// The OpenMP wait policy `castor train` chooses for itself (src/train/openmp_wait.cpp, tools/castor.cpp): cases worked
// by hand from the rule (passive where the job's threads share cores with other work or its model is large, else a
// bounded spin), and the command recording what it chose, or the user's choice, in config.json.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "castor/fs.h"
#include "castor/json.h"
#include "castor/trainer.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {

TEST(OpenMpWait, PassiveWhereCoresAreSharedOrTheModelIsLarge) {
  struct Case {
    std::vector<std::string> flags;
    int cpus;
    double busy;
    std::string wait;  // OpenMpWait::text() up to its reason
  };
  const std::vector<Case> cases = {
      {{}, 2, 0.0, "GOMP_SPINCOUNT=3000"},                        // a small model on idle cores: spin
      {{}, 2, 0.4, "GOMP_SPINCOUNT=3000"},                        // 2 + 0.4 <= 2.5: a shell, not a competitor
      {{}, 2, 1.0, "OMP_WAIT_POLICY=passive"},                    // 2 threads + 1 busy core > 2 cores
      {{"--threads", "1"}, 2, 1.0, "GOMP_SPINCOUNT=3000"},        // 1 thread beside 1 busy core fits
      {{"--nproc", "2"}, 4, 0.0, "GOMP_SPINCOUNT=3000"},          // 2 ranks x 2 threads on 4 idle cores
      {{"--nproc", "2"}, 4, 1.0, "OMP_WAIT_POLICY=passive"},      // ... with one core busy
      {{"--model", "gpt2"}, 2, 0.0, "OMP_WAIT_POLICY=passive"},   // 12 x 12 x 768^2 = 85M block weights
      {{"--model", "gpt"}, 2, 0.0, "GOMP_SPINCOUNT=3000"},        // 6 x 12 x 384^2 = 10.6M
      {{"--model", "llama-15m"}, 2, 0.0, "GOMP_SPINCOUNT=3000"},  // 6 x 12 x 288^2 = 6M
      {{"--model", "gpt", "--n-embd", "768", "--n-layer", "6"},
       2,
       0.0,  // 42.5M: large
       "OMP_WAIT_POLICY=passive"},
  };
  for (const Case& k : cases) {
    const OpenMpWait w = choose_openmp_wait(parse_train_flags(k.flags), k.cpus, k.busy);
    EXPECT_EQ(w.text().substr(0, k.wait.size()), k.wait) << w.text() << " for " << ::testing::PrintToString(k.flags);
  }
  EXPECT_EQ(choose_openmp_wait(parse_train_flags({}), 2, 1.0).text(),
            "OMP_WAIT_POLICY=passive (other processes keep 1.0 of 2 cores busy)");
  EXPECT_EQ(choose_openmp_wait(parse_train_flags({"--model", "gpt2"}), 2, 0.0).text(),
            "OMP_WAIT_POLICY=passive (a large model: 12 blocks of width 768)");
}

// config.json says how the run's threads waited: the user's variable "(given)", or what castor chose and why (which of
// the two depends on the machine's load as the run starts, so either is right here).
TEST(OpenMpWait, TheRunRecordsTheWaitItRanWith) {
  const test::ScratchDir dir("openmp_wait");
  const std::vector<std::string> args = {"train", "--data",  "synthetic", "--synthetic-size", "32", "--batch-size",
                                         "16",    "--steps", "1",         "--threads",        "1"};
  auto run = [&](const std::string& out, std::vector<std::string> env) {
    std::vector<std::string> a = {"-u", "OMP_WAIT_POLICY", "-u", "GOMP_SPINCOUNT", "-u", "CASTOR_OPENMP_WAIT"};
    a.insert(a.end(), env.begin(), env.end());
    a.push_back(std::string(CASTOR_BINARY_DIR) + "/castor");
    a.insert(a.end(), args.begin(), args.end());
    a.insert(a.end(), {"--out", out});
    const test::CastorProcess p = test::run_castor(a, test::CastorRun{dir, {}, 0, "env"});
    EXPECT_EQ(p.exit_code, 0) << p.err;
    const std::vector<uint8_t> b = read_file(dir + "/" + out + "/config.json");
    return Json::parse(std::string(b.begin(), b.end())).at("openmp_wait").as_string();
  };
  EXPECT_EQ(run("given", {"OMP_WAIT_POLICY=active"}), "OMP_WAIT_POLICY=active (given)");
  const std::string chosen = run("chosen", {});
  EXPECT_TRUE(chosen == "GOMP_SPINCOUNT=3000 (a bounded spin)" ||
              chosen.rfind("OMP_WAIT_POLICY=passive (other processes keep ", 0) == 0)
      << chosen;
  // --resume chooses for the recorded job: a run recorded as GPT-2's sizes (its config.json edited so) is large.
  const std::string cfg = dir + "/chosen/config.json";
  const std::vector<uint8_t> b = read_file(cfg);
  Json recorded = Json::parse(std::string(b.begin(), b.end()));
  for (const auto& [k, v] : std::vector<std::pair<std::string, Json>>{{"model", Json("gpt2")},
                                                                      {"data", Json("brown")},
                                                                      {"n_layer", Json(12)},
                                                                      {"n_head", Json(12)},
                                                                      {"n_embd", Json(768)}})
    recorded[k] = v;
  atomic_write_file(cfg, recorded.dump());
  const TrainConfig job = openmp_wait_job(parse_train_flags({"--resume", dir + "/chosen"}));
  EXPECT_EQ(job.model, ModelKind::Gpt2);
  EXPECT_EQ(choose_openmp_wait(job, 2, 0.0).text(), "OMP_WAIT_POLICY=passive (a large model: 12 blocks of width 768)");
  const TrainConfig unreadable = openmp_wait_job(parse_train_flags({"--resume", dir + "/missing"}));
  EXPECT_EQ(unreadable.model, ModelKind::SimpleCnn);  // the flags as they are
}

// busy_cores counts a process spinning beside this one (its own core, whatever else runs: at least half of one), from
// /proc/stat as castor train measures before it starts.
TEST(OpenMpWait, BusyCoresCountAProcessSpinningBesideThisOne) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);                               // (ended by the parent; never outlives the test)
    for (;;) asm volatile("" ::: "memory");  // a spin the compiler keeps
  }
  usleep(50 * 1000);
  const double busy = busy_cores(300);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_GE(busy, 0.5);
  EXPECT_LE(busy, online_cpus() + 0.01);
}

}  // namespace castor::train
