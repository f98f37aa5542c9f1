// What `--precision auto` picks, through `castor env` in child processes under each ONEDNN_MAX_CPU_ISA cap: bf16-mixed
// only where the CPU's flags (/proc/cpuinfo) have bfloat16 dot-product units and the cap lets oneDNN use them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "castor/json.h"
#include "run_test_util.h"

namespace castor {
namespace {

std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  return {};
}

// The `precision` line of `castor env` with ONEDNN_MAX_CPU_ISA set to `cap` (unset when empty).
std::string auto_line(const std::string& dir, const std::string& cap) {
  std::vector<std::string> args = {"-u", "ONEDNN_MAX_CPU_ISA", "-u", "DNNL_MAX_CPU_ISA"};
  if (!cap.empty()) args.push_back("ONEDNN_MAX_CPU_ISA=" + cap);
  args.insert(args.end(), {std::string(CASTOR_BINARY_DIR) + "/castor", "env"});
  const test::CastorProcess p = test::run_castor(args, test::CastorRun{dir, {}, 0, "env"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  const size_t at = p.out.find("\nprecision ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no precision line in castor env:\n" << p.out;
    return "";
  }
  return p.out.substr(at + 1, p.out.find('\n', at + 1) - at - 1);
}

TEST(AutoPrecision, FollowsTheCpusBf16UnitsUnderEachIsaCap) {
  const test::ScratchDir scratch("auto_precision");
  const std::string& dir = scratch.str();
  const std::set<std::string> flags = cpu_flags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const std::string none = "precision 32-true (auto: no bf16 units on this CPU; --precision bf16-mixed to force it)";
  // Capped below AVX512_CORE_BF16, no CPU has the units.
  EXPECT_EQ(auto_line(dir, "AVX2"), none);
  EXPECT_EQ(auto_line(dir, "AVX512_CORE"), none);
  // Capped at AVX512_CORE_BF16: the AVX512_BF16 dot products where the CPU has them, never AMX.
  EXPECT_EQ(auto_line(dir, "AVX512_CORE_BF16"),
            flags.count("avx512_bf16") ? "precision bf16-mixed (auto: avx512_bf16)" : none);
  // Uncapped: whatever the CPU has, AMX first.
  const std::string uncapped = auto_line(dir, "");
  if (flags.count("amx_bf16") || flags.count("avx512_bf16")) {
    const std::string unit = uncapped.substr(uncapped.find("auto: ") + 6,
                                             uncapped.size() - uncapped.find("auto: ") - 7);
    EXPECT_TRUE(uncapped.rfind("precision bf16-mixed (auto: ", 0) == 0) << uncapped;
    EXPECT_TRUE(flags.count(unit)) << uncapped << ": " << unit << " is not among the CPU's flags";
    // An AMX CPU picks AMX unless the kernel keeps the tiles from processes (oneDNN then stops at AVX512_CORE_BF16).
    if (!flags.count("amx_bf16")) {
      EXPECT_EQ(unit, "avx512_bf16");
    }
  } else {
    EXPECT_EQ(uncapped, none);
  }
}

// config.json's amp and dtype, and why auto chose them.
std::string recorded_precision(const std::string& run) {
  std::ifstream in(run + "/config.json");
  const Json c = Json::parse(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  const Json* why = c.find("precision_auto");
  return c.at("amp").as_string() + " " + c.at("dtype").as_string() + (why ? " (" + why->as_string() + ")" : "");
}

TEST(AutoPrecision, AResumedRunKeepsItsRecordedPrecisionOnAnotherCpu) {
  // A run started by default (auto) on one CPU class and resumed on another keeps what was chosen at its start:
  // config.json records the level and dtype. AVX512_CORE_BF16 and AVX2 caps give the two classes on a CPU with
  // AVX512_BF16; without it both choose 32-true and only that is checked.
  const test::ScratchDir scratch("auto_precision_resume");
  const std::string& dir = scratch.str();
  const bool units = cpu_flags().count("avx512_bf16") > 0;
  const std::vector<std::string> job = {"train", "--data",    "synthetic", "--synthetic-size",   "128", "--optimizer",
                                        "sgd",   "--threads", "2",         "--checkpoint-every", "2"};
  struct Case {
    std::string start_cap, resume_cap, first_line, recorded;
  };
  const std::string none = "auto: no bf16 units on this CPU; --precision bf16-mixed to force it";
  for (const Case& k :
       {Case{"AVX512_CORE_BF16", "AVX2",
             units ? "precision bf16-mixed (auto: avx512_bf16)" : "precision 32-true (" + none + ")",
             units ? "O1 bfloat16 (auto: avx512_bf16)" : "O0 bfloat16 (" + none + ")"},
        Case{"AVX2", "AVX512_CORE_BF16", "precision 32-true (" + none + ")", "O0 bfloat16 (" + none + ")"}}) {
    SCOPED_TRACE(k.start_cap + " then " + k.resume_cap);
    const std::string run = dir + "/" + k.start_cap;
    std::vector<std::string> start = job;
    start.insert(start.end(), {"--steps", "2", "--out", run});
    const test::CastorProcess a = test::run_castor(
        start, test::CastorRun{dir, {"ONEDNN_MAX_CPU_ISA=" + k.start_cap, "OMP_WAIT_POLICY=passive"}});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.err.substr(0, a.err.find('\n')), k.first_line);
    EXPECT_EQ(recorded_precision(run), k.recorded);
    const test::CastorProcess b = test::run_castor(
        {"train", "--resume", run, "--steps", "4"},
        test::CastorRun{dir, {"ONEDNN_MAX_CPU_ISA=" + k.resume_cap, "OMP_WAIT_POLICY=passive"}});
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(recorded_precision(run), k.recorded);
    const std::string level = k.recorded.substr(0, 2) == "O1" ? "bf16-mixed (O1)" : "32-true (O0)";
    EXPECT_NE(b.err.find("  " + level + "  "), std::string::npos) << b.err;
    EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step-0000000004/COMMIT")) << b.err;
  }
}

}  // namespace
}  // namespace castor
