// Max and average pooling forward and backward on oneDNN (max keeps oneDNN's workspace for its backward), on src's
// layout, except channels-last max pooling, which runs on Castor's own kernels (kernels/cpu/max_pool_nhwc.cpp, or the
// reference loops kernels/ref/max_pool_nhwc.cpp for windows over 256 positions). For NCHW tensors,
// where oneDNN has only its generic loop (simple_nchw, several times slower than its JIT kernels), the primitives
// run channels-last with a reorder on the way in and out. float16 (and bfloat16 where oneDNN lacks it) runs on
// exact float32 copies with one rounding.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "kernels/layers.h"
#include "kernels/onednn/fallback.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

// Everything that picks a pooling primitive pair; all int64 so that memcmp sees no padding bytes.
struct PoolKey {
  int64_t dt, alg, n, c, h, w, oh, ow, kernel[2], stride[2], padding[2], channels_last;
};

// The primitive pair, its layouts (src, dst: the tensors'; src_run, dst_run: what the primitives read and write),
// and the reorders between them when they differ.
struct PoolPrims {
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  memory::desc src, dst, src_run, dst_run, workspace;             // workspace is empty for average pooling
  std::optional<dnnl::reorder> src_in, dst_out, dst_in, src_out;  // plain -> run (in), run -> plain (out)
  bool generic;                                                   // a layout-generic loop (see is_generic)
};

dnnl::reorder make_reorder(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to));
}

// oneDNN's layout-generic loops (simple_nchw, ref), as opposed to its JIT kernels.
bool is_generic(const std::string& impl) { return impl.rfind("simple", 0) == 0 || impl.rfind("ref", 0) == 0; }

// The primitive pair on src/dst layouts `src`, `dst`.
std::unique_ptr<PoolPrims> build(const memory::desc& src, const memory::desc& dst, dnnl::algorithm alg,
                                 const memory::dims& kernel, const memory::dims& strides, const memory::dims& pad) {
  const dnnl::pooling_forward::primitive_desc fwd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, pad, pad),
      engine());
  const dnnl::pooling_backward::primitive_desc bwd(
      dnnl::pooling_backward::desc(alg, src, dst, strides, kernel, pad, pad), engine(), fwd);
  return std::make_unique<PoolPrims>(PoolPrims{dnnl::pooling_forward(fwd),
                                               dnnl::pooling_backward(bwd),
                                               src,
                                               dst,
                                               src,
                                               dst,
                                               fwd.workspace_desc(),
                                               {},
                                               {},
                                               {},
                                               {},
                                               is_generic(fwd.impl_info_str())});
}

// t in the primitives' layout: t itself, or a copy reordered by `in` (NHWC has NCHW's size, so t's shape fits it).
Tensor to_run(const std::optional<dnnl::reorder>& in, const memory::desc& plain, const memory::desc& run,
              const Tensor& t) {
  if (!in) return t;
  Tensor out = empty(t.shape(), t.dtype());
  in->execute(stream(), {{DNNL_ARG_FROM, as_memory(plain, t)}, {DNNL_ARG_TO, as_memory(run, out)}});
  return out;
}

// Where the primitive writes a result meant for `t`: t itself, or scratch that from_run() reorders into t.
Tensor run_target(const std::optional<dnnl::reorder>& out, const Tensor& t) {
  return out ? empty(t.shape(), t.dtype()) : t;
}
void from_run(const std::optional<dnnl::reorder>& out, const memory::desc& run, const Tensor& scratch,
              const memory::desc& plain, const Tensor& t) {
  if (out) out->execute(stream(), {{DNNL_ARG_FROM, as_memory(run, scratch)}, {DNNL_ARG_TO, as_memory(plain, t)}});
}

