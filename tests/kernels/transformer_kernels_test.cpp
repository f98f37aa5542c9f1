// The transformer kernels (src/kernels/transformer.h) against float64 references: the reference loops run in
// float64 on the same (exactly widened) inputs, a naive full-matrix float64 attention for the flash kernels, and
// PyTorch (tests/oracle/transformer_kernels_oracle.py) for layer norm and cross-entropy.
//
// Tolerances per dtype (16-bit computed in float32, each output rounded once):
//  - norms, cross-entropy, embedding: 16-bit outputs are one rounding of an accurate float32 value: within half an
//    ulp of the float64 result plus 1e-5 relative (norm backward, whose sums cancel: close() at rtol/atol 1e-2 for
//    bfloat16, 2e-3 for float16 of the largest gradient); float32 rtol 1e-5; float64 1e-12.
//  - attention (P and dS rounded to the 16-bit type before their products, as flash attention does): relative to the
//    largest value of each result, float32 2e-5, bfloat16 3e-2, float16 4e-3; float64 1e-12 (the same loops).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "castor/allocator.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/transformer.h"
#include "test_util.h"

namespace castor {
namespace {

const DType kAll[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64};

// N(0, scale^2) values rounded to dt (so that their float64 widening is exact).
Tensor rnd(const Shape& shape, DType dt, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  Tensor x = randn(shape, DType::Float64, &gen);
  x.mul_(scale);
  return x.to(dt).contiguous();
}

Tensor f64(const Tensor& t) { return t.to(DType::Float64).contiguous(); }

DType stat_dtype(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

// The spacing of dt's values at |x|.
double ulp(double x, DType dt) {
  const int p = dt == DType::BFloat16 ? 8 : dt == DType::Float16 ? 11 : dt == DType::Float32 ? 24 : 53;
  const int min_exp = dt == DType::BFloat16 ? -125 : dt == DType::Float16 ? -13 : dt == DType::Float32 ? -125 : -1021;
  int e = 0;
  std::frexp(x, &e);
  return std::ldexp(1.0, std::max(e, min_exp) - p);
}

// Each element of `got` (of its dtype) is one rounding of a value within rel * |e| + abs of the float64 `expected`,
// or of the same element of one of `alternatives` (expected values that differ by an earlier rounding).
::testing::AssertionResult one_rounding(const Tensor& got, const Tensor& expected, double rel, double abs = 0,
                                        const std::vector<Tensor>& alternatives = {}) {
  const std::vector<double> g = got.to_vector<double>(), e = expected.to_vector<double>();
  std::vector<std::vector<double>> alt;
  for (const Tensor& a : alternatives) alt.push_back(a.to_vector<double>());
  if (g.size() != e.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < g.size(); ++i) {
    auto within = [&](double want) {
      return std::fabs(g[i] - want) <= 0.5 * ulp(g[i], got.dtype()) + rel * std::fabs(want) + abs;
    };
    bool ok = within(e[i]);
    for (const std::vector<double>& a : alt) ok = ok || within(a[i]);
    if (!ok)
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << e[i] << " (slack "
                                           << 0.5 * ulp(g[i], got.dtype()) + rel * std::fabs(e[i]) + abs << ")";
  }
  return ::testing::AssertionSuccess();
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

// close() with atol = frac * max |expected| (results whose sums cancel), at least frac / 10 (results that are 0
// but for rounding, from inputs of order 1).
::testing::AssertionResult close_scaled(const Tensor& got, const Tensor& expected, double frac) {
  return test::close(got, expected, frac, frac * std::max(max_abs(expected), 0.1));
}

// ---- Layer norm and RMS norm ----

struct NormCase {
  Shape shape;
  bool affine;
};

void check_norm(bool rms, DType dt, const NormCase& c, DType param_dt, uint64_t seed) {
  const int64_t C = c.shape.back(), rows = shape_numel(c.shape) / C;
  const DType st = stat_dtype(dt);
  const Tensor x = rnd(c.shape, dt, seed, 2.0), dy = rnd(c.shape, dt, seed + 1);
  // A per-row offset so that the mean matters.
  Tensor w, b;
  if (c.affine) w = rnd({C}, param_dt, seed + 2), b = rnd({C}, param_dt, seed + 3);
  Tensor y = empty(c.shape, dt), mean = empty({rows}, st), rstd = empty({rows}, st);
  Tensor dx = empty(c.shape, dt), dw, db;
  if (c.affine) dw = empty({C}, param_dt), db = empty({C}, param_dt);
  // The float64 reference on the same values.
  Tensor y64 = empty(c.shape, DType::Float64), mean64 = empty({rows}, DType::Float64),
         rstd64 = empty({rows}, DType::Float64), dx64 = empty(c.shape, DType::Float64), dw64, db64;
  if (c.affine) dw64 = empty({C}, DType::Float64), db64 = empty({C}, DType::Float64);
  const Tensor w64 = c.affine ? f64(w) : Tensor(), b64 = c.affine ? f64(b) : Tensor();
  const double eps = 1e-5;
  if (rms) {
    kernels::rms_norm_forward(x, w, y, rstd, eps);
    kernels::rms_norm_backward(x, dy, w, rstd, dx, dw);
    kernels::rms_norm_forward(f64(x), w64, y64, rstd64, eps);
    kernels::rms_norm_backward(f64(x), f64(dy), w64, rstd64, dx64, dw64);
  } else {
    kernels::layer_norm_forward(x, w, b, y, mean, rstd, eps);
    kernels::layer_norm_backward(x, dy, w, mean, rstd, dx, dw, db);
    kernels::layer_norm_forward(f64(x), w64, b64, y64, mean64, rstd64, eps);
    kernels::layer_norm_backward(f64(x), f64(dy), w64, mean64, rstd64, dx64, dw64, db64);
    EXPECT_TRUE(test::close(mean, mean64, 1e-5, 1e-6)) << "mean";
  }
  EXPECT_TRUE(test::close(rstd, rstd64, 1e-5, 0)) << "rstd";
  if (dt == DType::Float64) {
    EXPECT_TRUE(test::bit_equal(y, y64));
    return;
  }
  if (dt == DType::Float32) {
    EXPECT_TRUE(test::close(y, y64, 1e-5, 1e-5)) << "dst";
    EXPECT_TRUE(close_scaled(dx, dx64, 1e-5)) << "diff_src";
  } else {
    // RMS norm rounds the normalised row to dt before the weight (torch.nn.RMSNorm's and Hugging Face's order): one
    // rounding of the weight times that, the normalised value (float32 in the kernel) rounded either way where it
    // lies within 1e-6 of a rounding boundary.
    Tensor want = y64;
    std::vector<Tensor> either;
    if (rms && c.affine) {
      Tensor n64 = empty(c.shape, DType::Float64), r64 = empty({rows}, DType::Float64);
      kernels::rms_norm_forward(f64(x), Tensor(), n64, r64, eps);
      want = mul(f64(n64.to(dt)), w64);
      for (double f : {1 - 1e-6, 1 + 1e-6}) either.push_back(mul(f64(mul(n64, f).to(dt)), w64));
    }
    EXPECT_TRUE(one_rounding(y, want, 1e-5, 1e-6, either)) << "dst";
    EXPECT_TRUE(close_scaled(dx, dx64, dt == DType::BFloat16 ? 1e-2 : 2e-3)) << "diff_src";
  }
  if (c.affine) {
    // Summed over rows in float32, rounded once into the parameters' dtype.
    if (param_dt == DType::Float32) {
      EXPECT_TRUE(close_scaled(dw, dw64, 1e-5)) << "diff_weight";
      if (!rms) {
        EXPECT_TRUE(close_scaled(db, db64, 1e-5)) << "diff_bias";
      }
    } else {
      EXPECT_TRUE(one_rounding(dw, dw64, 1e-5, 1e-5 * max_abs(dw64))) << "diff_weight";
      if (!rms) {
        EXPECT_TRUE(one_rounding(db, db64, 1e-5, 1e-5 * max_abs(db64))) << "diff_bias";
      }
    }
  }
}

const NormCase kNormCases[] = {
    {{1, 1}, true}, {{7, 16}, true}, {{2, 3, 65}, false}, {{5, 130}, true}, {{64, 768}, true}};

TEST(TransformerKernels, LayerNormMatchesFloat64) {
  for (DType dt : kAll)
    for (const NormCase& c : kNormCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.shape) + (c.affine ? " affine" : ""));
      check_norm(/*rms=*/false, dt, c, dt, 10);
      // Float32 parameters under a 16-bit input (the O2 case).
      if (c.affine && dt != DType::Float64) check_norm(/*rms=*/false, dt, c, DType::Float32, 20);
    }
}

TEST(TransformerKernels, RmsNormMatchesFloat64) {
  for (DType dt : kAll)
    for (const NormCase& c : kNormCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.shape) + (c.affine ? " affine" : ""));
      check_norm(/*rms=*/true, dt, c, dt, 30);
      if (c.affine && dt != DType::Float64) check_norm(/*rms=*/true, dt, c, DType::Float32, 40);
    }
}

