// Reading the optim oracle's raw little-endian result files (tests/oracle/optim_oracle.py).
#pragma once
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "castor/tensor.h"
#include "test_util.h"

namespace castor::test {

// The tensor in `<dir>/<name>.bin`, which must hold exactly shape's elements of dtype.
inline Tensor read_oracle_tensor(const std::string& dir, const std::string& name, const Shape& shape,
                                 DType dtype = DType::Float32) {
  const std::string path = dir + "/" + name + ".bin";
  std::ifstream f(path, std::ios::binary);
  CASTOR_CHECK(f.good(), "cannot open oracle file ", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CASTOR_CHECK(bytes.size() == static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), "oracle file ", path,
               " has ", bytes.size(), " bytes, expected ", dtype_name(dtype), shape_str(shape));
  return from_blob(bytes.data(), shape, dtype);
}

// Runs `optim_oracle.py <mode> <json> <dir>`, writing into the scratch directory `dir`.
inline void run_optim_oracle(const std::string& mode, const std::string& json, const ScratchDir& dir) {
  EXPECT_TRUE(run_oracle("optim_oracle.py", {mode, json, dir}));
}

}  // namespace castor::test
