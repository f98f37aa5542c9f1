// Batching for image classifiers: seeded order, augmentation, normalisation, and a background prefetch thread.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "castor/datasets.h"
#include "castor/tensor.h"

namespace castor::data {

// Per-channel mean and standard deviation of a dataset's pixels scaled to [0, 1].
struct Normalization {
  std::vector<double> mean, std;
};
Normalization compute_normalization(const ImageDataset& ds);

// A learnable synthetic dataset: each class is a fixed random pattern plus noise, all from `seed`.
ImageDataset make_synthetic(int64_t n, int64_t channels, int64_t height, int64_t width, int num_classes, uint64_t seed);

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool augment = false;  // random crop with 4-pixel zero padding and horizontal flip
  bool drop_last = false;
  uint64_t seed = 0;
  Normalization norm;
  // Data parallelism: batch_size is the global batch, and this loader yields its rows
  // [shard * batch_size / num_shards, (shard + 1) * batch_size / num_shards) with the augmentation those rows get
  // in the whole batch. num_shards must divide batch_size, and drop_last is needed with more than one shard.
  int64_t shard = 0, num_shards = 1;
};

struct Batch {
  Tensor images;      // (N, C, H, W) float32, normalised
  Tensor labels;      // (N) int64
  int64_t index = 0;  // batch index within the epoch
};

// Yields the batches of one epoch. The order and the augmentation of every batch are pure functions of
// (seed, epoch, batch index), so a run resumed at batch k of epoch e sees exactly the batches it would have.
// Batches are prepared on a background thread, one ahead of the consumer (building one takes a few percent of a
// training step, and each held batch is memory: 3 MiB of float32 at CIFAR's batch 256); an exception there (out of
// memory, say) is rethrown by next().
class DataLoader {
 public:
  DataLoader(const ImageDataset& dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  std::optional<Batch> next();  // nullopt at the end of the epoch

  // Builds one batch synchronously (what the background thread runs, with the epoch's order computed once).
  Batch make_batch(int64_t epoch, int64_t index) const;

 private:
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  Batch make_batch(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const;
  void stop();
  const ImageDataset& ds_;
  LoaderOptions opt_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  int64_t next_index_ = 0, end_index_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // what the background thread threw; next() rethrows it on the caller's thread
};

}  // namespace castor::data
