// castor::F layers and losses against PyTorch (forward and backward from identical inputs), float64 gradchecks of the
// reference path, the oneDNN kernels against the reference loops, and dropout's statistics.
//
// The oracle (tests/oracle/functional_oracle.py) rounds inputs to each case's dtype and computes the reference in
// float64 from them, so a 16-bit result may differ by its one rounding of a float32-accumulated value:
//   dtype      rtol    atol    why
//   float64    1e-10   1e-12   reference loops; only summation order differs
//   float32    1e-5    1e-5    oneDNN float32 accumulation over <= a few hundred terms of O(1) values
//   bfloat16   1e-2    1e-3    one rounding (half an ulp = 2^-9 relative) of a float32 result, plus cancellation
//   float16    2e-3    1e-3    one rounding (2^-12 relative) of a float32 result, plus cancellation
// Batch-norm statistics and running stats are float32 for every 16-bit input: checked at float32 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "castor/autocast.h"
#include "castor/backends.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/layers.h"
#include "test_util.h"

namespace castor {

namespace {

using Case = std::map<std::string, Tensor>;

const char* kDTypes[] = {"float32", "bfloat16", "float16", "float64"};

struct Tol {
  double rtol, atol;
};
Tol tolerance(DType d) {
  switch (d) {
    case DType::Float64: return {1e-10, 1e-12};
    case DType::BFloat16: return {1e-2, 1e-3};
    case DType::Float16: return {2e-3, 1e-3};
    default: return {1e-5, 1e-5};
  }
}

class Functional : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::ScratchDir>("functional_oracle");
    oracle_ok_ = test::run_oracle("functional_oracle.py", {*dir_});
  }
  static void TearDownTestSuite() { dir_.reset(); }

  // Reads a case the oracle wrote: float tensors as float64, integer ones as int64.
  static Case load(const std::string& name) {
    EXPECT_TRUE(oracle_ok_) << "the PyTorch oracle did not run";
    return test::read_oracle_case(*dir_ + "/" + name + ".bin");
  }

  static std::unique_ptr<test::ScratchDir> dir_;
  static bool oracle_ok_;
};
std::unique_ptr<test::ScratchDir> Functional::dir_;
bool Functional::oracle_ok_ = false;

// Compares a result computed in `dt` against the float64 reference.
::testing::AssertionResult matches(const Tensor& got, const Tensor& expected, DType dt) {
  if (!got.defined()) return ::testing::AssertionFailure() << "no result";
  if (got.dtype() != dt) return ::testing::AssertionFailure() << got.describe() << " should be " << dtype_name(dt);
  const Tol t = tolerance(dt);
  return test::close(got, expected, t.rtol, t.atol);
}

Tensor input(const Case& c, const std::string& key, DType dt, bool grad = true) {
  Tensor t = c.at(key).to(dt);
  return grad ? t.requires_grad_() : t;
}

std::vector<int64_t> ints(const Case& c, const std::string& key) { return c.at(key).to_vector<int64_t>(); }

}  // namespace

