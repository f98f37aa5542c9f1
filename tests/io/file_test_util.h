// Helpers for file-format tests: raw file writes and the system Python (scratch directories, commands and error
// checks: tests/support).
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
#include "support/support.h"

namespace castor::test {

// PyTorch lives in the system interpreter, not in the python3 on PATH.
inline const char* kPython = "/usr/bin/python3";

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::string oracle(const std::string& script) {
  return std::string(kPython) + " " + CASTOR_SOURCE_DIR + "/tests/oracle/" + script;
}

}  // namespace castor::test