TEST(TransformerKernels, NormBackwardSkipsUndefinedDiffs) {
  const Tensor x = rnd({4, 9}, DType::Float32, 1), dy = rnd({4, 9}, DType::Float32, 2), w = rnd({9}, DType::Float32, 3);
  Tensor y = empty({4, 9}), mean = empty({4}), rstd = empty({4}), dw = empty({9}), dw_all = empty({9}),
         dx = empty({4, 9}), db = empty({9});
  kernels::layer_norm_forward(x, w, Tensor(), y, mean, rstd, 1e-5);
  kernels::layer_norm_backward(x, dy, w, mean, rstd, Tensor(), dw, Tensor());
  kernels::layer_norm_backward(x, dy, w, mean, rstd, dx, dw_all, db);
  EXPECT_TRUE(test::bit_equal(dw, dw_all));
}

// ---- Attention ----

struct AttnCase {
  int64_t B, H, Tq, Tk, D;
  int64_t Hkv = 0;  // k/v heads (grouped-query attention); 0: H
  int64_t kv_heads() const { return Hkv ? Hkv : H; }
};

double attn_tol(DType dt) {
  switch (dt) {
    case DType::Float32: return 2e-5;
    case DType::BFloat16: return 3e-2;
    case DType::Float16: return 4e-3;
    default: return 1e-12;
  }
}