TEST_F(Functional, Conv2dMatchesTorch) {
  for (const char* name :
       {"conv_basic", "conv_stride_pad", "conv_dilation_nobias", "conv_groups", "conv_depthwise", "conv_simplecnn"})
    for (const char* dts : kDTypes) {
      SCOPED_TRACE(std::string(name) + " " + dts);
      const Case c = load(std::string(name) + "_" + dts);
      ASSERT_FALSE(c.empty());
      const DType dt = parse_dtype(dts);
      const auto p = ints(c, "params");
      Tensor x = input(c, "x", dt), w = input(c, "w", dt);
      Tensor b = c.count("b") ? input(c, "b", dt) : Tensor();
      Tensor y = F::conv2d(x, w, b, {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, p[6]);
      EXPECT_TRUE(matches(y, c.at("y"), dt));
      backward({y}, {c.at("gy").to(dt)});
      EXPECT_TRUE(matches(x.grad(), c.at("dx"), dt));
      EXPECT_TRUE(matches(w.grad(), c.at("dw"), dt));
      if (b.defined()) {
        EXPECT_TRUE(matches(b.grad(), c.at("db"), dt));
      }
    }
}

TEST_F(Functional, Conv2dSkipsInputGradientOfFirstLayer) {
  const Case c = load("conv_simplecnn_float32");
  ASSERT_FALSE(c.empty());
  Tensor x = input(c, "x", DType::Float32, /*grad=*/false), w = input(c, "w", DType::Float32);
  Tensor b = input(c, "b", DType::Float32);
  Tensor y = F::conv2d(x, w, b, {1, 1}, {1, 1});
  backward({y}, {c.at("gy").to(DType::Float32)});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_TRUE(matches(w.grad(), c.at("dw"), DType::Float32));
  EXPECT_TRUE(matches(b.grad(), c.at("db"), DType::Float32));
}

TEST_F(Functional, BatchNormMatchesTorch) {
  for (const char* name : {"bn_train_4d", "bn_train_2d", "bn_train_noaffine", "bn_eval_4d"})
    for (const char* dts : kDTypes) {
      SCOPED_TRACE(std::string(name) + " " + dts);
      const Case c = load(std::string(name) + "_" + dts);
      ASSERT_FALSE(c.empty());
      const DType dt = parse_dtype(dts), stat = dt == DType::Float64 ? DType::Float64 : DType::Float32;
      const auto p = ints(c, "params");
      const bool training = p[0], affine = p[1];
      Tensor x = input(c, "x", dt);
      Tensor w = affine ? input(c, "w", stat) : Tensor(), b = affine ? input(c, "b", stat) : Tensor();
      Tensor rm = c.at("running_mean").to(stat).clone(), rv = c.at("running_var").to(stat).clone();
      Tensor y = F::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
      EXPECT_TRUE(matches(y, c.at("y"), dt));
      EXPECT_TRUE(matches(rm, c.at("running_mean_after"), stat));
      EXPECT_TRUE(matches(rv, c.at("running_var_after"), stat));
      backward({y}, {c.at("gy").to(dt)});
      EXPECT_TRUE(matches(x.grad(), c.at("dx"), dt));
      if (affine) {
        // Parameter gradients are float32 sums over the batch of 16-bit products: float32 tolerance relative to
        // the rounding of the 16-bit inputs is already in the reference, so only accumulation order differs.
        EXPECT_TRUE(matches(w.grad(), c.at("dw"), stat));
        EXPECT_TRUE(matches(b.grad(), c.at("db"), stat));
      }
    }
}

TEST_F(Functional, PoolingMatchesTorch) {
  for (const char* name : {"maxpool_k3s2p1", "maxpool_k2", "avgpool_k3s2p1_incl", "avgpool_k3s2p1_excl",
                           "avgpool_k2x3s1", "adaptive_5x7_to_3x4", "adaptive_8x8_to_2x2", "adaptive_to_1x1"})
    for (const char* dts : kDTypes) {
      SCOPED_TRACE(std::string(name) + " " + dts);
      const Case c = load(std::string(name) + "_" + dts);
      ASSERT_FALSE(c.empty());
      const DType dt = parse_dtype(dts);
      const auto p = ints(c, "params");  // kind, kernel (or output size) h, w, stride h, w, padding h, w, incl
      Tensor x = input(c, "x", dt);
      Tensor y = p[0] == 0   ? F::max_pool2d(x, {p[1], p[2]}, {p[3], p[4]}, {p[5], p[6]})
                 : p[0] == 1 ? F::avg_pool2d(x, {p[1], p[2]}, {p[3], p[4]}, {p[5], p[6]}, p[7] != 0)
                             : F::adaptive_avg_pool2d(x, {p[1], p[2]});
      EXPECT_TRUE(matches(y, c.at("y"), dt));
      backward({y}, {c.at("gy").to(dt)});
      EXPECT_TRUE(matches(x.grad(), c.at("dx"), dt));
    }
}

TEST_F(Functional, LossesMatchTorch) {
  const std::map<std::string, std::vector<std::string>> variants = {
      {"ce", {"plain", "smooth", "ignore", "weight", "all"}},
      {"nll", {"plain", "ignore", "weight"}},
      {"mse", {"plain"}},
      {"bcel", {"plain"}},
      {"bce", {"plain"}}};
  const std::map<std::string, F::Reduction> reductions = {
      {"none", F::Reduction::None}, {"mean", F::Reduction::Mean}, {"sum", F::Reduction::Sum}};
  int cases = 0;
  for (const auto& [fn, vs] : variants)
    for (const std::string& v : vs)
      for (const auto& [red_name, red] : reductions)
        for (const char* dts : {"float32", "float64"}) {
          const std::string name = fn + "_" + v + "_" + red_name + "_" + dts;
          SCOPED_TRACE(name);
          const Case c = load(name);
          ASSERT_FALSE(c.empty());
          const DType dt = parse_dtype(dts);
          const int64_t ignore = ints(c, "params")[0];
          const double smoothing = c.at("smoothing").item();
          Tensor x = input(c, "x", dt);
          Tensor weight = c.count("weight") ? c.at("weight").to(dt) : Tensor();
          Tensor y;
          if (fn == "ce")
            y = F::cross_entropy(x, c.at("target"), red, smoothing, ignore, weight);
          else if (fn == "nll")
            y = F::nll_loss(log_softmax(x, 1), c.at("target"), red, ignore, weight);
          else if (fn == "mse")
            y = F::mse_loss(x, c.at("target").to(dt), red);
          else if (fn == "bcel")
            y = F::binary_cross_entropy_with_logits(x, c.at("target").to(dt), red);
          else
            y = F::binary_cross_entropy(x, c.at("target").to(dt), red);
          EXPECT_TRUE(matches(y, c.at("y"), dt));
          backward({y}, {c.at("gy").to(dt)});
          EXPECT_TRUE(matches(x.grad(), c.at("dx"), dt));
          ++cases;
        }
  EXPECT_EQ(cases, 66);
}

TEST(FunctionalGradcheck, Float64LayersMatchFiniteDifferences) {
  Generator gen(11);
  Tensor x = randn({2, 4, 6, 5}, DType::Float64, &gen).requires_grad_();
  Tensor w = randn({6, 2, 3, 2}, DType::Float64, &gen).requires_grad_();
  Tensor b = randn({6}, DType::Float64, &gen).requires_grad_();
  EXPECT_TRUE(test::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv2d(in[0], in[1], in[2], {2, 1}, {1, 1}, {1, 2}, 2);
      },
      {x, w, b}));
  Tensor gamma = uniform({4}, 0.5, 1.5, DType::Float64, &gen).requires_grad_();
  Tensor beta = randn({4}, DType::Float64, &gen).requires_grad_();
  for (bool training : {true, false}) {
    Tensor rm = randn({4}, DType::Float64, &gen), rv = uniform({4}, 0.5, 1.5, DType::Float64, &gen);
    EXPECT_TRUE(test::gradcheck(
        [&](const std::vector<Tensor>& in) {
          return F::batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training, 0.1, 1e-5);
        },
        {x, gamma, beta}))
        << "training " << training;
  }
  using In = const std::vector<Tensor>&;
  EXPECT_TRUE(test::gradcheck([](In in) { return F::max_pool2d(in[0], {3, 2}, {2, 2}, {1, 1}); }, {x}));
  EXPECT_TRUE(test::gradcheck([](In in) { return F::avg_pool2d(in[0], {3, 3}, {2, 1}, {1, 1}, false); }, {x}));
  EXPECT_TRUE(test::gradcheck([](In in) { return F::adaptive_avg_pool2d(in[0], {4, 3}); }, {x}));
}

