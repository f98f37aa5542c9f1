// Batches for language models from a token file: nanoGPT's random windows, llm.c's sequential (validation) order or
// llm.c's shuffled training order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "castor/random.h"
#include "castor/tensor.h"
#include "castor/token_file.h"

namespace castor::data {

enum class LmOrder {
  Random,      // nanoGPT's get_batch: B windows at seeded random offsets
  Sequential,  // llm.c's validation loader: the file's samples in order
  Llmc,        // llm.c's training loader: the same samples, shuffled each epoch by its Mersenne Twister
};

struct LmBatchOptions {
  int64_t batch_size = 12;  // B: rows per batch and rank
  int64_t block_size = 64;  // T: tokens per row
  LmOrder order = LmOrder::Random;
  uint64_t seed = 0;  // random windows only (llm.c's shuffle seeds itself with 42 + rank, as llm.c)
  // Data parallelism: rank `rank` of `num_ranks` takes its B rows of a global batch of B * num_ranks rows (llm.c's
  // process_rank / num_processes in its orders).
  int64_t rank = 0, num_ranks = 1;
};

// llm.c's training order (llmc/dataloader.h with should_shuffle): each rank runs a Mersenne Twister (castor::Mt19937)
// seeded 42 + rank. At each epoch's start it shuffles the shard order it had (Fisher-Yates from the last element
// down, j = draw % (i + 1), as llmc/rand.h's random_permutation), then as each shard is opened it shuffles the
// identity over that shard's samples the same way. A shard of n tokens holds (n - 1) / (B T R) samples; sample s
// of a shard is the global batch at token s B T R, rank r's share r B T tokens in.
class LlmcShuffle {
 public:
  struct Sample {
    int64_t shard = 0, sample = 0;
  };
  LlmcShuffle(std::vector<int64_t> shard_samples, int64_t rank);
  // Epoch e's samples in the order llm.c reads them (epochs are generated forward; an earlier one is replayed
  // from the start).
  const std::vector<Sample>& epoch(int64_t e);

 private:
  std::vector<int64_t> shard_samples_;
  int64_t rank_;
  Mt19937 rng_;
  std::vector<int> shard_order_;
  int64_t epoch_ = -1;
  std::vector<Sample> samples_;
};

struct LmBatch {
  Tensor x;           // (B, T) int64: the inputs
  Tensor y;           // (B, T) int64: the targets, x shifted left by one token
  int64_t index = 0;  // the batch number
};

// Where a batch source is: the number of the next batch. Every batch is a pure function of the token file, the
// options and its number, so restoring this state resumes the stream token for token.
struct LmBatchState {
  int64_t next_batch = 0;
};

// Random windows (nanoGPT): batch i draws B * num_ranks offsets o uniform in [0, n - T) from a generator seeded by
// (seed, i); row b of rank r uses offset B * r + b: x = tokens[o, o + T), y = tokens[o + 1, o + T + 1).
// Sequential (llm.c's validation loader): the global batch k = i mod (batches_per_epoch()) covers tokens
// [k * B * T * R, (k + 1) * B * T * R + 1); rank r's share starts at k * B * T * R + r * B * T and spans B * T + 1
// tokens, x = all but the last, y = all but the first, as rows of T; after the last whole global batch it wraps
// to the start. Llmc (llm.c's training loader): batch i of epoch e = i / batches_per_epoch() is sample
// LlmcShuffle::epoch(e)[i mod batches_per_epoch()] of the sequential order (the file is one shard).
class LmBatchSource {
 public:
  // Reads `tokens`, which must outlive the source. castor::Error naming the file when it holds too few tokens for one window (T + 1) or, sequential, one global
  // batch (B * T * R + 1); and on invalid options.
  LmBatchSource(const TokenFile& tokens, LmBatchOptions options);

  LmBatch next();                     // the batch state().next_batch, then advances
  LmBatch batch(int64_t i) const;     // any batch, without moving
  int64_t batches_per_epoch() const;  // sequential: global batches before the wrap; random: tokens / (B * T * R)

  LmBatchState state() const { return state_; }
  void set_state(const LmBatchState& s);

 private:
  const TokenFile& file_;
  LmBatchOptions opt_;
  LmBatchState state_;
  mutable std::optional<LlmcShuffle> shuffle_;  // LmOrder::Llmc: the epoch's order, made when first asked
};

// Evaluation over a whole split: the file as consecutive non-overlapping rows of T inputs (row k: x = tokens
// [k T, k T + T), y = tokens [k T + 1, k T + T + 1); the last (n - 1) % T tokens are in no row), B rows a batch and
// the last batch holding the rest. castor::Error naming the file when it holds fewer than T + 1 tokens.
int64_t eval_batch_count(const TokenFile& tokens, int64_t batch_size, int64_t block_size);
LmBatch eval_batch(const TokenFile& tokens, int64_t batch_size, int64_t block_size, int64_t i);
// Any of those rows (their numbers, in [0, (n - 1) / T)) as one batch numbered `index`.
LmBatch eval_rows(const TokenFile& tokens, int64_t block_size, const std::vector<int64_t>& rows, int64_t index);

// Fine-tuning rows (castor tokenize --format): `tokens` as rows of T + 1 tokens and `mask` (a token file of the same
// length, 1 where a token is a loss target). Row r gives x = row[0, T) and y = row[1, T + 1) with kIgnoreIndex where
// the mask of that target token is 0 (PyTorch's ignore_index). Batch i of epoch e = i / batches_per_epoch() takes
// the global rows k B R .. (k + 1) B R - 1 (k = i mod batches_per_epoch()) of the epoch's order, rank r its B from
// r B on: the file's order (Sequential) or a permutation drawn from (seed, e) (Random, Llmc). castor::Error naming
// the files when their lengths differ or are not whole rows, or hold fewer than B R rows.
constexpr int64_t kIgnoreIndex = -100;

class RowBatchSource {
 public:
  RowBatchSource(const TokenFile& tokens, const TokenFile& mask, LmBatchOptions options);
  LmBatch next();
  LmBatch batch(int64_t i) const;
  int64_t batches_per_epoch() const;
  LmBatchState state() const { return state_; }
  void set_state(const LmBatchState& s);

 private:
  const TokenFile& file_;
  const TokenFile& mask_;
  LmBatchOptions opt_;
  LmBatchState state_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

// Rows `rows` of a fine-tuning split (x, y as RowBatchSource gives them) as one batch numbered `index`.
LmBatch masked_rows(const TokenFile& tokens, const TokenFile& mask, int64_t block_size,
                    const std::vector<int64_t>& rows, int64_t index);
// The rows of `mask`'s file (rows of block_size + 1), checked against `tokens` as RowBatchSource does.
int64_t masked_row_count(const TokenFile& tokens, const TokenFile& mask, int64_t block_size);

}  // namespace castor::data