// q, k, v as strided (B, H, T, D) views of one (B, T, 3, H, D) buffer when Tq == Tk and k, v have H heads (the fused
// projection), else separate contiguous tensors.
struct Qkv {
  Tensor q, k, v;
};
Qkv make_qkv(const AttnCase& c, DType dt, uint64_t seed) {
  if (c.Tq == c.Tk && c.kv_heads() == c.H) {
    const Tensor all = rnd({c.B, c.Tq, 3, c.H, c.D}, dt, seed);
    return {all.select(2, 0).permute({0, 2, 1, 3}), all.select(2, 1).permute({0, 2, 1, 3}),
            all.select(2, 2).permute({0, 2, 1, 3})};
  }
  return {rnd({c.B, c.H, c.Tq, c.D}, dt, seed), rnd({c.B, c.kv_heads(), c.Tk, c.D}, dt, seed + 1),
          rnd({c.B, c.kv_heads(), c.Tk, c.D}, dt, seed + 2)};
}

// Gradients written into strided views of one (B, T, 3, H, D) buffer when Tq == Tk, like q, k, v.
Qkv make_grads(const AttnCase& c, DType dt) {
  if (c.Tq == c.Tk && c.kv_heads() == c.H) {
    const Tensor all = full({c.B, c.Tq, 3, c.H, c.D}, std::nan(""), dt);
    return {all.select(2, 0).permute({0, 2, 1, 3}), all.select(2, 1).permute({0, 2, 1, 3}),
            all.select(2, 2).permute({0, 2, 1, 3})};
  }
  return {empty({c.B, c.H, c.Tq, c.D}, dt), empty({c.B, c.kv_heads(), c.Tk, c.D}, dt),
          empty({c.B, c.kv_heads(), c.Tk, c.D}, dt)};
}

enum class MaskKind { None, Causal, Bool, Float, CausalBool };

Tensor make_mask(MaskKind kind, const AttnCase& c, DType dt, uint64_t seed) {
  Generator gen(seed);
  if (kind == MaskKind::Bool || kind == MaskKind::CausalBool) {
    // (B, 1, Tq, Tk), mostly kept.
    const Tensor r = rand({c.B, 1, c.Tq, c.Tk}, DType::Float64, &gen);
    Tensor m = empty({c.B, 1, c.Tq, c.Tk}, DType::Bool);
    const std::vector<double> rv = r.to_vector<double>();
    bool* p = m.data<bool>();
    for (size_t i = 0; i < rv.size(); ++i) p[i] = rv[i] > 0.2;
    return m;
  }
  if (kind == MaskKind::Float) return rnd({c.Tq, c.Tk}, dt, seed);  // (Tq, Tk), broadcast over B, H
  return Tensor();
}

