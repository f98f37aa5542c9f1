// Language-model batches from a token file: seeded random windows or llm.c's orders, resumable by number.
#include "castor/lm_batch.h"

#include <algorithm>
#include <numeric>

#include "castor/check.h"
#include "castor/random.h"

namespace castor::data {

namespace {

// A batch being built: its (rows, T) tensors, and operator() filling one row from the token at `start` on.
struct Filler {
  LmBatch b;
  const TokenFile* tok;
  int64_t T;
  void operator()(int64_t row, int64_t start) const {
    int64_t* x = b.x.data<int64_t>() + row * T;
    int64_t* y = b.y.data<int64_t>() + row * T;
    for (int64_t t = 0; t < T; ++t) {
      x[t] = (*tok)[start + t];
      y[t] = (*tok)[start + t + 1];
    }
  }
};

Filler make_batch(const TokenFile& f, int64_t rows, int64_t T, int64_t index) {
  return {{empty({rows, T}, DType::Int64), empty({rows, T}, DType::Int64), index}, &f, T};
}

void check_window(const TokenFile& f, int64_t T) {
  CASTOR_CHECK(f.size() >= T + 1, f.path(), ": ", f.size(), " tokens, too few for one window of block size ", T,
               " (needs ", T + 1, ")");
}

// llmc/rand.h's random_permutation: Fisher-Yates from the last element down.
void shuffle(int* data, int n, Mt19937& rng) {
  for (int i = n - 1; i > 0; --i) std::swap(data[i], data[rng.next_u32() % static_cast<uint32_t>(i + 1)]);
}

}  // namespace

LlmcShuffle::LlmcShuffle(std::vector<int64_t> shard_samples, int64_t rank)
    : shard_samples_(std::move(shard_samples)), rank_(rank) {
  CASTOR_CHECK(!shard_samples_.empty(), "llm.c order: no shards");
  for (int64_t n : shard_samples_)
    CASTOR_CHECK(n > 0 && n <= INT32_MAX, "llm.c order: a shard of ", n, " samples (llm.c needs 1 to 2^31 - 1)");
}

const std::vector<LlmcShuffle::Sample>& LlmcShuffle::epoch(int64_t e) {
  CASTOR_CHECK(e >= 0, "llm.c order: negative epoch ", e);
  if (e < epoch_ || epoch_ < 0) {  // from the start: dataloader_init's seed and identity shard order
    rng_.manual_seed(static_cast<uint32_t>(42 + rank_));
    shard_order_.resize(shard_samples_.size());
    std::iota(shard_order_.begin(), shard_order_.end(), 0);
    epoch_ = -1;
  }
  std::vector<int> within;
  for (; epoch_ < e; ++epoch_) {
    samples_.clear();
    shuffle(shard_order_.data(), static_cast<int>(shard_order_.size()), rng_);
    for (int shard : shard_order_) {
      within.resize(static_cast<size_t>(shard_samples_[shard]));
      std::iota(within.begin(), within.end(), 0);
      shuffle(within.data(), static_cast<int>(within.size()), rng_);
      for (int s : within) samples_.push_back({shard, s});
    }
  }
  return samples_;
}

LmBatchSource::LmBatchSource(const TokenFile& tokens, LmBatchOptions options) : file_(tokens), opt_(options) {
  CASTOR_CHECK(opt_.batch_size > 0 && opt_.block_size > 0, "LM batches: batch size ", opt_.batch_size,
               " and block size ", opt_.block_size, " must be positive");
  CASTOR_CHECK(opt_.num_ranks > 0 && opt_.rank >= 0 && opt_.rank < opt_.num_ranks, "LM batches: rank ", opt_.rank,
               " of ", opt_.num_ranks);
  const int64_t n = file_.size();
  check_window(file_, opt_.block_size);
  if (opt_.order != LmOrder::Random) {
    const int64_t need = opt_.batch_size * opt_.block_size * opt_.num_ranks + 1;
    CASTOR_CHECK(n >= need, file_.path(), ": ", n, " tokens, too few for one sequential batch of ", opt_.batch_size,
                 " x ", opt_.block_size, " x ", opt_.num_ranks, " ranks (needs ", need, ")");
  }
}

int64_t LmBatchSource::batches_per_epoch() const {
  const int64_t global = opt_.batch_size * opt_.block_size * opt_.num_ranks;
  return opt_.order != LmOrder::Random ? (file_.size() - 1) / global : std::max<int64_t>(1, file_.size() / global);
}

void LmBatchSource::set_state(const LmBatchState& s) {
  CASTOR_CHECK(s.next_batch >= 0, "LM batches: negative batch number ", s.next_batch);
  state_ = s;
}

LmBatch LmBatchSource::next() { return batch(state_.next_batch++); }

LmBatch LmBatchSource::batch(int64_t i) const {
  const int64_t B = opt_.batch_size, T = opt_.block_size;
  const Filler fill_row = make_batch(file_, B, T, i);
  if (opt_.order != LmOrder::Random) {
    const int64_t per_epoch = batches_per_epoch();
    int64_t sample = i % per_epoch;
    if (opt_.order == LmOrder::Llmc) {
      if (!shuffle_) shuffle_.emplace(std::vector<int64_t>{per_epoch}, opt_.rank);
      sample = shuffle_->epoch(i / per_epoch)[sample].sample;
    }
    const int64_t base = sample * B * T * opt_.num_ranks + opt_.rank * B * T;
    for (int64_t row = 0; row < B; ++row) fill_row(row, base + row * T);
  } else {
    // The seed and the batch number mixed (golden-ratio step) into one generator seed.
    Generator gen(opt_.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1)));
    const uint64_t windows = static_cast<uint64_t>(file_.size() - T);
    for (int64_t k = 0; k < B * opt_.num_ranks; ++k) {
      const int64_t start = static_cast<int64_t>(gen.next_u64() % windows);
      if (k / B == opt_.rank) fill_row(k % B, start);
    }
  }
  return fill_row.b;
}

