// Test helpers: running the PyTorch oracle, comparing tensors, float64 finite differences.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "castor/tensor.h"
#include "support/support.h"

namespace castor::test {

// A file's bytes as a string (a castor::Error, failing the test, when it cannot be read).
std::string read_text(const std::string& path);

// Runs `/usr/bin/python3 tests/oracle/<script> args...`; fails the test (returns false) with its output otherwise.
bool run_oracle(const std::string& script, const std::vector<std::string>& args);

// Reads a case an oracle script wrote (per tensor: u32 name length, name, u32 kind (0 float64, 1 int64), u32 ndim,
// i64 dims, data): float tensors as float64, integer ones as int64. Empty (with a test failure) if it is missing.
std::map<std::string, Tensor> read_oracle_case(const std::string& path);

// A tiny learnable CIFAR-10 set in its binary format (label byte + 3x32x32 bytes): data_batch_1..5.bin with
// `per_batch` records each and test_batch.bin with 30; pixels depend on the label, so a model can learn it.
void write_tiny_cifar10(const std::string& dir, int per_batch = 20);

// max |a - b| / (atol + rtol |b|) <= 1, with a message naming the first offending element.
::testing::AssertionResult close(const Tensor& a, const Tensor& b, double rtol, double atol);
// Bit-for-bit equality (NaN payloads aside), with the first differing element in the message.
::testing::AssertionResult bit_equal(const Tensor& a, const Tensor& b);

// Checks the gradients autograd gives f's float64 inputs against central finite differences of sum(f * w)
// for a fixed random weight w.
::testing::AssertionResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                     std::vector<Tensor> inputs, double eps = 1e-6, double tol = 1e-6);

}  // namespace castor::test
