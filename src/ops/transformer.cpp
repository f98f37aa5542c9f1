// Embedding, layer/RMS norm, fused attention, rotary embedding, SwiGLU and fused cross-entropy: each op's forward
// (its F:: function) beside its backward, on the transformer kernels (kernels/transformer.h, kernels/kernels.h).
#include "ops/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "core/parallel.h"
#include "kernels/kernels.h"
#include "kernels/transformer.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {

// Statistics are float32, float64 for float64 data.
DType stat_dtype(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

// The incoming gradient in the dtype the forward ran in, contiguous.
Tensor grad_in(const Tensor& g, DType dtype) { return (g.dtype() == dtype ? g : g.to(dtype)).contiguous(); }

Tensor wanted(const Node& node, size_t input, const Shape& shape, DType dtype) {
  return node.next.size() > input && node.next[input].valid() ? empty(shape, dtype) : Tensor();
}

// The rows (R, C) of a norm's input over its trailing `normalized_shape`, and its affine tensors checked.
int64_t norm_rows(const char* op, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias) {
  CASTOR_CHECK(is_floating(x.dtype()), op, ": needs a floating-point input, got ", x.describe());
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  CASTOR_CHECK(nd >= 1 && nd <= x.dim(), op, ": normalized_shape ", shape_str(normalized_shape), " does not fit input ",
               x.describe());
  for (int64_t d = 0; d < nd; ++d)
    CASTOR_CHECK(x.size(x.dim() - nd + d) == normalized_shape[d], op, ": input ", x.describe(),
                 " does not end in normalized_shape ", shape_str(normalized_shape));
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    CASTOR_CHECK(t->shape() == normalized_shape, op, ": weight/bias ", t->describe(), " must have shape ",
                 shape_str(normalized_shape));
    CASTOR_CHECK(t->dtype() == x.dtype() || t->dtype() == DType::Float32, op, ": weight/bias ", t->describe(),
                 " must be ", dtype_name(x.dtype()), " or float32 for input ", x.describe());
  }
  return shape_numel(normalized_shape);
}

Tensor flat(const Tensor& t) { return t.defined() ? t.detach().contiguous().view({t.numel()}) : Tensor(); }

}  // namespace

// ---- embedding ----

