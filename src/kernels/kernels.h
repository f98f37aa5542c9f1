// The kernel interface used by ops: plain-loop reference kernels (kernels/ref) and oneDNN kernels (kernels/onednn).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "castor/tensor.h"

namespace castor::kernels {

// oneDNN's version and the ISA it dispatches to on this CPU (after any ONEDNN_MAX_CPU_ISA cap): "2.6.3, dispatching
// to AVX512_CORE_BF16" (`castor env`).
std::string onednn_description();

// dst = src for the same shape; src may have any strides (0 for broadcast dims) and another dtype.
// dst may be strided. Float-to-int truncates toward zero; to bool is != 0.
void copy(const Tensor& src, const Tensor& dst);
void fill(const Tensor& dst, double value);

// Element-wise maps over tensors of one floating dtype laid out alike (same_layout: run as flat arrays, channels-last
// ones too); 16-bit values are computed in float32 and rounded once, float64 in double. p0/p1 are the op's scalars
// (exponent, clamp bounds, alpha).
enum class Unary : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Abs,
  Relu,
  Sigmoid,
  Tanh,
  Gelu,
  GeluTanh,
  Silu,
  Pow,
  Clamp,
  AddScalar,
  MulScalar
};
void unary(Unary op, const Tensor& src, const Tensor& dst, double p0 = 0, double p1 = 0);

// dst = op(a, b): tensors of dst's dtype; a and b are laid out like dst (same_layout) or are single elements.
// The *Grad ops are the fused backward maps: a is the incoming gradient, b the saved input (or output).
enum class Binary : uint8_t {
  Add,
  Sub,
  Mul,
  Div,
  Max,
  Min,
  ReluGrad,      // a * (b > 0), b = input
  SigmoidGrad,   // a * b * (1 - b), b = output
  TanhGrad,      // a * (1 - b * b), b = output
  GeluGrad,      // a * gelu'(b), b = input
  GeluTanhGrad,  // a * gelu_tanh'(b), b = input
  SiluGrad,      // a * silu'(b), b = input
};
void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& dst, double alpha = 1.0);

// SwiGLU's gate, dst = silu(a) * b, over contiguous a, b, dst of one floating dtype and numel (16-bit computed in
// float32 and rounded once). Its backward in one pass: diff_a = g b silu'(a) (silu' in double, as SiluGrad's),
// diff_b = g silu(a), each rounded once; either may be undefined.
void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& dst);
void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& diff_dst, const Tensor& diff_a,
                     const Tensor& diff_b);

// Comparisons: a and b contiguous of one dtype (numel of dst, or 1); dst bool.
enum class Compare : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
void compare(Compare op, const Tensor& a, const Tensor& b, const Tensor& dst);

// dst = cond ? a : b, all contiguous with dst's numel; cond bool; a, b of dst's dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& dst);

// Reductions over the middle dim of a contiguous (outer, n, inner) view of src.
// sum: dst (outer, inner) of any float dtype, accumulated in double and rounded once.
void sum_dim(const Tensor& src, int64_t outer, int64_t n, int64_t inner, const Tensor& dst);
// max/min: values in src's dtype and int64 indices (the first extreme; NaN wins like PyTorch).
void extreme_dim(const Tensor& src, int64_t outer, int64_t n, int64_t inner, bool is_max, const Tensor& values,
                 const Tensor& indices);
// softmax / log_softmax along the middle dim; src and dst contiguous of any float dtypes.
void softmax_dim(const Tensor& src, int64_t outer, int64_t n, int64_t inner, bool log, const Tensor& dst);
// The softmax backward maps: dst = y * (g - sum(g * y)) or g - exp(y) * sum(g).
void softmax_backward_dim(const Tensor& grad, const Tensor& out, int64_t outer, int64_t n, int64_t inner, bool log,
                          const Tensor& dst);

// Along the middle dim of contiguous views: src (outer, n, inner), index int64 (outer, m, inner), the other
// (outer, m, inner). gather: dst[o, j, i] = src[o, index[o, j, i], i], any dtype, an index out of [0, n) is a
// castor::Error. scatter_add: dst (outer, n, inner, a float dtype) = zeros + src[o, j, i] at [o, index[o, j, i], i],
// summed in double and rounded once.
void gather_dim(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t m, int64_t inner,
                const Tensor& dst);
void scatter_add_dim(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t m, int64_t inner,
                     const Tensor& dst);

// True if every element is finite.
bool all_finite(const Tensor& src);

// The sum of the squares of src's values times `scale` (each product rounded to float32, as unscale stores it;
// scale 1: src's own squares) in double (any float dtype and strides; 16-bit values widened exactly; float64 only
// with scale 1): per parallel_blocks block in 4 double lanes, then the blocks in order, so the same bits for any
// thread count. nonfinite (when given) is set if any element of src was inf or NaN, as unscale tests them.
double sum_of_squares(const Tensor& src, float scale = 1.0f, bool* nonfinite = nullptr);

// dst = src * inv_scale elementwise (the product in float32, or float64 for float64 tensors) in one pass that
// also tests every src element; true if any was inf or NaN. dst has src's shape and is either src itself (in
// place, any strides) or a contiguous float32 tensor (GradScaler's unscale).
bool unscale(const Tensor& src, const Tensor& dst, float inv_scale);

