// GPT training speed (issue #19/#20): one transformer block's forward+backward and whole AdamW training steps of the
// char model and GPT-2 124M, at O0 (float32) and O1 (bfloat16 autocast); bench/gpt_torch_bench.py is its PyTorch twin
// and bench/gpt_vs_torch.sh alternates the two and prints the ratios. Each run prints lines
// "castor KIND CONFIG LEVEL VALUE [FLOP/s]" (block: ms per forward+backward; step: tokens/s and model FLOP/s);
// "peak" prints the GEMM ceilings the MFU is taken against (best of a 2048^3 oneDNN matmul, float32 and bfloat16).
//
//   gpt_bench block char|124m|124m-8x256 O0|O1 ITERS
//   gpt_bench step char|124m|124m-8x256 O0|O1 WARMUP ITERS [profile]
//   gpt_bench peak
//   gpt_bench llmc char|124m FILE    (writes the configuration's initial weights in llm.c's checkpoint format, for
//                                     bench/llmc_vs_castor.sh)
//
// Configurations: char = 6 layers, 6 heads, 384 wide, V=85, B=8, T=256; 124m = GPT-2 (12/12/768, V=50,304), B=4,
// T=64; 124m-8x256 the same model at B=8, T=256 (GEMMs of 2048 rows). Model FLOPs per token: nanoGPT's
// estimate_mfu, 6 N + 12 L H D T (N without wpe: it does no arithmetic).
// "profile" adds Castor's op profile of the timed steps (ops by total time, forward and backward) and the split of
// the step into forward, backward and optimizer.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench_util.h"
#include "castor/amp.h"
#include "castor/functional.h"
#include "castor/llmc.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "train/profiler.h"

using namespace castor;
using Clock = std::chrono::steady_clock;

namespace {

struct Setup {
  models::GPTConfig config;
  int64_t B, T;
};

Setup setup(const std::string& name) {
  if (name == "char") {
    Setup s{models::gpt_preset("gpt-mini", 85), 8, 256};
    return s;
  }
  if (name == "124m") return Setup{models::gpt_preset("gpt2", 50304), 4, 64};
  if (name == "124m-8x256") return Setup{models::gpt_preset("gpt2", 50304), 8, 256};
  std::fprintf(stderr, "gpt_bench: unknown configuration \"%s\"; expected char, 124m or 124m-8x256\n", name.c_str());
  std::exit(2);
}

amp::OptLevel level_of(const std::string& s) {
  if (s == "O0") return amp::OptLevel::O0;
  if (s == "O1") return amp::OptLevel::O1;
  std::fprintf(stderr, "gpt_bench: unknown opt level \"%s\"; expected O0 or O1\n", s.c_str());
  std::exit(2);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// nanoGPT's optimizer: AdamW lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on tensors of 2 or more dims.
std::unique_ptr<optim::Adam> adamw(models::GPT& model) {
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = 6e-4, o.weight_decay = 0.1, o.beta2 = 0.95;
  return bench::decayed_adamw(model, o);
}

int run_step(const std::string& name, const std::string& level, int warmup, int iters, bool profile) {
  const Setup s = setup(name);
  auto model = models::gpt(s.config, 1);
  auto opt = adamw(*model);
  auto a = amp::initialize(*model, {opt.get()}, level_of(level), DType::BFloat16);
  const models::GPTConfig& c = s.config;
  const int64_t V = model->vocab_size();  // GPT-2's real 50,257 of the padded 50,304
  const Tensor x = randint(0, V, {s.B, s.T}), y = randint(0, V, {s.B, s.T});
  double fwd_s = 0, bwd_s = 0, opt_s = 0;
  auto step = [&] {
    auto t0 = Clock::now();
    Tensor loss;
    {
      auto fw = a->forward();
      loss = models::lm_loss(*model, x, y);  // castor train's loss: the head and cross-entropy a chunk at a time
    }
    auto t1 = Clock::now();
    a->scale_loss(loss, *opt).backward();
    auto t2 = Clock::now();
    opt->step();
    opt->zero_grad();
    auto t3 = Clock::now();
    fwd_s += std::chrono::duration<double>(t1 - t0).count();
    bwd_s += std::chrono::duration<double>(t2 - t1).count();
    opt_s += std::chrono::duration<double>(t3 - t2).count();
  };
  for (int i = 0; i < warmup; ++i) step();
  fwd_s = bwd_s = opt_s = 0;
  std::unique_ptr<train::Profiler> prof;
  if (profile) prof = std::make_unique<train::Profiler>();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double sec = seconds_since(t0);
  const double n = static_cast<double>(model->num_params() - model->wpe->weight.numel());
  const double flops_per_token = 6.0 * n +
                                 12.0 * c.n_layer * c.n_head * (c.n_embd / c.n_head) * static_cast<double>(s.T);
  const double tok_s = static_cast<double>(s.B * s.T) * iters / sec;
  std::printf("castor step %s %s %.1f %.4g\n", name.c_str(), level.c_str(), tok_s, tok_s * flops_per_token);
  if (profile) {
    std::printf("# %s %s: %.1f ms a step: forward %.1f, backward %.1f, optimizer %.1f\n", name.c_str(), level.c_str(),
                1e3 * sec / iters, 1e3 * fwd_s / iters, 1e3 * bwd_s / iters, 1e3 * opt_s / iters);
    std::printf("%s", prof->table(30).c_str());
  }
  return 0;
}

int run_block(const std::string& name, const std::string& level, int iters) {
  const Setup s = setup(name);
  const models::GPTConfig& c = s.config;
  models::Block block(c);
  const bool autocast = level_of(level) == amp::OptLevel::O1;
  const Tensor x = randn({s.B, s.T, c.n_embd}).requires_grad_(), dy = randn({s.B, s.T, c.n_embd});
  const double sec = bench::best_seconds(
      [&] {
        Tensor out;
        {
          amp::AutocastGuard guard(DType::BFloat16, /*enabled=*/autocast);
          out = block(x);
        }
        out.backward(dy.to(out.dtype()));
        block.zero_grad(/*set_to_none=*/true);
        x.set_grad(Tensor());
      },
      iters);
  std::printf("castor block %s %s %.3f\n", name.c_str(), level.c_str(), 1e3 * sec);
  return 0;
}

int run_peak() {
  for (DType dt : {DType::Float32, DType::BFloat16})
    std::printf("castor peak %s %.4g\n", dt == DType::Float32 ? "fp32" : "bf16", bench::gemm_peak(dt));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  omp_set_num_threads(2);
  const std::string kind = argc > 1 ? argv[1] : "";
  if (kind == "isa") {
    std::printf("%s\n", bench::cpu_isa().c_str());
    return 0;
  }
  if (kind == "peak") return run_peak();
  if (kind == "llmc" && argc == 4) {
    formats::write_llmc_checkpoint(argv[3], *models::gpt(setup(argv[2]).config, 1));
    return 0;
  }
  if (kind == "block" && argc == 5) return run_block(argv[2], argv[3], std::atoi(argv[4]));
  if (kind == "step" && (argc == 6 || argc == 7))
    return run_step(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]),
                    argc == 7 && std::strcmp(argv[6], "profile") == 0);
  std::fprintf(stderr,
               "usage: gpt_bench block char|124m O0|O1 ITERS | step char|124m O0|O1 WARMUP ITERS [profile] | peak | "
               "llmc char|124m FILE | isa\n");
  return 2;
}
