// llm.c interop on any shape (bench/llmc_interop.sh runs it on GPT-2 124M): loads the llm.c checkpoint PyTorch wrote
// (tests/oracle/llmc_oracle.py), trains the same AdamW steps on llm.c-order batches at O0 and O1 bf16, and prints
// each step's loss beside PyTorch's float32 loss, the differences, and the steps' time of each.
//
//   llmc_interop_bench DIR B T STEPS LR WEIGHT_DECAY     (DIR holds model.bin, train.bin, losses.safetensors)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../tests/train/llmc_interop.h"
#include "bench_util.h"
#include "castor/serialize.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: llmc_interop_bench DIR B T STEPS LR WEIGHT_DECAY\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t B = std::atoll(argv[2]), T = std::atoll(argv[3]), steps = std::atoll(argv[4]);
  const double lr = std::atof(argv[5]), wd = std::atof(argv[6]);
  try {
    const castor::StateDict want = castor::load_safetensors(dir + "/losses.safetensors").tensors;
    const std::vector<double> torch = want.at("loss").to_vector<double>();
    const double torch_seconds = want.at("seconds").item();
    const auto o0 = castor::test::llmc_train_steps(dir + "/model.bin", dir + "/train.bin", B, T, steps, lr, wd, false);
    const auto o1 = castor::test::llmc_train_steps(dir + "/model.bin", dir + "/train.bin", B, T, steps, lr, wd, true);
    std::printf("# %s\n# B=%lld T=%lld, %lld AdamW steps (lr %g, weight decay %g)\n", castor::bench::cpu_isa().c_str(),
                static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(steps), lr, wd);
    std::printf("%4s %12s %12s %10s %12s %10s\n", "step", "torch fp32", "castor O0", "rel diff", "castor O1", "diff");
    double rel0 = 0, abs1 = 0;
    for (int64_t i = 0; i < steps; ++i) {
      const double r = std::fabs(o0.losses[i] - torch[i]) / torch[i], a = std::fabs(o1.losses[i] - torch[i]);
      rel0 = std::max(rel0, r), abs1 = std::max(abs1, a);
      std::printf("%4lld %12.6f %12.6f %10.2e %12.6f %10.4f\n", static_cast<long long>(i), torch[i], o0.losses[i], r,
                  o1.losses[i], a);
    }
    std::printf("max: O0 relative %.2e (bound 1e-4), O1 bf16 %.4f (bound 0.02)\n", rel0, abs1);
    std::printf("ms/step (all %lld steps, the first included): torch fp32 %.0f, castor O0 %.0f, castor O1 bf16 %.0f\n",
                static_cast<long long>(steps), 1e3 * torch_seconds / steps, 1e3 * o0.seconds / steps,
                1e3 * o1.seconds / steps);
    return rel0 <= 1e-4 && abs1 <= 0.02 ? 0 : 1;
  } catch (const castor::Error& e) {
    std::fprintf(stderr, "llmc_interop_bench: %s\n", e.what());
    return 1;
  }
}
