// What `--precision auto` picks, through `castor env` in child processes under each ONEDNN_MAX_CPU_ISA cap: bf16-mixed
// only where the CPU's flags (/proc/cpuinfo) have bfloat16 dot-product units and the cap lets oneDNN use them.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

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
  const std::string dir = test::new_dir("auto_precision");
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
    const std::string unit = uncapped.substr(uncapped.find("auto: ") + 6, uncapped.size() - uncapped.find("auto: ") - 7);
    EXPECT_TRUE(uncapped.rfind("precision bf16-mixed (auto: ", 0) == 0) << uncapped;
    EXPECT_TRUE(flags.count(unit)) << uncapped << ": " << unit << " is not among the CPU's flags";
    // An AMX CPU picks AMX unless the kernel keeps the tiles from processes (oneDNN then stops at AVX512_CORE_BF16).
    if (!flags.count("amx_bf16")) EXPECT_EQ(unit, "avx512_bf16");
  } else {
    EXPECT_EQ(uncapped, none);
  }
}

}  // namespace
}  // namespace castor
