// Images/s of the image-folder loader: PNG and JPEG decoding, resize + centre crop, and a whole folder on 1 and all
// threads, side by side. ./build/image_decode_bench [IMAGES_PER_FORMAT] [SIDE] [IMAGE_SIZE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "../tests/images/image_files.h"
#include "bench_util.h"
#include "castor/data.h"
#include "castor/datasets.h"
#include "castor/fs.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100, side = argc > 2 ? std::atoi(argv[2]) : 256;
  const int64_t size = argc > 3 ? std::atoll(argv[3]) : 32;
  const std::string root = (fs::temp_directory_path() / ("castor_image_bench." + std::to_string(getpid()))).string();
  // Photo-like content: smooth colour gradients with a little noise (JPEG quality 90, PNG default compression).
  for (const char* cls : {"png", "jpeg"}) fs::create_directories(root + "/" + cls);
  uint32_t noise = 1;
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> px(static_cast<size_t>(side) * side * 3);
    for (int y = 0; y < side; ++y)
      for (int x = 0; x < side; ++x)
        for (int c = 0; c < 3; ++c) {
          noise = noise * 1664525u + 1013904223u;
          const double v = 127 + 100 * std::sin(0.03 * (x + 2 * y) + c + i) + static_cast<double>(noise >> 28);
          px[(static_cast<size_t>(y) * side + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
    castor::test::write_png(root + "/png/" + std::to_string(i) + ".png", px, side, side, 3);
    castor::test::write_jpeg(root + "/jpeg/" + std::to_string(i) + ".jpg", px, side, side, 3, 90);
  }
  std::printf("image_decode_bench: %d PNG + %d JPEG images of %dx%d to %lldx%lld, %s\n", n, n, side, side,
              static_cast<long long>(size), static_cast<long long>(size), castor::bench::cpu_isa().c_str());
  std::printf("%-34s %12s\n", "stage (one thread unless said)", "images/s");
  for (const char* fmt : {"png", "jpeg"}) {
    std::vector<std::vector<uint8_t>> files;
    for (int i = 0; i < n; ++i)
      files.push_back(
          castor::read_file(root + "/" + fmt + "/" + std::to_string(i) + (fmt[0] == 'p' ? ".png" : ".jpg")));
    const double decode = castor::bench::best_seconds(
        [&] {
          for (const auto& f : files) castor::decode_image(f, fmt);
        },
        3);
    std::vector<uint8_t> out(static_cast<size_t>(3 * size * size));
    const double both = castor::bench::best_seconds(
        [&] {
          for (const auto& f : files) castor::resize_center_crop(castor::decode_image(f, fmt), size, out.data());
        },
        3);
    std::printf("%-34s %12.0f\n", (std::string(fmt) + " decode").c_str(), n / decode);
    std::printf("%-34s %12.0f\n", (std::string(fmt) + " decode + resize/crop").c_str(), n / both);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, cores}) {
    const double s = castor::bench::best_seconds(
        [&] { castor::load_image_folder(root, {.image_size = size, .threads = threads}); }, 3);
    std::printf("%-34s %12.0f\n", ("folder load (files, " + std::to_string(threads) + " threads)").c_str(), 2 * n / s);
  }
  // What training sees: the loader's batches (64 images, one epoch) from the cached folder and from the same folder
  // streamed (decoded again on the loader's thread for every batch).
  for (const int64_t cache : {int64_t{-1}, int64_t{0}}) {
    const castor::ImageFolder f = castor::load_image_folder(root, {.image_size = size, .cache_bytes = cache});
    castor::data::DataLoader loader(f.data, {.batch_size = 64, .drop_last = true});
    const double s = castor::bench::best_seconds(
        [&] {
          loader.start_epoch(0);
          while (loader.next()) {
          }
        },
        3);
    std::printf("%-34s %12.0f\n", cache == 0 ? "loader batches, streamed" : "loader batches, cached",
                static_cast<double>(loader.batches_per_epoch() * 64) / s);
  }
  fs::remove_all(root);
}
