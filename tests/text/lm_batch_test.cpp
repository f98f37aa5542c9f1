// Language-model batches: llm.c's sequential order worked by hand, llm.c's shuffled training order against a Python
// oracle of llm.c's loader (tests/oracle/llmc_loader_oracle.py), seeded random windows, resume, short files.
#include <gtest/gtest.h>

#include <numeric>

#include "castor/json.h"
#include "castor/random.h"

#include "castor/lm_batch.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor::data {
namespace {

// A token file holding 0, 1, ..., n - 1 (so a token is its own position).
std::string counting_file(const test::ScratchDir& dir, int n) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), uint32_t{0});
  write_token_file(dir.file("tokens.bin"), t, 2);
  return dir.file("tokens.bin");
}

std::vector<int64_t> values(const Tensor& t) { return t.to_vector<int64_t>(); }

}  // namespace

TEST(LmBatches, SequentialIsLlmcOrderWithWrap) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 20));
  // B = 2, T = 3: batch i covers tokens [6i, 6i + 7); (20 - 1) / 6 = 3 batches, then back to the start.
  LmBatchSource s(f, {.batch_size = 2, .block_size = 3, .order = LmOrder::Sequential});
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
  LmBatchSource r1(f, {.batch_size = 2, .block_size = 3, .order = LmOrder::Sequential, .rank = 1, .num_ranks = 2});
  EXPECT_EQ(r1.batches_per_epoch(), 1);
  EXPECT_EQ(values(r1.batch(0).x), (std::vector<int64_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(values(r1.batch(1).y), (std::vector<int64_t>{7, 8, 9, 10, 11, 12}));
}

TEST(LmBatches, RandomWindowsAreSeededInRangeAndShifted) {
  test::ScratchDir dir;
  const int n = 1000;
  TokenFile f(counting_file(dir, n));
  const int64_t B = 16, T = 8;
  LmBatchSource a(f, {.batch_size = B, .block_size = T, .seed = 5}),
      b(f, {.batch_size = B, .block_size = T, .seed = 5}), c(f, {.batch_size = B, .block_size = T, .seed = 6});
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
  for (LmOrder order : {LmOrder::Random, LmOrder::Sequential, LmOrder::Llmc}) {
    LmBatchSource a(f, {.batch_size = 4, .block_size = 16, .order = order, .seed = 9});
    for (int i = 0; i < 7; ++i) a.next();
    const LmBatchState saved = a.state();
    const std::vector<int64_t> want = values(a.next().x);
    LmBatchSource b(f, {.batch_size = 4, .block_size = 16, .order = order, .seed = 9});
    b.set_state(saved);
    EXPECT_EQ(values(b.next().x), want);
  }
}

TEST(LmBatches, TooShortAFileIsAClearError) {
  test::ScratchDir dir;
  TokenFile f(counting_file(dir, 8));
  test::expect_error([&] { LmBatchSource s(f, {.batch_size = 1, .block_size = 8}); },
                     {f.path(), "8 tokens", "block size 8", "needs 9"});
  test::expect_error([&] { LmBatchSource s(f, {.batch_size = 2, .block_size = 4, .order = LmOrder::Sequential}); },
                     {f.path(), "needs 9"});
  LmBatchSource ok(f, {.batch_size = 1, .block_size = 7, .order = LmOrder::Sequential});
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

// llmc/rand.h's published draws for manual_seed(137), which it states equal torch.manual_seed(137)'s.
TEST(LmBatches, MersenneTwisterIsLlmcsAndTorchs) {
  Mt19937 g(137);
  std::vector<uint32_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(g.next_u32());
  EXPECT_EQ(got, (std::vector<uint32_t>{4053805790u, 2173880614u, 380293709u, 1237255315u, 2986595568u}));
}

// llm.c's training loader (the oracle runs llm.c's algorithm on the same files): the batches of each rank of two over
// two and a half epochs, read forward, after a resume and backwards; and the shard order of several shards.
TEST(LmBatches, LlmcOrderIsLlmcsTrainingLoader) {
  test::ScratchDir dir;
  Generator gen(7);
  auto random_tokens = [&](const std::string& name, int n) {
    std::vector<uint32_t> t(n);
    for (uint32_t& v : t) v = static_cast<uint32_t>(gen.next_u64() % 50257);
    write_token_file(dir.file(name), t, 2);
    return dir.file(name);
  };
  auto oracle = [&](const std::vector<std::string>& files, int64_t B, int64_t T, int64_t ranks, int64_t rank,
                    int64_t batches) {
    Json::Array names;
    for (const std::string& f : files) names.push_back(f);
    const Json config = Json::Object{
        {"files", names}, {"B", B}, {"T", T}, {"num_processes", ranks}, {"process_rank", rank}, {"batches", batches}};
    EXPECT_TRUE(test::run_oracle("llmc_loader_oracle.py", {config.dump(), dir.path().string()}));
    return test::read_oracle_case(dir.file("llmc_order.bin"));
  };
  const std::string one = random_tokens("train.bin", 1000);
  TokenFile f(one);
  const int64_t B = 2, T = 8, R = 2, batches = 80;  // (1000 - 1) / 32 = 31 samples an epoch
  for (int64_t rank = 0; rank < R; ++rank) {
    const auto want = oracle({one}, B, T, R, rank, batches);
    ASSERT_EQ(want.at("x").shape(), (Shape{batches, B, T}));
    LmBatchSource s(f, {.batch_size = B, .block_size = T, .order = LmOrder::Llmc, .rank = rank, .num_ranks = R});
    EXPECT_EQ(s.batches_per_epoch(), 31);
    for (int64_t i = 0; i < batches; ++i) {
      const LmBatch b = s.next();
      ASSERT_EQ(values(b.x), values(want.at("x").select(0, i))) << "rank " << rank << " batch " << i;
      ASSERT_EQ(values(b.y), values(want.at("y").select(0, i))) << "rank " << rank << " batch " << i;
    }
    LmBatchSource resumed(f, {.batch_size = B, .block_size = T, .order = LmOrder::Llmc, .rank = rank, .num_ranks = R});
    resumed.set_state({70});
    EXPECT_EQ(values(resumed.next().x), values(want.at("x").select(0, 70)));
    EXPECT_EQ(values(resumed.batch(3).x), values(want.at("x").select(0, 3)));  // an earlier epoch, replayed
  }
  // The order is not the sequential one: shuffled within the epoch, every sample once.
  const auto want = oracle({one}, B, T, 1, 0, 62);
  std::vector<int64_t> epoch0(want.at("sample").to_vector<int64_t>());
  epoch0.resize(62);
  std::vector<int64_t> sorted(epoch0.begin(), epoch0.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> ids(62);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(sorted, ids);
  EXPECT_NE(epoch0, ids);
  // Three shards of 5, 3 and 4 samples (B T = 16): shard order and samples over three epochs.
  const std::vector<std::string> shards = {random_tokens("a.bin", 81), random_tokens("b.bin", 60),
                                           random_tokens("c.bin", 70)};
  const auto order = oracle(shards, 2, 8, 1, 0, 36);
  const std::vector<int64_t> want_shard = order.at("shard").to_vector<int64_t>(),
                             want_sample = order.at("sample").to_vector<int64_t>();
  LlmcShuffle shuffle({5, 3, 4}, 0);
  std::vector<int64_t> got_shard, got_sample;
  for (int64_t e = 0; e < 3; ++e)
    for (const LlmcShuffle::Sample& s : shuffle.epoch(e)) got_shard.push_back(s.shard), got_sample.push_back(s.sample);
  EXPECT_EQ(got_shard, want_shard);
  EXPECT_EQ(got_sample, want_sample);
  EXPECT_NE(want_shard,
            (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 0, 1,
                                  1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2}));  // the shards were shuffled
}

}  // namespace castor::data
