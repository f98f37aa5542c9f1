// Tests for the safetensors reader/writer: round trips, every rejection rule, crash safety and PyTorch interop.
#include "castor/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "castor/fs.h"
#include "io/file_test_util.h"

namespace castor {
namespace {

using test::expect_error;
using test::ScratchDir;

// A tensor owning its bytes.
struct Blob {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  SafetensorsTensor view() const { return {name, dtype, shape, bytes.data(), bytes.size()}; }
};

template <class T>
Blob raw(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<T> values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return {std::move(name), dtype, std::move(shape), std::move(bytes)};
}

template <class T>
Blob blob(std::string name, std::vector<int64_t> shape, std::vector<T> values) {
  return raw(std::move(name), dtype_of<T>(), std::move(shape), std::move(values));
}

std::vector<SafetensorsTensor> views(const std::vector<Blob>& blobs) {
  std::vector<SafetensorsTensor> out;
  for (const Blob& b : blobs) out.push_back(b.view());
  return out;
}

const std::map<std::string, std::string> kMetadata = {{"producer", "castor"},
                                                      {"note", "caf\xc3\xa9 \xf0\x9f\xa6\xab \"quoted\""}};

// The same tensors as expected() in tests/oracle/safetensors_io.py, f16/bf16 given as the bits torch produces.
std::vector<Blob> oracle_tensors() {
  const float inf = std::numeric_limits<float>::infinity();
  const double dinf = std::numeric_limits<double>::infinity();
  auto f = [](double d) { return static_cast<float>(d); };  // torch rounds Python floats via double, too
  return {
      blob<float>("f32", {2, 4}, {f(0.1), f(-1e-30), f(3.4e38), -0.0f, inf, f(1e-45), f(1.0 / 3), -7.0f}),
      raw<uint16_t>("f16", DType::Float16, {4, 2}, {0xC100, 0x3C00, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x2E66, 0x3555}),
      raw<uint16_t>("bf16", DType::BFloat16, {2, 2, 2},
                    {0xC020, 0x3F80, 0x7F7F, 0x0001, 0x8000, 0x7F80, 0x3DCD, 0x3EAB}),
      blob<double>("f64", {3, 2}, {0.1, -1e300, 5e-324, -0.0, dinf, 1.0 / 3}),
      blob<int64_t>("i64", {4}, {std::numeric_limits<int64_t>::min(), -1, 0, std::numeric_limits<int64_t>::max()}),
      blob<int32_t>("i32", {2, 2}, {std::numeric_limits<int32_t>::min(), -7, 0, std::numeric_limits<int32_t>::max()}),
      blob<uint8_t>("u8", {1, 2, 3}, {0, 1, 127, 128, 255, 42}),
      raw<uint8_t>("bool", DType::Bool, {5}, {1, 0, 0, 1, 1}),
      blob<float>("rank0", {}, {2.5f}),
      raw<uint16_t>("empty", DType::Float16, {0, 3}, {}),
  };
}

void expect_matches(const SafetensorsFile& f, const std::vector<Blob>& blobs) {
  ASSERT_EQ(f.entries.size(), blobs.size());
  for (const Blob& b : blobs) {
    SCOPED_TRACE(b.name);
    const SafetensorsEntry* e = f.find(b.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, b.dtype);
    EXPECT_EQ(e->shape, b.shape);
    ASSERT_EQ(e->end - e->begin, b.bytes.size());
    EXPECT_EQ(std::vector<uint8_t>(f.data(*e), f.data(*e) + b.bytes.size()), b.bytes);
  }
}

// One tensor of every dtype, plus zero-size and rank-0 ones.
std::vector<Blob> every_dtype() {
  std::vector<Blob> out;
  for (int i = 0; i < kNumDTypes; ++i) {
    auto d = static_cast<DType>(i);
    std::string name = traits(d).safetensors_name;
    std::vector<uint8_t> bytes(6 * dtype_size(d));
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = d == DType::Bool ? k % 2 : static_cast<uint8_t>(k * 37 + i);
    out.push_back({name, d, {2, 3}, bytes});
    out.push_back({name + "_empty", d, {3, 0, 2}, {}});
    out.push_back({name + "_scalar", d, {}, std::vector<uint8_t>(bytes.begin(), bytes.begin() + dtype_size(d))});
  }
  return out;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  ScratchDir dir;
  std::vector<Blob> blobs = every_dtype();
  write_safetensors(dir.file("a.safetensors"), views(blobs), kMetadata);
  SafetensorsFile f = read_safetensors(dir.file("a.safetensors"));
  expect_matches(f, blobs);
  EXPECT_EQ(f.metadata, kMetadata);
  for (size_t i = 1; i < f.entries.size(); ++i) EXPECT_LT(f.entries[i - 1].name, f.entries[i].name);  // sorted
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.find("F32_scalar")->numel(), 1);
  EXPECT_EQ(f.find("F32_empty")->numel(), 0);
}

TEST(Safetensors, WriterIsDeterministicAndPadsTheHeader) {
  std::vector<Blob> blobs = every_dtype();
  std::vector<uint8_t> a = serialize_safetensors(views(blobs), kMetadata, "a");
  std::reverse(blobs.begin(), blobs.end());
  EXPECT_EQ(serialize_safetensors(views(blobs), kMetadata, "b"), a);
  uint64_t n;
  std::memcpy(&n, a.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(a[8], '{');
  SafetensorsFile f = parse_safetensors(a.data(), a.size(), "memory");
  expect_matches(f, blobs);

  std::vector<uint8_t> empty = serialize_safetensors({}, {}, "empty");
  EXPECT_EQ(std::string(empty.begin() + 8, empty.end()), "{}      ");
  EXPECT_TRUE(parse_safetensors(empty.data(), empty.size(), "empty").entries.empty());
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  ScratchDir dir;
  std::string path = dir.file("w.safetensors");
  std::vector<float> v(6);
  auto write = [&](std::vector<SafetensorsTensor> ts) { write_safetensors(path, ts); };
  expect_error([&] { write({{"a", DType::Float32, {2, 3}, v.data(), 20}}); }, {path, "\"a\"", "24"});
  expect_error([&] { write({{"a", DType::Float32, {-1}, v.data(), 4}}); }, {path, "negative"});
  expect_error(
      [&] {
        write({{"a", DType::Float32, {6}, v.data(), 24}, {"a", DType::Float32, {6}, v.data(), 24}});
      },
      {path, "duplicate"});
  expect_error([&] { write({{"__metadata__", DType::Float32, {6}, v.data(), 24}}); }, {path, "reserved"});
  expect_error([&] { write({{"a", DType::Float32, {6}, nullptr, 24}}); }, {path, "null"});
  EXPECT_FALSE(file_exists(path));
}

// A crafted file: the u64 header length (`n`, or the real length), the header text, then `data`.
std::vector<uint8_t> crafted(const std::string& header, size_t data_bytes = 0, int64_t n = -1) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0xAB);
  uint64_t len = n < 0 ? header.size() : static_cast<uint64_t>(n);
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

TEST(Safetensors, RejectsBadFilesNamingThem) {
  ScratchDir dir;
  std::string path = dir.file("bad.safetensors");
  auto check = [&](const std::vector<uint8_t>& bytes, const std::string& problem) {
    SCOPED_TRACE(problem);
    test::write_bytes(path, bytes);
    expect_error([&] { read_safetensors(path); }, {path, problem});
    expect_error([&] { parse_safetensors(bytes.data(), bytes.size(), "buffer"); }, {"buffer: ", problem});
  };
  std::string f32_a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  auto obj = [](const std::string& s) { return "{" + s + "}"; };

  check({1, 2, 3}, "too short");
  check({}, "too short");
  check(crafted("{}", 0, 100'000'001), "exceeds the limit");
  check(crafted("{}", 0, 3), "runs past the end");
  check(crafted("{\"a\xff\": 1}"), "not valid UTF-8");
  check(crafted("{\"a\": }"), "invalid JSON");
  check(crafted("{\"a\": 1,}"), "invalid JSON");
  check(crafted("[]"), "not a JSON object");
  check(crafted("\"x\""), "not a JSON object");
  check(crafted(R"({"a": 1})"), "entry is not an object");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2]}})"), "needs");
  check(crafted(R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", 8), "needs");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}})", 8), "unknown field");
  check(crafted(R"({"a": {"dtype": 3, "shape": [2], "data_offsets": [0, 8]}})", 8), "dtype is not a string");
  check(crafted(R"({"a": {"dtype": "F8", "shape": [2], "data_offsets": [0, 8]}})", 8), "unknown dtype \"F8\"");
  check(crafted(R"({"a": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}})", 8), "unknown dtype");
  check(crafted(R"({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", 8), "shape is not an array");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", 8), "non-negative integers");
  check(crafted(R"({"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})", 8), "non-negative integers");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8), "non-negative integers");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8), "data_offsets must be");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}})", 8), "data_offsets must be");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": {}}})", 8), "data_offsets must be");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8), "data_offsets must be");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 8), "data_offsets must be");
  check(crafted(R"({"a": {"dtype": "U8", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})"),
        "overflows int64");
  check(crafted(R"({"a": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})"),
        "overflows int64");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4), "need 8");
  check(crafted(R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 8]}})", 8), "need 4");
  // Offsets must tile the buffer from 0 in order of begin.
  check(crafted(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8), "hole after byte 0");
  check(crafted(obj(f32_a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]})"), 16),
        "hole after byte 8");
  check(crafted(obj(f32_a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]})"), 12), "overlapping");
  check(crafted(obj(f32_a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})"), 8), "overlapping");
  check(crafted(obj(f32_a), 10), "2 bytes left over");
  check(crafted(obj(f32_a), 5), "truncated");
  check(crafted("{}", 1), "1 bytes left over");
  check(crafted(obj(f32_a + ", " + f32_a), 8), "duplicate key \"a\"");
  check(crafted(R"({"__metadata__": {"k": 1}})"), "__metadata__ value of \"k\" is not a string");
  check(crafted(R"({"__metadata__": ["k"]})"), "__metadata__ is not an object");
}

