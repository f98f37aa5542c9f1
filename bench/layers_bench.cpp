// SimpleCNN's conv layers at batch 256: forward, backward-data and backward-weights through Castor's kernels, on NCHW
// and on channels-last activations (the models' layout), vs the raw oneDNN primitives on buffers already in their
// preferred layouts (no reorders), in float32 and bfloat16.
//
// Usage: layers_bench [reps]. Where oneDNN has no bfloat16 kernel (CPUs without AVX-512), Castor runs bfloat16 on
// float32 copies and the raw row times the float32 primitive that fallback calls, so the ratio shows the cost of the
// fallback's conversions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <unordered_map>
#include <vector>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/random.h"
#include "kernels/layers.h"
#include "kernels/onednn/onednn.h"

namespace {

using namespace castor;
using dnnl::memory;
using tag = memory::format_tag;

// The median wall time of `reps` calls after two warm-up calls, in milliseconds.
double time_ms(int reps, const std::function<void()>& fn) {
  fn();
  fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Layer {
  const char* name;
  int64_t n, c, o, hw;
};

// The three raw primitives of one layer, with buffers in the layouts oneDNN chose. `dt` must be implemented.
struct RawConv {
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  std::unordered_map<int, memory> fwd_args, data_args, weights_args;

  RawConv(const Layer& l, memory::data_type dt) {
    const memory::dims src = {l.n, l.c, l.hw, l.hw}, wts = {l.o, l.c, 3, 3}, dst = {l.n, l.o, l.hw, l.hw};
    const memory::dims strides = {1, 1}, dilates = {0, 0}, pad = {1, 1};
    const memory::desc src_any(src, dt, tag::any), w_any(wts, dt, tag::any), dst_any(dst, dt, tag::any);
    const memory::desc bias({l.o}, dt, tag::x);
    const auto algo = dnnl::algorithm::convolution_direct;
    dnnl::convolution_forward::primitive_desc fpd(dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                                                  algo, src_any, w_any, bias, dst_any,
                                                                                  strides, dilates, pad, pad),
                                                  kernels::engine());
    dnnl::convolution_backward_data::primitive_desc dpd(
        dnnl::convolution_backward_data::desc(algo, src_any, w_any, dst_any, strides, dilates, pad, pad),
        kernels::engine(), fpd);
    dnnl::convolution_backward_weights::primitive_desc wpd(
        dnnl::convolution_backward_weights::desc(algo, src_any, w_any, bias, dst_any, strides, dilates, pad, pad),
        kernels::engine(), fpd);
    fwd = dnnl::convolution_forward(fpd);
    bwd_data = dnnl::convolution_backward_data(dpd);
    bwd_weights = dnnl::convolution_backward_weights(wpd);
    auto m = [](const memory::desc& d) {
      memory mem(d, kernels::engine());
      std::fill_n(static_cast<char*>(mem.get_data_handle()), d.get_size(), 0);
      return mem;
    };
    fwd_args = {{DNNL_ARG_SRC, m(fpd.src_desc())},
                {DNNL_ARG_WEIGHTS, m(fpd.weights_desc())},
                {DNNL_ARG_BIAS, m(bias)},
                {DNNL_ARG_DST, m(fpd.dst_desc())}};
    data_args = {{DNNL_ARG_DIFF_DST, m(dpd.diff_dst_desc())},
                 {DNNL_ARG_WEIGHTS, m(dpd.weights_desc())},
                 {DNNL_ARG_DIFF_SRC, m(dpd.diff_src_desc())}};
    weights_args = {{DNNL_ARG_SRC, m(wpd.src_desc())},
                    {DNNL_ARG_DIFF_DST, m(wpd.diff_dst_desc())},
                    {DNNL_ARG_DIFF_WEIGHTS, m(wpd.diff_weights_desc())},
                    {DNNL_ARG_DIFF_BIAS, m(bias)}};
  }

  static void run(dnnl::primitive& p, std::unordered_map<int, memory>& args) {
    p.execute(kernels::stream(), args);
    kernels::stream().wait();
  }
};

// Whether oneDNN implements a bfloat16 convolution on this CPU.
bool has_bf16_conv() {
  try {
    RawConv probe({"probe", 1, 8, 8, 8}, memory::data_type::bf16);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const Layer layers[] = {{"conv1 3->32 32x32", 256, 3, 32, 32}, {"conv2 32->64 16x16", 256, 32, 64, 16}};
  const bool bf16_native = has_bf16_conv();
  std::printf("batch 256, 3x3 pad 1, median of %d; oneDNN bf16 conv %s\n", reps,
              bf16_native ? "available" : "unavailable (castor bf16 runs on float32 copies)");
  std::printf("%-20s %-9s %-13s %-12s %10s %10s %7s\n", "layer", "dtype", "activations", "pass", "castor ms",
              "oneDNN ms", "ratio");
  Generator gen(0);
  for (const Layer& l : layers) {
    for (DType dt : {DType::Float32, DType::BFloat16})
      for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
        const bool raw_native = dt == DType::Float32 || bf16_native;
        RawConv raw(l, raw_native ? kernels::to_dnnl(dt) : memory::data_type::f32);
        const Tensor x = randn({l.n, l.c, l.hw, l.hw}, dt, &gen).contiguous(format);
        const Tensor w = randn({l.o, l.c, 3, 3}, dt, &gen), b = randn({l.o}, dt, &gen);
        const Tensor dy = randn({l.n, l.o, l.hw, l.hw}, dt, &gen).contiguous(format);
        const Tensor dx = empty(x.shape(), dt, format), dw = empty(w.shape(), dt);
        const Tensor db = empty(b.shape(), dt);
        const kernels::Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
        struct Row {
          const char* pass;
          std::function<void()> castor_fn, raw_fn;
        };
        const Row rows[] = {
            {"forward",
             [&] {
               NoGradGuard g;
               F::conv2d(x, w, b, {1, 1}, {1, 1});
             },
             [&] { RawConv::run(raw.fwd, raw.fwd_args); }},
            {"bwd-data", [&] { kernels::conv2d_backward(x, w, dy, dx, Tensor(), Tensor(), p); },
             [&] { RawConv::run(raw.bwd_data, raw.data_args); }},
            {"bwd-weights", [&] { kernels::conv2d_backward(x, w, dy, Tensor(), dw, db, p); },
             [&] { RawConv::run(raw.bwd_weights, raw.weights_args); }},
        };
        for (const Row& r : rows) {
          const int64_t reorders0 = kernels::conv_reorder_count();
          const double c = time_ms(reps, r.castor_fn);
          const double reorders = static_cast<double>(kernels::conv_reorder_count() - reorders0) / (reps + 2);
          const double o = time_ms(reps, r.raw_fn);
          std::printf("%-20s %-9s %-13s %-12s %10.2f %10.2f %7.2f   (%.0f reorders/call)\n", l.name, dtype_name(dt),
                      format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW", r.pass, c, o, c / o, reorders);
        }
      }
  }
  return 0;
}
