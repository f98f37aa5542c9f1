// Language-model batches: llm.c's sequential order worked by hand, seeded random windows, resume, short files.
#include <gtest/gtest.h>

#include <numeric>

#include "castor/lm_batch.h"
#include "io/file_test_util.h"

namespace castor::data {
namespace {

// A token file holding 0, 1, ..., n - 1 (so a token is its own position).
std::string counting_file(const test::ScratchDir& dir, int n) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), uint16_t{0});
  write_token_file(dir.file("tokens.bin"), t);
  return dir.file("tokens.bin");
}

std::vector<int64_t> values(const Tensor& t) { return t.to_vector<int64_t>(); }

}  // namespace

TEST(LmBatches, SequentialIsLlmcOrderWithWrap) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 20));
  // B = 2, T = 3: batch i covers tokens [6i, 6i + 7); (20 - 1) / 6 = 3 batches, then back to the start.
  LmBatchSource s(f, {.batch_size = 2, .block_size = 3, .sequential = true});
  EXPECT_EQ(s.batches_per_epoch(), 3);
  LmBatch b0 = s.next();
  EXPECT_EQ(b0.x.shape(), (Shape{2, 3}));
  EXPECT_EQ(b0.x.dtype(), DType::Int64);
  EXPECT_EQ(values(b0.x), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(values(b0.y), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  s.next();
  LmBatch b2 = s.next();
  EXPECT_EQ(values(b2.x), (std::vector<int64_t>{12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(values(b2.y), (std::vector<int64_t>{13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(values(s.next().x), values(b0.x));  // wrapped
  // Two ranks (llm.c's process_rank): global batch k covers [12k, 12k + 13); rank 1 starts 6 tokens in.
  LmBatchSource r1(f, {.batch_size = 2, .block_size = 3, .sequential = true, .rank = 1, .num_ranks = 2});
  EXPECT_EQ(r1.batches_per_epoch(), 1);
  EXPECT_EQ(values(r1.batch(0).x), (std::vector<int64_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(values(r1.batch(1).y), (std::vector<int64_t>{7, 8, 9, 10, 11, 12}));
}

TEST(LmBatches, RandomWindowsAreSeededInRangeAndShifted) {
  test::ScratchDir dir;
  const int n = 1000;
  TokenFile f(counting_file(dir, n));
  const int64_t B = 16, T = 8;
  LmBatchSource a(f, {.batch_size = B, .block_size = T, .seed = 5}), b(f, {.batch_size = B, .block_size = T, .seed = 5}),
      c(f, {.batch_size = B, .block_size = T, .seed = 6});
  std::set<int64_t> starts;
  for (int i = 0; i < 20; ++i) {
    LmBatch x = a.next(), y = b.next();
    EXPECT_EQ(values(x.x), values(y.x));
    EXPECT_NE(values(x.x), values(c.next().x));
    const std::vector<int64_t> xs = values(x.x), ys = values(x.y);
    for (int64_t row = 0; row < B; ++row) {
      const int64_t s = xs[row * T];
      EXPECT_GE(s, 0);
      EXPECT_LT(s, n - T);  // nanoGPT: randint(len(data) - block_size)
      starts.insert(s);
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(xs[row * T + t], s + t);
        EXPECT_EQ(ys[row * T + t], s + t + 1);
      }
    }
  }
  EXPECT_GT(starts.size(), 250u);  // 320 draws from 992 windows: nearly all distinct
  // Two ranks split one global batch of 2B windows.
  LmBatchSource global(f, {.batch_size = 2 * B, .block_size = T, .seed = 5}),
      r1(f, {.batch_size = B, .block_size = T, .seed = 5, .rank = 1, .num_ranks = 2});
  const std::vector<int64_t> g = values(global.batch(3).x), h = values(r1.batch(3).x);
  EXPECT_EQ(std::vector<int64_t>(g.begin() + B * T, g.end()), h);
}

TEST(LmBatches, StateRestoresTheStreamExactly) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 500));
  for (bool sequential : {false, true}) {
    LmBatchSource a(f, {.batch_size = 4, .block_size = 16, .sequential = sequential, .seed = 9});
    for (int i = 0; i < 7; ++i) a.next();
    const LmBatchState saved = a.state();
    const std::vector<int64_t> want = values(a.next().x);
    LmBatchSource b(f, {.batch_size = 4, .block_size = 16, .sequential = sequential, .seed = 9});
    b.set_state(saved);
    EXPECT_EQ(values(b.next().x), want);
  }
}

TEST(LmBatches, TooShortAFileIsAClearError) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 8));
  test::expect_error([&] { LmBatchSource s(f, {.batch_size = 1, .block_size = 8}); },
                     {f.path(), "8 tokens", "block size 8", "needs 9"});
  test::expect_error([&] { LmBatchSource s(f, {.batch_size = 2, .block_size = 4, .sequential = true}); },
                     {f.path(), "needs 9"});
  LmBatchSource ok(f, {.batch_size = 1, .block_size = 7, .sequential = true});
  EXPECT_EQ(values(ok.next().y), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(LmBatches, EvalCoversTheSplitInConsecutiveRows) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 20));
  // T = 3: rows start at 0, 3, ..., 15 ((20 - 1) / 3 = 6 rows; token 19 is only a target); B = 4: 4 rows, then 2.
  EXPECT_EQ(eval_batch_count(f, 4, 3), 2);
  const LmBatch last = eval_batch(f, 4, 3, 1);
  EXPECT_EQ(last.x.shape(), (Shape{2, 3}));
  EXPECT_EQ(values(last.x), (std::vector<int64_t>{12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(values(last.y), (std::vector<int64_t>{13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(values(eval_batch(f, 4, 3, 0).y), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(eval_batch_count(f, 1, 19), 1);
  test::expect_error([&] { eval_batch_count(f, 1, 20); }, {f.path(), "needs 21"});
  test::expect_error([&] { eval_batch(f, 4, 3, 2); }, {"eval batch 2 of 2"});
}

}  // namespace castor::data