// The flash kernel against the naive float64 attention on the same values, forward and backward.
void check_attention(const AttnCase& c, DType dt, MaskKind kind, uint64_t seed) {
  const Qkv x = make_qkv(c, dt, seed);
  const Tensor mask = make_mask(kind, c, dt, seed + 7);
  const bool causal = kind == MaskKind::Causal || kind == MaskKind::CausalBool;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const DType st = stat_dtype(dt);
  Tensor dst = empty({c.B, c.H, c.Tq, c.D}, dt), lse = empty({c.B, c.H, c.Tq}, st);
  kernels::attention_forward(x.q, x.k, x.v, mask, causal, scale, dst, lse);
  const Tensor dy = rnd({c.B, c.H, c.Tq, c.D}, dt, seed + 3);
  const Qkv g = make_grads(c, dt);
  kernels::attention_backward(x.q, x.k, x.v, mask, causal, scale, dst, lse, dy, g.q, g.k, g.v);

  const Tensor mask64 = mask.defined() && mask.dtype() != DType::Bool ? f64(mask) : mask;
  Tensor dst64 = empty(dst.shape(), DType::Float64), lse64 = empty(lse.shape(), DType::Float64);
  kernels::attention_forward_ref(f64(x.q), f64(x.k), f64(x.v), mask64, causal, scale, dst64, lse64);
  Tensor dq64 = empty(x.q.shape(), DType::Float64), dk64 = empty(x.k.shape(), DType::Float64),
         dv64 = empty(x.v.shape(), DType::Float64);
  kernels::attention_backward_ref(f64(x.q), f64(x.k), f64(x.v), mask64, causal, scale, dst64, lse64, f64(dy), dq64,
                                  dk64, dv64);
  const double tol = attn_tol(dt);
  EXPECT_TRUE(close_scaled(dst, dst64, tol)) << "dst";
  EXPECT_TRUE(test::close(lse, lse64, dt == DType::Float64 ? 1e-12 : 1e-5, 1e-5)) << "lse";
  EXPECT_TRUE(close_scaled(g.q, dq64, tol)) << "diff_q";
  EXPECT_TRUE(close_scaled(g.k, dk64, tol)) << "diff_k";
  EXPECT_TRUE(close_scaled(g.v, dv64, tol)) << "diff_v";
}

const AttnCase kAttnCases[] = {
    {2, 3, 7, 7, 16},  {1, 2, 65, 65, 32},  {1, 1, 130, 130, 64}, {1, 2, 1, 1, 16},   {2, 1, 1, 7, 32},
    {1, 2, 7, 65, 64}, {1, 1, 130, 65, 16}, {1, 1, 65, 130, 32},  {4, 4, 33, 33, 16},  // the last: 4 heads a product
};

TEST(TransformerKernels, AttentionMatchesNaiveFloat64) {
  for (DType dt : kAll)
    for (const AttnCase& c : kAttnCases)
      for (MaskKind kind : {MaskKind::None, MaskKind::Causal, MaskKind::Bool, MaskKind::Float, MaskKind::CausalBool}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B " << c.B << " H " << c.H << " Tq " << c.Tq << " Tk "
                                        << c.Tk << " D " << c.D << " mask " << static_cast<int>(kind));
        check_attention(c, dt, kind, 100);
      }
}

// Grouped-query attention (k, v with fewer heads than q): the flash kernels, whose backward sums each shared head's
// dK, dV over its query heads within one task, against the reference loops in float64 (whose GQA semantics
// TransformerOps.MatchPyTorch checks against PyTorch's repeat_interleave). The last case runs several k/v heads per
// product group.
TEST(TransformerKernels, AttentionGroupedQueryMatchesNaiveFloat64) {
  const AttnCase cases[] = {
      {2, 6, 70, 70, 16, 2}, {1, 4, 7, 65, 32, 1}, {4, 8, 33, 33, 16, 4}, {1, 8, 130, 130, 16, 2}};
  for (DType dt : kAll)
    for (const AttnCase& c : cases)
      for (MaskKind kind : {MaskKind::None, MaskKind::Causal, MaskKind::Bool}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B " << c.B << " H " << c.H << " Hkv " << c.Hkv << " Tq "
                                        << c.Tq << " Tk " << c.Tk << " mask " << static_cast<int>(kind));
        check_attention(c, dt, kind, 200);
      }
}

TEST(TransformerKernels, AttentionFullyMaskedRowGivesZeros) {
  const AttnCase c{1, 2, 9, 9, 16};
  for (DType dt : kAll) {
    SCOPED_TRACE(dtype_name(dt));
    const Qkv x = make_qkv(c, dt, 5);
    Tensor mask = full({c.Tq, c.Tk}, 1.0, DType::Bool);
    bool* m = mask.data<bool>();
    for (int64_t j = 0; j < c.Tk; ++j) m[3 * c.Tk + j] = false;  // query row 3 sees no key
    Tensor dst = empty({c.B, c.H, c.Tq, c.D}, dt), lse = empty({c.B, c.H, c.Tq}, stat_dtype(dt));
    kernels::attention_forward(x.q, x.k, x.v, mask, /*is_causal=*/false, 0.25, dst, lse);
    const Tensor dy = rnd(dst.shape(), dt, 6);
    const Qkv g = make_grads(c, dt);
    kernels::attention_backward(x.q, x.k, x.v, mask, /*is_causal=*/false, 0.25, dst, lse, dy, g.q, g.k, g.v);
    for (int64_t h = 0; h < c.H; ++h) {
      EXPECT_EQ(lse.select(1, h).select(1, 3).item(), -std::numeric_limits<double>::infinity());
      EXPECT_EQ(max_abs(dst.select(1, h).select(1, 3)), 0.0);
      EXPECT_EQ(max_abs(g.q.select(1, h).select(1, 3)), 0.0);
      // The other rows are finite.
      EXPECT_TRUE(std::isfinite(max_abs(dst)) && std::isfinite(max_abs(g.k)) && std::isfinite(max_abs(g.v)));
    }
    check_attention(c, dt, MaskKind::None, 7);
  }
}

