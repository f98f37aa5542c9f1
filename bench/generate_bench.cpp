// Text generation with the KV cache against nanoGPT's way (a full forward over the whole context for every new
// token), on the same model, greedy, side by side in one run: ms per generated token and the ratio, alternating.
//   ./build/generate_bench [preset=gpt-mini] [new_tokens=255] [rounds=3] [cached]
// (cached: that path alone, to profile)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/autograd.h"
#include "castor/models.h"
#include "castor/ops.h"

using namespace castor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// nanoGPT's generate: logits of the last position of a full forward over the (cropped) context, argmax.
std::vector<int64_t> generate_uncached(models::GPT& model, std::vector<int64_t> seq, int64_t new_tokens) {
  NoGradGuard no_grad;
  const int64_t T = model.config().block_size;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const size_t start = seq.size() > static_cast<size_t>(T) ? seq.size() - T : 0;
    std::vector<double> ids(seq.begin() + start, seq.end());
    const Tensor logits = model(tensor(ids, Shape{1, static_cast<int64_t>(ids.size())}, DType::Int64));
    seq.push_back(argmax(logits.select(1, logits.size(1) - 1), 1).to_vector<int64_t>()[0]);
  }
  return seq;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "gpt-mini";
  const int64_t new_tokens = argc > 2 ? std::atoll(argv[2]) : 255;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const bool cached_only = argc > 4 && std::string(argv[4]) == "cached";
  const models::GPTConfig c = models::gpt_preset(preset, 85);
  auto model = models::gpt(c, 1);
  model->eval();
  std::printf(
      "# %s\n# %s: %lld layers, %lld heads, %lld wide, block %lld, vocab %lld; %lld greedy tokens from a "
      "1-token prompt, float32\n",
      bench::cpu_isa().c_str(), preset.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
      static_cast<long long>(c.n_embd), static_cast<long long>(c.block_size), static_cast<long long>(c.vocab_size),
      static_cast<long long>(new_tokens));
  std::vector<double> cached, full;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const auto a = models::generate(*model, {0}, new_tokens, /*temperature=*/0.0);
    cached.push_back(seconds_since(t0));
    if (cached_only) continue;
    t0 = std::chrono::steady_clock::now();
    const auto b = generate_uncached(*model, {0}, new_tokens);
    full.push_back(seconds_since(t0));
    if (a != b && new_tokens < c.block_size) std::printf("# note: the two paths chose different tokens\n");
  }
  std::sort(cached.begin(), cached.end());
  if (cached_only)
    return std::printf("ms/token (median of %d): KV cache %.2f\n", rounds, 1e3 * cached[rounds / 2] / new_tokens), 0;
  std::sort(full.begin(), full.end());
  const double mc = cached[rounds / 2], mf = full[rounds / 2];
  std::printf("ms/token (median of %d): KV cache %.2f, full forward per token %.2f, ratio %.1fx\n", rounds,
              1e3 * mc / new_tokens, 1e3 * mf / new_tokens, mf / mc);
  return 0;
}
