// The transformer kernels against PyTorch in one run: causal attention forward and forward+backward (q, k, v strided
// views of a (B, T, 3C) projection, as nanoGPT makes them), cross-entropy over GPT-2's vocabulary and layer norm,
// float32 and bfloat16, side by side with bench/attention_torch_bench.py (nanoGPT's manual attention; PyTorch 1.13
// has no F.scaled_dot_product_attention) at its best: tcmalloc, torch.set_num_threads, OMP_WAIT_POLICY=passive for
// float32, autocast bfloat16 without it. Times are the best of `reps` calls.
//   ./build/attention_bench [reps=10] [--no-torch] [--attention-only]   (Castor alone / attention only: to profile)
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "bench_util.h"
#include "castor/random.h"
#include "kernels/transformer.h"

using namespace castor;

namespace {

// name -> best ms from the PyTorch twin (empty if it did not run).
std::map<std::string, double> run_torch(bool bf16, int reps) {
  std::map<std::string, double> out;
  const std::string cmd = bench::torch_command(std::string("attention_torch_bench.py ") + (bf16 ? "bf16" : "fp32") +
                                                   " " + std::to_string(reps) + " " +
                                                   std::to_string(omp_get_max_threads()),
                                               /*passive=*/!bf16);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char name[128];
  double ms;
  while (std::fscanf(p, "%127s %lf", name, &ms) == 2) out[name] = ms;
  if (pclose(p) != 0) std::fprintf(stderr, "attention_bench: the PyTorch twin failed: %s\n", cmd.c_str());
  return out;
}

void row(const char* what, DType dt, double castor_ms, const std::map<std::string, double>& torch,
         const std::string& key) {
  auto it = torch.find(key);
  if (it == torch.end()) {
    std::printf("%-34s %-9s %10.3f %10s %8s\n", what, dtype_name(dt), castor_ms, "-", "-");
    return;
  }
  std::printf("%-34s %-9s %10.3f %10.3f %7.2fx\n", what, dtype_name(dt), castor_ms, it->second, it->second / castor_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  bool with_torch = true, with_ce = true;
  for (int i = 2; i < argc; ++i) {
    with_torch &= std::string(argv[i]) != "--no-torch";
    with_ce &= std::string(argv[i]) != "--attention-only";
  }
  std::printf(
      "castor attention_bench: %s, %d OpenMP threads, OMP_WAIT_POLICY=%s; PyTorch: %s, fp32 passive, bf16 "
      "autocast default policy\n",
      bench::cpu_isa().c_str(), omp_get_max_threads(),
      std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(unset)", bench::torch_allocator());
  std::printf("%-34s %-9s %10s %10s %8s\n", "kernel", "dtype", "castor ms", "torch ms", "speedup");
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const auto torch = with_torch ? run_torch(dt == DType::BFloat16, reps) : std::map<std::string, double>();
    for (const auto& [B, H, T, D] : {std::array<int64_t, 4>{8, 6, 256, 64}, std::array<int64_t, 4>{4, 12, 64, 64}}) {
      const Tensor qkv = randn({B, T, 3, H, D}).to(dt);
      auto part = [&](const Tensor& t, int i) { return t.select(2, i).permute({0, 2, 1, 3}); };
      const Tensor q = part(qkv, 0), k = part(qkv, 1), v = part(qkv, 2);
      const Tensor dy = randn({B, H, T, D}).to(dt), dqkv = empty({B, T, 3, H, D}, dt);
      Tensor dst = empty({B, H, T, D}, dt), lse = empty({B, H, T});
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      auto fwd = [&] { kernels::attention_forward(q, k, v, Tensor(), /*is_causal=*/true, scale, dst, lse); };
      const double f = bench::best_seconds(fwd, reps) * 1e3;
      const double fb = bench::best_seconds(
                            [&] {
                              fwd();
                              kernels::attention_backward(q, k, v, Tensor(), /*is_causal=*/true, scale, dst, lse, dy,
                                                          part(dqkv, 0), part(dqkv, 1), part(dqkv, 2));
                            },
                            reps) *
                        1e3;
      const std::string shape = std::to_string(B) + "_" + std::to_string(H) + "_" + std::to_string(T) + "_" +
                                std::to_string(D);
      const std::string label = "B" + std::to_string(B) + " H" + std::to_string(H) + " T" + std::to_string(T) + " D" +
                                std::to_string(D);
      row(("attention fwd " + label).c_str(), dt, f, torch, "attn_fwd_" + shape);
      row(("attention fwd+bwd " + label).c_str(), dt, fb, torch, "attn_fwdbwd_" + shape);
    }
    if (!with_ce) continue;
    const int64_t N = 256, V = 50257;
    Tensor logits = randn({N, V}).mul_(3.0).to(dt), target = randint(0, V, {N});
    Tensor losses = empty({N}), lse = empty({N}), g = full({N}, 1.0 / N), dlogits = empty({N, V}, dt);
    const double ce = bench::best_seconds(
                          [&] {
                            kernels::cross_entropy_forward(logits, target, -100, 0.0, losses, lse);
                            kernels::cross_entropy_backward(logits, target, lse, g, -100, 0.0, dlogits);
                          },
                          reps) *
                      1e3;
    row("cross-entropy fwd+bwd N256 V50257", dt, ce, torch, "ce_fwdbwd_256_50257");
    // Layer norm of nanoGPT's B=8, T=256 activations, C=768, float32 parameters under bfloat16 (the O2 case).
    const int64_t rows = 2048, C = 768;
    const Tensor x = randn({rows, C}).to(dt), dy = randn({rows, C}).to(dt), w = randn({C}), b = randn({C});
    Tensor y = empty({rows, C}, dt), mean = empty({rows}), rstd = empty({rows}), dx = empty({rows, C}, dt),
           dw = empty({C}), db = empty({C});
    const double ln = bench::best_seconds(
                          [&] {
                            kernels::layer_norm_forward(x, w, b, y, mean, rstd, 1e-5);
                            kernels::layer_norm_backward(x, dy, w, mean, rstd, dx, dw, db);
                          },
                          reps) *
                      1e3;
    row("layer norm fwd+bwd 2048x768", dt, ln, torch, "ln_fwdbwd_2048_768");
  }
  return 0;
}