TEST(TransformerKernels, AttentionFlashMatchesReferenceLoops) {
  // The same dtype on both: only the order of the float32 sums and (16-bit) the rounded P differ.
  const AttnCase c{2, 2, 130, 130, 64};
  const Qkv x = make_qkv(c, DType::Float32, 9);
  Tensor dst = empty({c.B, c.H, c.Tq, c.D}), lse = empty({c.B, c.H, c.Tq}), dst_ref = empty_like(dst),
         lse_ref = empty_like(lse);
  kernels::attention_forward(x.q, x.k, x.v, Tensor(), /*is_causal=*/true, 0.125, dst, lse);
  kernels::attention_forward_ref(x.q, x.k, x.v, Tensor(), /*is_causal=*/true, 0.125, dst_ref, lse_ref);
  EXPECT_TRUE(close_scaled(dst, dst_ref, 2e-5));
  EXPECT_TRUE(test::close(lse, lse_ref, 1e-5, 1e-5));
}

// A causal call without a mask takes the fused softmax row passes (16 lanes where the CPU has AVX-512); the same call
// with a bool mask that keeps every key takes the masked row loops over the same products. They do the same
// operations on every visible score, so the results are the same bits, forward and backward (lengths that reach the
// 16-, 8-lane and scalar tails).
TEST(TransformerKernels, AttentionCausalRowPassesMatchTheMaskedLoopsBitForBit) {
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    for (const AttnCase& c : {AttnCase{2, 3, 75, 75, 48}, AttnCase{1, 2, 130, 130, 16}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T " << c.Tq << " D " << c.D);
      const Qkv x = make_qkv(c, dt, 41);
      const Tensor keep_all = full({c.Tq, c.Tk}, 1.0, DType::Bool);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const Tensor dy = rnd({c.B, c.H, c.Tq, c.D}, dt, 43);
      auto run = [&](const Tensor& mask, bool is_causal) {
        Tensor dst = empty({c.B, c.H, c.Tq, c.D}, dt), lse = empty({c.B, c.H, c.Tq}, stat_dtype(dt));
        kernels::attention_forward(x.q, x.k, x.v, mask, is_causal, scale, dst, lse);
        const Qkv g = make_grads(c, dt);
        kernels::attention_backward(x.q, x.k, x.v, mask, is_causal, scale, dst, lse, dy, g.q, g.k, g.v);
        return std::vector<Tensor>{dst, lse, g.q, g.k, g.v};
      };
      const std::vector<Tensor> fused = run(Tensor(), true), masked = run(keep_all, true);
      for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(test::bit_equal(fused[i], masked[i])) << "output " << i;
    }
}

TEST(TransformerKernels, AttentionScratchIsLinearInT) {
  // One head of T = 4096 would need 64 MiB of float32 scores (B * H = 2 heads, 128 MiB); the flash kernels keep a
  // block of rows (and the backward a head's dK, dV and dense K, V) per thread.
  const int64_t B = 1, H = 2, T = 4096, D = 64;
  const Tensor q = rnd({B, H, T, D}, DType::Float32, 1), k = rnd({B, H, T, D}, DType::Float32, 2),
               v = rnd({B, H, T, D}, DType::Float32, 3), dy = rnd({B, H, T, D}, DType::Float32, 4);
  Tensor dst = empty({B, H, T, D}), lse = empty({B, H, T}), dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
  const int64_t bound = 2 * (4 * 64 * T + 6 * T * D + 4 * 64 * D) * 4;  // two threads' scratch
  const int64_t square = T * T * 4;
  for (int pass = 0; pass < 2; ++pass) {
    reset_peak_memory_stats();
    const int64_t before = memory_stats().current_bytes;
    if (pass == 0)
      kernels::attention_forward(q, k, v, Tensor(), /*is_causal=*/true, 0.125, dst, lse);
    else
      kernels::attention_backward(q, k, v, Tensor(), /*is_causal=*/true, 0.125, dst, lse, dy, dq, dk, dv);
    const int64_t used = memory_stats().peak_bytes - before;
    EXPECT_GT(used, 0) << "the scratch should come from the caching allocator";
    EXPECT_LE(used, bound) << (pass ? "backward" : "forward");
    EXPECT_LT(used, square / 2) << (pass ? "backward" : "forward");
  }
}

// ---- Cross-entropy ----

void check_cross_entropy(DType dt, int64_t N, int64_t V, int64_t ignore_index, double smoothing, uint64_t seed) {
  const Tensor logits = rnd({N, V}, dt, seed, 3.0);
  Generator gen(seed + 1);
  Tensor target = randint(0, V, {N}, &gen);
  if (N > 2) target.data<int64_t>()[1] = ignore_index;
  const DType st = stat_dtype(dt);
  Tensor losses = empty({N}, st), lse = empty({N}, st), dlogits = empty({N, V}, dt);
  const Tensor g = rnd({N}, st, seed + 2);
  kernels::cross_entropy_forward(logits, target, ignore_index, smoothing, losses, lse);
  kernels::cross_entropy_backward(logits, target, lse, g, ignore_index, smoothing, dlogits);
  Tensor losses64 = empty({N}, DType::Float64), lse64 = empty({N}, DType::Float64), d64 = empty({N, V}, DType::Float64);
  kernels::cross_entropy_forward_ref(f64(logits), target, ignore_index, smoothing, losses64, lse64);
  kernels::cross_entropy_backward_ref(f64(logits), target, lse64, f64(g), ignore_index, smoothing, d64);
  const double rtol = dt == DType::Float64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(test::close(losses, losses64, rtol, rtol)) << "losses";
  EXPECT_TRUE(test::close(lse, lse64, rtol, rtol)) << "lse";
  if (N > 2) {
    EXPECT_EQ(losses.select(0, 1).item(), 0.0);
  }
  if (dt == DType::Float64)
    EXPECT_TRUE(test::close(dlogits, d64, 1e-12, 1e-15));
  else  // one rounding of float32 (the softmax within 1e-5 relative, or 1e-6 of the row's scale)
    EXPECT_TRUE(one_rounding(dlogits, d64, 1e-5, 1e-7 * max_abs(g))) << "diff_logits";
}

TEST(TransformerKernels, CrossEntropyMatchesFloat64) {
  for (DType dt : kAll)
    for (double smoothing : {0.0, 0.1})
      for (int64_t V : {1, 7, 1000, 2049, 50257}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " V " << V << " smoothing " << smoothing);
        check_cross_entropy(dt, V > 2049 ? 3 : 9, V, -100, smoothing, 50 + V);
        check_cross_entropy(dt, 5, V, /*ignore_index=*/0, smoothing, 60 + V);
      }
}