// The oneDNN float32 kernels against the reference loops over many parameter combinations (no PyTorch needed).
TEST(FunctionalKernels, OnednnConvMatchesReferenceLoops) {
  Generator gen(5);
  int combos = 0;
  for (int64_t groups : {1, 3})
    for (int64_t stride : {1, 2})
      for (int64_t padding : {0, 1, 2})
        for (int64_t dilation : {1, 2}) {
          SCOPED_TRACE(
              detail::cat("groups ", groups, " stride ", stride, " padding ", padding, " dilation ", dilation));
          Tensor x = randn({2, 6, 9, 8}, DType::Float32, &gen).requires_grad_();
          Tensor w = randn({9, 6 / groups, 3, 3}, DType::Float32, &gen).requires_grad_();
          Tensor b = randn({9}, DType::Float32, &gen).requires_grad_();
          Tensor x64 = x.detach().double_().requires_grad_(), w64 = w.detach().double_().requires_grad_();
          Tensor b64 = b.detach().double_().requires_grad_();
          auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
            return F::conv2d(xi, wi, bi, {stride, stride}, {padding, padding}, {dilation, dilation}, groups);
          };
          Tensor y = run(x, w, b), y64 = run(x64, w64, b64);
          EXPECT_TRUE(test::close(y, y64, 1e-5, 1e-5));
          Tensor gy = randn(y.shape(), DType::Float32, &gen);
          backward({y}, {gy});
          backward({y64}, {gy.double_()});
          EXPECT_TRUE(test::close(x.grad(), x64.grad(), 1e-5, 1e-5));
          EXPECT_TRUE(test::close(w.grad(), w64.grad(), 1e-5, 1e-5));
          EXPECT_TRUE(test::close(b.grad(), b64.grad(), 1e-5, 1e-5));
          ++combos;
        }
  EXPECT_EQ(combos, 24);
}