int64_t eval_batch_count(const TokenFile& tokens, int64_t batch_size, int64_t block_size) {
  CASTOR_CHECK(batch_size > 0 && block_size > 0, "eval batches: batch size ", batch_size, " and block size ",
               block_size, " must be positive");
  check_window(tokens, block_size);
  const int64_t rows = (tokens.size() - 1) / block_size;
  return (rows + batch_size - 1) / batch_size;
}

LmBatch eval_batch(const TokenFile& tokens, int64_t batch_size, int64_t block_size, int64_t i) {
  const int64_t count = eval_batch_count(tokens, batch_size, block_size);
  CASTOR_CHECK(i >= 0 && i < count, "eval batch ", i, " of ", count);
  std::vector<int64_t> rows(std::min(batch_size, (tokens.size() - 1) / block_size - i * batch_size));
  std::iota(rows.begin(), rows.end(), i * batch_size);
  return eval_rows(tokens, block_size, rows, i);
}

LmBatch eval_rows(const TokenFile& tokens, int64_t block_size, const std::vector<int64_t>& rows, int64_t index) {
  check_window(tokens, block_size);
  const int64_t last = (tokens.size() - 1) / block_size;
  const Filler fill_row = make_batch(tokens, static_cast<int64_t>(rows.size()), block_size, index);
  for (size_t r = 0; r < rows.size(); ++r) {
    CASTOR_CHECK(rows[r] >= 0 && rows[r] < last, tokens.path(), ": eval row ", rows[r], " of ", last);
    fill_row(static_cast<int64_t>(r), rows[r] * block_size);
  }
  return fill_row.b;
}

int64_t masked_row_count(const TokenFile& tokens, const TokenFile& mask, int64_t block_size) {
  const int64_t L = block_size + 1;
  CASTOR_CHECK(tokens.size() == mask.size(), mask.path(), ": ", mask.size(), " entries, but ", tokens.path(), " holds ",
               tokens.size(), " tokens");
  CASTOR_CHECK(tokens.size() % L == 0 && tokens.size() > 0, tokens.path(), ": ", tokens.size(),
               " tokens are not whole rows of block size ", block_size, " + 1");
  return tokens.size() / L;
}

LmBatch masked_rows(const TokenFile& tokens, const TokenFile& mask, int64_t block_size,
                    const std::vector<int64_t>& rows, int64_t index) {
  const int64_t T = block_size, n_rows = masked_row_count(tokens, mask, block_size);
  const int64_t R = static_cast<int64_t>(rows.size());
  LmBatch b{empty({R, T}, DType::Int64), empty({R, T}, DType::Int64), index};
  int64_t* x = b.x.data<int64_t>();
  int64_t* y = b.y.data<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    CASTOR_CHECK(rows[r] >= 0 && rows[r] < n_rows, tokens.path(), ": row ", rows[r], " of ", n_rows);
    const int64_t at = rows[r] * (T + 1);
    for (int64_t t = 0; t < T; ++t) {
      x[r * T + t] = tokens[at + t];
      y[r * T + t] = mask[at + t + 1] ? tokens[at + t + 1] : kIgnoreIndex;
    }
  }
  return b;
}

RowBatchSource::RowBatchSource(const TokenFile& tokens, const TokenFile& mask, LmBatchOptions options)
    : file_(tokens), mask_(mask), opt_(options) {
  CASTOR_CHECK(opt_.batch_size > 0 && opt_.block_size > 0, "LM batches: batch size ", opt_.batch_size,
               " and block size ", opt_.block_size, " must be positive");
  CASTOR_CHECK(opt_.num_ranks > 0 && opt_.rank >= 0 && opt_.rank < opt_.num_ranks, "LM batches: rank ", opt_.rank,
               " of ", opt_.num_ranks);
  const int64_t rows = masked_row_count(tokens, mask, opt_.block_size);
  CASTOR_CHECK(rows >= opt_.batch_size * opt_.num_ranks, tokens.path(), ": ", rows, " rows, too few for one batch of ",
               opt_.batch_size, " x ", opt_.num_ranks, " ranks");
}

int64_t RowBatchSource::batches_per_epoch() const {
  return masked_row_count(file_, mask_, opt_.block_size) / (opt_.batch_size * opt_.num_ranks);
}

void RowBatchSource::set_state(const LmBatchState& s) {
  CASTOR_CHECK(s.next_batch >= 0, "LM batches: negative batch number ", s.next_batch);
  state_ = s;
}

LmBatch RowBatchSource::next() { return batch(state_.next_batch++); }

LmBatch RowBatchSource::batch(int64_t i) const {
  const int64_t per_epoch = batches_per_epoch(), e = i / per_epoch, k = i % per_epoch;
  const int64_t n = masked_row_count(file_, mask_, opt_.block_size);
  if (order_epoch_ != e) {
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    if (opt_.order != LmOrder::Sequential) {  // Fisher-Yates from a generator of (seed, epoch)
      Generator gen(opt_.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(e + 1)));
      for (int64_t j = n - 1; j > 0; --j)
        std::swap(order_[static_cast<size_t>(j)], order_[gen.next_u64() % static_cast<uint64_t>(j + 1)]);
    }
    order_epoch_ = e;
  }
  const int64_t B = opt_.batch_size;
  const int64_t base = k * B * opt_.num_ranks + opt_.rank * B;
  std::vector<int64_t> rows(order_.begin() + base, order_.begin() + base + B);
  return masked_rows(file_, mask_, opt_.block_size, rows, i);
}

}  // namespace castor::data
