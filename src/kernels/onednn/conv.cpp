// Convolution forward, backward-data and backward-weights on oneDNN, cached with their reorders by pass, shape,
// dtype, layouts and parameters. Channels-last activations with few input channels run on channels-last (nhwc)
// primitives without any reorder; others on the layout oneDNN prefers (blocked), reordered on the way in and out.
// float16 (and bfloat16 where oneDNN lacks it) runs on exact float32 copies with one rounding of the result. Also
// the fused convolution + max pooling + ReLU forward, a slice of the batch at a time.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "castor/backends.h"
#include "kernels/layers.h"
#include "kernels/onednn/fallback.h"

namespace castor::kernels {

namespace {

using dnnl::memory;
using tag = memory::format_tag;

std::atomic<int64_t> g_reorders{0};
std::atomic<int64_t> g_backward_data{0};  // backward-data passes run
std::atomic<int64_t> g_winograd{0};       // passes run as Winograd

// Where a tensor in Castor's layout ("plain": nchw or nhwc activations, oihw weights) meets a primitive: the layout
// the primitive takes and the reorder between the two (absent when they agree).
struct Port {
  memory::desc plain, want;
  std::optional<dnnl::reorder> reorder;  // plain -> want for inputs, want -> plain for outputs
};

Port input_port(const memory::desc& plain, const memory::desc& want) {
  Port p{plain, want, {}};
  if (want != plain) p.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain, engine(), want));
  return p;
}
Port output_port(const memory::desc& want, const memory::desc& plain) {
  Port p{plain, want, {}};
  if (want != plain) p.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), want, engine(), plain));
  return p;
}

// A tensor's data as a primitive takes it: the tensor's own buffer, or a reordered copy in `buffer`, which comes
// from Castor's caching allocator (no page faults after the first step; counted in memory_stats(), since at batch
// 256 a copy is as large as the activation it holds) and is given back when the call is done.
struct Staged {
  memory mem;
  Tensor buffer;
};

Staged scratch_for(const Port& port, DType dtype) {
  const int64_t bytes = static_cast<int64_t>(port.want.get_size()), size = dtype_size(dtype);
  Tensor buffer = empty({(bytes + size - 1) / size}, dtype);
  return {memory(port.want, engine(), buffer.data_ptr()), buffer};
}

// An input in the port's layout (reordered into scratch when needed).
Staged stage_in(const Port& port, const Tensor& t) {
  memory user(port.plain, engine(), t.data_ptr());
  if (!port.reorder) return {user};
  Staged s = scratch_for(port, t.dtype());
  port.reorder->execute(stream(), user, s.mem);
  ++g_reorders;
  return s;
}

constexpr int64_t kBlockedFromChannels = 64;
constexpr int64_t kNhwcWeightsFromChannels = 16;

enum Pass : int64_t { kForward, kBackwardData, kBackwardWeights };

// Everything that picks a convolution primitive; all int64 so that memcmp sees no padding bytes. src_cl and dst_cl
// say whether the tensors on the src side (src, diff_src) and dst side (dst, diff_dst) are channels-last.
struct ConvKey {
  int64_t pass, dt;
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t stride[2], padding[2], dilation[2], groups, bias, src_cl, dst_cl;
  int64_t winograd;  // try Winograd F(4x4, 3x3) first (build() falls back to direct where oneDNN has none)
  int64_t grad_dt;   // backward weights: diff_weights' and diff_bias' dnnl data type when not dt's (0: dt's)
};

// A cached convolution: the primitive and its three tensor ports, in the order
//   forward:          src (in), weights (in), dst (out)
//   backward data:    diff_dst (in), weights (in), diff_src (out)
//   backward weights: src (in), diff_dst (in), diff_weights (out)
// plus the plain bias (or diff_bias) descriptor.
struct ConvPrim {
  dnnl::primitive prim;
  std::array<Port, 3> ports;
  std::array<int, 3> args;
  memory::desc bias;
  bool winograd = false;
};

std::atomic<backends::ConvAlgorithm> g_algorithm{backends::ConvAlgorithm::Auto};

