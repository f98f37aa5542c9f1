// Image-classification datasets as plain byte arrays: Fashion-MNIST (IDX, optionally gzipped) and CIFAR-10.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace castor {

struct ImageDataset {
  int64_t n = 0, channels = 0, height = 0, width = 0;
  std::vector<uint8_t> images;  // (N, C, H, W)
  std::vector<uint8_t> labels;  // N values in [0, num_classes)
  int num_classes = 0;
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
// Reads data_batch_1.bin .. data_batch_5.bin (train) or test_batch.bin from `dir`.
ImageDataset load_cifar10(const std::string& dir, bool train);

}  // namespace castor