// The forward a block of classes at a time (linear_cross_entropy's): within the float64 reference's tolerance for
// any block width, and bit for bit the whole rows' kernel for blocks of whole kBlock (2048) columns.
TEST(TransformerKernels, CrossEntropyByBlocksOfClassesMatchesWholeRows) {
  for (DType dt : kAll)
    for (double smoothing : {0.0, 0.1})
      for (int64_t V : {int64_t{7}, int64_t{5000}})
        for (int64_t width : {int64_t{1}, int64_t{3}, int64_t{2048}, int64_t{4096}}) {
          SCOPED_TRACE(testing::Message()
                       << dtype_name(dt) << " V " << V << " smoothing " << smoothing << " width " << width);
          const int64_t N = 6;
          const Tensor logits = rnd({N, V}, dt, 70 + V, 3.0);
          Generator gen(71 + V);
          Tensor target = randint(0, V, {N}, &gen);
          target.data<int64_t>()[1] = -100;
          target.data<int64_t>()[2] = V - 1;  // the last block's last column
          const DType st = stat_dtype(dt);
          Tensor losses = empty({N}, st), lse = empty({N}, st), whole = empty({N}, st), whole_lse = empty({N}, st);
          const Tensor state = kernels::cross_entropy_state(N, st);
          for (int64_t c0 = 0; c0 < V; c0 += width) {
            const Tensor block = logits.narrow(1, c0, std::min(width, V - c0)).contiguous();
            kernels::cross_entropy_forward_block(block, target, c0, smoothing, state);
          }
          kernels::cross_entropy_forward_finish(state, target, -100, smoothing, V, losses, lse);
          kernels::cross_entropy_forward(logits, target, -100, smoothing, whole, whole_lse);
          Tensor losses64 = empty({N}, DType::Float64), lse64 = empty({N}, DType::Float64);
          kernels::cross_entropy_forward_ref(f64(logits), target, -100, smoothing, losses64, lse64);
          const double rtol = dt == DType::Float64 ? 1e-12 : 1e-5;
          EXPECT_TRUE(test::close(losses, losses64, rtol, rtol)) << "losses";
          EXPECT_TRUE(test::close(lse, lse64, rtol, rtol)) << "lse";
          EXPECT_EQ(losses.select(0, 1).item(), 0.0);
          if (dt != DType::Float64 && width % 2048 == 0) {
            EXPECT_EQ(losses.to_vector<double>(), whole.to_vector<double>());
            EXPECT_EQ(lse.to_vector<double>(), whole_lse.to_vector<double>());
          }
        }
  const Tensor state = kernels::cross_entropy_state(2, DType::Float32);
  Tensor losses = empty({2}), lse = empty({2});
  EXPECT_THROW(kernels::cross_entropy_forward_finish(state, tensor({1, 5}, DType::Int64), -100, 0, 5, losses, lse),
               Error);
}