// The key for tensors `src` (or diff_src), `weights` (or diff_weights) and `dst` (or diff_dst), computing in `dt`.
// Float32 tensors (not the float32 copies that emulate 16-bit types) may run as Winograd: see castor/backends.h.
ConvKey make_key(Pass pass, DType dt, const Tensor& src, const Tensor& weights, const Tensor& dst, bool bias,
                 const Conv2dParams& p) {
  ConvKey k{};
  k.pass = pass;
  k.dt = static_cast<int64_t>(to_dnnl(dt));
  k.n = src.size(0), k.c = src.size(1), k.h = src.size(2), k.w = src.size(3);
  k.o = dst.size(1), k.oh = dst.size(2), k.ow = dst.size(3);
  k.kh = weights.size(2), k.kw = weights.size(3);
  k.dst_cl = channels_last(dst);
  // A dense one-channel src is laid out alike in both formats: nhwc beside a channels-last dst, so that a grayscale
  // network's first layer runs without reorders.
  k.src_cl = channels_last(src) || (k.c == 1 && k.dst_cl && src.is_contiguous(MemoryFormat::ChannelsLast));
  for (int i = 0; i < 2; ++i) k.stride[i] = p.stride[i], k.padding[i] = p.padding[i], k.dilation[i] = p.dilation[i];
  k.groups = p.groups;
  k.bias = bias;
  // (Below kBlockedFromChannels input channels Winograd's reorders to blocked layouts and its batch-slice
  // inefficiency cost more than it saves: SimpleCNN's second layer runs 10% slower a step.)
  k.winograd = dt == DType::Float32 && src.dtype() == DType::Float32 && k.c >= kBlockedFromChannels &&
               g_algorithm.load() == backends::ConvAlgorithm::Auto && k.kh == 3 && k.kw == 3 && p.stride[0] == 1 &&
               p.stride[1] == 1 && p.dilation[0] == 1 && p.dilation[1] == 1 && p.groups == 1;
  return k;
}

// Builds the primitive for `k`; nullptr when oneDNN has no implementation for its dtype on this CPU.
std::unique_ptr<ConvPrim> build(const ConvKey& k) {
  const auto dt = static_cast<memory::data_type>(k.dt);
  const memory::dims strides = {k.stride[0], k.stride[1]}, dilates = {k.dilation[0] - 1, k.dilation[1] - 1},
                     pad = {k.padding[0], k.padding[1]};
  const memory::dims src_dims = {k.n, k.c, k.h, k.w}, dst_dims = {k.n, k.o, k.oh, k.ow};
  const memory::dims w_dims = k.groups == 1 ? memory::dims{k.o, k.c, k.kh, k.kw}
                                            : memory::dims{k.groups, k.o / k.groups, k.c / k.groups, k.kh, k.kw};
  const memory::desc src_plain(src_dims, dt, k.src_cl ? tag::nhwc : tag::nchw);
  const memory::desc dst_plain(dst_dims, dt, k.dst_cl ? tag::nhwc : tag::nchw);
  const memory::desc w_plain(w_dims, dt, k.groups == 1 ? tag::oihw : tag::goihw);
  const auto gdt = k.grad_dt ? static_cast<memory::data_type>(k.grad_dt) : dt;  // diff_weights, diff_bias
  const memory::desc dw_plain(w_dims, gdt, k.groups == 1 ? tag::oihw : tag::goihw), dw_any(w_dims, gdt, tag::any);
  // The primitive's activation layout: channels-last tensors with few input channels run on oneDNN's nhwc kernels,
  // which here match its blocked ones below 64 channels but are 10-30% slower from 64 up (ResNet-18's layers),
  // more than the reorders to and from the blocked layout cost (docs/benchmarks.md).
  // Backward-weights of a layer with few input channels (a network's first) is the exception: oneDNN 2.6's nhwc
  // kernel for it runs 4-1000x slower than its blocked one here (about 3 s against 3 ms for SimpleCNN's first layer in
  // bfloat16 on 2 busy cores), far more than reordering src and diff_dst costs.
  const bool nhwc_ok = (k.pass != kBackwardWeights || k.c >= kNhwcWeightsFromChannels) && !k.winograd;
  const tag act = k.src_cl && k.c < kBlockedFromChannels && nhwc_ok ? tag::nhwc : tag::any;
  const memory::desc src_any(src_dims, dt, act), dst_any(dst_dims, dt, act), w_any(w_dims, dt, tag::any);
  const memory::desc bias = k.bias ? memory::desc({k.o}, dt, tag::x) : memory::desc();
  const memory::desc diff_bias = k.bias ? memory::desc({k.o}, gdt, tag::x) : memory::desc();
  const auto algo = k.winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  try {
    const dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, w_any, bias, dst_any, strides,
                                        dilates, pad, pad),
        engine());
    auto out = std::make_unique<ConvPrim>();
    out->bias = bias;
    out->winograd = k.winograd;
    if (k.pass == kForward) {
      out->prim = dnnl::convolution_forward(fwd);
      out->ports = {input_port(src_plain, fwd.src_desc()), input_port(w_plain, fwd.weights_desc()),
                    output_port(fwd.dst_desc(), dst_plain)};
      out->args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    } else if (k.pass == kBackwardData) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, src_any, w_any, dst_any, strides, dilates, pad, pad), engine(),
          fwd);
      out->prim = dnnl::convolution_backward_data(pd);
      out->ports = {input_port(dst_plain, pd.diff_dst_desc()), input_port(w_plain, pd.weights_desc()),
                    output_port(pd.diff_src_desc(), src_plain)};
      out->args = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    } else {
      out->bias = diff_bias;
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, src_any, dw_any, diff_bias, dst_any, strides, dilates, pad,
                                                   pad),
          engine(), fwd);
      out->prim = dnnl::convolution_backward_weights(pd);
      out->ports = {input_port(src_plain, pd.src_desc()), input_port(dst_plain, pd.diff_dst_desc()),
                    output_port(pd.diff_weights_desc(), dw_plain)};
      out->args = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
    }
    return out;
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    if (!k.winograd) return nullptr;
    ConvKey direct = k;
    direct.winograd = 0;
    return build(direct);
  }
}

