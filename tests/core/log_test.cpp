// The warning hook: stderr by default, redirected or silenced by the application, and used by the library.
#include <gtest/gtest.h>

#include "castor/grad_scaler.h"
#include "castor/log.h"

namespace castor {

TEST(Log, DefaultIsStderrAndTheHandlerRedirectsOrSilences) {
  testing::internal::CaptureStderr();
  warn("first");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "castor: warning: first\n");

  std::vector<std::string> seen;
  const LogHandler previous = set_log_handler([&](const std::string& m) { seen.push_back(m); });
  testing::internal::CaptureStderr();
  warn("second");
  set_log_handler({});
  warn("third");  // silenced
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(seen, std::vector<std::string>{"second"});
  set_log_handler(previous);
}

// In a fresh process (the warning is given once per process): two bfloat16 scalers warn once, an explicit
// enabled=false says nothing.
TEST(Log, GradScalerSaysOnceThatItIsOffForBFloat16) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto count_warnings = [](bool explicit_off) {
    int seen = 0;
    set_log_handler([&](const std::string& m) { seen += m.find("bfloat16") != std::string::npos; });
    if (explicit_off) {
      amp::GradScaler off({.enabled = false, .dtype = DType::BFloat16});
    } else {
      amp::GradScaler a({.dtype = DType::BFloat16}), b({.dtype = DType::BFloat16});
      if (a.is_enabled()) seen += 10;
    }
    std::exit(seen);
  };
  EXPECT_EXIT(count_warnings(false), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(count_warnings(true), ::testing::ExitedWithCode(0), "");
}

}  // namespace castor
