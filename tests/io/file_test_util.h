// Helpers for file-format tests: scratch directories, raw file writes, error checks and the system Python.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "castor/check.h"

namespace castor::test {

// PyTorch lives in the system interpreter, not in the python3 on PATH.
inline const char* kPython = "/usr/bin/python3";

// A fresh directory under the build tree for the current test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(CASTOR_BINARY_DIR) / "test_scratch" /
            (std::string(info->test_suite_name()) + "." + info->name() + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// Runs `f` and returns the castor::Error message it throws; records a failure when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a castor::Error";
  return "";
}

// Expects `f` to throw a one-line castor::Error containing every part (such as the file name and the problem).
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  std::string msg = error_of(f);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// Runs a command through the shell, returning its exit status and appending its stdout to `out`.
inline int run_command(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    if (out) out->append(buf, n);
  return ::pclose(p);
}

inline std::string oracle(const std::string& script) {
  return std::string(kPython) + " " + CASTOR_SOURCE_DIR + "/tests/oracle/" + script;
}

}  // namespace castor::test
