// The data loader: seeded epoch order, crop/flip augmentation, normalisation, background prefetching (and the
// decoding of a streamed dataset's images).
#include "castor/data.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "castor/random.h"

namespace castor::data {

Normalization compute_normalization(const ImageDataset& ds) {
  Normalization n;
  const int64_t plane = ds.height * ds.width;
  std::vector<double> s(ds.channels, 0.0), s2(ds.channels, 0.0);
  std::vector<uint8_t> scratch;
  for (int64_t i = 0; i < ds.n; ++i) {  // image by image: a streamed dataset decodes each once
    const uint8_t* image = ds.image(i, scratch);
    for (int64_t c = 0; c < ds.channels; ++c) {
      const uint8_t* p = image + c * plane;
      for (int64_t k = 0; k < plane; ++k) {
        const double v = p[k] / 255.0;
        s[c] += v;
        s2[c] += v * v;
      }
    }
  }
  for (int64_t c = 0; c < ds.channels; ++c) {
    const double count = static_cast<double>(ds.n * plane);
    const double m = s[c] / count;
    n.mean.push_back(m);
    n.std.push_back(std::sqrt(std::max(s2[c] / count - m * m, 1e-12)));
  }
  return n;
}

ImageDataset make_synthetic(int64_t n, int64_t channels, int64_t height, int64_t width, int num_classes,
                            uint64_t seed) {
  CASTOR_CHECK(n > 0 && channels > 0 && height > 0 && width > 0 && num_classes > 1, "synthetic data: invalid size ", n,
               "x", channels, "x", height, "x", width, " with ", num_classes, " classes");
  Generator gen(seed);
  ImageDataset ds{n, channels, height, width, {}, {}, num_classes};
  const int64_t sz = channels * height * width;
  CASTOR_CHECK(sz <= INT64_MAX / n && sz <= INT64_MAX / num_classes, "synthetic data: ", n, " images of ", channels,
               "x", height, "x", width, " overflow the size arithmetic");
  std::vector<double> patterns(num_classes * sz);
  for (auto& v : patterns) v = gen.next_double();
  ds.images.resize(n * sz);
  ds.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(gen.next_u64() % num_classes);
    ds.labels[i] = static_cast<uint8_t>(label);
    for (int64_t k = 0; k < sz; ++k) {
      const double v = 0.7 * patterns[label * sz + k] + 0.3 * gen.next_double();
      ds.images[i * sz + k] = static_cast<uint8_t>(std::lround(255.0 * v));
    }
  }
  return ds;
}

DataLoader::DataLoader(const ImageDataset& dataset, LoaderOptions options) : ds_(dataset), opt_(std::move(options)) {
  CASTOR_CHECK(opt_.batch_size > 0, "--batch-size must be positive, got ", opt_.batch_size);
  CASTOR_CHECK(ds_.n > 0, "the dataset is empty");
  // The buffers must hold what the dataset declares: batches index them without further checks.
  int64_t image_bytes = 1;
  bool sized = true;
  for (int64_t d : {ds_.n, ds_.channels, ds_.height, ds_.width})
    sized = sized && d > 0 && !__builtin_mul_overflow(image_bytes, d, &image_bytes);
  CASTOR_CHECK(sized, "data loader: the dataset's size ", ds_.n, " x ", ds_.channels, " x ", ds_.height, " x ",
               ds_.width, " is not positive or overflows int64");
  // (a streamed dataset holds no image bytes: its `load` gives each image)
  const int64_t held = ds_.images.empty() && ds_.load ? image_bytes : static_cast<int64_t>(ds_.images.size());
  CASTOR_CHECK(held == image_bytes && static_cast<int64_t>(ds_.labels.size()) == ds_.n,
               "data loader: the dataset declares ", ds_.n, " images of ", ds_.channels, " x ", ds_.height, " x ",
               ds_.width, " (", image_bytes, " bytes) with labels, but holds ", ds_.images.size(), " image bytes and ",
               ds_.labels.size(), " labels");
  CASTOR_CHECK(ds_.num_classes > 0, "data loader: the dataset has ", ds_.num_classes, " classes");
  for (uint8_t label : ds_.labels)
    CASTOR_CHECK(label < ds_.num_classes, "data loader: label ", int{label}, " is not below the dataset's ",
                 ds_.num_classes, " classes");
  CASTOR_CHECK(opt_.num_shards >= 1 && opt_.shard >= 0 && opt_.shard < opt_.num_shards, "data loader: shard ",
               opt_.shard, " of ", opt_.num_shards, " does not exist");
  CASTOR_CHECK(opt_.num_shards == 1 || (opt_.drop_last && opt_.batch_size % opt_.num_shards == 0),
               "data loader: a batch of ", opt_.batch_size, " cannot be split evenly into ", opt_.num_shards,
               " shards (drop_last is needed too)");
  if (opt_.norm.mean.empty())
    opt_.norm = {std::vector<double>(ds_.channels, 0.0), std::vector<double>(ds_.channels, 1.0)};
  CASTOR_CHECK(static_cast<int64_t>(opt_.norm.mean.size()) == ds_.channels, "normalisation has ", opt_.norm.mean.size(),
               " channels, the dataset ", ds_.channels);
}

