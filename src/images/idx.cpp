// IDX (MNIST-format) image and label files, plain or gzip-compressed, and the Fashion-MNIST loader.
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include "castor/check.h"
#include "castor/datasets.h"
#include "castor/fs.h"

namespace castor {
namespace {

constexpr size_t kMaxInflatedBytes = size_t(1) << 30;

bool is_gzip(std::span<const uint8_t> b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

// Inflates one or more concatenated gzip members; trailing non-gzip bytes, truncation and corruption are errors.
std::vector<uint8_t> gunzip(std::span<const uint8_t> in, const std::string& what) {
  CASTOR_CHECK(in.size() <= UINT_MAX, what, ": gzip file too large");
  z_stream zs{};
  CASTOR_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, what, ": cannot initialize zlib");
  struct End {
    z_stream* zs;
    ~End() { inflateEnd(zs); }
  } end{&zs};
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  std::vector<uint8_t> out;
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) {
      CASTOR_CHECK(out.size() < kMaxInflatedBytes, what, ": decompresses to more than ", kMaxInflatedBytes, " bytes");
      out.resize(std::max<size_t>(1 << 16, 2 * out.size()));
    }
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT_MAX));
    uInt avail = zs.avail_out;
    int ret = inflate(&zs, Z_NO_FLUSH);
    produced += avail - zs.avail_out;
    if (ret == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      CASTOR_CHECK(is_gzip({zs.next_in, zs.avail_in}), what, ": ", zs.avail_in, " trailing bytes after the gzip data");
      CASTOR_CHECK(inflateReset(&zs) == Z_OK, what, ": cannot reset zlib");
      continue;
    }
    CASTOR_CHECK(ret != Z_BUF_ERROR, what, ": truncated gzip data");
    CASTOR_CHECK(ret == Z_OK, what, ": corrupt gzip data: ", zs.msg ? zs.msg : "unknown zlib error");
  }
  out.resize(produced);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// Checks the magic number and that the data after the header holds exactly the product of the dims; returns
// the dims and points `data` at the payload.
std::vector<uint32_t> idx_header(std::span<const uint8_t> b, uint32_t magic, const std::string& what,
                                 const uint8_t** data) {
  size_t ndims = magic & 0xff;
  size_t header = 4 + 4 * ndims;
  CASTOR_CHECK(b.size() >= 4, what, ": ", b.size(), " bytes, too short for an IDX magic number");
  CASTOR_CHECK(be32(b.data()) == magic, what, ": bad IDX magic ", hex32(be32(b.data())), ", expected ", hex32(magic));
  CASTOR_CHECK(b.size() >= header, what, ": ", b.size(), " bytes, too short for an IDX header of ", header);
  std::vector<uint32_t> dims;
  uint64_t total = 1;
  for (size_t i = 0; i < ndims; ++i) {
    dims.push_back(be32(b.data() + 4 + 4 * i));
    CASTOR_CHECK(!__builtin_mul_overflow(total, dims.back(), &total), what, ": IDX dims overflow");
  }
  uint64_t have = b.size() - header;
  CASTOR_CHECK(have >= total, what, ": truncated: the dims need ", total, " bytes of data, file holds ", have);
  CASTOR_CHECK(have == total, what, ": ", have - total, " trailing bytes after the ", total, " bytes of data");
  *data = b.data() + header;
  return dims;
}

// The bytes of `b`, inflated first when they are gzip-compressed.
std::span<const uint8_t> decompressed(std::span<const uint8_t> b, std::vector<uint8_t>& storage,
                                      const std::string& what) {
  if (!is_gzip(b)) return b;
  storage = gunzip(b, what);
  return storage;
}

std::string existing_path(const std::string& dir, const std::string& name) {
  std::string path = dir + "/" + name;
  if (file_exists(path)) return path;
  CASTOR_CHECK(file_exists(path + ".gz"), dir, ": neither ", name, " nor ", name, ".gz exists");
  return path + ".gz";
}

}  // namespace

ImageDataset parse_idx_images(std::span<const uint8_t> bytes, const std::string& what) {
  std::vector<uint8_t> storage;
  const uint8_t* data;
  std::vector<uint32_t> dims = idx_header(decompressed(bytes, storage, what), 0x00000803, what, &data);
  CASTOR_CHECK(dims[1] > 0 && dims[2] > 0, what, ": image size ", dims[1], "x", dims[2], " is empty");
  ImageDataset ds;
  ds.n = dims[0];
  ds.channels = 1;
  ds.height = dims[1];
  ds.width = dims[2];
  ds.images.assign(data, data + ds.n * ds.height * ds.width);
  return ds;
}

std::vector<uint8_t> parse_idx_labels(std::span<const uint8_t> bytes, int num_classes, const std::string& what) {
  std::vector<uint8_t> storage;
  const uint8_t* data;
  std::vector<uint32_t> dims = idx_header(decompressed(bytes, storage, what), 0x00000801, what, &data);
  std::vector<uint8_t> labels(data, data + dims[0]);
  for (size_t i = 0; i < labels.size(); ++i)
    CASTOR_CHECK(labels[i] < num_classes, what, ": label ", int(labels[i]), " at index ", i, " is not below ",
                 num_classes);
  return labels;
}

ImageDataset load_fashion_mnist(const std::string& dir, bool train) {
  std::string prefix = train ? "train" : "t10k";
  std::string images_path = existing_path(dir, prefix + "-images-idx3-ubyte");
  std::string labels_path = existing_path(dir, prefix + "-labels-idx1-ubyte");
  ImageDataset ds = parse_idx_images(read_file(images_path), images_path);
  CASTOR_CHECK(ds.height == 28 && ds.width == 28, images_path, ": images are ", ds.height, "x", ds.width,
               ", expected 28x28");
  ds.num_classes = 10;
  ds.labels = parse_idx_labels(read_file(labels_path), ds.num_classes, labels_path);
  CASTOR_CHECK(int64_t(ds.labels.size()) == ds.n, labels_path, ": ", ds.labels.size(), " labels, but ", images_path,
               " holds ", ds.n, " images");
  return ds;
}

}  // namespace castor