const ConvPrim* cached(const ConvKey& k) {
  static PrimitiveCache<ConvKey, ConvPrim> cache;
  return cache.get(k, build);
}

// Runs one cached convolution on staged inputs, writing its output into the tensor `out` (through a scratch buffer
// and a reorder when the primitive's layout is not out's).
void run(const ConvPrim& c, const Staged& in0, const Staged& in1, const Tensor& out, const Tensor& bias) {
  const Port& port = c.ports[2];
  memory user(port.plain, engine(), out.data_ptr());
  Staged dst = port.reorder ? scratch_for(port, out.dtype()) : Staged{user, Tensor()};
  std::unordered_map<int, memory> args = {{c.args[0], in0.mem}, {c.args[1], in1.mem}, {c.args[2], dst.mem}};
  if (bias.defined())
    args[c.args[2] == DNNL_ARG_DST ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS] = memory(c.bias, engine(), bias.data_ptr());
  c.prim.execute(stream(), args);
  g_winograd += c.winograd;
  if (port.reorder) {
    port.reorder->execute(stream(), dst.mem, user);
    ++g_reorders;
  }
  stream().wait();
}

// The weights (or, in backward, the weights as the data pass reads them) staged once for all the batch slices of a
// pass: staged again only when a slice's primitive wants another layout.
class StagedWeights {
 public:
  explicit StagedWeights(const Tensor& weights) : weights_(weights) {}
  const Staged& in(const Port& port) {
    if (!staged_ || staged_->mem.get_desc() != port.want) staged_ = stage_in(port, weights_);
    return *staged_;
  }

 private:
  const Tensor& weights_;
  std::optional<Staged> staged_;
};

void run_forward(const ConvPrim& c, const Tensor& src, StagedWeights& weights, const Tensor& bias, const Tensor& dst) {
  run(c, stage_in(c.ports[0], src), weights.in(c.ports[1]), dst, bias);
}

// Both backward passes; diff_dst is reordered once when the two primitives want the same layout for it.
void run_backward(const ConvPrim* data, const ConvPrim* wts, const Tensor& src, StagedWeights& weights,
                  const Tensor& diff_dst, const Tensor& diff_src, const Tensor& diff_weights, const Tensor& diff_bias) {
  Staged dy;
  if (data) {
    ++g_backward_data;
    dy = stage_in(data->ports[0], diff_dst);
    run(*data, dy, weights.in(data->ports[1]), diff_src, Tensor());
  }
  if (wts) {
    const bool reuse = data && dy.mem.get_desc() == wts->ports[1].want;
    run(*wts, stage_in(wts->ports[0], src), reuse ? dy : stage_in(wts->ports[1], diff_dst), diff_weights, diff_bias);
  }
}