// Channels-last inputs run the layers on channels-last primitives and give channels-last results: each layer,
// forward and backward, against the float64 reference loops on the same (rounded) values in NCHW, to the tolerance
// of the dtype (the table at the top).
TEST(FunctionalKernels, ChannelsLastLayersMatchReferenceLoops) {
  struct Layer {
    const char* name;
    Shape w, b;  // empty: no such parameter
    std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> f;
  };
  const std::vector<Layer> layers = {
      // clang-format off
      {"conv", {9, 6, 3, 3}, {9}, [](auto& x, auto& w, auto& b) { return F::conv2d(x, w, b, {1, 1}, {1, 1}); }},
      {"grouped strided conv", {9, 2, 3, 3}, {}, [](auto& x, auto& w, auto& b) {
         return F::conv2d(x, w, b, {2, 2}, {1, 0}, {1, 1}, /*groups=*/3);
       }},
      {"batch norm", {6}, {6}, [](auto& x, auto& w, auto& b) {
         return F::batch_norm(x, {}, {}, w, b, /*training=*/true);
       }},
      {"max pool", {}, {}, [](auto& x, auto&, auto&) { return F::max_pool2d(x, {3, 2}, {2, 2}, {1, 1}); }},
      {"avg pool", {}, {}, [](auto& x, auto&, auto&) { return F::avg_pool2d(x, {2, 2}); }},
      // clang-format on
  };
  Generator gen(7);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    for (const Layer& layer : layers) {
      SCOPED_TRACE(detail::cat(layer.name, " in ", dtype_name(dt)));
      const Tol tol = tolerance(dt);
      auto param = [&](const Shape& shape) {
        return shape.empty() ? Tensor() : randn(shape, DType::Float32, &gen).to(dt).requires_grad_();
      };
      Tensor x = randn({2, 6, 9, 8}, DType::Float32, &gen).to(dt);
      Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast).requires_grad_(), w = param(layer.w), b = param(layer.b);
      Tensor x64 = x.double_().requires_grad_();
      Tensor w64 = w.defined() ? w.detach().double_().requires_grad_() : w;
      Tensor b64 = b.defined() ? b.detach().double_().requires_grad_() : b;
      Tensor y = layer.f(x_cl, w, b), y64 = layer.f(x64, w64, b64);
      EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
      EXPECT_TRUE(test::close(y, y64, tol.rtol, tol.atol));
      Tensor gy = randn(y.shape(), DType::Float32, &gen).to(dt);
      backward({y}, {gy.contiguous(MemoryFormat::ChannelsLast)});
      backward({y64}, {gy.double_()});
      EXPECT_TRUE(test::close(x_cl.grad(), x64.grad(), tol.rtol, tol.atol));
      if (w.defined()) {
        EXPECT_TRUE(test::close(w.grad(), w64.grad(), tol.rtol, tol.atol));
      }
      if (b.defined()) {
        EXPECT_TRUE(test::close(b.grad(), b64.grad(), tol.rtol, tol.atol));
      }
    }
  // Max pooling propagates a NaN in its window, as the reference loops (and PyTorch) do.
  Tensor x = randn({1, 3, 4, 4}, DType::Float32, &gen);
  x.select(0, 0).select(0, 1).select(0, 2).select(0, 1).fill_(std::nan(""));
  const auto pooled = F::max_pool2d(x.contiguous(MemoryFormat::ChannelsLast), {2, 2}).to_vector<double>();
  const auto want = F::max_pool2d(x.double_(), {2, 2}).to_vector<double>();
  ASSERT_EQ(pooled.size(), want.size());
  int nans = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(std::isnan(pooled[i]), std::isnan(want[i])) << "output " << i;
    if (!std::isnan(want[i])) {
      EXPECT_EQ(pooled[i], want[i]) << "output " << i;
    }
    nans += std::isnan(want[i]);
  }
  EXPECT_EQ(nans, 1);
}

