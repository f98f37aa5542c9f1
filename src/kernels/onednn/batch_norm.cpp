// Batch norm forward and backward on oneDNN with float32 statistics, on src's layout (oneDNN's JIT kernel for
// channels-last, a generic loop for NCHW); float16 (and bfloat16 where oneDNN lacks it) runs on exact float32
// copies of src/diff_dst with one rounding of the result.
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/layers.h"
#include "kernels/onednn/fallback.h"

namespace castor::kernels {

namespace {

using dnnl::memory;
using flags = dnnl::normalization_flags;

// Everything that picks a batch norm primitive pair; no padding bytes, so memcmp is equality.
struct BnKey {
  int64_t dt, n, c, h, w, flags, channels_last;
  double eps;
};

struct BnPrims {
  dnnl::batch_normalization_forward fwd;
  dnnl::batch_normalization_backward bwd;
  memory::desc data, stats;  // src/dst/diff layouts (nchw or nhwc) and the (C) float32 statistics
};

// nullptr when oneDNN has no batch norm for the key's dtype on this CPU.
std::unique_ptr<BnPrims> build(const BnKey& k) {
  std::unique_ptr<BnPrims> p;
  const auto f = static_cast<flags>(k.flags);
  const memory::desc data({k.n, k.c, k.h, k.w}, static_cast<memory::data_type>(k.dt),
                          k.channels_last ? memory::format_tag::nhwc : memory::format_tag::nchw);
  try {
    const dnnl::batch_normalization_forward::primitive_desc fwd(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, static_cast<float>(k.eps), f),
        engine());
    const bool affine = (f & (flags::use_scale | flags::use_shift)) != flags::none;
    const dnnl::batch_normalization_backward::primitive_desc bwd(
        dnnl::batch_normalization_backward::desc(affine ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data,
                                                 data, data, static_cast<float>(k.eps), f),
        engine(), fwd);
    p = std::make_unique<BnPrims>(BnPrims{dnnl::batch_normalization_forward(fwd),
                                          dnnl::batch_normalization_backward(bwd), data,
                                          memory::desc({k.c}, memory::data_type::f32, memory::format_tag::x)});
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return p;
}

const BnPrims* cached(const BnKey& k) {
  static PrimitiveCache<BnKey, BnPrims> cache;
  return cache.get(k, build);
}

BnKey make_key(DType dt, const Tensor& src, bool scale, bool shift, double eps, bool training) {
  flags f = flags::none;
  if (scale) f |= flags::use_scale;
  if (shift) f |= flags::use_shift;
  if (!training) f |= flags::use_global_stats;
  return {static_cast<int64_t>(to_dnnl(dt)), src.size(0),        src.size(1), src.size(2), src.size(3),
          static_cast<int64_t>(f),           channels_last(src), eps};
}

// The primitives in src's own dtype, or nullptr where they must run on float32 copies.
const BnPrims* native(const Tensor& src, bool scale, bool shift, double eps, bool training) {
  if (src.dtype() == DType::Float16) return nullptr;
  return cached(make_key(src.dtype(), src, scale, shift, eps, training));
}
const BnPrims& in_float32(const Tensor& src, bool scale, bool shift, double eps, bool training) {
  const BnPrims* p = cached(make_key(DType::Float32, src, scale, shift, eps, training));
  CASTOR_ASSERT(p, "oneDNN has no float32 batch norm");
  return *p;
}

void run_forward(const BnPrims& p, const Tensor& src, const Tensor& scale, const Tensor& shift, const Tensor& mean,
                 const Tensor& var, const Tensor& dst) {
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, as_memory(p.data, src)},
                                          {DNNL_ARG_DST, as_memory(p.data, dst)},
                                          {DNNL_ARG_MEAN, as_memory(p.stats, mean)},
                                          {DNNL_ARG_VARIANCE, as_memory(p.stats, var)}};
  if (scale.defined()) args[DNNL_ARG_SCALE] = as_memory(p.stats, scale);
  if (shift.defined()) args[DNNL_ARG_SHIFT] = as_memory(p.stats, shift);
  p.fwd.execute(stream(), args);
  stream().wait();
}