// The primitive for `pass` in dtype `dt`, or nullptr where it must run on float32 copies.
const ConvPrim* native(Pass pass, DType dt, const Tensor& src, const Tensor& weights, const Tensor& dst, bool bias,
                       const Conv2dParams& p) {
  if (!native_products(dt)) return nullptr;
  return cached(make_key(pass, dt, src, weights, dst, bias, p));
}
const ConvPrim& in_float32(Pass pass, const Tensor& src, const Tensor& weights, const Tensor& dst, bool bias,
                           const Conv2dParams& p) {
  const ConvPrim* c = cached(make_key(pass, DType::Float32, src, weights, dst, bias, p));
  CASTOR_ASSERT(c, "oneDNN has no float32 convolution");
  return *c;
}

std::string describe(const Tensor& src, const Tensor& weights, const Conv2dParams& p) {
  return detail::cat(src.describe(), " with weights ", weights.describe(), ", stride (", p.stride[0], ", ", p.stride[1],
                     "), padding (", p.padding[0], ", ", p.padding[1], "), dilation (", p.dilation[0], ", ",
                     p.dilation[1], "), groups ", p.groups);
}

// Images per slice of the batch on the float32 emulation (float16, and bfloat16 without oneDNN bf16 kernels): the
// float32 copies of a slice's activations stay near kSliceBytes instead of whole-batch size, which would cost more
// memory than the 16-bit activations save. Each slice's widening, convolution and rounding are parallel regions of
// their own, whose thread wake-ups cost more than the cache saves at small slices: SimpleCNN's O1 bfloat16 step
// under the AVX2 cap, wall time as `castor train` reports it, ran at 0.77x float32's with 1 MiB slices (about 550
// regions a step against float32's 62) and 1.00x with 4 MiB, quiet (docs/benchmarks.md, #49).
constexpr int64_t kSliceBytes = 4 << 20;
int64_t slice_images(const Tensor& src, const Tensor& dst) {
  const int64_t per_image = 4 * std::max(src.numel(), dst.numel()) / std::max<int64_t>(src.size(0), 1);
  return std::max<int64_t>(1, kSliceBytes / std::max<int64_t>(per_image, 1));
}

// Images [n0, n0 + len) of an activation (undefined stays undefined).
Tensor images(const Tensor& t, int64_t n0, int64_t len) { return t.defined() ? t.narrow(0, n0, len) : t; }

// sum += part, float32 (undefined: nothing).
void accumulate(const Tensor& sum, const Tensor& part) {
  if (!sum.defined()) return;
  float* s = sum.data<float>();
  const float* q = part.data<float>();
  for (int64_t i = 0; i < sum.numel(); ++i) s[i] += q[i];
}

// A 16-bit backward-weights pass whose src or diff_dst the primitive takes in another layout (e.g. the blocked
// layout of a first layer's bfloat16 kernels without AMX) would hold whole-batch reordered copies of them, as large
// as the activations (16 MiB for SimpleCNN's first layer at batch 256): it runs in batch slices whose copies stay
// near kReorderSliceBytes instead, each slice's diff_weights and diff_bias summed in float32 (a primitive writing
// float32 gradients) and rounded once, the numerics of the whole-batch pass. Images per slice, or 0 for one pass.
constexpr int64_t kReorderSliceBytes = 4 << 20;
int64_t weights_slice_images(const ConvPrim& wts, const Tensor& src, const Tensor& diff_dst) {
  if (!is_16bit_float(diff_dst.dtype())) return 0;
  const int64_t n = diff_dst.size(0), size = dtype_size(diff_dst.dtype());
  int64_t per_image = 0;
  if (wts.ports[0].reorder) per_image = std::max(per_image, src.numel() / std::max<int64_t>(n, 1) * size);
  if (wts.ports[1].reorder) per_image = std::max(per_image, diff_dst.numel() / std::max<int64_t>(n, 1) * size);
  if (per_image * n <= kReorderSliceBytes) return 0;
  return std::max<int64_t>(1, kReorderSliceBytes / per_image);
}

