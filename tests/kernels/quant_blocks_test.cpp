// The block-type table (castor/quant.h) against its oracles, row by row: ggml itself (node-llama-cpp's prebuilt
// libggml-base.so, reached with dlopen: ggml_quantize_chunk, dequantize_row_*) for GGUF's types, and bitsandbytes'
// algorithm in numpy (tests/oracle/nf4_oracle.py) for NF4.
#include <dlfcn.h>
#include <glob.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "castor/half.h"
#include "castor/quant.h"
#include "test_util.h"

namespace castor {
namespace {

using quant::BlockType;
using quant::BlockTypeInfo;

// libggml-base.so of node-llama-cpp's linux-x64 package (scripts/setup_tests.sh installs it).
struct Ggml {
  void* lib = nullptr;
  size_t (*quantize_chunk)(int type, const float* src, void* dst, int64_t start, int64_t nrows, int64_t n_per_row,
                           const float* imatrix) = nullptr;
  size_t (*row_size)(int type, int64_t n) = nullptr;
  std::string error;

  Ggml() {
    const std::string pattern =
        std::string(CASTOR_SOURCE_DIR) +
        "/third_party/npm-llama-cpp/node_modules/@node-llama-cpp/linux-x64/bins/*/libggml-base.so";
    glob_t g{};
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0)
      lib = dlopen(g.gl_pathv[0], RTLD_NOW | RTLD_LOCAL);
    globfree(&g);
    if (!lib) {
      error = "cannot load " + pattern + " (scripts/setup_tests.sh installs it): " + (dlerror() ? dlerror() : "");
      return;
    }
    quantize_chunk = reinterpret_cast<decltype(quantize_chunk)>(dlsym(lib, "ggml_quantize_chunk"));
    row_size = reinterpret_cast<decltype(row_size)>(dlsym(lib, "ggml_row_size"));
  }
  // ggml's float32 view of n values of `type` (dequantize_row_<name>, or its 16-bit row conversions).
  using ToFloat = void (*)(const void*, float*, int64_t);
  ToFloat to_float(const BlockTypeInfo& t) const {
    const std::string name = t.id == BlockType::F16    ? "ggml_fp16_to_fp32_row"
                             : t.id == BlockType::BF16 ? "ggml_bf16_to_fp32_row"
                                                       : "dequantize_row_" + ggml_name(t);
    return reinterpret_cast<ToFloat>(dlsym(lib, name.c_str()));
  }
  static std::string ggml_name(const BlockTypeInfo& t) {  // dequantize_row_q4_K: ggml spells K upper case
    std::string n = t.name;
    if (n.back() == 'k') n.back() = 'K';
    return n;
  }
};

const Ggml& ggml() {
  static const Ggml g;
  return g;
}

// The GGUF rows of the table (everything but NF4).
std::vector<const BlockTypeInfo*> gguf_rows() {
  std::vector<const BlockTypeInfo*> rows;
  for (const BlockTypeInfo& t : quant::block_types())
    if (t.id != BlockType::NF4) rows.push_back(&t);
  return rows;
}

// The float16 fields (scales and mins) of each type's block, by byte offset: the edge blocks set them.
const std::map<BlockType, std::vector<int>> kScaleFields = {
    {BlockType::Q4_0, {0}},    {BlockType::Q4_1, {0, 2}},   {BlockType::Q5_0, {0}},   {BlockType::Q5_1, {0, 2}},
    {BlockType::Q8_0, {0}},    {BlockType::Q2_K, {80, 82}}, {BlockType::Q3_K, {108}}, {BlockType::Q4_K, {0, 2}},
    {BlockType::Q5_K, {0, 2}}, {BlockType::Q6_K, {208}},    {BlockType::F16, {0}},    {BlockType::BF16, {0}},
    {BlockType::F32, {}},
};

std::vector<float> matrix(int64_t n, int kind, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::student_t_distribution<float> heavy(3);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = kind == 0 ? normal(rng) * 0.02f : kind == 1 ? uniform(rng) + 0.3f : heavy(rng);
  return x;
}

// Equal bits, or NaN both (ggml and castor may quiet a NaN's payload differently).
::testing::AssertionResult same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure()
             << "value " << i << " (block " << i << "): " << got[i] << " vs ggml's " << want[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(QuantBlocks, TableMatchesGgmlRowSizes) {
  const Ggml& g = ggml();
  ASSERT_TRUE(g.lib && g.row_size) << g.error;
  for (const BlockTypeInfo* t : gguf_rows()) {
    SCOPED_TRACE(t->name);
    EXPECT_EQ(static_cast<int64_t>(g.row_size(static_cast<int>(t->id), 4096)), quant::row_bytes(t->id, 4096));
    EXPECT_EQ(quant::find_block_type(t->name), t);
  }
  EXPECT_EQ(quant::find_block_type("Q4_K_M"), nullptr);
}

// Dequantization equals ggml's bit for bit: on ggml's own blocks of random matrices, on blocks of random bytes
// (any scale, NaN and infinity included), and on ggml's blocks with each scale field set to 0, the smallest and
// largest float16 denormals, +-infinity and the largest finite float16.
TEST(QuantBlocks, DequantizeEqualsGgml) {
  const Ggml& g = ggml();
  ASSERT_TRUE(g.lib && g.quantize_chunk) << g.error;
  std::mt19937 rng(46);
  const int64_t rows = 4, cols = 1024, n = rows * cols;
  for (const BlockTypeInfo* t : gguf_rows()) {
    SCOPED_TRACE(t->name);
    const Ggml::ToFloat ref = g.to_float(*t);
    ASSERT_TRUE(ref || t->id == BlockType::F32) << "ggml has no dequantizer for " << t->name;
    const int64_t bytes = quant::row_bytes(t->id, n);
    std::vector<std::vector<uint8_t>> cases;
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> x = matrix(n, kind, rng);
      std::vector<uint8_t> blocks(static_cast<size_t>(bytes));
      g.quantize_chunk(static_cast<int>(t->id), x.data(), blocks.data(), 0, rows, cols, nullptr);
      cases.push_back(blocks);
    }
    std::vector<uint8_t> noise(static_cast<size_t>(bytes));
    for (uint8_t& b : noise) b = static_cast<uint8_t>(rng());
    cases.push_back(noise);
    for (uint16_t edge : {0x0000, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7bff}) {
      std::vector<uint8_t> blocks = cases[0];
      for (int64_t b = 0; b < bytes; b += t->bytes)
        for (int field : kScaleFields.at(t->id)) {
          if (t->id == BlockType::F32) continue;
          const uint16_t v = t->id == BlockType::BF16 ? float_to_bf16_bits(half_bits_to_float(edge)) : edge;
          std::memcpy(&blocks[static_cast<size_t>(b + field)], &v, 2);
        }
      cases.push_back(blocks);
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE("case " + std::to_string(c));
      std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      t->dequantize(cases[c].data(), got.data(), n);
      if (ref)
        ref(cases[c].data(), want.data(), n);
      else
        std::memcpy(want.data(), cases[c].data(), static_cast<size_t>(bytes));
      ASSERT_TRUE(same_floats(got, want));
    }
  }
}

// Castor's quantizers against llama-quantize's (ggml_quantize_chunk without an importance matrix): the squared error
// of each matrix at most 1.02 times ggml's, on normal, shifted uniform and heavy-tailed (Student's t) weights; being
// the same algorithms, they give ggml's blocks byte for byte.
TEST(QuantBlocks, QuantizeErrorWithinGgmls) {
  const Ggml& g = ggml();
  ASSERT_TRUE(g.lib && g.quantize_chunk) << g.error;
  std::mt19937 rng(4646);
  const int64_t rows = 16, cols = 2048, n = rows * cols;
  for (const BlockTypeInfo* t : gguf_rows()) {
    const int64_t bytes = quant::row_bytes(t->id, n);
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(std::string(t->name) + " matrix " + std::to_string(kind));
      const std::vector<float> x = matrix(n, kind, rng);
      std::vector<uint8_t> ours(static_cast<size_t>(bytes)), theirs(static_cast<size_t>(bytes));
      for (int64_t r = 0; r < rows; ++r) t->quantize(x.data() + r * cols, ours.data() + r * bytes / rows, cols);
      g.quantize_chunk(static_cast<int>(t->id), x.data(), theirs.data(), 0, rows, cols, nullptr);
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      t->dequantize(ours.data(), a.data(), n);
      t->dequantize(theirs.data(), b.data(), n);
      double ea = 0, eb = 0;
      for (int64_t i = 0; i < n; ++i) {
        ea += (static_cast<double>(a[i]) - x[i]) * (static_cast<double>(a[i]) - x[i]);
        eb += (static_cast<double>(b[i]) - x[i]) * (static_cast<double>(b[i]) - x[i]);
      }
      EXPECT_LE(ea, 1.02 * eb) << "castor's squared error " << ea << ", ggml's " << eb;
      if (t->id != BlockType::F32) EXPECT_GT(ea, 0.0) << "no quantization error at all: the matrix was not quantized";
      // (llama-quantize's own algorithms, so the same blocks: pinned ggml, no contraction of products)
      EXPECT_TRUE(ours == theirs) << "blocks differ from ggml's";
    }
  }
}

