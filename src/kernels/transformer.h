// The transformer kernel interface: layer/RMS norm, flash attention, fused cross-entropy and embedding backward.
#pragma once
#include <cstdint>
#include <functional>

#include "castor/tensor.h"

namespace castor::kernels {

// Conventions. Floating dtypes float32, bfloat16, float16 and float64. 16-bit tensors are computed in float32 and
// each output is rounded once; float64 computes in double. Statistics (mean, rstd, lse) are float32, float64 for
// float64 inputs. Tensors are contiguous unless said otherwise; an undefined optional tensor means "none" (no
// affine parameters, a gradient not wanted).

// Layer norm over the last dim: src (..., C) is viewed as (rows, C) with C = src.size(-1) (flatten several
// normalized dims into one first). weight, bias (C) may be undefined, and may be float32 while src is 16-bit (norms
// keeping float32 parameters). dst like src; mean, rstd (rows) with rstd = 1 / sqrt(biased var + eps).
void layer_norm_forward(const Tensor& src, const Tensor& weight, const Tensor& bias, const Tensor& dst,
                        const Tensor& mean, const Tensor& rstd, double eps);
// diff_src like src; diff_weight, diff_bias (C) in weight's dtype, summed over rows in float32 (double for float64)
// and rounded once. Any diff may be undefined; weight undefined = no affine.
void layer_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& diff_src, const Tensor& diff_weight,
                         const Tensor& diff_bias);

// RMS norm over the last dim: dst = src * rstd * weight, rstd (rows) = 1 / sqrt(mean(src^2) + eps); weight (C) may
// be undefined or float32 under a 16-bit src, as for layer norm.
void rms_norm_forward(const Tensor& src, const Tensor& weight, const Tensor& dst, const Tensor& rstd, double eps);
void rms_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& weight, const Tensor& rstd,
                       const Tensor& diff_src, const Tensor& diff_weight);

// Scaled dot-product attention (F.scaled_dot_product_attention of PyTorch 2, no dropout):
// dst (B, H, Tq, D) = softmax(q k^T * scale + mask) v with q (B, H, Tq, D), k and v (B, Hkv, Tk, D) of one dtype,
// H a multiple of Hkv: query head h attends with k/v head h / (H / Hkv) (grouped-query attention). q, k, v
// may be strided views with a contiguous last dim (e.g. split from a (B, T, 3C) projection and permuted): never
// copied whole (the rows a product reads are copied into dense per-thread scratch). mask: undefined, bool (true =
// keep) or floating (added to the scaled scores), broadcastable to (B, H, Tq, Tk). is_causal keeps key j <= query i
// (top-left aligned, as PyTorch). dst contiguous in q's dtype; lse (B, H, Tq) the log-sum-exp of each row of the
// scaled, masked scores. A fully masked row (every key masked out) gives dst 0, lse -inf and zero gradients (PyTorch
// gives NaN).
// float32/bfloat16/float16 run flash-style (src/kernels/onednn/attention.cpp): a block of query rows against the keys
// up to its causal limit, scratch O(block * Tk + Tk * D) per thread, never the (Tq, Tk) matrix of a head; the
// forward parallel over (batch, heads, query blocks), the backward over (batch, whole k/v heads); the products in
// the input dtype with float32 accumulation (bfloat16 on oneDNN, float16 emulated on float32 oneDNN products of
// float16 values), the probabilities rounded to the input dtype before P v. float64 runs the reference loops.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                       double scale, const Tensor& dst, const Tensor& lse);
// Recomputes the probabilities per query block from q, k and lse. diff_dst (B, H, Tq, D) may be strided (contiguous
// last dim); diff_q (B, H, Tq, D), diff_k, diff_v (B, Hkv, Tk, D) in q's dtype may be strided views with a contiguous
// last dim (e.g. of one (B, T, 3C) gradient); any of them may be undefined. A shared k/v head's gradient is the sum
// over its query heads (float32, rounded once), computed by one task: the backward runs over (batch, k/v heads).
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                        double scale, const Tensor& dst, const Tensor& lse, const Tensor& diff_dst,
                        const Tensor& diff_q, const Tensor& diff_k, const Tensor& diff_v);
// The reference loops behind them (one head's full (Tq, Tk) matrix at a time, in float32 or double): the float64
// path and the oracle the flash kernels are tested against. Same contracts.
void attention_forward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                           double scale, const Tensor& dst, const Tensor& lse);
void attention_backward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                            double scale, const Tensor& dst, const Tensor& lse, const Tensor& diff_dst,
                            const Tensor& diff_q, const Tensor& diff_k, const Tensor& diff_v);

// Rotary position embedding of src (B, T, H, D) contiguous, D even: pair k of each row, (2k, 2k + 1) when
// `interleaved` (Meta's and llama2.c's) or (k, k + D/2) (Hugging Face's rotate-half), is rotated by the angle whose
// cos and sin are row t of cos, sin (T, D/2) float32: (a, b) -> (a cos - b sin, a sin + b cos), computed in float32
// (double for float64) and rounded once into dst (like src). `inverse` rotates by minus the angle (the backward).
void rotary_embedding(const Tensor& src, const Tensor& cos, const Tensor& sin, bool interleaved, bool inverse,
                      const Tensor& dst);

