// Tests for the Fashion-MNIST (IDX) and CIFAR-10 readers: real data against Python, and crafted bad files.
#include "castor/datasets.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <numeric>
#include <sstream>

#include "castor/fs.h"
#include "io/file_test_util.h"

namespace castor {
namespace {

using test::expect_error;
using test::ScratchDir;

const std::string kFashionDir = "/usr/share/datasets/fashion-mnist";

uint64_t checksum(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += (i + 1) * p[i];
  return s;
}

void check_against_python(bool train, int64_t expected_n) {
  ImageDataset ds = load_fashion_mnist(kFashionDir, train);
  std::string prefix = kFashionDir + (train ? "/train" : "/t10k");
  std::string out;
  int rc = test::run_command(test::oracle("idx_checksum.py") + " " + prefix + "-images-idx3-ubyte.gz " + prefix +
                                 "-labels-idx1-ubyte.gz 2>&1",
                             &out);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream in(out);
  uint64_t n, h, w, first_image, labels, pixel_sum;
  ASSERT_TRUE(in >> n >> h >> w >> first_image >> labels >> pixel_sum) << out;

  EXPECT_EQ(ds.n, expected_n);
  EXPECT_EQ(uint64_t(ds.n), n);
  EXPECT_EQ(ds.channels, 1);
  EXPECT_EQ(ds.height, 28);
  EXPECT_EQ(ds.width, 28);
  EXPECT_EQ(uint64_t(ds.height), h);
  EXPECT_EQ(uint64_t(ds.width), w);
  EXPECT_EQ(ds.num_classes, 10);
  ASSERT_EQ(ds.images.size(), size_t(ds.n * 28 * 28));
  ASSERT_EQ(ds.labels.size(), size_t(ds.n));
  EXPECT_EQ(checksum(ds.images.data(), 28 * 28), first_image);
  EXPECT_EQ(checksum(ds.labels.data(), ds.labels.size()), labels);
  EXPECT_EQ(std::accumulate(ds.images.begin(), ds.images.end(), uint64_t{0}), pixel_sum);
}

TEST(FashionMnist, TrainMatchesPython) { check_against_python(true, 60000); }
TEST(FashionMnist, TestMatchesPython) { check_against_python(false, 10000); }

std::vector<uint8_t> be32(std::initializer_list<uint32_t> words) {
  std::vector<uint8_t> out;
  for (uint32_t w : words)
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(w >> s));
  return out;
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w) {
  std::vector<uint8_t> out = be32({0x803, n, h, w});
  for (uint32_t i = 0; i < n * h * w; ++i) out.push_back(uint8_t(i * 7));
  return out;
}

std::vector<uint8_t> idx_labels(std::vector<uint8_t> labels) {
  std::vector<uint8_t> out = be32({0x801, uint32_t(labels.size())});
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, in.size()));
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = uInt(in.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::vector<uint8_t> concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Idx, ParsesPlainAndGzip) {
  std::vector<uint8_t> images = idx_images(3, 2, 4);
  for (const auto& bytes :
       {images, gzip(images),
        concat(gzip({images.begin(), images.begin() + 10}), gzip({images.begin() + 10, images.end()}))}) {
    ImageDataset ds = parse_idx_images(bytes, "x");
    EXPECT_EQ(ds.n, 3);
    EXPECT_EQ(ds.channels, 1);
    EXPECT_EQ(ds.height, 2);
    EXPECT_EQ(ds.width, 4);
    EXPECT_EQ(ds.images, std::vector<uint8_t>(images.begin() + 16, images.end()));
  }
  EXPECT_EQ(parse_idx_labels(gzip(idx_labels({0, 9, 3})), 10, "y"), (std::vector<uint8_t>{0, 9, 3}));
  EXPECT_EQ(parse_idx_images(idx_images(0, 28, 28), "empty").n, 0);
}

TEST(Idx, RejectsBadFilesNamingThem) {
  ScratchDir dir;
  std::string path = dir.file("bad-idx");
  auto images = [&](const std::vector<uint8_t>& bytes, const std::string& problem) {
    SCOPED_TRACE(problem);
    test::write_bytes(path, bytes);
    expect_error([&] { parse_idx_images(read_file(path), path); }, {path, problem});
  };
  auto labels = [&](const std::vector<uint8_t>& bytes, const std::string& problem) {
    SCOPED_TRACE(problem);
    test::write_bytes(path, bytes);
    expect_error([&] { parse_idx_labels(read_file(path), 10, path); }, {path, problem});
  };
  std::vector<uint8_t> good = idx_images(2, 3, 3);
  images(be32({0x804, 2, 3, 3}), "bad IDX magic 0x00000804, expected 0x00000803");
  images(idx_labels({1, 2}), "bad IDX magic 0x00000801");
  images({0, 0, 8}, "too short");
  images(be32({0x803, 2, 3}), "too short");
  images({good.begin(), good.end() - 1}, "truncated");
  images(concat(good, {0}), "1 trailing bytes");
  images(gzip({good.begin(), good.end() - 1}), "truncated: the dims need 18 bytes");
  images(concat(gzip(good), {1, 2, 3}), "trailing bytes after the gzip data");
  std::vector<uint8_t> gz = gzip(good);
  images({gz.begin(), gz.end() - 6}, "truncated gzip data");
  gz[gz.size() - 6] ^= 0xff;  // CRC
  images(gz, "corrupt gzip data");
  images({0x1f, 0x8b}, "truncated gzip data");
  images({0x1f, 0x8b, 0, 0, 0, 0, 0, 0, 0, 0}, "corrupt gzip data");
  images(be32({0x803, 0xffffffff, 0xffffffff, 0xffffffff}), "overflow");
  images(be32({0x803, 0xffffffff, 0xffff, 2}), "truncated");
  images(be32({0x803, 1, 0, 5}), "empty");
  labels(be32({0x803, 1}), "bad IDX magic");
  labels(idx_labels({1, 10, 2}), "label 10 at index 1");
  labels(idx_labels({255}), "label 255");
  labels(concat(idx_labels({1}), {1}), "trailing");
  labels(be32({0x801, 5}), "truncated");
  expect_error([&] { read_file(dir.file("missing")); }, {dir.file("missing"), "cannot open"});
}

