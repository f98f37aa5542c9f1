// Transformer ops as typed definitions: embedding, layer/RMS norm, fused attention, rotary embedding, SwiGLU and
// fused cross-entropy. Their forwards are the F:: functions of castor/functional.h (cross-entropy's: the per-row
// losses F::cross_entropy reduces), defined beside these backwards in transformer.cpp.
#pragma once
#include <vector>

#include "castor/functional.h"
#include "ops/op_def.h"

namespace castor {

// dst (*, C) = weight (V, C) rows at indices (*) int64; the gradient is dense (V, C), none into padding_idx's row.
template <>
struct OpDef<OpKind::Embedding> {
  struct Params {
    int64_t padding_idx;  // -1: none
  };
  struct Saved {
    SavedTensor indices;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Layer norm over the trailing `normalized` elements of src; statistics float32, dst in src's dtype; weight and
// bias (normalized shape) may be undefined, or float32 under a 16-bit src (norms keeping float32 parameters).
template <>
struct OpDef<OpKind::LayerNorm> {
  struct Params {
    int64_t normalized;  // elements per row
    bool has_bias;
  };
  struct Saved {
    SavedTensor src, weight, mean, rstd;  // src as rows (R, C); mean, rstd (R) float32
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// RMS norm: src * rsqrt(mean(src^2) + eps) * weight over the trailing `normalized` elements.
template <>
struct OpDef<OpKind::RmsNorm> {
  struct Params {
    int64_t normalized;
  };
  struct Saved {
    SavedTensor src, weight, rstd;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// softmax(q k^T * scale + mask) v, flash-style: saves q, k, v, the output and the per-row log-sum-exp (float32),
// never the (Tq, Tk) probabilities; backward recomputes them a block of rows at a time.
template <>
struct OpDef<OpKind::ScaledDotProductAttention> {
  struct Params {
    bool is_causal;
    double scale;
  };
  struct Saved {
    SavedTensor q, k, v, mask, dst, lse;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// F::qkv_attention: the causal attention of q, k, v split from one (B, T, 3C) projection, output (B, T, C) with the
// heads merged; saves the projection, the (B, H, T, D) attention output and lse; the backward's q, k, v gradients
// are strided views of one (B, T, 3C) buffer.
template <>
struct OpDef<OpKind::QkvAttention> {
  struct Params {
    int64_t n_head;
    bool is_causal;
    double scale;
  };
  struct Saved {
    SavedTensor qkv, dst, lse;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// F::rotary_embedding: dst (B, T, H, D) = src with each pair rotated by its position's angle; the backward is the
// rotation by minus the angle. Saves only the cos, sin rows of its positions (views of the shared tables).
template <>
struct OpDef<OpKind::RotaryEmbedding> {
  struct Params {
    bool interleaved;
  };
  struct Saved {
    SavedTensor cos, sin;  // (T, D/2) float32
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// The inverse frequencies (head_size / 2) of rotary embeddings: theta^(-2k / head_size) in float32 as llama2.c's
// precompute_freqs_cis and transformers' default rope, changed by `scaling` (F::RopeScaling).
std::vector<float> rotary_inv_freq(int64_t head_size, double theta, const F::RopeScaling& scaling = {});
// The cos and sin tables (positions, head_size / 2) float32 of rotary embeddings, angle (p, k) = p * inv_freq[k] in
// float32: made once per (head size, theta, scaling), grown (doubling) when more positions are asked for (a row never
// changes), shared by every call; thread-safe. Views of the shared tables.
std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_size, double theta,
                                        const F::RopeScaling& scaling = {});

// F::swiglu: dst = silu(gate) * up; the backward computes both gradients in one pass over the saved inputs.
template <>
struct OpDef<OpKind::SwiGlu> {
  struct Params {};
  struct Saved {
    SavedTensor gate, up;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Per-row cross-entropy losses (N) float32 of logits (N, V) read in their own dtype (no float32 copy of them).
template <>
struct OpDef<OpKind::CrossEntropy> {
  struct Params {
    int64_t ignore_index;
    double label_smoothing;
  };
  struct Saved {
    SavedTensor logits, target, lse;
  };
  // F.cross_entropy(reduction='none'): 0 where target == ignore_index.
  static Tensor forward(const Tensor& logits, const Tensor& target, double label_smoothing, int64_t ignore_index);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Per-row cross-entropy losses (N) float32 of linear(input, weight[:classes]), the logits `chunk` at a time.
template <>
struct OpDef<OpKind::LinearCrossEntropy> {
  struct Params {
    int64_t ignore_index;
    double label_smoothing;
    int64_t classes, chunk;
  };
  struct Saved {
    SavedTensor input, weight, target, lse;
  };
  // F::linear_cross_entropy(reduction=None): 0 where target == ignore_index.
  static Tensor forward(const Tensor& input, const Tensor& weight, const Tensor& target, double label_smoothing,
                        int64_t ignore_index, int64_t classes, int64_t chunk);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