DataLoader::~DataLoader() { stop(); }

int64_t DataLoader::batches_per_epoch() const {
  return opt_.drop_last ? ds_.n / opt_.batch_size : (ds_.n + opt_.batch_size - 1) / opt_.batch_size;
}

// The epoch's permutation of the dataset, from the seed alone.
std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  Generator order_gen(opt_.seed * 1000003ull + static_cast<uint64_t>(epoch));
  std::vector<int64_t> order(ds_.n);
  std::iota(order.begin(), order.end(), 0);
  if (opt_.shuffle)
    for (int64_t i = ds_.n - 1; i > 0; --i) std::swap(order[i], order[order_gen.next_u64() % (i + 1)]);
  return order;
}

Batch DataLoader::make_batch(int64_t epoch, int64_t index) const {
  return make_batch(epoch_order(epoch), epoch, index);
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
  const int64_t batch_begin = index * opt_.batch_size, batch_end = std::min(ds_.n, batch_begin + opt_.batch_size);
  // This shard's rows of the batch (all of them with one shard).
  const int64_t per_shard = (batch_end - batch_begin) / opt_.num_shards;
  const int64_t skipped = opt_.num_shards == 1 ? 0 : opt_.shard * per_shard;
  const int64_t begin = batch_begin + skipped, end = opt_.num_shards == 1 ? batch_end : begin + per_shard;
  const int64_t bs = end - begin, C = ds_.channels, H = ds_.height, W = ds_.width;
  Batch b;
  b.index = index;
  b.images = empty({bs, C, H, W}, DType::Float32);
  b.labels = empty({bs}, DType::Int64);
  float* img = b.images.data<float>();
  int64_t* lab = b.labels.data<int64_t>();
  Generator aug_gen((opt_.seed + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(epoch) << 32) ^
                    static_cast<uint64_t>(index));
  if (opt_.augment)  // the draws of the rows before this shard's
    for (int64_t i = 0; i < 3 * skipped; ++i) aug_gen.next_u64();
  // A streamed dataset's images of this batch, decoded here (on the loader's thread and helpers, one per core).
  std::vector<uint8_t> streamed;
  if (ds_.images.empty() && ds_.load) {
    streamed.resize(static_cast<size_t>(bs * C * H * W));
    std::atomic<int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mu;
    auto work = [&] {
      try {
        for (int64_t i; (i = next.fetch_add(1)) < bs;) ds_.load(order[begin + i], streamed.data() + i * C * H * W);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = bs;
      }
    };
    std::vector<std::thread> helpers;
    const int64_t threads = std::min<int64_t>(bs, std::max(1u, std::thread::hardware_concurrency()));
    for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
    work();
    for (std::thread& t : helpers) t.join();
    if (error) std::rethrow_exception(error);
  }
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t src = order[begin + i];
    const uint8_t* image = streamed.empty() ? ds_.images.data() + src * C * H * W : streamed.data() + i * C * H * W;
    lab[i] = ds_.labels[src];
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (opt_.augment) {
      dy = static_cast<int64_t>(aug_gen.next_u64() % 9) - 4;
      dx = static_cast<int64_t>(aug_gen.next_u64() % 9) - 4;
      flip = aug_gen.next_u64() & 1;
    }
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* p = image + c * H * W;
      float* q = img + (i * C + c) * H * W;
      const float scale = static_cast<float>(1.0 / (255.0 * opt_.norm.std[c]));
      const float shift = static_cast<float>(-opt_.norm.mean[c] / opt_.norm.std[c]);
      if (dy == 0 && dx == 0 && !flip) {  // the image as it is: one loop the compiler vectorises
        for (int64_t k = 0; k < H * W; ++k) q[k] = p[k] * scale + shift;
        continue;
      }
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          const int64_t sy = y + dy, sx0 = x + dx, sx = flip ? W - 1 - sx0 : sx0;
          const bool inside = sy >= 0 && sy < H && sx0 >= 0 && sx0 < W;
          q[y * W + x] = (inside ? p[sy * W + sx] : 0) * scale + shift;
        }
    }
  }
  return b;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  stop();
  ready_.clear();
  error_ = nullptr;
  stopping_ = false;
  next_index_ = first_batch;
  end_index_ = batches_per_epoch();
  worker_ = std::thread([this, epoch, first_batch] {
    std::vector<int64_t> order;
    for (int64_t i = first_batch; i < end_index_; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || ready_.empty(); });  // one batch ahead
        if (stopping_) return;
      }
      std::optional<Batch> b;
      std::exception_ptr error;
      try {
        if (order.empty()) order = epoch_order(epoch);
        b = make_batch(order, epoch, i);
      } catch (...) {  // out of memory, say: handed to the consumer, which rethrows it
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (error) {
        error_ = error;
        cv_.notify_all();
        return;
      }
      ready_.push_back(std::move(*b));
      cv_.notify_all();
    }
  });
}

std::optional<Batch> DataLoader::next() {
  if (next_index_ >= end_index_) return std::nullopt;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  ++next_index_;
  cv_.notify_all();
  return b;
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

}  // namespace castor::data
