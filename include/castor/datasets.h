// Image-classification datasets as plain byte arrays: Fashion-MNIST (IDX, optionally gzipped), CIFAR-10 and folders
// of PNG/JPEG files (torchvision's ImageFolder).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace castor {

struct ImageDataset {
  int64_t n = 0, channels = 0, height = 0, width = 0;
  std::vector<uint8_t> images;  // (N, C, H, W); empty when `load` gives the images
  std::vector<uint8_t> labels;  // N values in [0, num_classes)
  int num_classes = 0;
  // Set where the images are not held in memory (an image folder too large to cache decoded): writes image i as
  // (C, H, W) bytes to dst; the loader calls it from several threads at once.
  std::function<void(int64_t i, uint8_t* dst)> load;

  // Image i's (C, H, W) bytes: in `images`, or loaded into `scratch`.
  const uint8_t* image(int64_t i, std::vector<uint8_t>& scratch) const {
    const int64_t size = channels * height * width;
    if (!images.empty() || !load) return images.data() + i * size;
    scratch.resize(static_cast<size_t>(size));
    load(i, scratch.data());
    return scratch.data();
  }
};

// IDX files (gzip-compressed or not, detected by magic bytes); `what` names the source in errors.
// Images: magic 0x00000803, dims N x H x W, giving channels = 1 and no labels.
ImageDataset parse_idx_images(std::span<const uint8_t> bytes, const std::string& what);
// Labels: magic 0x00000801, dim N, each value < num_classes.
std::vector<uint8_t> parse_idx_labels(std::span<const uint8_t> bytes, int num_classes, const std::string& what);

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte, or the same names with .gz, from `dir`: 28x28, 10 classes.
ImageDataset load_fashion_mnist(const std::string& dir, bool train);

// CIFAR-10 binary batch: records of 1 label byte + 3x32x32 channel-major pixels.
ImageDataset parse_cifar10_batch(std::span<const uint8_t> bytes, const std::string& what);
// Reads data_batch_1.bin .. data_batch_5.bin (train) or test_batch.bin from `dir`; a missing file is an error that
// names the download (kCifar10Url) and the files expected.
ImageDataset load_cifar10(const std::string& dir, bool train);
inline constexpr const char* kCifar10Url = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";

// One decoded image: (H, W, 3) RGB bytes. PNG (any bit depth and colour type, converted to 8-bit RGB) or JPEG
// (baseline or progressive, greyscale or colour), told apart by their signatures; `what` names the file in errors.
// A truncated or corrupt file is a castor::Error naming it (a JPEG that libjpeg would finish with grey is one too).
struct RgbImage {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;  // (H, W, 3)
};
RgbImage decode_image(std::span<const uint8_t> bytes, const std::string& what);

// `src` resized so that its shorter side is `size` (a triangle filter, widened when shrinking: PIL's
// antialiased bilinear), then the centre
// size x size square (torchvision's Resize(size) + CenterCrop(size)), written as (3, size, size) into `dst`.
void resize_center_crop(const RgbImage& src, int64_t size, uint8_t* dst);

// A folder of images as torchvision's ImageFolder: ROOT/<class>/**/*.{png,jpg,jpeg} (any case, subfolders included),
// classes in sorted order of their folder names, files sorted by path within each. Every image is decoded (on
// `threads` threads; 0: the machine's cores) and checked; when the images at size x size fit in `cache_bytes` they
// are kept in memory, otherwise the dataset's `load` decodes each again when a batch needs it (the loader's thread
// and helper threads).
struct ImageFolderOptions {
  int64_t image_size = 32;
  bool skip_bad_images = false;  // false: the first unreadable image is an error naming it
  int threads = 0;
  int64_t cache_bytes = -1;  // the most decoded bytes kept in memory; -1: half of this machine's memory
  // When not empty: the classes expected (e.g. the training set's, for its val/ folder), in label order.
  std::vector<std::string> classes;
};
struct ImageFolder {
  ImageDataset data;
  std::vector<std::string> classes;  // label i is classes[i]
  int64_t skipped = 0;               // unreadable images left out (with skip_bad_images)
};
ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& options);

}  // namespace castor
