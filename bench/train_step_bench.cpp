// Training-step throughput (forward, cross_entropy, backward, Adam) of SimpleCNN and ResNet-18 against PyTorch 1.13
// measured in the same run, and against the sum of the raw oneDNN primitives such a step needs.
//
// Usage: train_step_bench [simplecnn|resnet18|all] [rounds] [auto|direct]
//        (default: simplecnn, 3 rounds, auto: float32 3x3 convolutions as Winograd where oneDNN has it, as
//        castor/backends.h; direct: every convolution direct, in Castor and in the floor)
//
// Configurations: Castor float32; Castor all-bfloat16 (model->to(BFloat16), bfloat16 input, Adam with float32 master
// weights); PyTorch float32 and PyTorch CPU autocast bfloat16 (bench/train_step_torch.py, run with /usr/bin/python3),
// in NCHW and channels_last, in PyTorch's best configuration here (bench::torch_command: tcmalloc); "castor/best" is
// against the faster layout. Prints the CPU's and oneDNN's ISA. (ResNet-18 without AVX-512: PyTorch float32 only,
// its autocast bfloat16 convolutions take minutes a step at batch 64 there). Rounds alternate Castor and PyTorch;
// each figure is the median over rounds of images/s, each measurement timing up to `iters` steps after `warmup`,
// stopping early (after at least 2) once `seconds` have passed (PyTorch's autocast bfloat16 takes seconds a step without AVX-512).
//
// The kernel floor: every oneDNN primitive of the step (convolutions, pooling, batch norm, ReLU, residual adds,
// matmuls of the linears; forward and backward) at the same shapes, on buffers in the layouts oneDNN prefers, run
// back to back (float32 3x3 stride-1 convolutions by the algorithm Castor picks); "overhead" is the step time over
// their sum. GFLOP/s count the convolutions' direct multiply-adds (Winograd does fewer), beside the GEMM peak. Where oneDNN has no bfloat16 kernels (CPUs without
// AVX-512) the bfloat16 floor is the float32 primitives, which is what Castor's bfloat16 runs on there.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "castor/backends.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "bench_util.h"
#include "kernels/onednn/onednn.h"

namespace {

using namespace castor;
using dnnl::memory;
using tag = memory::format_tag;
using Clock = std::chrono::steady_clock;

constexpr int kThreads = 2;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- the kernel floor: the step's oneDNN primitives ----

struct Kernel {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
};

// The primitives of one training step, built layer by layer; each layer takes its input's descriptor and returns
// its output's, so activations flow in the layouts oneDNN picks.
class Floor {
 public:
  explicit Floor(memory::data_type dt) : dt_(dt) {}

  double flops() const { return flops_; }

  // The median over `reps` of all primitives run back to back, in milliseconds.
  double time_ms(int reps) {
    std::vector<double> ms;
    for (int r = 0; r <= reps; ++r) {
      const auto t0 = Clock::now();
      for (Kernel& k : kernels_) k.prim.execute(kernels::stream(), k.args);
      kernels::stream().wait();
      if (r > 0) ms.push_back(seconds_since(t0) * 1e3);
    }
    return bench::median(ms);
  }