TEST(Safetensors, AcceptsValidEdgeCases) {
  // Zero-size tensors anywhere (sharing offsets), rank-0 tensors, space padding, metadata only.
  std::string header = R"({"z": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [2, 2]},
    "s": {"dtype": "U8", "shape": [], "data_offsets": [1, 2]},
    "e": {"dtype": "I64", "shape": [0], "data_offsets": [0, 0]},
    "b": {"dtype": "BOOL", "shape": [1, 1], "data_offsets": [0, 1]},
    "__metadata__": {}}     )";
  std::vector<uint8_t> bytes = crafted(header, 2);
  SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size(), "edge");
  ASSERT_EQ(f.entries.size(), 4u);
  EXPECT_EQ(f.entries[0].name, "e");  // data order
  EXPECT_EQ(f.entries[1].name, "b");
  EXPECT_EQ(f.entries[2].name, "s");
  EXPECT_EQ(f.entries[3].name, "z");
  EXPECT_TRUE(f.find("s")->shape.empty());
  EXPECT_EQ(f.bytes.size(), 2u);
  std::vector<uint8_t> meta = crafted(R"({"__metadata__": {"a": "b"}})");
  EXPECT_EQ(parse_safetensors(meta.data(), meta.size(), "meta").metadata.at("a"), "b");
}