// nullptr when oneDNN has no pooling for the key's dtype on this CPU.
std::unique_ptr<PoolPrims> build_pool(const PoolKey& k) {
  std::unique_ptr<PoolPrims> p;
  const auto dt = static_cast<memory::data_type>(k.dt);
  const auto alg = static_cast<dnnl::algorithm>(k.alg);
  const auto layout = k.channels_last ? memory::format_tag::nhwc : memory::format_tag::nchw;
  const memory::desc src({k.n, k.c, k.h, k.w}, dt, layout), dst({k.n, k.c, k.oh, k.ow}, dt, layout);
  const memory::dims kernel = {k.kernel[0], k.kernel[1]}, strides = {k.stride[0], k.stride[1]},
                     pad = {k.padding[0], k.padding[1]};
  try {
    p = build(src, dst, alg, kernel, strides, pad);
    if (p->generic && !k.channels_last) {  // where oneDNN lacks an NHWC pair, the throw below leaves p the plain pair
      const memory::desc src_cl({k.n, k.c, k.h, k.w}, dt, memory::format_tag::nhwc);
      const memory::desc dst_cl({k.n, k.c, k.oh, k.ow}, dt, memory::format_tag::nhwc);
      std::unique_ptr<PoolPrims> cl = build(src_cl, dst_cl, alg, kernel, strides, pad);
      if (!cl->generic) {
        cl->src = src, cl->dst = dst;
        cl->src_in = make_reorder(src, src_cl), cl->src_out = make_reorder(src_cl, src);
        cl->dst_in = make_reorder(dst, dst_cl), cl->dst_out = make_reorder(dst_cl, dst);
        p = std::move(cl);
      }
    }
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return p;
}

const PoolPrims* cached(const PoolKey& k) {
  static PrimitiveCache<PoolKey, PoolPrims> cache;
  return cache.get(k, build_pool);
}

PoolKey make_key(DType dt, const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  const dnnl::algorithm alg = p.is_max              ? dnnl::algorithm::pooling_max
                              : p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding;
  PoolKey k{};
  k.dt = static_cast<int64_t>(to_dnnl(dt));
  k.alg = static_cast<int64_t>(alg);
  k.n = src.size(0), k.c = src.size(1), k.h = src.size(2), k.w = src.size(3), k.oh = dst.size(2), k.ow = dst.size(3);
  k.channels_last = channels_last(src);
  for (int i = 0; i < 2; ++i) k.kernel[i] = p.kernel[i], k.stride[i] = p.stride[i], k.padding[i] = p.padding[i];
  return k;
}

// The primitives in the tensors' own dtype, or the float32 ones (then `widened` is set) where oneDNN lacks it.
const PoolPrims& select(DType dt, const Tensor& src, const Tensor& dst, const Pool2dParams& p, bool& widened) {
  const PoolPrims* prims = dt == DType::Float16 ? nullptr : cached(make_key(dt, src, dst, p));
  widened = prims == nullptr;
  if (widened) prims = cached(make_key(DType::Float32, src, dst, p));
  CASTOR_ASSERT(prims, "oneDNN has no float32 pooling");
  return *prims;
}

}  // namespace

Tensor pool2d_forward(const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  if (src.dtype() == DType::Float64) return pool2d_forward_ref(src, dst, p);
  assert_laid_out_like(dst, src);
  CASTOR_ASSERT(!p.relu || (p.is_max && channels_last(src) && max_pool2d_nhwc_fits(p)),
                "max_pool2d: a folded ReLU runs on the fast channels-last kernel only");
  if (p.is_max && channels_last(src))
    return max_pool2d_nhwc_fits(p) ? max_pool2d_nhwc_forward(src, dst, p) : max_pool2d_nhwc_forward_ref(src, dst, p);
  try {
    bool widened = false;
    const PoolPrims& prims = select(src.dtype(), src, dst, p, widened);
    const Tensor s = widened ? widen(src) : src, d = widened ? float_like(dst) : dst;
    const Tensor d_run = run_target(prims.dst_out, d);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, as_memory(prims.src_run, to_run(prims.src_in, prims.src, prims.src_run, s))},
        {DNNL_ARG_DST, as_memory(prims.dst_run, d_run)}};
    Tensor workspace;
    if (p.is_max) {
      workspace = empty({static_cast<int64_t>(prims.workspace.get_size())}, DType::UInt8);
      args[DNNL_ARG_WORKSPACE] = as_memory(prims.workspace, workspace);
    }
    prims.fwd.execute(stream(), args);
    from_run(prims.dst_out, prims.dst_run, d_run, prims.dst, d);
    stream().wait();
    if (widened) copy(d, dst);
    return workspace;
  } catch (const dnnl::error& e) {
    throw Error(
        detail::cat(p.is_max ? "max_pool2d" : "avg_pool2d", ": oneDNN could not run ", src.describe(), ": ", e.what()));
  }
}

void pool2d_backward(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src, const Pool2dParams& p) {
  if (diff_dst.dtype() == DType::Float64) return pool2d_backward_ref(diff_dst, workspace, diff_src, p);
  assert_laid_out_like(diff_dst, diff_src);
  if (p.is_max && channels_last(diff_src))
    return workspace.dtype() == DType::UInt8 ? max_pool2d_nhwc_backward(diff_dst, workspace, diff_src, p)
                                             : max_pool2d_nhwc_backward_ref(diff_dst, workspace, diff_src);
  try {
    bool widened = false;
    const PoolPrims& prims = select(diff_dst.dtype(), diff_src, diff_dst, p, widened);
    const Tensor dy = widened ? widen(diff_dst) : diff_dst;
    const Tensor dx = widened ? float_like(diff_src) : diff_src;
    const Tensor dx_run = run_target(prims.src_out, dx);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_DIFF_DST, as_memory(prims.dst_run, to_run(prims.dst_in, prims.dst, prims.dst_run, dy))},
        {DNNL_ARG_DIFF_SRC, as_memory(prims.src_run, dx_run)}};
    if (p.is_max) args[DNNL_ARG_WORKSPACE] = as_memory(prims.workspace, workspace);
    prims.bwd.execute(stream(), args);
    from_run(prims.src_out, prims.src_run, dx_run, prims.src, dx);
    stream().wait();
    if (widened) copy(dx, diff_src);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat(p.is_max ? "max_pool2d" : "avg_pool2d", " backward: oneDNN could not run ",
                            diff_dst.describe(), ": ", e.what()));
  }
}

}  // namespace castor::kernels