  // 2-D convolution (weights o x c x k x k); backward-data only when the input needs a gradient.
  memory::desc conv(const memory::desc& in, int64_t o, int64_t k, int64_t stride, int64_t pad, bool bias,
                    bool need_dx) {
    const memory::dims d = in.dims();
    const int64_t oh = (d[2] + 2 * pad - k) / stride + 1, ow = (d[3] + 2 * pad - k) / stride + 1;
    const memory::desc src(d, dt_, tag::any), w({o, d[1], k, k}, dt_, tag::any), dst({d[0], o, oh, ow}, dt_, tag::any);
    const memory::desc b = bias ? memory::desc({o}, dt_, tag::x) : memory::desc();
    const memory::dims s = {stride, stride}, dil = {0, 0}, p = {pad, pad};
    // Castor's choice (castor/backends.h): float32 3x3 stride-1 convolutions as Winograd where oneDNN has it.
    auto algo = dnnl::algorithm::convolution_direct;
    const auto forward = [&] {
      return dnnl::convolution_forward::primitive_desc(
          {dnnl::prop_kind::forward_training, algo, src, w, b, dst, s, dil, p, p}, kernels::engine());
    };
    dnnl::convolution_forward::primitive_desc fwd;
    try {
      if (dt_ == memory::data_type::f32 && k == 3 && stride == 1 && d[1] >= 64 &&
          backends::conv_algorithm() == backends::ConvAlgorithm::Auto)
        algo = dnnl::algorithm::convolution_winograd;
      fwd = forward();
    } catch (const dnnl::error&) {
      algo = dnnl::algorithm::convolution_direct;
      fwd = forward();
    }
    add(dnnl::convolution_forward(fwd), {{DNNL_ARG_SRC, fwd.src_desc()},
                                         {DNNL_ARG_WEIGHTS, fwd.weights_desc()},
                                         {DNNL_ARG_BIAS, b},
                                         {DNNL_ARG_DST, fwd.dst_desc()}});
    if (need_dx) {
      const dnnl::convolution_backward_data::primitive_desc bd({algo, src, w, dst, s, dil, p, p}, kernels::engine(),
                                                               fwd);
      add(dnnl::convolution_backward_data(bd), {{DNNL_ARG_DIFF_DST, bd.diff_dst_desc()},
                                                {DNNL_ARG_WEIGHTS, bd.weights_desc()},
                                                {DNNL_ARG_DIFF_SRC, bd.diff_src_desc()}});
    }
    const dnnl::convolution_backward_weights::primitive_desc bw({algo, src, w, b, dst, s, dil, p, p}, kernels::engine(),
                                                                fwd);
    add(dnnl::convolution_backward_weights(bw), {{DNNL_ARG_SRC, bw.src_desc()},
                                                 {DNNL_ARG_DIFF_DST, bw.diff_dst_desc()},
                                                 {DNNL_ARG_DIFF_WEIGHTS, bw.diff_weights_desc()},
                                                 {DNNL_ARG_DIFF_BIAS, b}});
    flops_ += (2.0 + need_dx) * 2.0 * d[0] * o * oh * ow * d[1] * k * k;
    return fwd.dst_desc();
  }