// Rounding float32 values into a contiguous 16-bit tensor: to nearest even, or stochastically (up with
// probability equal to the distance from the value below) with random bits from a generator seeded per
// parallel_blocks block from `key`, so the result depends neither on the thread count nor on which pass writes
// the block. dst null: nothing is written.
struct RoundInto {
  const Tensor* dst = nullptr;
  bool stochastic = false;
  uint64_t key = 0;
};
// All dst.numel() values of src.
void round_into_16bit(const float* src, const RoundInto& into);
// Elements [begin, end) of one parallel_blocks block, for kernels that round what they have just computed.
void round_block_into_16bit(const float* src, const RoundInto& into, int64_t begin, int64_t end);

// The optimizers' updates of elements [b, e) of n contiguous float32 ones, with PyTorch 1.13's single-tensor
// formulas (src/optim computes the scalars, each rounded to float32 as PyTorch does). [b, e) is one
// parallel_blocks block (kBlock elements, fewer at the end): the optimizers run the blocks of all their parameters
// in one multi-tensor pass, and each kernel rounds its block of w into `into` as soon as it is updated (the
// master -> 16-bit copy in the same pass).
// Adam: g += wd * w (coupled); AdamW: w *= decay_factor (decoupled); m = beta1 m + (1 - beta1) g;
// v = beta2 v + (1 - beta2) g^2 (AMSGrad: v_max = max(v_max, v), used for v); w += neg_step_size m / (sqrt(v) /
// bias_correction2_sqrt + eps). max_exp_avg_sq is null without AMSGrad.
// Every update first takes g = (g * grad_inv_scale) * grad_clip, each product rounded to float32 (a GradScaler's
// unscale and a gradient clip folded into the pass; 1 and 1 leave g as it is).
struct AdamUpdate {
  float neg_step_size, bias_correction2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float weight_decay, decay_factor;
  bool coupled, decoupled;
  float grad_inv_scale = 1.0f, grad_clip = 1.0f;
};
void adam_update(const AdamUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, const RoundInto& into);
// SGD: d = g + wd w; with a momentum buffer: buf = d on the first step, else momentum buf + keep d (keep = 1 -
// dampening), d = nesterov ? d + momentum buf : buf; w += neg_lr d. momentum_buffer is null without momentum.
struct SgdUpdate {
  float neg_lr, weight_decay, momentum, keep;
  bool decay, first, nesterov;
  float grad_inv_scale = 1.0f, grad_clip = 1.0f;
};
void sgd_update(const SgdUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* momentum_buffer,
                const RoundInto& into);

// Block-wise 8-bit quantisation (Dettmers et al. 2021, bitsandbytes' dynamic maps): a value is the code's entry
// of a 256-value map times its block's absmax. The signed map (first moment) and the unsigned map (second moment)
// are bitsandbytes' create_dynamic_map(signed) for 8 bits and 7 exponent bits, computed in double and rounded to
// float32 once, sorted ascending. A value x is normalised as x / absmax (0 where absmax is 0) and takes the nearest
// code: the number of midpoints (map[k] + map[k+1]) * 0.5f below it (a tie goes to the lower code).
const float* dynamic_map(bool is_signed);  // 256 values
// Codes and absmaxes (ceil(n / block) of them) of n contiguous values; block a power of two.
void quantize_blockwise(const float* x, int64_t n, int64_t block, bool is_signed, uint8_t* codes, float* absmax);
void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, int64_t block, bool is_signed,
                          float* out);
// 8-bit AdamW over elements [b, e), which are whole quantisation blocks of `block` elements (the last may be
// short): per element m and v dequantised, updated as by adam_update (decoupled, no AMSGrad; products rounded on
// their own, no fused multiply-adds), w updated with the float32 m and v, then the block's absmaxes taken and m
// and v requantised (m keeps its sign: a negative m that would take the code of 0 takes the code below).
// exp_avg_absmax and exp_avg_sq_absmax are the whole tensor's (indexed by b / block).
void adamw8bit_update(const AdamUpdate& u, int64_t b, int64_t e, int64_t block, float* w, const float* g,
                      uint8_t* exp_avg_code, float* exp_avg_absmax, uint8_t* exp_avg_sq_code, float* exp_avg_sq_absmax,
                      const RoundInto& into);

// Matrix products on tensors of one float dtype, any strides in the last two dims:
// dst (B, M, N) = a (B, M, K) x b (B, K, N) [+ bias (N), added to every row before the one rounding, as PyTorch's
// addmm]; dst and bias contiguous, bias of dst's dtype or undefined. B dims are 1 for mm.
void matmul(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias = Tensor());
// dst (B, M, N) += a (B, M, K) x b (B, K, N), dst contiguous, of the operands' dtype or float32 for 16-bit ones:
// the exact products summed in float32 (double for float64) and added to dst in that precision (oneDNN's kernel
// for the operands' dtype with a float32 destination where the CPU has one, exact float32 copies otherwise).
void matmul_add(const Tensor& a, const Tensor& b, const Tensor& dst);
// The plain-loop reference: the same contract, float32 (double for float64) accumulation, one rounding.
void matmul_ref(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias = Tensor());
// The multiply-adds each of `threads` threads does in matmul's float32 emulation of a 16-bit (B, M, K) x (B, K, N)
// (its tiles and their split between the threads), for tests of its balance.
std::vector<int64_t> emulated_matmul_work(int64_t B, int64_t M, int64_t K, int64_t N, int threads);

}  // namespace castor::kernels
