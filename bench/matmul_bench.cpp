// 1024^3 matmul through castor::matmul vs the raw oneDNN matmul primitive, float32 and bfloat16.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <dnnl.hpp>
#include <functional>

#include "bench_util.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/onednn/onednn.h"

using namespace castor;

namespace {

// The raw primitive for (M, K) x (K, N) row-major of `dt`, or nullptr when oneDNN has no kernel on this CPU.
std::unique_ptr<dnnl::matmul> raw_primitive(int64_t M, int64_t K, int64_t N, dnnl::memory::data_type dt) {
  using tag = dnnl::memory::format_tag;
  dnnl::memory::desc a({M, K}, dt, tag::ab), b({K, N}, dt, tag::ab), c({M, N}, dt, tag::ab);
  try {
    return std::make_unique<dnnl::matmul>(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), kernels::engine()));
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    return nullptr;
  }
}

double raw_seconds(const dnnl::matmul& prim, const Tensor& a, const Tensor& b, const Tensor& c,
                   dnnl::memory::data_type dt) {
  using tag = dnnl::memory::format_tag;
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  dnnl::memory am({{M, K}, dt, tag::ab}, kernels::engine(), a.data_ptr());
  dnnl::memory bm({{K, N}, dt, tag::ab}, kernels::engine(), b.data_ptr());
  dnnl::memory cm({{M, N}, dt, tag::ab}, kernels::engine(), c.data_ptr());
  return bench::best_seconds([&] {
    prim.execute(kernels::stream(), {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    kernels::stream().wait();
  });
}

}  // namespace

int main() {
  const int64_t M = 1024, K = 1024, N = 1024;
  const double flop = 2.0 * M * N * K;
  std::printf("castor matmul_bench: %lldx%lldx%lld, %d OpenMP threads, oneDNN %d.%d\n", static_cast<long long>(M),
              static_cast<long long>(K), static_cast<long long>(N), omp_get_max_threads(), dnnl_version()->major,
              dnnl_version()->minor);
  std::printf("%-9s %-34s %10s %10s %12s %8s\n", "dtype", "baseline", "castor ms", "raw ms", "castor GF/s", "ratio");
  for (DType d : {DType::Float32, DType::BFloat16}) {
    Tensor a = randn({M, K}, d), b = randn({K, N}, d);
    const double t_castor = bench::best_seconds([&] { matmul(a, b); });
    auto dt = kernels::to_dnnl(d);
    auto prim = raw_primitive(M, K, N, dt);
    const char* baseline = "raw oneDNN primitive, same dtype";
    double t_raw;
    if (prim) {
      t_raw = raw_seconds(*prim, a, b, empty({M, N}, d), dt);
    } else {
      // No bf16 kernel on this CPU (no AVX-512): castor widens to float32, so the fair floor is the f32 primitive.
      std::printf("%-9s oneDNN has no %s matmul on this CPU\n", dtype_name(d), dtype_name(d));
      baseline = "raw oneDNN f32 primitive (emulation)";
      auto f32 = dnnl::memory::data_type::f32;
      prim = raw_primitive(M, K, N, f32);
      t_raw = raw_seconds(*prim, a.to(DType::Float32), b.to(DType::Float32), empty({M, N}), f32);
    }
    std::printf("%-9s %-34s %10.2f %10.2f %12.1f %7.2fx\n", dtype_name(d), baseline, t_castor * 1e3, t_raw * 1e3,
                flop / t_castor / 1e9, t_castor / t_raw);
  }
  return 0;
}
