// Neural-network functions (torch.nn.functional): layers and losses, autocast-aware and differentiable.
#pragma once
#include <array>
#include <optional>

#include "castor/tensor.h"

namespace castor::F {

// input (N, in), weight (out, in), bias (out) -> (N, out). Lower precision under autocast.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = {});

// input (N, C, H, W), weight (O, C/groups, kh, kw), bias (O). oneDNN forward and backward in float32 and
// bfloat16; float16 emulated exactly (fp16 inputs, fp32 accumulation, one rounding).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

// Batch norm over (N, C, H, W) or (N, C). Statistics always in float32, also for 16-bit inputs; the output
// has the input's dtype. In training, running_mean/var (float32) are updated in place with `momentum`
// (PyTorch's convention, unbiased variance for the running estimate).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// Training-mode batch norm over (N, C, H, W) with the statistics of every rank's batch together (torch.nn.SyncBatchNorm):
// per-channel float32 sums all-reduced in forward, their gradients all-reduced in backward; every rank must call it.
// With one rank it equals batch_norm(training=true) up to float32 rounding.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, double momentum = 0.1, double eps = 1e-5);

Tensor max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0});  // stride {0, 0} means stride = kernel
Tensor avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0}, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);
// relu(max_pool2d(input, ...)) with the same values and gradients, bit for bit. On channels-last float32 and 16-bit
// inputs with windows of at most 255 positions it is one pass, the ReLU folded into the pooling forward and backward
// (recorded and profiled as max_pool2d); elsewhere it is the two ops.
Tensor max_pool2d_relu(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                       std::array<int64_t, 2> padding = {0, 0});
// relu(max_pool2d(conv2d(input, weight, bias, stride, padding), pool_kernel)) as one op: on channels-last float32
// and 16-bit inputs its forward runs the convolution and the pooling a slice of the batch at a time, so that the
// convolution's output stays in the cache (and is never allocated whole); values and gradients are those of the
// three ops. Elsewhere it is the three ops.
Tensor conv2d_max_pool2d_relu(const Tensor& input, const Tensor& weight, const Tensor& bias,
                              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                              std::array<int64_t, 2> pool_kernel);
Tensor relu(const Tensor& input);
Tensor gelu(const Tensor& input, bool tanh_approximate = false);
Tensor silu(const Tensor& input);
Tensor dropout(const Tensor& input, double p, bool training);  // uses castor::default_generator()

// input (*) int64 indices, weight (V, C) -> (*, C). The weight's gradient is dense; padding_idx's row gets none.
Tensor embedding(const Tensor& input, const Tensor& weight, int64_t padding_idx = -1);
// Layer norm over the trailing normalized_shape of input; statistics in float32 whatever the input dtype, output in
// the input's dtype. weight/bias (normalized_shape) optional; they may be float32 under a 16-bit input (O2).
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// input * rsqrt(mean(input^2) + eps) * weight over the trailing normalized_shape (torch.nn.RMSNorm).
Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {}, double eps = 1e-6);
// PyTorch 2's F.scaled_dot_product_attention: q (B, H, Tq, D), k, v (B, Hkv, Tk, D) with H a multiple of Hkv
// (grouped-query attention, PyTorch 2.5's enable_gqa=True: query head h reads k/v head h / (H / Hkv) in place, no
// repeated copies); attn_mask bool (true = attend) or floating (added), broadcastable to (B, H, Tq, Tk); is_causal
// masks key j > query i. Fused (flash-style): the softmax statistics in float32, the products in the inputs' dtype,
// memory linear in T (docs/transformers.md). dropout_p > 0 runs PyTorch's math path instead (the probabilities
// materialised). Lower precision under autocast.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);
// nanoGPT's attention on the packed projection: qkv (B, T, 3C) = [q | k | v], n_head heads of D = C / n_head;
// returns the heads merged back, (B, T, C) = scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
// (no mask, no dropout), but one node: the heads are read in place and the backward writes the q, k and v
// gradients into one (B, T, 3C) buffer (no slice gradients to zero and add). Lower precision under autocast.
Tensor qkv_attention(const Tensor& qkv, int64_t n_head, bool is_causal = true,
                     std::optional<double> scale = std::nullopt);