void run_backward(const BnPrims& p, const Tensor& src, const Tensor& diff_dst, const Tensor& scale, const Tensor& shift,
                  const Tensor& mean, const Tensor& var, const Tensor& diff_src, const Tensor& diff_scale,
                  const Tensor& diff_shift) {
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, as_memory(p.data, src)},
                                          {DNNL_ARG_DIFF_DST, as_memory(p.data, diff_dst)},
                                          {DNNL_ARG_DIFF_SRC, as_memory(p.data, diff_src)},
                                          {DNNL_ARG_MEAN, as_memory(p.stats, mean)},
                                          {DNNL_ARG_VARIANCE, as_memory(p.stats, var)}};
  if (scale.defined()) {
    args[DNNL_ARG_SCALE] = as_memory(p.stats, scale);
    args[DNNL_ARG_DIFF_SCALE] = as_memory(p.stats, diff_scale);
  }
  if (shift.defined()) {
    args[DNNL_ARG_SHIFT] = as_memory(p.stats, shift);
    args[DNNL_ARG_DIFF_SHIFT] = as_memory(p.stats, diff_shift);
  }
  p.bwd.execute(stream(), args);
  stream().wait();
}

}  // namespace

void batch_norm_forward(const Tensor& src, const Tensor& scale, const Tensor& shift, const Tensor& mean,
                        const Tensor& var, const Tensor& dst, double eps, bool training) {
  if (src.dtype() == DType::Float64) return batch_norm_forward_ref(src, scale, shift, mean, var, dst, eps, training);
  assert_laid_out_like(dst, src);
  const bool has_scale = scale.defined(), has_shift = shift.defined();
  try {
    if (const BnPrims* p = native(src, has_scale, has_shift, eps, training))
      return run_forward(*p, src, scale, shift, mean, var, dst);
    Tensor dst_f = float_like(dst);
    run_forward(in_float32(src, has_scale, has_shift, eps, training), widen(src), scale, shift, mean, var, dst_f);
    copy(dst_f, dst);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("batch_norm: oneDNN could not run ", src.describe(), ": ", e.what()));
  }
}

void batch_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& scale, const Tensor& shift,
                         const Tensor& mean, const Tensor& var, const Tensor& diff_src, const Tensor& diff_scale_in,
                         const Tensor& diff_shift_in, double eps, bool training) {
  if (src.dtype() == DType::Float64)
    return batch_norm_backward_ref(src, diff_dst, scale, shift, mean, var, diff_src, diff_scale_in, diff_shift_in, eps,
                                   training);
  assert_laid_out_like(diff_dst, src);
  assert_laid_out_like(diff_src, src);
  // The primitive's flags follow the forward's; gradients nobody wants land in scratch.
  const bool has_scale = scale.defined(), has_shift = shift.defined();
  const Tensor diff_scale = has_scale && !diff_scale_in.defined() ? empty(scale.shape(), scale.dtype()) : diff_scale_in;
  const Tensor diff_shift = has_shift && !diff_shift_in.defined() ? empty(shift.shape(), shift.dtype()) : diff_shift_in;
  try {
    if (const BnPrims* p = native(src, has_scale, has_shift, eps, training))
      return run_backward(*p, src, diff_dst, scale, shift, mean, var, diff_src, diff_scale, diff_shift);
    Tensor diff_src_f = float_like(diff_src);
    run_backward(in_float32(src, has_scale, has_shift, eps, training), widen(src), widen(diff_dst), scale, shift, mean,
                 var, diff_src_f, diff_scale, diff_shift);
    copy(diff_src_f, diff_src);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("batch_norm backward: oneDNN could not run ", src.describe(), ": ", e.what()));
  }
}

}  // namespace castor::kernels
