// LoRA fine-tuning against full fine-tuning (issue #29): the same model, batch and AdamW at O1 bfloat16, once with every
// weight training and once with rank-8 adapters on the attention projections over a frozen base (stored in
// bfloat16, no weight gradients, no optimizer state). Prints peak memory (Castor's allocator, from after the setup
// through the timed steps: the resident model, gradients, optimizer state and the steps' transients) and the median
// step time of each side by side, with the LoRA/full ratios.
//
//   lora_bench [124m|llama-15m] [STEPS]    (default 124m, 3 timed steps after one warm-up step each)
//
// 124m: GPT-2 (12/12/768, V=50,304), B=4, T=64, adapters on attn.c_attn and attn.c_proj; llama-15m: the llama-15m
// preset, llama2.c's stories15M shape (6 layers, 6 heads, 288 wide, V=32,000), B=4, T=256, adapters on wq, wk, wv and
// wo.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/allocator.h"
#include "castor/amp.h"
#include "castor/functional.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/optim.h"
#include "castor/random.h"

using namespace castor;

namespace {

struct Setup {
  std::function<std::shared_ptr<models::LanguageModel>()> make;
  int64_t B, T;
  std::vector<std::string> targets;
};

Setup setup(const std::string& name) {
  if (name == "124m")
    return {[] { return models::gpt(models::gpt_preset("gpt2", 50304)); }, 4, 64, {"attn.c_attn", "attn.c_proj"}};
  if (name == "llama-15m")
    return {[] { return models::llama(models::llama_preset("llama-15m", 32000)); }, 4, 256, {"wq", "wk", "wv", "wo"}};
  std::fprintf(stderr, "lora_bench: unknown configuration \"%s\"; expected 124m or llama-15m\n", name.c_str());
  std::exit(2);
}

struct Result {
  double peak_mib, step_ms;
  int64_t trainable;
};

// One warm-up step, then `steps` timed ones; the peak counts from after the setup.
Result run(const Setup& s, bool lora, int steps) {
  auto model = s.make();
  if (lora) nn::apply_lora(*model, nn::LoraConfig{.r = 8, .alpha = 16, .target_modules = s.targets});
  std::vector<Tensor> decay, no_decay;
  int64_t trainable = 0;
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p), trainable += p.numel();
  auto opt = optim::make_adamw(decay, optim::AdamOptions::adamw());
  if (!no_decay.empty()) opt->add_param_group(no_decay, 1e-3, 0.0);
  auto amp = amp::initialize(*model, {opt.get()}, amp::OptLevel::O1, DType::BFloat16);
  Generator gen(1);
  const Tensor x = randint(0, model->vocab_size(), {s.B, s.T}, &gen);
  const Tensor y = randint(0, model->vocab_size(), {s.B, s.T}, &gen);
  reset_peak_memory_stats();
  std::vector<double> ms;
  for (int i = 0; i <= steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      auto fw = amp->forward();
      const Tensor logits = (*model)(x);
      loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    }
    amp->scale_loss(loss, *opt).backward();
    opt->step();
    opt->zero_grad();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {static_cast<double>(memory_stats().peak_bytes) / (1 << 20), ms[ms.size() / 2], trainable};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "124m";
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  const Setup s = setup(name);
  std::printf("lora_bench %s: B=%lld T=%lld, O1 bfloat16, AdamW; %s\n", name.c_str(), static_cast<long long>(s.B),
              static_cast<long long>(s.T), bench::cpu_isa().c_str());
  const Result full = run(s, false, steps), lora = run(s, true, steps);
  std::printf("%-22s %14s %14s %8s\n", "", "full", "LoRA r=8", "ratio");
  std::printf("%-22s %14lld %14lld %8.4f\n", "trainable parameters", static_cast<long long>(full.trainable),
              static_cast<long long>(lora.trainable), static_cast<double>(lora.trainable) / full.trainable);
  std::printf("%-22s %14.1f %14.1f %8.3f\n", "peak memory (MiB)", full.peak_mib, lora.peak_mib,
              lora.peak_mib / full.peak_mib);
  std::printf("%-22s %14.1f %14.1f %8.3f\n", "step time (ms, median)", full.step_ms, lora.step_ms,
              lora.step_ms / full.step_ms);
  return 0;
}
