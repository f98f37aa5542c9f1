// Batches for language models from a token file: nanoGPT's random windows or llm.c's sequential order.
#pragma once
#include <cstdint>
#include <string>

#include "castor/tensor.h"
#include "castor/token_file.h"

namespace castor::data {

struct LmBatchOptions {
  int64_t batch_size = 12;  // B: rows per batch and rank
  int64_t block_size = 64;  // T: tokens per row
  bool sequential = false;  // false: random windows (nanoGPT's get_batch); true: llm.c's loader order
  uint64_t seed = 0;        // random windows only
  // Data parallelism: rank `rank` of `num_ranks` takes its B rows of a global batch of B * num_ranks rows (llm.c's
  // process_rank / num_processes in sequential order).
  int64_t rank = 0, num_ranks = 1;
};

struct LmBatch {
  Tensor x;  // (B, T) int64: the inputs
  Tensor y;  // (B, T) int64: the targets, x shifted left by one token
  int64_t index = 0;  // the batch number
};

// Where a batch source is: the number of the next batch. Every batch is a pure function of the token file, the
// options and its number, so restoring this state resumes the stream token for token.
struct LmBatchState {
  int64_t next_batch = 0;
};

// Random windows (nanoGPT): batch i draws B * num_ranks offsets o uniform in [0, n - T) from a generator seeded by
// (seed, i); row b of rank r uses offset B * r + b: x = tokens[o, o + T), y = tokens[o + 1, o + T + 1).
// Sequential (llm.c): the global batch k = i mod (batches_per_epoch()) covers tokens
// [k * B * T * R, (k + 1) * B * T * R + 1); rank r's share starts at k * B * T * R + r * B * T and spans B * T + 1
// tokens, x = all but the last, y = all but the first, as rows of T; after the last whole global batch it wraps
// to the start.
class LmBatchSource {
 public:
  // Reads `tokens`, which must outlive the source. castor::Error naming the file when it holds too few tokens for one window (T + 1) or, sequential, one global
  // batch (B * T * R + 1); and on invalid options.
  LmBatchSource(const TokenFile& tokens, LmBatchOptions options);

  LmBatch next();                   // the batch state().next_batch, then advances
  LmBatch batch(int64_t i) const;   // any batch, without moving
  int64_t batches_per_epoch() const;  // sequential: global batches before the wrap; random: tokens / (B * T * R)

  LmBatchState state() const { return state_; }
  void set_state(const LmBatchState& s);

 private:
  const TokenFile& file_;
  LmBatchOptions opt_;
  LmBatchState state_;
};

// Evaluation over a whole split: the file as consecutive non-overlapping rows of T inputs (row k: x = tokens
// [k T, k T + T), y = tokens [k T + 1, k T + T + 1); the last (n - 1) % T tokens are in no row), B rows a batch and
// the last batch holding the rest. castor::Error naming the file when it holds fewer than T + 1 tokens.
int64_t eval_batch_count(const TokenFile& tokens, int64_t batch_size, int64_t block_size);
LmBatch eval_batch(const TokenFile& tokens, int64_t batch_size, int64_t block_size, int64_t i);

}  // namespace castor::data