  // Max or (exact-window) average pooling with kernel = stride = k.
  memory::desc pool(const memory::desc& in, int64_t k, bool is_max) {
    const memory::dims d = in.dims();
    const memory::desc dst({d[0], d[1], d[2] / k, d[3] / k}, dt_, tag::any);
    const auto alg = is_max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_include_padding;
    const memory::dims kk = {k, k}, p = {0, 0};
    const dnnl::pooling_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, alg, in, dst, kk, kk, p, p},
                                                    kernels::engine());
    const dnnl::pooling_backward::primitive_desc bwd({alg, in, fwd.dst_desc(), kk, kk, p, p}, kernels::engine(), fwd);
    const memory::desc ws = fwd.workspace_desc();
    add(dnnl::pooling_forward(fwd), {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, fwd.dst_desc()}, {DNNL_ARG_WORKSPACE, ws}});
    add(dnnl::pooling_backward(bwd),
        {{DNNL_ARG_DIFF_DST, fwd.dst_desc()}, {DNNL_ARG_DIFF_SRC, in}, {DNNL_ARG_WORKSPACE, ws}});
    return fwd.dst_desc();
  }

  memory::desc relu(const memory::desc& in) {
    const auto alg = dnnl::algorithm::eltwise_relu;
    const dnnl::eltwise_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, alg, in, 0.f},
                                                    kernels::engine());
    const dnnl::eltwise_backward::primitive_desc bwd({alg, in, in, 0.f}, kernels::engine(), fwd);
    add(dnnl::eltwise_forward(fwd), {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, in}});
    add(dnnl::eltwise_backward(bwd), {{DNNL_ARG_SRC, in}, {DNNL_ARG_DIFF_DST, in}, {DNNL_ARG_DIFF_SRC, in}});
    return in;
  }

  // Training batch norm with scale and shift (float32 statistics).
  memory::desc batch_norm(const memory::desc& in) {
    const auto f = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    const dnnl::batch_normalization_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, in, 1e-5f, f},
                                                                kernels::engine());
    const dnnl::batch_normalization_backward::primitive_desc bwd({dnnl::prop_kind::backward, in, in, 1e-5f, f},
                                                                 kernels::engine(), fwd);
    const memory::desc stats({in.dims()[1]}, memory::data_type::f32, tag::x);
    add(dnnl::batch_normalization_forward(fwd), {{DNNL_ARG_SRC, in},
                                                 {DNNL_ARG_DST, in},
                                                 {DNNL_ARG_MEAN, stats},
                                                 {DNNL_ARG_VARIANCE, stats},
                                                 {DNNL_ARG_SCALE, stats},
                                                 {DNNL_ARG_SHIFT, stats}});
    add(dnnl::batch_normalization_backward(bwd), {{DNNL_ARG_SRC, in},
                                                  {DNNL_ARG_DIFF_DST, in},
                                                  {DNNL_ARG_DIFF_SRC, in},
                                                  {DNNL_ARG_MEAN, stats},
                                                  {DNNL_ARG_VARIANCE, stats},
                                                  {DNNL_ARG_SCALE, stats},
                                                  {DNNL_ARG_SHIFT, stats},
                                                  {DNNL_ARG_DIFF_SCALE, stats},
                                                  {DNNL_ARG_DIFF_SHIFT, stats}});
    return in;
  }

  // A residual add (its backward passes the gradient through).
  memory::desc residual_add(const memory::desc& in) {
    const dnnl::binary::primitive_desc pd({dnnl::algorithm::binary_add, in, in, in}, kernels::engine());
    add(dnnl::binary(pd), {{DNNL_ARG_SRC_0, in}, {DNNL_ARG_SRC_1, in}, {DNNL_ARG_DST, in}});
    return in;
  }

  // y (n, out) = x (n, in) w^T + b, then dx = dy w (when wanted) and dw = dy^T x.
  memory::desc linear(int64_t n, int64_t in, int64_t out, bool need_dx) {
    const memory::desc x({n, in}, dt_, tag::ab), wt({in, out}, dt_, tag::ba), b({1, out}, dt_, tag::ab),
        y({n, out}, dt_, tag::ab);
    add_matmul({x, wt, b, y});
    if (need_dx) add_matmul({y, memory::desc({out, in}, dt_, tag::ab), {}, x});
    add_matmul({memory::desc({out, n}, dt_, tag::ba), x, {}, memory::desc({out, in}, dt_, tag::ab)});
    flops_ += (2.0 + need_dx) * 2.0 * n * in * out;
    return y;
  }

 private:
  struct MatmulDescs {
    memory::desc a, b, bias, c;
  };
  void add_matmul(const MatmulDescs& m) {
    const dnnl::matmul::primitive_desc pd({m.a, m.b, m.bias, m.c}, kernels::engine());
    add(dnnl::matmul(pd), {{DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_BIAS, m.bias}, {DNNL_ARG_DST, m.c}});
  }

  // Adds a primitive with zero-filled buffers for its arguments (empty descriptors are left out).
  void add(dnnl::primitive prim, const std::vector<std::pair<int, memory::desc>>& descs) {
    Kernel k{std::move(prim), {}};
    for (const auto& [arg, desc] : descs) {
      if (desc.get_size() == 0) continue;
      memory m(desc, kernels::engine());
      std::memset(m.get_data_handle(), 0, desc.get_size());
      k.args.emplace(arg, m);
    }
    kernels_.push_back(std::move(k));
  }

  memory::data_type dt_;
  std::vector<Kernel> kernels_;
  double flops_ = 0;
};

Floor simple_cnn_floor(memory::data_type dt, int64_t n) {
  Floor f(dt);
  memory::desc x({n, 3, 32, 32}, dt, tag::nchw);
  x = f.relu(f.pool(f.conv(x, 32, 3, 1, 1, true, false), 2, true));
  x = f.relu(f.pool(f.conv(x, 64, 3, 1, 1, true, true), 2, true));
  f.relu(f.linear(n, 64 * 8 * 8, 128, true));
  f.linear(n, 128, 10, true);
  return f;
}

