// Issue #46: a frozen base's products at a TinyLlama-1.1B layer's shapes (M = 512 tokens), forward y = x W^T and input
// gradient dx = dy W, a bfloat16 weight through kernels::matmul (oneDNN on the plain weight) against the same weight
// in a block type through quant::quantized_matmul; cold weights (each call on one of `copies` matrices, as in a
// 22-layer step whose weights stream from memory). Milliseconds a layer's products, best of 5.
//
//   quant_matmul_bench [TYPE=q8_0] [COPIES=6]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "kernels/kernels.h"

using namespace castor;

int main(int argc, char** argv) {
  const quant::BlockTypeInfo* type = quant::find_block_type(argc > 1 ? argv[1] : "q8_0");
  if (!type) return std::fprintf(stderr, "quant_matmul_bench: unknown block type\n"), 2;
  const int copies = argc > 2 ? std::atoi(argv[2]) : 6;
  const int64_t M = 512;
  struct Shape {
    const char* name;
    int64_t N, K, per_layer;
  };
  Generator gen(1);
  double total_dense = 0, total_quant = 0;
  std::printf("%-8s %10s %10s %10s %10s\n", "weight", "bf16 fwd", "quant fwd", "bf16 bwd", "quant bwd");
  for (const Shape& s : {Shape{"q/o", 2048, 2048, 2}, Shape{"k/v", 256, 2048, 2}, Shape{"gate/up", 5632, 2048, 2},
                         Shape{"down", 2048, 5632, 1}}) {
    std::vector<Tensor> dense;
    std::vector<quant::QuantizedMatrix> blocks;
    for (int c = 0; c < copies; ++c) {
      const Tensor w = randn({s.N, s.K}, DType::Float32, &gen) * 0.02;
      blocks.push_back(quant::quantize_matrix(w.data<float>(), s.N, s.K, type->id));
      dense.push_back(w.to(DType::BFloat16));
    }
    const Tensor x = randn({M, s.K}, DType::Float32, &gen).to(DType::BFloat16);
    const Tensor g = randn({M, s.N}, DType::Float32, &gen).to(DType::BFloat16);
    const Tensor y = empty({M, s.N}, DType::BFloat16), dx = empty({M, s.K}, DType::BFloat16);
    int i = 0;
    auto cycle = [&](auto fn) { return bench::best_seconds([&] { fn(i++ % copies); }) * 1e3; };
    const double df = cycle([&](int c) { kernels::matmul(x, dense[c].t(), y); });
    const double qf = cycle([&](int c) { quant::quantized_matmul(x, blocks[c], false, y); });
    const double db = cycle([&](int c) { kernels::matmul(g, dense[c], dx); });
    const double qb = cycle([&](int c) { quant::quantized_matmul(g, blocks[c], true, dx); });
    std::printf("%-8s %10.2f %10.2f %10.2f %10.2f\n", s.name, df, qf, db, qb);
    total_dense += (df + db) * s.per_layer;
    total_quant += (qf + qb) * s.per_layer;
  }
  std::printf("a layer: bf16 %.1f ms, %s %.1f ms\n", total_dense, type->name, total_quant);
}
