// Llama training speed (issue #28, Performance): AdamW training steps of models::llama at the llama-15m shape (dim
// 288, 6 layers, 6 heads, context 256, vocabulary 512, batch 8 x 256 tokens), at O0 (float32) or O1 (bfloat16
// autocast), with N_KV_HEADS key/value heads (6: multi-head; 3: grouped-query attention); bench/llama_torch.py is
// its PyTorch twin (same shape, optimizer and clipping) and bench/llama_vs_torch.sh alternates the two and prints the
// ratios. Prints "castor step llama-15m LEVEL KV TOKENS_PER_S"; "profile" adds Castor's op profile of the timed
// steps.
//
//   llama_bench O0|O1 [N_KV_HEADS=6] [BATCH=8] [WARMUP=2] [ITERS=5] [profile]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench_util.h"
#include "castor/amp.h"
#include "castor/functional.h"
#include "castor/llama.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "train/profiler.h"

using namespace castor;
using Clock = std::chrono::steady_clock;

namespace {

// llama2.c's train.py optimizer: AdamW lr 5e-4, betas (0.9, 0.95), weight decay 0.1 on tensors of 2 or more dims.
std::unique_ptr<optim::Adam> adamw(models::Llama& model) {
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = 5e-4, o.weight_decay = 0.1, o.beta2 = 0.95;
  return bench::decayed_adamw(model, o);
}

int run(const std::string& level, int64_t n_kv, int64_t batch, int warmup, int iters, bool profile) {
  models::LlamaConfig c = models::llama_preset("llama-15m", 512);
  c.n_kv_heads = n_kv;
  auto model = models::llama(c);
  auto opt = adamw(*model);
  auto a = amp::initialize(*model, {opt.get()}, level == "O1" ? amp::OptLevel::O1 : amp::OptLevel::O0, DType::BFloat16);
  const int64_t T = c.max_seq_len;
  const Tensor x = randint(0, c.vocab_size, {batch, T}), y = randint(0, c.vocab_size, {batch, T});
  auto step = [&] {
    Tensor loss;
    {
      auto fw = a->forward();
      loss = F::cross_entropy((*model)(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
    }
    a->scale_loss(loss, *opt).backward();
    amp::clip_grad_norm_(*opt, 1.0);
    opt->step();
    opt->zero_grad();
  };
  for (int i = 0; i < warmup; ++i) step();
  std::unique_ptr<train::Profiler> prof;
  if (profile) prof = std::make_unique<train::Profiler>();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("castor step llama-15m %s %lld %.1f\n", level.c_str(), static_cast<long long>(n_kv),
              static_cast<double>(batch * T) * iters / sec);
  if (profile) std::printf("%s", prof->table(30).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  omp_set_num_threads(2);
  const std::string level = argc > 1 ? argv[1] : "";
  if (level != "O0" && level != "O1") {
    std::fprintf(stderr, "usage: llama_bench O0|O1 [N_KV_HEADS=6] [BATCH=8] [WARMUP=2] [ITERS=5] [profile]\n");
    return 2;
  }
  auto arg = [&](int i, long long fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  return run(level, arg(2, 6), arg(3, 8), static_cast<int>(arg(4, 2)), static_cast<int>(arg(5, 5)),
             argc > 6 && std::strcmp(argv[6], "profile") == 0);
}