Tensor F::embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx) {
  CASTOR_CHECK(indices.dtype() == DType::Int64, "embedding: indices must be int64, got ", indices.describe());
  OpScope s(OpKind::Embedding, {weight});
  const Tensor& w = s[0];
  CASTOR_CHECK(w.dim() == 2, "embedding: weight must be (num_embeddings, embedding_dim), got ", w.describe());
  const int64_t V = w.size(0), C = w.size(1);
  CASTOR_CHECK(padding_idx >= -1 && padding_idx < V, "embedding: padding_idx ", padding_idx, " outside [0, ", V, ")");
  const Tensor wc = w.detach().contiguous(), ic = indices.contiguous();
  Shape shape = indices.shape();
  shape.push_back(C);
  Tensor out = empty(shape, w.dtype());  // (*, C)
  const int64_t* idx = ic.data<int64_t>();
  const size_t row = static_cast<size_t>(C) * dtype_size(w.dtype());
  const auto* src = static_cast<const char*>(wc.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (int64_t n = 0; n < ic.numel(); ++n) {
    CASTOR_CHECK(idx[n] >= 0 && idx[n] < V, "embedding: index ", idx[n], " is out of range [0, ", V, ")");
    std::memcpy(dst + n * row, src + idx[n] * row, row);
  }
  record_op<OpKind::Embedding>({w}, out, {padding_idx}, {save(ic)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Embedding>::backward(const Node& node, const Params& p, const Saved& s,
                                                       Tensor diff_dst) {
  check_first_order(node);
  const Tensor indices = node.unpack(s.indices);
  const Shape& ws = node.input_shapes[0];
  const Tensor src = grad_in(diff_dst, node.out_dtype).view({indices.numel(), ws[1]});
  // A weight that already has a float32 (float64) .grad, like GPT's wte tied to lm_head whose gradient came first:
  // only the indexed rows are added into it, not a dense (V, C) gradient built and added.
  Tensor acc = leaf_grad_to_accumulate_into(node, 0);
  if (acc.defined() && (acc.dtype() == DType::Float32 || acc.dtype() == DType::Float64)) {
    kernels::embedding_backward(src, indices.view({indices.numel()}), p.padding_idx, acc, /*accumulate=*/true);
    acc.bump_version();
    return {Tensor()};
  }
  Tensor diff_weight = empty(ws, node.input_dtypes[0]);
  kernels::embedding_backward(src, indices.view({indices.numel()}), p.padding_idx, diff_weight);
  return {diff_weight};
}

// ---- layer norm and RMS norm ----

namespace {

// What LayerNorm's and RMSNorm's backward share: the saved input rows (R, C) and weight, the upstream gradient as
// rows, and where wanted the gradients of the input (input 0) and of the weight (input 1, when given).
struct NormBackward {
  NormBackward(const Node& node, const SavedTensor& saved_src, const SavedTensor& saved_weight, int64_t normalized,
               const Tensor& dy) {
    check_first_order(node);
    src = node.unpack(saved_src);
    weight = node.unpack(saved_weight);
    R = src.size(0);
    C = normalized;
    diff_src = wanted(node, 0, {R, C}, src.dtype());
    diff_weight = weight.defined() ? wanted(node, 1, {C}, weight.dtype()) : Tensor();
    diff_dst = grad_in(dy, node.out_dtype).view({R, C});
  }
  // The input's gradient, then the weight's when it was given, in their shapes.
  std::vector<Tensor> grads(const Node& node) const {
    std::vector<Tensor> g = {diff_src.defined() ? diff_src.view(node.input_shapes[0]) : Tensor()};
    if (weight.defined()) g.push_back(diff_weight.defined() ? diff_weight.view(node.input_shapes[1]) : Tensor());
    return g;
  }

  Tensor src, weight, diff_dst;  // (R, C), (C) or undefined, (R, C)
  int64_t R = 0, C = 0;
  Tensor diff_src, diff_weight;  // undefined where not wanted
};

}  // namespace

Tensor F::layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                     double eps) {
  OpScope s(OpKind::LayerNorm, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  const int64_t C = norm_rows("layer_norm", x, normalized_shape, w, b), R = x.numel() / std::max<int64_t>(C, 1);
  const Tensor src = x.detach().contiguous().view({R, C});  // (R, C)
  const Tensor wf = flat(w), bf = flat(b);
  Tensor dst = empty({R, C}, x.dtype());
  Tensor mean = empty({R}, stat_dtype(x.dtype())), rstd = empty({R}, stat_dtype(x.dtype()));
  kernels::layer_norm_forward(src, wf, bf, dst, mean, rstd, eps);
  Tensor out = dst.view(x.shape());
  std::vector<Tensor> inputs = {x};
  if (w.defined()) inputs.push_back(w);
  if (b.defined()) inputs.push_back(b);
  record_op<OpKind::LayerNorm>(inputs, out, {C, b.defined()}, {save(src), save(wf), save(mean), save(rstd)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::LayerNorm>::backward(const Node& node, const Params& p, const Saved& s,
                                                       Tensor diff_dst) {
  const NormBackward n(node, s.src, s.weight, p.normalized, diff_dst);
  const size_t bi = n.weight.defined() ? 2 : 1;
  Tensor diff_bias = p.has_bias ? wanted(node, bi, {n.C}, node.input_dtypes[bi]) : Tensor();
  kernels::layer_norm_backward(n.src, n.diff_dst, n.weight, node.unpack(s.mean), node.unpack(s.rstd), n.diff_src,
                               n.diff_weight, diff_bias);
  std::vector<Tensor> grads = n.grads(node);
  if (p.has_bias) grads.push_back(diff_bias.defined() ? diff_bias.view(node.input_shapes[bi]) : Tensor());
  return grads;
}

Tensor F::rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, double eps) {
  OpScope s(OpKind::RmsNorm, {input, weight});
  const Tensor &x = s[0], &w = s[1];
  const int64_t C = norm_rows("rms_norm", x, normalized_shape, w, Tensor()), R = x.numel() / std::max<int64_t>(C, 1);
  const Tensor src = x.detach().contiguous().view({R, C});  // (R, C)
  const Tensor wf = flat(w);
  Tensor dst = empty({R, C}, x.dtype()), rstd = empty({R}, stat_dtype(x.dtype()));
  kernels::rms_norm_forward(src, wf, dst, rstd, eps);
  Tensor out = dst.view(x.shape());
  std::vector<Tensor> inputs = {x};
  if (w.defined()) inputs.push_back(w);
  record_op<OpKind::RmsNorm>(inputs, out, {C}, {save(src), save(wf), save(rstd)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::RmsNorm>::backward(const Node& node, const Params& p, const Saved& s,
                                                     Tensor diff_dst) {
  const NormBackward n(node, s.src, s.weight, p.normalized, diff_dst);
  kernels::rms_norm_backward(n.src, n.diff_dst, n.weight, node.unpack(s.rstd), n.diff_src, n.diff_weight);
  return n.grads(node);
}

// ---- attention ----

namespace {

// q/k/v as the kernels read them: strided views are fine while the last dim is contiguous.
Tensor rows_contiguous(const Tensor& t) { return t.stride(-1) == 1 ? t.detach() : t.detach().contiguous(); }

// PyTorch's math path, for dropout: the (Tq, Tk) probabilities are materialised.
Tensor attention_math(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                      bool is_causal, double scale);

}  // namespace

Tensor F::scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                       const Tensor& attn_mask, double dropout_p, bool is_causal,
                                       std::optional<double> scale_in) {
  const char* op = "scaled_dot_product_attention";
  CASTOR_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  CASTOR_CHECK(!(is_causal && attn_mask.defined()), op, ": pass either attn_mask or is_causal, not both");
  OpScope s(OpKind::ScaledDotProductAttention, {q_in, k_in, v_in});
  const Tensor &q = s[0], &k = s[1], &v = s[2];
  CASTOR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected (B, H, T, D) q, k, v, got ", q.describe(),
               ", ", k.describe(), ", ", v.describe());
  CASTOR_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_floating(q.dtype()), op,
               ": q, k, v must share one floating dtype, got ", q.describe(), ", ", k.describe(), ", ", v.describe());
  CASTOR_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(3) == k.size(3), op,
               ": shapes do not match: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
               shape_str(v.shape()));
  CASTOR_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, op, ": q's ", q.size(1),
               " heads are not a multiple of k and v's ", k.size(1), " heads");
  if (attn_mask.defined()) {
    CASTOR_CHECK(attn_mask.dim() <= 4, op, ": attn_mask ", attn_mask.describe(), " has more than 4 dims");
    const Shape want = {q.size(0), q.size(1), q.size(2), k.size(2)};
    for (int64_t d = 0; d < attn_mask.dim(); ++d) {
      const int64_t m = attn_mask.size(attn_mask.dim() - 1 - d), w = want[3 - d];
      CASTOR_CHECK(m == w || m == 1, op, ": attn_mask ", attn_mask.describe(), " does not broadcast to ",
                   shape_str(want));
    }
  }
  const double scale = scale_in.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (dropout_p > 0) return s.done(attention_math(q, k, v, attn_mask, dropout_p, is_causal, scale));
  Tensor mask = attn_mask;
  if (mask.defined() && mask.dtype() != DType::Bool && mask.dtype() != q.dtype()) mask = mask.to(q.dtype());
  Tensor dst = empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.dtype());
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, stat_dtype(q.dtype()));
  const Tensor qd = rows_contiguous(q), kd = rows_contiguous(k), vd = rows_contiguous(v);
  kernels::attention_forward(qd, kd, vd, mask, is_causal, scale, dst, lse);
  record_op<OpKind::ScaledDotProductAttention>({q, k, v}, dst, {is_causal, scale},
                                               {save(qd), save(kd), save(vd), save(mask), save_output(dst), save(lse)});
  return s.done(dst);
}

std::vector<Tensor> OpDef<OpKind::ScaledDotProductAttention>::backward(const Node& node, const Params& p,
                                                                       const Saved& s, Tensor diff_dst) {
  check_first_order(node);
  const Tensor q = node.unpack(s.q), k = node.unpack(s.k), v = node.unpack(s.v);
  Tensor diff_q = wanted(node, 0, q.shape(), q.dtype());
  Tensor diff_k = wanted(node, 1, k.shape(), k.dtype());
  Tensor diff_v = wanted(node, 2, v.shape(), v.dtype());
  Tensor g = diff_dst.dtype() == q.dtype() ? diff_dst : diff_dst.to(q.dtype());
  kernels::attention_backward(q, k, v, node.unpack(s.mask), p.is_causal, p.scale, node.unpack(s.dst),
                              node.unpack(s.lse), rows_contiguous(g), diff_q, diff_k, diff_v);
  return {diff_q, diff_k, diff_v};
}

namespace {

// q, k, v as (B, H, T, D) strided views of a contiguous (B, T, 3C) projection.
std::array<Tensor, 3> split_heads(const Tensor& qkv, int64_t n_head) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  const Tensor parts = qkv.view({B, T, 3, n_head, C / n_head});
  return {parts.select(2, 0).permute({0, 2, 1, 3}), parts.select(2, 1).permute({0, 2, 1, 3}),
          parts.select(2, 2).permute({0, 2, 1, 3})};
}

}  // namespace

Tensor F::qkv_attention(const Tensor& qkv_in, int64_t n_head, bool is_causal, std::optional<double> scale_in) {
  OpScope s(OpKind::QkvAttention, {qkv_in});
  const Tensor& x = s[0];
  CASTOR_CHECK(x.dim() == 3 && is_floating(x.dtype()), "qkv_attention: expected a floating (B, T, 3C) input, got ",
               x.describe());
  CASTOR_CHECK(n_head > 0 && x.size(2) % (3 * n_head) == 0, "qkv_attention: last dim of ", x.describe(),
               " is not 3 * n_head (", n_head, ") * head size");
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2) / 3, D = C / n_head;
  const double scale = scale_in.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const Tensor qkv = x.detach().contiguous();
  const auto [q, k, v] = split_heads(qkv, n_head);
  Tensor dst = empty({B, n_head, T, D}, x.dtype()), lse = empty({B, n_head, T}, stat_dtype(x.dtype()));
  kernels::attention_forward(q, k, v, Tensor(), is_causal, scale, dst, lse);
  Tensor out = empty({B, T, C}, x.dtype());  // the heads merged: (B, T, H, D)
  kernels::copy(dst.permute({0, 2, 1, 3}), out.view({B, T, n_head, D}));
  record_op<OpKind::QkvAttention>({x}, out, {n_head, is_causal, scale}, {save(qkv), save(dst), save(lse)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::QkvAttention>::backward(const Node& node, const Params& p, const Saved& s,
                                                          Tensor diff_dst) {
  check_first_order(node);
  const Tensor qkv = node.unpack(s.qkv);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / p.n_head;
  const auto [q, k, v] = split_heads(qkv, p.n_head);
  Tensor diff_qkv = empty(qkv.shape(), qkv.dtype());  // (B, T, 3C)
  const auto [diff_q, diff_k, diff_v] = split_heads(diff_qkv, p.n_head);
  const Tensor g = grad_in(diff_dst, qkv.dtype()).view({B, T, p.n_head, D}).permute({0, 2, 1, 3});  // (B, H, T, D)
  kernels::attention_backward(q, k, v, Tensor(), p.is_causal, p.scale, node.unpack(s.dst), node.unpack(s.lse), g,
                              diff_q, diff_k, diff_v);
  return {diff_qkv};
}

namespace {

// k or v (B, Hkv, T, D) with each head repeated for the H / Hkv query heads sharing it (torch.repeat_interleave on
// dim 1), a copy: the math path only.
Tensor repeat_heads(const Tensor& x, int64_t H) {
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), D = x.size(3);
  if (Hkv == H) return x;
  return x.unsqueeze(2).expand({B, Hkv, H / Hkv, T, D}).reshape({B, H, T, D});
}

Tensor attention_math(const Tensor& q, const Tensor& k_in, const Tensor& v_in, const Tensor& mask, double dropout_p,
                      bool is_causal, double scale) {
  const Tensor k = repeat_heads(k_in, q.size(1)), v = repeat_heads(v_in, q.size(1));
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;  // (B, H, Tq, Tk)
  const int64_t tq = q.size(2), tk = k.size(2);
  if (is_causal) {
    Tensor upper = empty({tq, tk}, DType::Bool);
    bool* u = upper.data<bool>();
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j) u[i * tk + j] = j > i;
    scores = masked_fill(scores, upper, -INFINITY);
  } else if (mask.defined()) {
    scores = mask.dtype() == DType::Bool ? masked_fill(scores, eq(mask, scalar_tensor(0, DType::Bool)), -INFINITY)
                                         : scores + mask;
  }
  Tensor probs = softmax(scores, -1);
  Tensor keep;
  {
    NoGradGuard no_grad;
    keep = bernoulli(probs.shape(), 1.0 - dropout_p, probs.dtype());
  }
  return matmul(probs * keep * (1.0 / (1.0 - dropout_p)), v);
}

}  // namespace

// ---- rotary embedding ----

void F::RopeScaling::validate() const {
  if (type == Type::None) return;
  CASTOR_CHECK(factor > 0 && std::isfinite(factor), "rope_scaling: factor must be positive, got ", factor);
  if (type == Type::Linear) return;
  CASTOR_CHECK(low_freq_factor > 0 && high_freq_factor > low_freq_factor && std::isfinite(high_freq_factor),
               "rope_scaling: low_freq_factor ", low_freq_factor, " and high_freq_factor ", high_freq_factor,
               " must be positive, high above low");
  CASTOR_CHECK(original_max_position_embeddings > 0,
               "rope_scaling: original_max_position_embeddings must be positive, got ",
               original_max_position_embeddings);
}

std::vector<float> rotary_inv_freq(int64_t head_size, double theta, const F::RopeScaling& scaling) {
  using Type = F::RopeScaling::Type;
  const int64_t half = head_size / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(theta), factor = static_cast<float>(scaling.factor);
  for (int64_t k = 0; k < half; ++k) {
    // llama2.c and transformers: 1 / theta ** (arange(0, D, 2).float() / D), each step in float32.
    inv[k] = 1.0f / std::pow(base, static_cast<float>(2 * k) / static_cast<float>(head_size));
    if (scaling.type == Type::Linear) inv[k] /= factor;
    if (scaling.type != Type::Llama3) continue;
    // _compute_llama3_parameters in float32; Python's `scalar / tensor` is tensor.reciprocal() * scalar.
    const float orig = static_cast<float>(scaling.original_max_position_embeddings);
    const float low = static_cast<float>(scaling.low_freq_factor);
    const float low_wavelen = static_cast<float>(scaling.original_max_position_embeddings / scaling.low_freq_factor);
    const float high_wavelen = static_cast<float>(scaling.original_max_position_embeddings / scaling.high_freq_factor);
    const float wavelen = (1.0f / inv[k]) * static_cast<float>(2 * M_PI);
    const float scaled = wavelen > low_wavelen ? inv[k] / factor : inv[k];
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      inv[k] = scaled;
    } else {
      const float smooth = ((1.0f / wavelen) * orig - low) /
                           static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
      inv[k] = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
  }
  return inv;
}

std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_size, double theta,
                                        const F::RopeScaling& scaling) {
  struct Tables {
    Tensor cos, sin;  // (rows, head_size / 2)
  };
  using Key = std::tuple<int64_t, double, F::RopeScaling::Type, double, double, double, int64_t>;
  static std::mutex mu;
  static std::map<Key, Tables> cache;
  const int64_t half = head_size / 2;
  std::lock_guard<std::mutex> lock(mu);
  const bool scaled = scaling.type != F::RopeScaling::Type::None;
  const F::RopeScaling none;
  const F::RopeScaling& sc = scaled ? scaling : none;  // unscaled tables whatever the unread fields say
  Tables& t = cache[{head_size, theta, sc.type, sc.factor, sc.low_freq_factor, sc.high_freq_factor,
                     sc.original_max_position_embeddings}];
  if (!t.cos.defined() || t.cos.size(0) < positions) {
    const int64_t rows = std::max(positions, t.cos.defined() ? 2 * t.cos.size(0) : positions);
    Tables grown{empty({rows, half}, DType::Float32), empty({rows, half}, DType::Float32)};
    float *c = grown.cos.data<float>(), *s = grown.sin.data<float>();
    const std::vector<float> inv_freq = rotary_inv_freq(head_size, theta, sc);
    for (int64_t k = 0; k < half; ++k) {
      for (int64_t p = 0; p < rows; ++p) {
        const float angle = static_cast<float>(p) * inv_freq[k];
        c[p * half + k] = static_cast<float>(std::cos(static_cast<double>(angle)));
        s[p * half + k] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    t = grown;  // tensors already handed out keep the old tables alive
  }
  return {t.cos.narrow(0, 0, positions), t.sin.narrow(0, 0, positions)};
}

Tensor F::rotary_embedding(const Tensor& input, int64_t start_pos, double theta, RotaryPairing pairing,
                           const RopeScaling& scaling) {
  OpScope s(OpKind::RotaryEmbedding, {input});
  const Tensor& x = s[0];
  CASTOR_CHECK(x.dim() == 4 && is_floating(x.dtype()), "rotary_embedding: expected a floating (B, T, H, D) input, got ",
               x.describe());
  CASTOR_CHECK(x.size(3) % 2 == 0, "rotary_embedding: head size ", x.size(3), " of ", x.describe(),
               " is odd (RoPE rotates pairs of elements)");
  CASTOR_CHECK(start_pos >= 0 && theta > 0, "rotary_embedding: start_pos ", start_pos, " and theta ", theta,
               " must be >= 0 and > 0");
  scaling.validate();
  const int64_t T = x.size(1), D = x.size(3);
  const auto [cos_all, sin_all] = rotary_tables(start_pos + T, D, theta, scaling);
  const Tensor cos = cos_all.narrow(0, start_pos, T), sin = sin_all.narrow(0, start_pos, T);  // (T, D/2)
  const bool interleaved = pairing == RotaryPairing::Interleaved;
  Tensor out = empty(x.shape(), x.dtype());
  kernels::rotary_embedding(x.detach().contiguous(), cos, sin, interleaved, /*inverse=*/false, out);
  record_op<OpKind::RotaryEmbedding>({x}, out, {interleaved}, {save(cos), save(sin)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::RotaryEmbedding>::backward(const Node& node, const Params& p, const Saved& s,
                                                             Tensor diff_dst) {
  check_first_order(node);
  const Tensor g = grad_in(diff_dst, node.out_dtype);
  Tensor diff_src = empty(g.shape(), g.dtype());
  kernels::rotary_embedding(g, node.unpack(s.cos), node.unpack(s.sin), p.interleaved, /*inverse=*/true, diff_src);
  return {diff_src};
}

// ---- SwiGLU ----

Tensor F::swiglu(const Tensor& gate_in, const Tensor& up_in) {
  OpScope s(OpKind::SwiGlu, {gate_in, up_in});
  CASTOR_CHECK(s[0].shape() == s[1].shape() && is_floating(s[0].dtype()) && is_floating(s[1].dtype()), "swiglu: gate ",
               s[0].describe(), " and up ", s[1].describe(), " must be floating, of one shape");
  const DType dt = result_type({s[0], s[1]});
  const Tensor gate = s[0].to(dt), up = s[1].to(dt);  // promoted as silu(gate) * up would be
  const Tensor a = gate.detach().contiguous(), b = up.detach().contiguous();
  Tensor out = empty(gate.shape(), dt);
  kernels::swiglu_forward(a, b, out);
  record_op<OpKind::SwiGlu>({gate, up}, out, {}, {save(a), save(b)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::SwiGlu>::backward(const Node& node, const Params&, const Saved& s, Tensor diff_dst) {
  check_first_order(node);
  const Tensor a = node.unpack(s.gate), b = node.unpack(s.up);
  Tensor diff_gate = wanted(node, 0, a.shape(), a.dtype()), diff_up = wanted(node, 1, b.shape(), b.dtype());
  kernels::swiglu_backward(a, b, grad_in(diff_dst, node.out_dtype), diff_gate, diff_up);
  return {diff_gate, diff_up};
}

// ---- cross-entropy ----

Tensor OpDef<OpKind::CrossEntropy>::forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                                            int64_t ignore_index) {
  OpScope s(OpKind::CrossEntropy, {logits});
  const Tensor& x = s[0];
  CASTOR_CHECK(x.dim() == 2 && is_floating(x.dtype()), "cross_entropy: expected floating (N, C) logits, got ",
               x.describe());
  CASTOR_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == x.size(0),
               "cross_entropy: expected int64 targets (", x.size(0), "), got ", target.describe());
  // Rows may be strided (a GPT's logits without the padding columns): the kernels read them in place.
  const bool rows_in_place = x.stride(1) == 1 && x.dtype() != DType::Float64;
  const Tensor xc = rows_in_place ? x.detach() : x.detach().contiguous(), tc = target.contiguous();
  Tensor losses = empty({x.size(0)}, stat_dtype(x.dtype())), lse = empty({x.size(0)}, stat_dtype(x.dtype()));
  kernels::cross_entropy_forward(xc, tc, ignore_index, label_smoothing, losses, lse);
  record_op<OpKind::CrossEntropy>({x}, losses, {ignore_index, label_smoothing}, {save(xc), save(tc), save(lse)});
  return s.done(losses);
}

std::vector<Tensor> OpDef<OpKind::CrossEntropy>::backward(const Node& node, const Params& p, const Saved& s,
                                                          Tensor diff_dst) {
  check_first_order(node);
  const Tensor logits = node.unpack(s.logits);
  Tensor diff_logits = empty(logits.shape(), logits.dtype());
  kernels::cross_entropy_backward(logits, node.unpack(s.target), node.unpack(s.lse), grad_in(diff_dst, node.out_dtype),
                                  p.ignore_index, p.label_smoothing, diff_logits);
  return {diff_logits};
}

// ---- linear + cross-entropy, the logits a chunk at a time ----

Tensor OpDef<OpKind::LinearCrossEntropy>::forward(const Tensor& input, const Tensor& weight, const Tensor& target,
                                                  double label_smoothing, int64_t ignore_index, int64_t classes,
                                                  int64_t chunk) {
  OpScope s(OpKind::LinearCrossEntropy, {input, weight});
  const Tensor &x = s[0], &w = s[1];
  CASTOR_CHECK(x.dim() == 2 && is_floating(x.dtype()), "linear_cross_entropy: expected a floating (N, C) input, got ",
               x.describe());
  CASTOR_CHECK(w.dim() == 2 && w.size(1) == x.size(1) && w.dtype() == x.dtype(), "linear_cross_entropy: weight ",
               w.describe(), " does not match input ", x.describe(), " (expected (V, ", x.size(1), ") of its dtype)");
  CASTOR_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == x.size(0),
               "linear_cross_entropy: expected int64 targets (", x.size(0), "), got ", target.describe());
  CASTOR_CHECK(classes > 0 && classes <= w.size(0), "linear_cross_entropy: classes ", classes, " must be in [1, ",
               w.size(0), "]");
  CASTOR_CHECK(chunk > 0, "linear_cross_entropy: chunk must be positive, got ", chunk);
  const int64_t N = x.size(0);
  const Tensor xc = x.detach().contiguous(), wc = w.detach().contiguous(), tc = target.contiguous();
  Tensor losses = empty({N}, stat_dtype(x.dtype())), lse = empty({N}, stat_dtype(x.dtype()));
  kernels::linear_cross_entropy_forward(
      xc, [&wc](int64_t c0, int64_t n) { return wc.narrow(0, c0, n); }, tc, classes, chunk, ignore_index,
      label_smoothing, losses, lse);
  record_op<OpKind::LinearCrossEntropy>({x, w}, losses, {ignore_index, label_smoothing, classes, chunk},
                                        {save(xc), save(wc), save(tc), save(lse)});
  return s.done(losses);
}

std::vector<Tensor> OpDef<OpKind::LinearCrossEntropy>::backward(const Node& node, const Params& p, const Saved& s,
                                                                Tensor diff_dst) {
  check_first_order(node);
  const Tensor x = node.unpack(s.input), w = node.unpack(s.weight), t = node.unpack(s.target), lse = node.unpack(s.lse);
  const DType dt = x.dtype(), acc = stat_dtype(dt);
  const Tensor g = grad_in(diff_dst, acc);
  const bool need_x = node.next[0].valid(), need_w = node.next[1].valid();
  const int64_t N = x.size(0), C = x.size(1);
  // The weight's gradient: rows of padding classes 0. The input's: summed over the blocks of classes in float32
  // (double for float64) and rounded once, as one product over all classes would be.
  Tensor diff_w = need_w ? empty(w.shape(), dt) : Tensor(), diff_x = need_x ? zeros({N, C}, acc) : Tensor();
  if (need_w && p.classes < w.size(0)) kernels::fill(diff_w.narrow(0, p.classes, w.size(0) - p.classes), 0.0);
  kernels::linear_cross_entropy_backward(
      x, [&w](int64_t c0, int64_t n) { return w.narrow(0, c0, n); }, t, lse, g, p.classes, p.chunk, p.ignore_index,
      p.label_smoothing, diff_w, diff_x);
  return {need_x ? diff_x.to(dt) : Tensor(), diff_w};
}

}  // namespace castor
