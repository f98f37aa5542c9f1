// Language-model batches from a token file: seeded random windows or llm.c's sequential order, resumable by number.
#include "castor/lm_batch.h"

#include <algorithm>

#include "castor/check.h"
#include "castor/random.h"

namespace castor::data {

namespace {

// A batch being built: its (rows, T) tensors, and operator() filling one row from the token at `start` on.
struct Filler {
  LmBatch b;
  const uint16_t* tok;
  int64_t T;
  void operator()(int64_t row, int64_t start) const {
    int64_t* x = b.x.data<int64_t>() + row * T;
    int64_t* y = b.y.data<int64_t>() + row * T;
    for (int64_t t = 0; t < T; ++t) {
      x[t] = tok[start + t];
      y[t] = tok[start + t + 1];
    }
  }
};

Filler make_batch(const TokenFile& f, int64_t rows, int64_t T, int64_t index) {
  return {{empty({rows, T}, DType::Int64), empty({rows, T}, DType::Int64), index}, f.tokens().data(), T};
}

void check_window(const TokenFile& f, int64_t T) {
  CASTOR_CHECK(f.size() >= T + 1, f.path(), ": ", f.size(), " tokens, too few for one window of block size ", T,
               " (needs ", T + 1, ")");
}

}  // namespace

LmBatchSource::LmBatchSource(const TokenFile& tokens, LmBatchOptions options) : file_(tokens), opt_(options) {
  CASTOR_CHECK(opt_.batch_size > 0 && opt_.block_size > 0, "LM batches: batch size ", opt_.batch_size,
               " and block size ", opt_.block_size, " must be positive");
  CASTOR_CHECK(opt_.num_ranks > 0 && opt_.rank >= 0 && opt_.rank < opt_.num_ranks, "LM batches: rank ", opt_.rank,
               " of ", opt_.num_ranks);
  const int64_t n = file_.size();
  check_window(file_, opt_.block_size);
  if (opt_.sequential) {
    const int64_t need = opt_.batch_size * opt_.block_size * opt_.num_ranks + 1;
    CASTOR_CHECK(n >= need, file_.path(), ": ", n, " tokens, too few for one sequential batch of ", opt_.batch_size,
                 " x ", opt_.block_size, " x ", opt_.num_ranks, " ranks (needs ", need, ")");
  }
}

int64_t LmBatchSource::batches_per_epoch() const {
  const int64_t global = opt_.batch_size * opt_.block_size * opt_.num_ranks;
  return opt_.sequential ? (file_.size() - 1) / global : std::max<int64_t>(1, file_.size() / global);
}

void LmBatchSource::set_state(const LmBatchState& s) {
  CASTOR_CHECK(s.next_batch >= 0, "LM batches: negative batch number ", s.next_batch);
  state_ = s;
}

LmBatch LmBatchSource::next() { return batch(state_.next_batch++); }

LmBatch LmBatchSource::batch(int64_t i) const {
  const int64_t B = opt_.batch_size, T = opt_.block_size;
  const Filler fill_row = make_batch(file_, B, T, i);
  if (opt_.sequential) {
    const int64_t base = (i % batches_per_epoch()) * B * T * opt_.num_ranks + opt_.rank * B * T;
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
  const int64_t rows = std::min(batch_size, (tokens.size() - 1) / block_size - i * batch_size);
  const Filler fill_row = make_batch(tokens, rows, block_size, i);
  for (int64_t r = 0; r < rows; ++r) fill_row(r, (i * batch_size + r) * block_size);
  return fill_row.b;
}

}  // namespace castor::data