TEST(FashionMnist, RejectsInconsistentDirectories) {
  ScratchDir dir;
  std::string d = dir.path().string();
  expect_error([&] { load_fashion_mnist(d, true); }, {d, "train-images-idx3-ubyte.gz"});
  test::write_bytes(dir.file("t10k-images-idx3-ubyte"), idx_images(3, 28, 28));
  expect_error([&] { load_fashion_mnist(d, false); }, {d, "t10k-labels-idx1-ubyte.gz"});
  test::write_bytes(dir.file("t10k-labels-idx1-ubyte.gz"), gzip(idx_labels({1, 2})));
  expect_error([&] { load_fashion_mnist(d, false); },
               {dir.file("t10k-labels-idx1-ubyte.gz"), "2 labels", dir.file("t10k-images-idx3-ubyte"), "3 images"});
  test::write_bytes(dir.file("t10k-labels-idx1-ubyte.gz"), gzip(idx_labels({1, 2, 9})));
  EXPECT_EQ(load_fashion_mnist(d, false).labels, (std::vector<uint8_t>{1, 2, 9}));
  test::write_bytes(dir.file("t10k-images-idx3-ubyte"), idx_images(3, 32, 28));
  expect_error([&] { load_fashion_mnist(d, false); }, {dir.file("t10k-images-idx3-ubyte"), "32x28"});
}

// `n` CIFAR-10 records whose labels and pixels derive from `seed`.
std::vector<uint8_t> cifar_records(int n, int seed) {
  std::vector<uint8_t> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(uint8_t((seed + r) % 10));
    for (int i = 0; i < 3072; ++i) out.push_back(uint8_t(seed * 31 + r * 7 + i));
  }
  return out;
}

TEST(Cifar10, LoadsTrainAndTestBatches) {
  ScratchDir dir;
  for (int b = 1; b <= 5; ++b)
    test::write_bytes(dir.file("data_batch_" + std::to_string(b) + ".bin"), cifar_records(2, b));
  test::write_bytes(dir.file("test_batch.bin"), cifar_records(3, 9));
  ImageDataset train = load_cifar10(dir.path().string(), true);
  EXPECT_EQ(train.n, 10);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.width, 32);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_EQ(train.labels, (std::vector<uint8_t>{1, 2, 2, 3, 3, 4, 4, 5, 5, 6}));
  ASSERT_EQ(train.images.size(), 10u * 3072);
  std::vector<uint8_t> third = cifar_records(2, 2);  // records 2 and 3 come from data_batch_2
  EXPECT_TRUE(std::equal(third.begin() + 1, third.begin() + 3073, train.images.begin() + 2 * 3072));
  ImageDataset test = load_cifar10(dir.path().string(), false);
  EXPECT_EQ(test.n, 3);
  EXPECT_EQ(test.labels, (std::vector<uint8_t>{9, 0, 1}));
}

TEST(Cifar10, RejectsBadFilesNamingThem) {
  ScratchDir dir;
  std::string d = dir.path().string();
  for (int b = 1; b <= 5; ++b)
    test::write_bytes(dir.file("data_batch_" + std::to_string(b) + ".bin"), cifar_records(1, b));
  std::filesystem::remove(dir.file("data_batch_3.bin"));
  expect_error([&] { load_cifar10(d, true); }, {dir.file("data_batch_3.bin"), "missing", kCifar10Url,
                                                "data_batch_1.bin .. data_batch_5.bin, test_batch.bin"});
  expect_error([&] { load_cifar10(d, false); }, {dir.file("test_batch.bin"), "missing", kCifar10Url});
  std::string path = dir.file("test_batch.bin");
  auto check = [&](const std::vector<uint8_t>& bytes, const std::string& problem) {
    SCOPED_TRACE(problem);
    test::write_bytes(path, bytes);
    expect_error([&] { load_cifar10(d, false); }, {path, problem});
  };
  std::vector<uint8_t> good = cifar_records(2, 0);
  check({}, "size 0 is not a positive multiple of the 3073-byte");
  check({good.begin(), good.end() - 1}, "size 6145");
  check(concat(good, {0}), "size 6147");
  good[3073] = 10;
  check(good, "label 10 of record 1");
}

}  // namespace
}  // namespace castor