// The backward-weights pass in slices of `step` images (see weights_slice_images); false, with nothing written,
// where oneDNN has no primitive writing float32 gradients from these inputs.
bool backward_weights_sliced(const Tensor& src, const Tensor& src_side, const Tensor& diff_dst,
                             const Tensor& diff_weights, const Tensor& diff_bias, const Conv2dParams& p, int64_t step) {
  const Tensor dw = float_like(diff_weights), db = float_like(diff_bias);
  const Tensor dw_part = float_like(diff_weights), db_part = float_like(diff_bias);
  const int64_t n = diff_dst.size(0);
  for (int64_t n0 = 0; n0 < n; n0 += step) {
    const int64_t len = std::min(step, n - n0);
    const Tensor dd = images(diff_dst, n0, len);
    ConvKey key = make_key(kBackwardWeights, diff_dst.dtype(), images(src_side, n0, len), diff_weights, dd,
                           diff_bias.defined(), p);
    key.grad_dt = static_cast<int64_t>(memory::data_type::f32);
    const ConvPrim* c = cached(key);
    if (!c) return false;
    const bool first = n0 == 0;
    run(*c, stage_in(c->ports[0], images(src, n0, len)), stage_in(c->ports[1], dd), first ? dw : dw_part,
        first ? db : db_part);
    if (!first) accumulate(dw, dw_part), accumulate(db, db_part);
  }
  round_into(dw, diff_weights);
  round_into(db, diff_bias);
  return true;
}

}  // namespace

int64_t conv_reorder_count() { return g_reorders.load(); }
int64_t conv_backward_data_count() { return g_backward_data.load(); }
int64_t conv_winograd_count() { return g_winograd.load(); }

void conv2d_forward(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                    const Conv2dParams& p) {
  if (src.dtype() == DType::Float64) return conv2d_forward_ref(src, weights, bias, dst, p);
  try {
    const bool has_bias = bias.defined();
    if (const ConvPrim* c = native(kForward, src.dtype(), src, weights, dst, has_bias, p)) {
      StagedWeights w(weights);
      return run_forward(*c, src, w, bias, dst);
    }
    const Tensor w_f = widen(weights), b_f = widen(bias);
    StagedWeights w(w_f);
    const int64_t n = src.size(0), step = slice_images(src, dst);
    for (int64_t n0 = 0; n0 < n; n0 += step) {
      const int64_t len = std::min(step, n - n0);
      const Tensor s = images(src, n0, len), d = images(dst, n0, len), d_f = float_like(d);
      run_forward(in_float32(kForward, s, weights, d, has_bias, p), widen(s), w, b_f, d_f);
      copy(d_f, d);
    }
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("conv2d: oneDNN could not run ", describe(src, weights, p), ": ", e.what()));
  }
}