Tensor flatten(const Tensor& input, int64_t start_dim = 1);  // channel-major, as PyTorch's view on NCHW

// Which elements a rotary embedding rotates together: (2k, 2k + 1) (Meta's Llama and llama2.c) or (k, k + D/2)
// (Hugging Face's rotate_half).
enum class RotaryPairing { Interleaved, RotateHalf };
// Hugging Face's rope_scaling (modeling_rope_utils.py): how pair k's inverse frequency inv_k = theta^(-2k/D) is
// changed. Linear: inv_k / factor (positions divided by factor). Llama3: with wavelength w = 2 pi / inv_k and
// orig = original_max_position_embeddings, inv_k when w < orig / high_freq_factor, inv_k / factor when w > orig /
// low_freq_factor, else (1 - s) inv_k / factor + s inv_k with s = (orig / w - low_freq_factor) / (high_freq_factor -
// low_freq_factor). Each step in float32, as transformers computes it.
struct RopeScaling {
  enum class Type { None, Linear, Llama3 };
  Type type = Type::None;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3 only
  int64_t original_max_position_embeddings = 8192;       // llama3 only
  void validate() const;                                 // a castor::Error naming the field otherwise
  bool operator==(const RopeScaling&) const = default;
};
// Rotary position embedding (RoPE) of q or k as (B, T, H, D), the projection viewed as heads before their transpose
// (llama2.c's layout), at positions start_pos .. start_pos + T - 1: pair k of position p is rotated by the float32
// angle p * inv_k, inv_k = theta^(-2k/D) (llama2.c's precompute_freqs_cis) changed by `scaling` (the cos/sin tables
// made once per head size, theta and scaling, and shared). Computed in float32 (double for float64), the result
// rounded once to the input's dtype; D must be even. The backward rotates by minus the angle. Passes through autocast.
Tensor rotary_embedding(const Tensor& input, int64_t start_pos = 0, double theta = 10000.0,
                        RotaryPairing pairing = RotaryPairing::Interleaved, const RopeScaling& scaling = {});
// SwiGLU's gate: silu(gate) * up of one shape, one fused node (forward and backward each one pass; 16-bit computed
// in float32 and rounded once), so Llama's feed-forward is w2(swiglu(w1(x), w3(x))). Operands of two dtypes
// promote, as silu(gate) * up does in PyTorch (also under autocast).
Tensor swiglu(const Tensor& gate, const Tensor& up);

enum class Reduction { None, Mean, Sum };
// logits (N, C), target (N) int64 class indices. Computed in float32 (16-bit logits are read as they are, without a
// float32 copy: a vocabulary of 50,257 stays one tensor); without class weights one fused pass per row.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     double label_smoothing = 0.0, int64_t ignore_index = -100, const Tensor& weight = {});
// cross_entropy(linear(input, weight[:classes]), target) without the logits ever held whole (Liger-Kernel's fused
// linear cross-entropy): input (N, C), weight (V, C), target (N) int64 in [0, classes) (classes 0: V; a GPT's padded
// head passes its real vocabulary). The forward computes the logits `chunk` of them at a time (all rows, a block of
// classes, each row's log-sum-exp carried across blocks) and keeps each row's log-sum-exp; the backward computes them
// again block by block, so the weight's
// gradient is one product over all rows as linear's is. The same loss and gradients as the two ops within float32
// summation order. Under autocast linear's policy (input and weight cast to the 16-bit type, the logits rounded to it
// once) and cross_entropy's (the loss computed in float32 from them). Label smoothing with ignored targets under
// Mean (PyTorch's two denominators) is refused.
Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& target,
                            Reduction reduction = Reduction::Mean, double label_smoothing = 0.0,
                            int64_t ignore_index = -100, int64_t classes = 0, int64_t chunk = int64_t{1} << 22);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean,
                int64_t ignore_index = -100, const Tensor& weight = {});
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);
// Banned under autocast (raises there, naming binary_cross_entropy_with_logits).
Tensor binary_cross_entropy(const Tensor& probs, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace castor::F
