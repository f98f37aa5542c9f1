// What the tests share to set up and observe: one scratch directory type, one way to run a command or the castor
// binary (CastorProcess in tests/train/run_test_util.h for whole runs), one helper for error messages.
#pragma once
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "castor/check.h"

namespace castor::test {

// This test process's scratch root, build/test_scratch/<pid> (created on first use).
std::string scratch_dir();

// A scratch directory of one test: scratch_dir()/<name> (by default the current test's "Suite.Test"), emptied and
// created, and removed with the object. It reads as its path: `dir + "/file"`, or passed as a std::string.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name = "");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  const std::string& str() const { return str_; }
  operator const std::string&() const { return str_; }             // NOLINT: a scratch directory is used as its path
  operator const std::filesystem::path&() const { return path_; }  // NOLINT

 private:
  std::filesystem::path path_;
  std::string str_;
};
inline std::string operator+(const ScratchDir& dir, const std::string& tail) { return dir.str() + tail; }
inline std::string operator+(const ScratchDir& dir, const char* tail) { return dir.str() + tail; }
inline std::string operator+(const std::string& head, const ScratchDir& dir) { return head + dir.str(); }
inline std::string operator+(const char* head, const ScratchDir& dir) { return head + dir.str(); }
inline std::ostream& operator<<(std::ostream& os, const ScratchDir& dir) { return os << dir.str(); }

// Runs `cmd` through the shell; returns its exit status (as pclose gives it) and appends its stdout to `out`.
int run_command(const std::string& cmd, std::string* out = nullptr);
// `args` single-quoted for the shell, each after a space.
std::string shell_words(const std::vector<std::string>& args);
// The shell command that runs `castor ARGS` (already quoted) in `dir` on a pseudo-terminal `columns` wide (through
// script(1)), its stdout discarded: what the terminal receives is the command's stdout.
std::string on_terminal(const std::string& dir, const std::string& args, int columns);

// The castor::Error message `f` throws; "no error", with a test failure, when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a castor::Error";
  return "no error";
}

// Expects `f` to throw a one-line castor::Error containing every part (such as the file name and the problem).
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  const std::string msg = error_of(f);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace castor::test