// Whether this CPU has AVX-512 as oneDNN's Winograd convolutions need it (avx512_core: F, BW, VL, DQ), and
// ONEDNN_MAX_CPU_ISA (the IsaCap tests) does not cap oneDNN below it.
bool has_avx512_core() {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap) cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (cap && std::string(cap).rfind("AVX512_CORE", 0) != 0 && std::string(cap) != "ALL") return false;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" avx512f") != std::string::npos && line.find(" avx512bw") != std::string::npos &&
             line.find(" avx512vl") != std::string::npos && line.find(" avx512dq") != std::string::npos;
  return false;
}

// Largest |a - b| over the largest |b|: Winograd's error scales with the sums an output is made of, not with the
// output itself, so it is measured against the tensor's scale (docs/numerics.md).
double scaled_error(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.double_().contiguous(), b64 = b.double_().contiguous();
  double err = 0, scale = 0;
  for (int64_t i = 0; i < b64.numel(); ++i) {
    err = std::max(err, std::abs(a64.data<double>()[i] - b64.data<double>()[i]));
    scale = std::max(scale, std::abs(b64.data<double>()[i]));
  }
  return err / scale;
}

// castor/backends.h: under Auto, float32 3x3 stride-1 convolutions with 64 or more input channels run as Winograd
// where the CPU has AVX-512 (all three passes), within 1e-5 of float64 relative to the tensor's scale (measured
// 1-2e-6); under Direct (and without AVX-512) the same convolutions run direct, within 5e-6 (measured 2-6e-7 on
// AVX-512 kernels, up to 1.5e-6 on AVX2 ones).
TEST(FunctionalKernels, WinogradConvolutionsAreFloat32WithinTheirTolerance) {
  Generator gen(11);
  const auto restore = backends::conv_algorithm();
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
    for (int64_t padding : {0, 1})
      for (auto algorithm : {backends::ConvAlgorithm::Auto, backends::ConvAlgorithm::Direct}) {
        const bool auto_algo = algorithm == backends::ConvAlgorithm::Auto;
        SCOPED_TRACE(detail::cat(format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW", " padding ", padding,
                                 auto_algo ? " auto" : " direct"));
        backends::set_conv_algorithm(algorithm);
        Tensor x = randn({3, 64, 11, 9}, DType::Float32, &gen).contiguous(format).requires_grad_();
        Tensor w = (randn({80, 64, 3, 3}, DType::Float32, &gen) * 0.05).requires_grad_();
        Tensor b = randn({80}, DType::Float32, &gen).requires_grad_();
        Tensor x64 = x.detach().double_().requires_grad_(), w64 = w.detach().double_().requires_grad_();
        Tensor b64 = b.detach().double_().requires_grad_();
        const int64_t before = kernels::conv_winograd_count();
        Tensor y = F::conv2d(x, w, b, {1, 1}, {padding, padding});
        Tensor y64 = F::conv2d(x64, w64, b64, {1, 1}, {padding, padding});
        Tensor gy = randn(y.shape(), DType::Float32, &gen);
        backward({y}, {gy});
        backward({y64}, {gy.double_()});
        const bool winograd = auto_algo && has_avx512_core();
        EXPECT_EQ(kernels::conv_winograd_count() - before, winograd ? 3 : 0);
        const double tol = winograd ? 1e-5 : 5e-6;
        EXPECT_LT(scaled_error(y, y64), tol);
        EXPECT_LT(scaled_error(x.grad(), x64.grad()), tol);
        EXPECT_LT(scaled_error(w.grad(), w64.grad()), tol);
        EXPECT_TRUE(test::close(b.grad(), b64.grad(), 1e-5, 1e-5));
        std::printf("%s scaled errors: y %.2g, dx %.2g, dw %.2g\n", winograd ? "Winograd" : "direct",
                    scaled_error(y, y64), scaled_error(x.grad(), x64.grad()), scaled_error(w.grad(), w64.grad()));
      }
  backends::set_conv_algorithm(restore);
}