Floor resnet18_floor(memory::data_type dt, int64_t n) {
  Floor f(dt);
  memory::desc x({n, 3, 32, 32}, dt, tag::nchw);
  x = f.relu(f.batch_norm(f.conv(x, 64, 3, 1, 1, false, false)));
  int64_t planes = 64;
  for (int64_t stage = 0; stage < 4; ++stage) {
    for (int64_t block = 0; block < 2; ++block) {
      const int64_t out = 64 << stage, stride = stage > 0 && block == 0 ? 2 : 1;
      const memory::desc y = f.batch_norm(
          f.conv(f.relu(f.batch_norm(f.conv(x, out, 3, stride, 1, false, true))), out, 3, 1, 1, false, true));
      if (stride != 1 || planes != out) f.batch_norm(f.conv(x, out, 1, stride, 0, false, true));
      x = f.relu(f.residual_add(y));
      planes = out;
    }
  }
  f.pool(x, 4, false);
  f.linear(n, 512, 10, true);
  return f;
}

// The instruction set oneDNN dispatches its kernels for on this CPU.
const char* onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "older than avx2";
  }
}

bool has_bf16_kernels() {
  try {
    Floor f(memory::data_type::bf16);
    f.conv(memory::desc({1, 8, 8, 8}, memory::data_type::bf16, tag::nchw), 8, 3, 1, 1, false, true);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// ---- Castor's step ----

class CastorStep {
 public:
  CastorStep(const std::string& model, DType dt, int64_t batch) {
    Generator gen(0);
    model_ = models::make_model(model, 3, 32, 32, 10);
    model_->to(dt);
    opt_ = std::make_unique<optim::Adam>(model_->parameters(), optim::AdamOptions{});
    opt_->set_master_weights(dt != DType::Float32);
    x_ = randn({batch, 3, 32, 32}, dt, &gen);
    y_ = randint(0, 10, {batch}, &gen);
  }

  double images_per_second(int warmup, int iters, double seconds) {
    for (int i = 0; i < warmup; ++i) step();
    const auto t0 = Clock::now();
    int done = 0;
    for (; done < iters && (done < 2 || seconds_since(t0) < seconds); ++done) step();
    return static_cast<double>(x_.size(0)) * done / seconds_since(t0);
  }

 private:
  void step() {
    opt_->zero_grad();
    F::cross_entropy(model_->forward(x_), y_).backward();
    opt_->step();
  }

  nn::ModulePtr model_;
  std::unique_ptr<optim::Adam> opt_;
  Tensor x_, y_;
};

// ---- PyTorch ----

// images/s per mode from one run of bench/train_step_torch.py.
std::map<std::string, double> torch_images_per_second(const std::string& model, int64_t batch, int warmup, int iters,
                                                      double seconds, const std::vector<std::string>& modes) {
  std::string cmd = bench::torch_command("train_step_torch.py " + model + " " + std::to_string(batch) + " " +
                                         std::to_string(warmup) + " " + std::to_string(iters) + " " +
                                         std::to_string(seconds) + " " + std::to_string(kThreads));
  for (const std::string& m : modes) cmd += " " + m;
  std::map<std::string, double> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char mode[64];
  double ips;
  while (std::fscanf(p, "%63s %lf", mode, &ips) == 2) out[mode] = ips;
  if (pclose(p) != 0) std::fprintf(stderr, "warning: %s failed\n", cmd.c_str());
  return out;
}

// ---- the report ----

struct Bench {
  std::string model;
  int64_t batch;
  int warmup, iters;
  double seconds;
  std::vector<std::string> torch_modes;
};

void run(const Bench& b, int rounds, bool bf16_native) {
  std::printf(
      "\n== %s, batch %lld, %d threads: %d warm-up + up to %d timed steps (or %.0f s) per measurement, "
      "median of %d rounds; PyTorch with %s\n",
      b.model.c_str(), static_cast<long long>(b.batch), kThreads, b.warmup, b.iters, b.seconds, rounds,
      bench::torch_allocator());
  const DType dtypes[] = {DType::Float32, DType::BFloat16};
  const double peak[] = {bench::gemm_peak(DType::Float32),
                         bench::gemm_peak(bf16_native ? DType::BFloat16 : DType::Float32)};
  std::vector<CastorStep> castor;
  for (DType dt : dtypes) castor.emplace_back(b.model, dt, b.batch);
  std::vector<std::vector<double>> castor_ips(2);
  std::map<std::string, std::vector<double>> torch_ips;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < castor.size(); ++i)
      castor_ips[i].push_back(castor[i].images_per_second(b.warmup, b.iters, b.seconds));
    for (const auto& [mode, ips] :
         torch_images_per_second(b.model, b.batch, b.warmup, b.iters, b.seconds, b.torch_modes))
      torch_ips[mode].push_back(ips);
  }
  auto torch_median = [&](const std::string& mode) {
    return torch_ips.count(mode) ? bench::median(torch_ips[mode]) : 0.0;
  };
  const char* floor_dt[] = {"f32", bf16_native ? "bf16" : "f32 (no bf16 here)"};
  std::printf("%-9s %10s %9s %8s %10s %10s %9s %9s %9s %11s %11s\n", "castor", "images/s", "step ms", "GFLOP/s",
              "kernels ms", "overhead", "torch", "NCHW", "ch_last", "castor/NCHW", "castor/best");
  for (size_t i = 0; i < castor.size(); ++i) {
    const bool bf16 = dtypes[i] == DType::BFloat16;
    Floor floor = b.model == "simplecnn"
                      ? simple_cnn_floor(bf16 && bf16_native ? memory::data_type::bf16 : memory::data_type::f32,
                                         b.batch)
                      : resnet18_floor(bf16 && bf16_native ? memory::data_type::bf16 : memory::data_type::f32, b.batch);
    const double kernel_ms = floor.time_ms(std::max(3, b.iters / 2));
    const double ips = bench::median(castor_ips[i]), step_ms = b.batch * 1e3 / ips;
    const std::string mode = bf16 ? "bf16" : "fp32", cl = mode + "_cl";
    const double pt = torch_median(mode), pt_cl = torch_median(cl), best = std::max(pt, pt_cl);
    std::printf("%-9s %10.1f %9.1f %8.1f %10.1f %9.2fx %9s ", bf16 ? "bfloat16" : "float32", ips, step_ms,
                floor.flops() / (step_ms * 1e6), kernel_ms, step_ms / kernel_ms, bf16 ? "autocast" : "float32");
    auto column = [](double v, int width) {
      if (v > 0)
        std::printf("%*.1f ", width, v);
      else
        std::printf("%*s ", width, "-");
    };
    column(pt, 9);
    column(pt_cl, 9);
    if (pt > 0)
      std::printf("%10.2fx ", ips / pt);
    else
      std::printf("%11s ", "-");
    if (best > 0)
      std::printf("%10.2fx\n", ips / best);
    else
      std::printf("%11s\n", "-");
    std::printf(
        "          kernels: %s primitives, %.2f GFLOP of conv/matmul per step (as direct convolution); "
        "GEMM peak %.0f GFLOP/s\n",
        floor_dt[i], floor.flops() / 1e9, peak[i] / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "simplecnn";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string algorithm = argc > 3 ? argv[3] : "auto";
  if (algorithm != "auto" && algorithm != "direct") {
    std::fprintf(stderr, "train_step_bench: convolution algorithm \"%s\" is not auto or direct\n", algorithm.c_str());
    return 2;
  }
  backends::set_conv_algorithm(algorithm == "auto" ? backends::ConvAlgorithm::Auto : backends::ConvAlgorithm::Direct);
  const bool bf16_native = has_bf16_kernels();
  std::printf("CPU: %s; oneDNN ISA %s; float32 convolutions: %s\n", bench::cpu_isa().c_str(), onednn_isa(),
              algorithm == "auto" ? "Winograd where oneDNN has it (auto)" : "direct");
  std::printf("oneDNN bfloat16 kernels: %s\n",
              bf16_native ? "available" : "unavailable (castor bfloat16 runs on exact float32 copies)");
  // ResNet-18's PyTorch autocast bfloat16 takes minutes a step without AVX-512: measured only where oneDNN has
  // bfloat16 kernels.
  const std::vector<std::string> resnet_modes = bf16_native
                                                    ? std::vector<std::string>{"fp32", "fp32_cl", "bf16", "bf16_cl"}
                                                    : std::vector<std::string>{"fp32"};
  const Bench benches[] = {{"simplecnn", 256, 3, 10, 3.0, {"fp32", "fp32_cl", "bf16", "bf16_cl"}},
                           {"resnet18", 64, 1, 3, 5.0, resnet_modes}};
  for (const Bench& b : benches)
    if (which == "all" || which == b.model) run(b, rounds, bf16_native);
  return 0;
}