TEST(Safetensors, AtomicWriteFailuresLeaveTheOldFile) {
  ScratchDir dir;
  expect_error([&] { atomic_write_file(dir.file("no/such/dir/x"), std::vector<uint8_t>{1}); },
               {dir.file("no/such/dir/x"), "cannot create a temp file"});
  std::filesystem::create_directory(dir.file("target_is_dir"));
  expect_error([&] { atomic_write_file(dir.file("target_is_dir"), std::vector<uint8_t>{1}); },
               {dir.file("target_is_dir"), "is a directory"});

  // A full disk, simulated with a file-size limit (writes past it fail with EFBIG).
  std::string path = dir.file("keep.bin");
  std::vector<uint8_t> old_bytes = {1, 2, 3};
  atomic_write_file(path, old_bytes);
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg = test::error_of([&] { atomic_write_file(path, std::vector<uint8_t>(4096, 7)); });
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(path + ": write failed"), std::string::npos) << msg;
  EXPECT_EQ(read_file(path), old_bytes);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "a temp file was left behind";

  atomic_write_file(path, std::vector<uint8_t>{9});
  EXPECT_EQ(read_file(path), std::vector<uint8_t>{9});
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all, std::filesystem::perms(0644));
}

// Castor writes, PyTorch (through the independent oracle script) reads and compares bit for bit.
TEST(SafetensorsInterop, PytorchReadsCastorFiles) {
  ScratchDir dir;
  std::string path = dir.file("castor.safetensors");
  write_safetensors(path, views(oracle_tensors()), kMetadata);
  std::string out;
  int rc = test::run_command(test::oracle("safetensors_io.py") + " verify " + path + " 2>&1", &out);
  EXPECT_EQ(rc, 0) << out;
}

// PyTorch writes (reverse name order, unpadded header, \u-escaped metadata), Castor reads the same bits.
TEST(SafetensorsInterop, CastorReadsPytorchFiles) {
  ScratchDir dir;
  std::string path = dir.file("torch.safetensors");
  std::string out;
  int rc = test::run_command(test::oracle("safetensors_io.py") + " write " + path + " 2>&1", &out);
  ASSERT_EQ(rc, 0) << out;
  SafetensorsFile f = read_safetensors(path);
  expect_matches(f, oracle_tensors());
  EXPECT_EQ(f.metadata, kMetadata);
  EXPECT_EQ(f.entries.front().name, "u8");  // data order, as torch laid it out
}

}  // namespace
}  // namespace castor
