// Element-wise add/mul/relu throughput on 16M-element contiguous float32 and bfloat16 tensors vs memcpy.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "bench_util.h"
#include "castor/ops.h"
#include "castor/random.h"

using namespace castor;

namespace {}  // namespace

int main() {
  const int64_t n = 16 << 20;
  std::printf("castor ops_bench: %lld elements, %d OpenMP threads\n", static_cast<long long>(n), omp_get_max_threads());
  std::printf("%-10s %-9s %10s %12s %14s\n", "op", "dtype", "ms", "GB/s", "memcpy ratio");
  for (DType d : {DType::Float32, DType::BFloat16}) {
    Tensor a = randn({n}, d), b = randn({n}, d);
    const double es = static_cast<double>(dtype_size(d));
    // memcpy of one operand's bytes: read + write of n elements, the floor for a unary map.
    Tensor dst = empty({n}, d);
    const double t_copy = bench::best_seconds([&] { std::memcpy(dst.data_ptr(), a.data_ptr(), a.nbytes()); });
    const double copy_gbs = 2 * n * es / t_copy / 1e9;
    std::printf("%-10s %-9s %10.2f %12.1f %14s\n", "memcpy", dtype_name(d), t_copy * 1e3, copy_gbs, "1.00");
    // The same memcpy into a freshly allocated tensor, as every out-of-place op writes: first-touch page faults.
    const double t_fresh = bench::best_seconds([&] {
      Tensor out = empty({n}, d);
      std::memcpy(out.data_ptr(), a.data_ptr(), a.nbytes());
    });
    std::printf("%-10s %-9s %10.2f %12.1f %13.2fx\n", "memcpy+new", dtype_name(d), t_fresh * 1e3,
                2 * n * es / t_fresh / 1e9, t_fresh / t_copy);
    struct Case {
      const char* name;
      int operands;  // tensors read
      std::function<Tensor()> run;
    };
    const Case cases[] = {
        {"add", 2, [&] { return add(a, b); }},
        {"mul", 2, [&] { return mul(a, b); }},
        {"relu", 1, [&] { return relu(a); }},
    };
    for (const Case& c : cases) {
      const double t = bench::best_seconds([&] { c.run(); });
      const double bytes = (c.operands + 1) * n * es;  // reads + the write
      const double gbs = bytes / t / 1e9;
      // Ratio of time against a memcpy moving the same number of bytes.
      const double ratio = t / (t_copy * bytes / (2 * n * es));
      std::printf("%-10s %-9s %10.2f %12.1f %13.2fx\n", c.name, dtype_name(d), t * 1e3, gbs, ratio);
    }
  }
  return 0;
}