TEST(TransformerKernels, CrossEntropyRejectsBadTargets) {
  const Tensor logits = rnd({2, 5}, DType::Float32, 1);
  Tensor losses = empty({2}), lse = empty({2});
  EXPECT_THROW(kernels::cross_entropy_forward(logits, tensor({1, 5}, DType::Int64), -100, 0, losses, lse), Error);
  EXPECT_THROW(kernels::cross_entropy_forward(logits, tensor({-1, 2}, DType::Int64), -100, 0, losses, lse), Error);
  EXPECT_NO_THROW(kernels::cross_entropy_forward(logits, tensor({-100, 2}, DType::Int64), -100, 0, losses, lse));
}

// ---- Embedding backward ----

TEST(TransformerKernels, EmbeddingBackwardMatchesFloat64AndIsDeterministic) {
  for (DType dt : kAll)
    for (int64_t V : {13, 400}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " V " << V);
      const int64_t N = 3 * V, C = 130, padding = 3;
      Generator gen(V);
      const Tensor idx = randint(0, V / 2, {N}, &gen);  // repeats, and rows never hit
      const Tensor dy = rnd({N, C}, dt, V + 1);
      // float64 oracle: plain sums in n order.
      Tensor expected = zeros({V, C}, DType::Float64);
      const std::vector<double> d = dy.to_vector<double>();
      const int64_t* ip = idx.data<int64_t>();
      double* e = expected.data<double>();
      for (int64_t n = 0; n < N; ++n)
        if (ip[n] != padding)
          for (int64_t j = 0; j < C; ++j) e[ip[n] * C + j] += d[n * C + j];
      Tensor dw = empty({V, C}, dt), dw1 = empty({V, C}, dt);
      kernels::embedding_backward(dy, idx, padding, dw);
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      kernels::embedding_backward(dy, idx, padding, dw1);
      omp_set_num_threads(threads);
      EXPECT_TRUE(test::bit_equal(dw, dw1)) << "1 thread vs " << threads;
      if (dt == DType::Float64)
        EXPECT_TRUE(test::close(dw, expected, 1e-12, 1e-12));
      else if (dt == DType::Float32)
        EXPECT_TRUE(test::close(dw, expected, 1e-5, 1e-5));
      else
        EXPECT_TRUE(one_rounding(dw, expected, 1e-5, 1e-5));
      EXPECT_EQ(max_abs(dw.select(0, padding)), 0.0);
    }
  Tensor dw = empty({4, 2});
  EXPECT_THROW(kernels::embedding_backward(zeros({1, 2}), tensor({4}, DType::Int64), -1, dw), Error);
}

// ---- Against PyTorch ----

class TransformerTorch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::ScratchDir>("transformer_kernels_oracle");
    oracle_ok_ = test::run_oracle("transformer_kernels_oracle.py", {*dir_});
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::map<std::string, Tensor> load(const std::string& name) {
    EXPECT_TRUE(oracle_ok_) << "the PyTorch oracle did not run";
    return test::read_oracle_case(*dir_ + "/" + name + ".bin");
  }
  static std::unique_ptr<test::ScratchDir> dir_;
  static bool oracle_ok_;
};
std::unique_ptr<test::ScratchDir> TransformerTorch::dir_;
bool TransformerTorch::oracle_ok_ = false;

// Elements of a and b (float64 widenings of one dtype's values) that differ, and whether each is within `ulps` of
// `dt`'s spacing of the other (plus abs); `allowed` caps the differing fraction.
::testing::AssertionResult nearly_bit_equal(const Tensor& a, const Tensor& b, DType dt, double allowed, double abs) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    ++n;
    if (std::fabs(x[i] - y[i]) > ulp(y[i], dt) + abs)
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
  }
  if (n > allowed * static_cast<double>(x.size()))
    return ::testing::AssertionFailure() << n << " of " << x.size() << " elements differ";
  return ::testing::AssertionSuccess() << n << " of " << x.size() << " differ";
}

