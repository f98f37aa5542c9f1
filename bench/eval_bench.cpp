// Castor's side of bench/eval_vs_torch.sh (issue #47's scoring throughput): multiple-choice rows scored as castor eval
// --task scores them (train/lm_scoring.h: the shared context once per row, in one forward with the choices'
// continuations as runs after it, models::forward_runs) on a Hugging Face directory's model under its dtype's autocast. The rows are
// random token ids (seeded): CONTEXT tokens of context and 4 continuations of 16-24 tokens each, written to IDS (JSON,
// for the PyTorch side). Prints "castor rows/s R tok/s T" over ROWS timed rows after 2 untimed ones; tokens count
// each row's context once and every continuation token.
//   ./build/eval_bench DIR TOKENIZER_DIR IDS [ROWS=16] [CONTEXT=80] [THREADS=2]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "castor/autocast.h"
#include "castor/fs.h"
#include "castor/random.h"
#include "train/loaded_model.h"
#include "train/lm_scoring.h"

using namespace castor;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: eval_bench DIR TOKENIZER_DIR IDS [ROWS=16] [CONTEXT=80] [THREADS=2]\n");
    return 2;
  }
  const int64_t rows = argc > 4 ? std::atoll(argv[4]) : 16, context = argc > 5 ? std::atoll(argv[5]) : 80;
  omp_set_num_threads(argc > 6 ? std::atoi(argv[6]) : 2);
  try {
    train::LoadedLm lm = train::load_language_model(argv[1], 0, "", argv[2]);
    const DType weights = lm.model->cache_shape().dtype;
    std::optional<amp::AutocastGuard> autocast;
    if (is_16bit_float(weights)) autocast.emplace(weights, true);
    Generator gen(47);
    auto draw = [&](int64_t n) {
      std::vector<int64_t> v(n);
      for (int64_t& x : v) x = 3 + static_cast<int64_t>(gen.next_double() * (lm.model->vocab_size() - 3));
      return v;
    };
    const int64_t warmup = 2;
    std::vector<std::vector<train::LlRequest>> all;
    Json::Array json_rows;
    for (int64_t r = 0; r < warmup + rows; ++r) {
      const std::vector<int64_t> ctx = draw(context);
      std::vector<train::LlRequest> row;
      Json::Array conts;
      for (int c = 0; c < 4; ++c) {
        row.push_back({ctx, draw(16 + static_cast<int64_t>(gen.next_double() * 9))});
        conts.push_back(Json::Array(row.back().continuation.begin(), row.back().continuation.end()));
      }
      json_rows.push_back(Json::Object{{"context", Json::Array(ctx.begin(), ctx.end())}, {"continuations", conts}});
      all.push_back(std::move(row));
    }
    atomic_write_file(argv[3], Json(Json::Object{{"warmup", warmup}, {"rows", json_rows}}).dump());
    train::LlScorer scorer(*lm.model);
    for (int64_t r = 0; r < warmup; ++r) scorer.score(all[r]);
    int64_t tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = warmup; r < warmup + rows; ++r) {
      scorer.score(all[r]);
      tokens += context;
      for (const train::LlRequest& q : all[r]) tokens += static_cast<int64_t>(q.continuation.size());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("castor rows/s %.3f tok/s %.1f\n", static_cast<double>(rows) / s, static_cast<double>(tokens) / s);
  } catch (const Error& e) {
    std::fprintf(stderr, "eval_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