void conv2d_backward(const Tensor& src, const Tensor& weights, const Tensor& diff_dst, const Tensor& diff_src,
                     const Tensor& diff_weights_in, const Tensor& diff_bias, const Conv2dParams& p) {
  // oneDNN computes the bias gradient with the weights gradient; a scratch diff_weights serves a lone diff_bias.
  const Tensor diff_weights = diff_bias.defined() && !diff_weights_in.defined()
                                  ? empty(weights.shape(), weights.dtype())
                                  : diff_weights_in;
  if (diff_dst.dtype() == DType::Float64)
    return conv2d_backward_ref(src, weights, diff_dst, diff_src, diff_weights, diff_bias, p);
  const Tensor& src_side = diff_src.defined() ? diff_src : src;
  const Tensor& w_side = diff_weights.defined() ? diff_weights : weights;
  const bool has_bias = diff_bias.defined();
  try {
    const DType dt = diff_dst.dtype();
    // Whether to run natively is decided per dtype and shape, so both passes make the same choice.
    const ConvPrim* data = diff_src.defined() ? native(kBackwardData, dt, src_side, w_side, diff_dst, false, p)
                                              : nullptr;
    const ConvPrim* wts = diff_weights.defined() ? native(kBackwardWeights, dt, src_side, w_side, diff_dst, has_bias, p)
                                                 : nullptr;
    const bool need_data = diff_src.defined(), need_wts = diff_weights.defined();
    if ((!need_data || data) && (!need_wts || wts)) {
      const int64_t step = wts ? weights_slice_images(*wts, src, diff_dst) : 0;
      StagedWeights w(weights);
      if (step == 0) return run_backward(data, wts, src, w, diff_dst, diff_src, diff_weights, diff_bias);
      run_backward(data, nullptr, src, w, diff_dst, diff_src, Tensor(), Tensor());
      if (backward_weights_sliced(src, src_side, diff_dst, diff_weights, diff_bias, p, step)) return;
      return run_backward(nullptr, wts, src, w, diff_dst, Tensor(), diff_weights, diff_bias);
    }
    // Slice by slice; the weights' and bias' gradients are summed over the slices in float32 and rounded once.
    const Tensor w_f = need_data ? widen(weights) : Tensor();
    StagedWeights w(w_f);
    const Tensor dw = float_like(diff_weights), db = float_like(diff_bias);
    const Tensor dw_part = float_like(diff_weights), db_part = float_like(diff_bias);
    const int64_t n = diff_dst.size(0), step = slice_images(src_side, diff_dst);
    for (int64_t n0 = 0; n0 < n; n0 += step) {
      const int64_t len = std::min(step, n - n0);
      const Tensor side = images(src_side, n0, len), dd = images(diff_dst, n0, len);
      const Tensor dsrc = images(diff_src, n0, len), dx = float_like(dsrc);
      const bool first = n0 == 0;
      run_backward(need_data ? &in_float32(kBackwardData, side, w_side, dd, false, p) : nullptr,
                   need_wts ? &in_float32(kBackwardWeights, side, w_side, dd, has_bias, p) : nullptr,
                   need_wts ? widen(images(src, n0, len)) : Tensor(), w, widen(dd), dx, first ? dw : dw_part,
                   first ? db : db_part);
      if (!first) accumulate(dw, dw_part), accumulate(db, db_part);
      round_into(dx, dsrc);
    }
    round_into(dw, diff_weights);
    round_into(db, diff_bias);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("conv2d backward: oneDNN could not run ", describe(diff_dst, weights, p), ": ", e.what()));
  }
}

// Images per slice of the fused convolution and pooling: the slice's convolution output near kFusedSliceBytes, which
// measured fastest here (64 images of SimpleCNN's first layer in bf16: 28% under the unfused pair; 16 or fewer lose
// to the per-call overhead).
constexpr int64_t kFusedSliceBytes = 4 << 20;

void conv2d_max_pool_relu_forward(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                                  const Tensor& workspace, const Shape& conv_shape, const Conv2dParams& conv,
                                  const Pool2dParams& pool) {
  const int64_t n = src.size(0), elements = conv_shape[1] * conv_shape[2] * conv_shape[3];
  if (n == 0) return;
  const DType dt = dst.dtype();
  const Tensor probe = empty({1, conv_shape[1], conv_shape[2], conv_shape[3]}, dt, MemoryFormat::ChannelsLast);
  // An emulated 16-bit convolution (conv2d_forward) slices by its float32 copies' size: one of its slices per fused
  // slice, since each slice is a few parallel regions whose thread wake-ups cost more than the cache saves.
  const bool emulated = !native(kForward, dt, src.narrow(0, 0, 1), weights, probe, bias.defined(), conv);
  const int64_t per_image = emulated ? elements * dtype_size(DType::Float32) : elements * dtype_size(dt);
  const int64_t step = std::clamp<int64_t>(kFusedSliceBytes / std::max<int64_t>(per_image, 1), 1,
                                           std::max<int64_t>(n, 1));
  const Tensor conv_out = empty({step, conv_shape[1], conv_shape[2], conv_shape[3]}, dst.dtype(),
                                MemoryFormat::ChannelsLast);
  for (int64_t n0 = 0; n0 < n; n0 += step) {
    const int64_t len = std::min(step, n - n0);
    const Tensor c = conv_out.narrow(0, 0, len);
    conv2d_forward(src.narrow(0, n0, len), weights, bias, c, conv);
    max_pool2d_nhwc_forward_into(c, dst.narrow(0, n0, len), workspace.narrow(0, n0, len), pool);
  }
}

}  // namespace castor::kernels

namespace castor::backends {

void set_conv_algorithm(ConvAlgorithm algorithm) { kernels::g_algorithm.store(algorithm); }
ConvAlgorithm conv_algorithm() { return kernels::g_algorithm.load(); }

}  // namespace castor::backends
