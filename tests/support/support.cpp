// The tests' scratch directories and command runner.
#include "support/support.h"

#include <unistd.h>

#include <cstdio>

namespace castor::test {

std::string scratch_dir() {
  static const std::string dir = [] {
    const std::string d = std::string(CASTOR_BINARY_DIR) + "/test_scratch/" + std::to_string(getpid());
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    if (ec) ADD_FAILURE() << "cannot create " << d << ": " << ec.message();
    return d;
  }();
  return dir;
}

ScratchDir::ScratchDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  str_ = scratch_dir() + "/" +
         (!name.empty() || info == nullptr ? name : std::string(info->test_suite_name()) + "." + info->name());
  path_ = str_;
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int run_command(const std::string& cmd, std::string* out) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p))
    if (out) out->append(buf, n);
  return ::pclose(p);
}

std::string shell_words(const std::vector<std::string>& args) {
  std::string words;
  for (const std::string& a : args) words += " '" + a + "'";
  return words;
}

std::string on_terminal(const std::string& dir, const std::string& args, int columns) {
  return "cd '" + dir + "' && OMP_WAIT_POLICY=passive script -qec \"stty cols " + std::to_string(columns) + "; '" +
         CASTOR_BINARY_DIR + "/castor' " + args + " >/dev/null\" /dev/null";
}

}  // namespace castor::test