// PyTorch 1.13's float32 layer norm sums in another order (not bit for bit); its bfloat16 layer norm rounds
// intermediates to bfloat16 (about 60% of its outputs differ from the one rounding Castor gives, up to 4 ulps), so
// Castor's bfloat16 output is asked to be, element by element, no further from the float64 value than PyTorch's.
TEST_F(TransformerTorch, LayerNorm) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto c = load(std::string("layer_norm_") + dtype_name(dt));
    ASSERT_FALSE(c.empty());
    const Tensor x = c["x"].to(dt), w = c["w"].to(dt), b = c["b"].to(dt), gy = c["gy"].to(dt);
    const int64_t C = x.size(-1), rows = x.numel() / C;
    Tensor y = empty(x.shape(), dt), mean = empty({rows}), rstd = empty({rows}), dx = empty(x.shape(), dt),
           dw = empty({C}, dt), db = empty({C}, dt);
    kernels::layer_norm_forward(x, w, b, y, mean, rstd, 1e-5);
    kernels::layer_norm_backward(x, gy, w, mean, rstd, dx, dw, db);
    if (dt == DType::Float32) {
      EXPECT_TRUE(test::close(y, c["y"], 1e-5, 1e-5));
      EXPECT_TRUE(close_scaled(dx, c["dx"], 1e-5));
      EXPECT_TRUE(close_scaled(dw, c["dw"], 1e-5));
      EXPECT_TRUE(close_scaled(db, c["db"], 1e-5));
    } else {
      Tensor y64 = empty(x.shape(), DType::Float64), mean64 = empty({rows}, DType::Float64),
             rstd64 = empty({rows}, DType::Float64);
      kernels::layer_norm_forward(f64(x), f64(w), f64(b), y64, mean64, rstd64, 1e-5);
      const std::vector<double> got = y.to_vector<double>(), torch = c["y"].to_vector<double>(),
                                exact = y64.to_vector<double>();
      int64_t worse = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worse += std::fabs(got[i] - exact[i]) > std::fabs(torch[i] - exact[i]) + 1e-6 * std::fabs(exact[i]);
      EXPECT_EQ(worse, 0) << "elements further from float64 than PyTorch's";
      EXPECT_TRUE(close_scaled(dx, c["dx"], 2e-2));
      EXPECT_TRUE(close_scaled(dw, c["dw"], 2e-2));
      EXPECT_TRUE(close_scaled(db, c["db"], 2e-2));
    }
  }
}

// Cross-entropy under autocast is float32 from the logits, the bfloat16 logits' gradient one rounding of it. PyTorch's
// float32 differs from Castor's in the last bits (its exp; its log-softmax backward sums the incoming gradient), so
// the float32 results are close (with label smoothing PyTorch's gradient is the less accurate one: its log-softmax
// backward sums V copies of -g * label_smoothing / V in float32, off by up to 6e-5 relative where Castor's is within
// 1e-6 of float64: rtol 1e-4 there, else 1e-5; atol 1e-7 |g|), and the bfloat16 gradient
// differs from PyTorch's rounding only where the float32 values straddle a rounding boundary: by one ulp (plus that
// atol), in under 1% of the elements.
TEST_F(TransformerTorch, CrossEntropy) {
  for (DType dt : {DType::Float32, DType::BFloat16})
    for (const char* smoothing : {"0.0", "0.1"}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " smoothing " + smoothing);
      auto c = load(std::string("cross_entropy_") + dtype_name(dt) + "_" + smoothing);
      ASSERT_FALSE(c.empty());
      const Tensor logits = c["logits"].to(dt), target = c["target"], gl = c["gl"].to(DType::Float32);
      const int64_t N = logits.size(0), V = logits.size(1);
      Tensor losses = empty({N}), lse = empty({N}), dx = empty({N, V}, dt);
      kernels::cross_entropy_forward(logits, target, -100, std::stod(smoothing), losses, lse);
      kernels::cross_entropy_backward(logits, target, lse, gl, -100, std::stod(smoothing), dx);
      EXPECT_TRUE(test::close(losses, c["losses"], 1e-6, 1e-6));
      if (dt == DType::Float32)
        EXPECT_TRUE(test::close(dx, c["dx"], std::stod(smoothing) ? 1e-4 : 1e-5, 1e-7 * max_abs(gl)));
      else
        EXPECT_TRUE(nearly_bit_equal(dx, c["dx"], dt, 0.01, 1e-7 * max_abs(gl)));
    }
}

}  // namespace
}  // namespace castor