// Cross-entropy of logits (N, V) (any float dtype; rows may be strided, columns contiguous, except float64) against
// target int64 (N), F.cross_entropy(reduction='none') with ignore_index and label_smoothing: losses (N) float32
// (float64 for float64 logits; 0 where target == ignore_index), lse (N) of the same dtype, the log-sum-exp of each
// row. Each row is computed in float32 straight from the logits (no float32 copy of them). A target outside [0, V) other than ignore_index is a castor::Error.
void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                           const Tensor& losses, const Tensor& lse);
// The same a block of classes at a time (F::linear_cross_entropy's forward, its logits never whole): state (N, 4) of
// the stat dtype (float32; float64 for float64 logits) from cross_entropy_state holds each row's running maximum, sum
// of exps relative to it, target logit and sum of logits; cross_entropy_forward_block folds in logits (N, n), the
// columns [first_class, first_class + n) of the rows (blocks in order); cross_entropy_forward_finish writes losses and
// lse over `classes` classes (and checks the targets against them). Blocks that are whole multiples of kBlock columns
// give cross_entropy_forward's bits on the whole rows (float32 and 16-bit logits).
Tensor cross_entropy_state(int64_t rows, DType stat);
void cross_entropy_forward_block(const Tensor& logits, const Tensor& target, int64_t first_class,
                                 double label_smoothing, const Tensor& state);
void cross_entropy_forward_finish(const Tensor& state, const Tensor& target, int64_t ignore_index,
                                  double label_smoothing, int64_t classes, const Tensor& losses, const Tensor& lse);
// diff_logits (N, V) in logits' dtype = diff_losses[i] * (softmax - (1 - label_smoothing) onehot(target) -
// label_smoothing / V), rounded once; rows with target == ignore_index get 0. With `classes` > 0 the logits are the
// columns [first_class, first_class + V) of rows over `classes` classes (lse the whole rows'): that block of the
// whole rows' gradient (F::linear_cross_entropy's backward, a block of the vocabulary at a time).
void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& diff_losses,
                            int64_t ignore_index, double label_smoothing, const Tensor& diff_logits,
                            int64_t first_class = 0, int64_t classes = 0);
// F::linear_cross_entropy's two passes over a (V, C) weight given by `rows`: rows(c0, n) is its rows [c0, c0 + n) as
// an (n, C) tensor of x's dtype (a view of a dense weight, or a quantized one's rows dequantized). Forward: all rows'
// logits a block of classes at a time (about `chunk` logits; whole multiples of kBlock columns where the budget
// allows), each row's log-sum-exp carried across blocks, into losses and lse (N, stat dtype). Backward: the blocks'
// logits again, their gradient, diff_w's rows [0, classes) (when defined) and diff_x (N, C) of the stat dtype, zeros
// on entry, summed over the blocks (exact products, float32 sums).
using WeightRows = std::function<Tensor(int64_t c0, int64_t n)>;
void linear_cross_entropy_forward(const Tensor& x, const WeightRows& rows, const Tensor& target, int64_t classes,
                                  int64_t chunk, int64_t ignore_index, double label_smoothing, const Tensor& losses,
                                  const Tensor& lse);
void linear_cross_entropy_backward(const Tensor& x, const WeightRows& rows, const Tensor& target, const Tensor& lse,
                                   const Tensor& diff_losses, int64_t classes, int64_t chunk, int64_t ignore_index,
                                   double label_smoothing, const Tensor& diff_w, const Tensor& diff_x);
// The plain reference loops behind them (std::exp, two passes), the float64 path and the fast kernels' oracle.
void cross_entropy_forward_ref(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                               const Tensor& losses, const Tensor& lse);
void cross_entropy_backward_ref(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                const Tensor& diff_losses, int64_t ignore_index, double label_smoothing,
                                const Tensor& diff_logits, int64_t first_class = 0, int64_t classes = 0);

// The embedding's weight gradient: diff_weight (V, C) = sum over n of diff_dst[n] (N, C) into row indices[n]
// (int64 (N)), rows == padding_idx skipped (padding_idx -1: none), accumulated in float32 (double for float64) in
// the order of n and rounded once: the same bits on any thread count. An index outside [0, V) is a castor::Error.
// The forward is a gather (gather_dim). With `accumulate` (float32 or float64 diff_weight) each indexed row's sum
// is added into diff_weight instead, once, and the other rows are left as they are: the bits of adding the dense
// gradient, without building it (except that a -0 in a row no index reaches stays -0).
void embedding_backward(const Tensor& diff_dst, const Tensor& indices, int64_t padding_idx, const Tensor& diff_weight,
                        bool accumulate = false);

}  // namespace castor::kernels