TEST(FunctionalKernels, ConvReordersPerCallAreFew) {
  // SimpleCNN's second conv. NCHW activations: the primitive may want blocked layouts, so at most src, weights and
  // dst are reordered forward, and backward reorders diff_dst once for both passes. Channels-last activations run
  // on channels-last primitives: only the weights are reordered (forward, backward-data, diff_weights).
  Generator gen(3);
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    const bool cl = format == MemoryFormat::ChannelsLast;
    Tensor x = randn({8, 32, 16, 16}, DType::Float32, &gen).contiguous(format).requires_grad_();
    Tensor w = randn({64, 32, 3, 3}, DType::Float32, &gen).requires_grad_();
    Tensor y = F::conv2d(x, w, {}, {1, 1}, {1, 1});  // warm the caches
    const int64_t before_fwd = kernels::conv_reorder_count();
    y = F::conv2d(x, w, {}, {1, 1}, {1, 1});
    const int64_t fwd = kernels::conv_reorder_count() - before_fwd;
    backward({y}, {ones_like(y)});
    const int64_t bwd = kernels::conv_reorder_count() - before_fwd - fwd;
    EXPECT_LE(fwd, cl ? 1 : 3);
    EXPECT_LE(bwd, cl ? 2 : 5);  // diff_dst, weights, diff_src, src, diff_weights
    std::printf("conv reorders per call, %s: forward %lld, backward %lld\n", cl ? "channels-last" : "NCHW",
                static_cast<long long>(fwd), static_cast<long long>(bwd));
  }
}

// PyTorch 1.13's linear with a bias on a 2-D or contiguous 3-D input is one addmm: the bias is added to the float32
// product before the one rounding to 16 bits. Dyadic operands make every float32 sum exact, so the oracle is the
// exact float64 result rounded once. A product then an add rounds twice (PyTorch's path for other inputs, e.g. a
// transposed 3-D one) and differs from it here, which shows that the check tells the two apart.
TEST(FunctionalLinear, BiasIsAddedBeforeTheOneRoundingAsInPyTorchsAddmm) {
  Generator gen(11);
  auto dyadic = [&](const Shape& shape, int64_t range, double scale) {
    return randint(-range, range + 1, shape, &gen).to(DType::Float64) * scale;
  };
  // Operands of 5 and 7 significant bits (exact in both 16-bit types); sums of up to 16 bits (exact in float32).
  const Tensor x = dyadic({3, 5, 64}, 31, 1.0 / 16), w = dyadic({24, 64}, 31, 1.0 / 16);
  const Tensor b = dyadic({24}, 127, 1.0 / 256);
  const Tensor exact = matmul(x, w.t()) + b;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor xd = x.to(dt), wd = w.to(dt), bd = b.to(dt), want = exact.to(dt);
    EXPECT_TRUE(test::bit_equal(F::linear(xd, wd, bd), want));
    EXPECT_TRUE(test::bit_equal(F::linear(xd.reshape({15, 64}), wd, bd), want.reshape({15, 24})));
    EXPECT_TRUE(test::bit_equal(addmm(bd, xd.reshape({15, 64}), wd.t()), want.reshape({15, 24})));
    {
      amp::AutocastGuard autocast(dt);
      EXPECT_TRUE(test::bit_equal(F::linear(x.to(DType::Float32), w.to(DType::Float32), b.to(DType::Float32)), want));
    }
    const Tensor twice = matmul(xd, wd.t()) + bd;
    EXPECT_FALSE(test::bit_equal(twice, want));
    const Tensor transposed = xd.transpose(0, 1).contiguous().transpose(0, 1);  // (3, 5, 64), not contiguous
    EXPECT_TRUE(test::bit_equal(F::linear(transposed, wd, bd), twice));
  }
}

