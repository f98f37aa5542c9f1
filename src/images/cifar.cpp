// CIFAR-10 binary batches: records of one label byte followed by 3x32x32 channel-major pixels.
#include "castor/check.h"
#include "castor/datasets.h"
#include "castor/fs.h"

namespace castor {
namespace {

constexpr int64_t kChannels = 3, kSide = 32, kPixels = kChannels * kSide * kSide;
constexpr size_t kRecordBytes = 1 + kPixels;
constexpr int kClasses = 10;

}  // namespace

ImageDataset parse_cifar10_batch(std::span<const uint8_t> bytes, const std::string& what) {
  CASTOR_CHECK(!bytes.empty() && bytes.size() % kRecordBytes == 0, what, ": size ", bytes.size(),
               " is not a positive multiple of the ", kRecordBytes, "-byte CIFAR-10 record");
  ImageDataset ds{static_cast<int64_t>(bytes.size() / kRecordBytes), kChannels, kSide, kSide, {}, {}, kClasses};
  ds.images.reserve(ds.n * kPixels);
  ds.labels.reserve(ds.n);
  for (const uint8_t* r = bytes.data(); r != bytes.data() + bytes.size(); r += kRecordBytes) {
    CASTOR_CHECK(r[0] < kClasses, what, ": label ", int(r[0]), " of record ", ds.labels.size(), " is not below ",
                 kClasses);
    ds.labels.push_back(r[0]);
    ds.images.insert(ds.images.end(), r + 1, r + kRecordBytes);
  }
  return ds;
}

ImageDataset load_cifar10(const std::string& dir, bool train) {
  std::vector<std::string> names;
  if (train) {
    for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else {
    names.push_back("test_batch.bin");
  }
  ImageDataset all{0, kChannels, kSide, kSide, {}, {}, kClasses};
  for (const std::string& name : names) {
    std::string path = dir + "/" + name;
    CASTOR_CHECK(file_exists(path), path, ": missing; CIFAR-10's binary version (data_batch_1.bin .. ",
                 "data_batch_5.bin, test_batch.bin) comes from ", kCifar10Url,
                 " (extract it and pass its cifar-10-batches-bin folder)");
    ImageDataset part = parse_cifar10_batch(read_file(path), path);
    all.n += part.n;
    all.images.insert(all.images.end(), part.images.begin(), part.images.end());
    all.labels.insert(all.labels.end(), part.labels.begin(), part.labels.end());
  }
  return all;
}

}  // namespace castor
