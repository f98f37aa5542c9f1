// Channels-last max pooling at SimpleCNN's shapes (batch 256, 2x2 stride 2): the fast kernel against the reference
// loops it must match, forward and backward, in every dtype, as milliseconds and GB/s of the bytes each pass must
// move (read + write), next to a memcpy of the same bytes (the bandwidth ceiling), all in one run.
//
// Usage: pool_bench [reps]   (best of reps after a warm-up call)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench_util.h"
#include "castor/random.h"
#include "kernels/layers.h"

namespace {

using namespace castor;

// The best of `reps` calls in milliseconds (the machine is shared: the best is the least disturbed).
double best_ms(int reps, const std::function<void()>& fn) { return 1e3 * bench::best_seconds(fn, reps); }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 11;
  std::printf("CPU: %s\n", bench::cpu_isa().c_str());
  std::printf("max_pool2d 2x2 stride 2, channels-last, batch 256, best of %d\n", reps);
  std::printf("%-18s %-9s %-9s %9s %9s %8s %9s %9s %8s\n", "input", "dtype", "pass", "fast ms", "ref ms", "ref/fast",
              "fast GB/s", "copy GB/s", "of copy");
  struct Shape4 {
    const char* name;
    int64_t n, c, hw;
  };
  const Shape4 shapes[] = {{"256x32x32x32", 256, 32, 32}, {"256x64x16x16", 256, 64, 16}};
  Generator gen(0);
  kernels::Pool2dParams p{};
  p.is_max = true;
  p.kernel[0] = p.kernel[1] = p.stride[0] = p.stride[1] = 2;
  for (const Shape4& s : shapes)
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
      const int64_t oh = s.hw / 2;
      const Tensor x = randn({s.n, s.c, s.hw, s.hw}, dt, &gen).contiguous(MemoryFormat::ChannelsLast);
      const Tensor dy = randn({s.n, s.c, oh, oh}, dt, &gen).contiguous(MemoryFormat::ChannelsLast);
      Tensor y = empty(dy.shape(), dt, MemoryFormat::ChannelsLast),
             dx = empty(x.shape(), dt, MemoryFormat::ChannelsLast);
      const Tensor ws = kernels::max_pool2d_nhwc_forward(x, y, p);
      const Tensor ws_ref = kernels::max_pool2d_nhwc_forward_ref(x, y, p);
      const double in_bytes = static_cast<double>(x.numel() * x.element_size());
      const double out_bytes = static_cast<double>(y.numel() * y.element_size());
      // forward: read src, write dst and the workspace; backward: read diff_dst and the workspace, write diff_src.
      const double bytes = in_bytes + out_bytes + static_cast<double>(ws.numel());
      std::vector<char> a(static_cast<size_t>(bytes)), b(static_cast<size_t>(bytes));
      const double copy_ms = best_ms(reps, [&] { std::memcpy(b.data(), a.data(), a.size()); });
      const double copy_gbs = 2 * bytes / copy_ms / 1e6;  // read + write
      struct Pass {
        const char* name;
        std::function<void()> fast, ref;
      };
      const Pass passes[] = {
          {"forward", [&] { kernels::max_pool2d_nhwc_forward(x, y, p); },
           [&] { kernels::max_pool2d_nhwc_forward_ref(x, y, p); }},
          {"backward", [&] { kernels::max_pool2d_nhwc_backward(dy, ws, dx, p); },
           [&] { kernels::max_pool2d_nhwc_backward_ref(dy, ws_ref, dx); }},
      };
      for (const Pass& ps : passes) {
        const double fast = best_ms(reps, ps.fast), ref = best_ms(reps, ps.ref);
        const double gbs = bytes / fast / 1e6;
        std::printf("%-18s %-9s %-9s %9.2f %9.2f %7.2fx %9.1f %9.1f %7.0f%%\n", s.name, dtype_name(dt), ps.name, fast,
                    ref, ref / fast, gbs, copy_gbs, 100 * gbs / copy_gbs);
      }
    }
  return 0;
}