std::vector<float> read_floats(const std::string& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return v;
}

// NF4 equals bitsandbytes' algorithm (nf4_oracle.py) bit for bit, with and without double quantization: through the
// table's row (blocks with their absmax) and through a quantized matrix (rows dequantized in two ranges).
TEST(QuantBlocks, Nf4EqualsBitsandbytes) {
  test::ScratchDir dir;
  std::mt19937 rng(2305);
  const int64_t rows = 96, cols = 448, n = rows * cols;  // 672 blocks: three double-quantization blocks, one short
  std::vector<float> x = matrix(n, 2, rng);
  for (int64_t i = 0; i < 64; ++i) x[static_cast<size_t>(64 + i)] = 0;  // an all-zero block
  x[500] = 1e30f;                                                       // a block with a huge absmax
  {
    std::ofstream f(dir.file("x.f32"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), n * 4);
  }
  ASSERT_TRUE(test::run_oracle("nf4_oracle.py", {dir.file("x.f32"), dir}));
  const std::vector<float> plain = read_floats(dir.file("plain.f32"), n), dq = read_floats(dir.file("double.f32"), n);
  const BlockTypeInfo& t = quant::block_type(BlockType::NF4);
  std::vector<uint8_t> blocks(static_cast<size_t>(quant::row_bytes(BlockType::NF4, n)));
  t.quantize(x.data(), blocks.data(), n);
  std::vector<float> got(static_cast<size_t>(n));
  t.dequantize(blocks.data(), got.data(), n);
  EXPECT_TRUE(same_floats(got, plain));
  for (bool double_quant : {false, true}) {
    SCOPED_TRACE(double_quant ? "double quantization" : "fp32 absmax");
    const quant::QuantizedMatrix q = quant::quantize_matrix(x.data(), rows, cols, BlockType::NF4, double_quant);
    std::fill(got.begin(), got.end(), 0.0f);
    quant::dequantize_rows(q, 0, 37, got.data());
    quant::dequantize_rows(q, 37, rows, got.data() + 37 * cols);
    EXPECT_TRUE(same_floats(got, double_quant ? dq : plain));
    EXPECT_EQ(q.bytes(), double_quant ? n / 2 + n / 64 + 4 * 3 + 4 : n / 64 * 36);
  }
}

TEST(QuantBlocks, RowsNotWholeBlocksAreErrors) {
  std::vector<float> x(100);
  test::expect_error([&] { quant::quantize_matrix(x.data(), 1, 100, BlockType::Q4_K); }, {"q4_k", "100", "256"});
  test::expect_error([&] { quant::quantize_matrix(x.data(), 1, 64, BlockType::Q8_0, true); }, {"double", "q8_0"});
}

}  // namespace
}  // namespace castor