TEST(FunctionalDropout, StatisticsAndBackwardMask) {
  manual_seed(42);
  Tensor x = full({200, 500}, 2.0).requires_grad_();
  const double p = 0.3;
  Tensor y = F::dropout(x, p, /*training=*/true);
  backward({sum(y)});
  const auto out = y.to_vector<double>(), g = x.grad().to_vector<double>();
  int64_t zeros = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0) {
      ++zeros;
      ASSERT_EQ(g[i], 0.0) << "element " << i << " was dropped but got a gradient";
    } else {
      ASSERT_NEAR(out[i], 2.0 / (1 - p), 1e-6) << "element " << i;
      ASSERT_NEAR(g[i], 1.0 / (1 - p), 1e-6) << "element " << i;
    }
  }
  // 100000 Bernoulli(0.3) draws: the fraction dropped is within 5 standard deviations (0.0072) of p.
  EXPECT_NEAR(static_cast<double>(zeros) / out.size(), p, 0.0072);
  EXPECT_TRUE(F::dropout(x, p, /*training=*/false).is_same(x));
  EXPECT_EQ(sum(F::dropout(x, 1.0, true)).item(), 0.0);
  EXPECT_THROW(F::dropout(x, 1.5, true), Error);
  Tensor h = F::dropout(x.detach().bfloat16(), 0.5, true);
  EXPECT_EQ(h.dtype(), DType::BFloat16);
}

TEST(FunctionalErrors, NameTheOpAndShapes) {
  Tensor x = zeros({2, 3, 8, 8});
  test::expect_error([&] { F::conv2d(x, zeros({4, 2, 3, 3})); }, {"conv2d", "[4, 2, 3, 3]"});
  EXPECT_THROW(F::max_pool2d(x, {2, 2}, {2, 2}, {2, 2}), Error);
  EXPECT_THROW(F::cross_entropy(zeros({2, 3}), tensor({0, 3}, DType::Int64)), Error);
  EXPECT_THROW(F::batch_norm(zeros({1, 3}), {}, {}, {}, {}, /*training=*/true), Error);
  amp::AutocastGuard autocast(DType::BFloat16);
  EXPECT_THROW(F::binary_cross_entropy(full({2}, 0.5), full({2}, 1.0)), Error);
}

TEST(FunctionalAutocast, LayersFollowTheirPolicies) {
  Generator gen(9);
  Tensor x = randn({4, 3, 8, 8}, DType::Float32, &gen);
  Tensor w = randn({5, 3, 3, 3}, DType::Float32, &gen).requires_grad_();
  Tensor lw = randn({7, 5}, DType::Float32, &gen).requires_grad_(), lb = randn({7}, DType::Float32, &gen);
  amp::AutocastGuard autocast(DType::BFloat16);
  Tensor y = F::conv2d(x, w, {}, {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  Tensor n = F::batch_norm(y, zeros({5}), ones({5}), {}, {}, /*training=*/true);
  EXPECT_EQ(n.dtype(), DType::BFloat16);  // PyTorch 1.13 CPU autocast: batch_norm keeps the input dtype
  Tensor l = F::linear(F::adaptive_avg_pool2d(n, {1, 1}).flatten(1), lw, lb);
  EXPECT_EQ(l.dtype(), DType::BFloat16);
  Tensor loss = F::cross_entropy(l, tensor({0, 1, 2, 3}, DType::Int64));
  EXPECT_EQ(loss.dtype(), DType::Float32);
  loss.backward();
  EXPECT_EQ(w.grad().dtype(), DType::Float32);
  EXPECT_EQ(lw.grad().dtype(), DType::Float32);
}

}  // namespace castor
