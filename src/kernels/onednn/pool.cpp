// Max and average pooling forward and backward on oneDNN in the plain NCHW layout (max keeps oneDNN's workspace for
// its backward); float16 (and bfloat16 where oneDNN lacks it) runs on exact float32 copies with one rounding.
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/layers.h"
#include "kernels/onednn/fallback.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

// Everything that picks a pooling primitive pair; all int64 so that memcmp sees no padding bytes.
struct PoolKey {
  int64_t dt, alg, n, c, h, w, oh, ow, kernel[2], stride[2], padding[2];
  bool operator==(const PoolKey& k) const { return std::memcmp(this, &k, sizeof(k)) == 0; }
};
struct PoolKeyHash {
  size_t operator()(const PoolKey& k) const { return hash_bytes(&k, sizeof(k)); }
};

struct PoolPrims {
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  memory::desc src, dst, workspace;  // workspace is empty for average pooling
};

// nullptr when oneDNN has no pooling for the key's dtype on this CPU.
const PoolPrims* cached(const PoolKey& k) {
  static std::mutex mu;
  static std::unordered_map<PoolKey, std::unique_ptr<PoolPrims>, PoolKeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<PoolPrims> p;
  const auto dt = static_cast<memory::data_type>(k.dt);
  const auto alg = static_cast<dnnl::algorithm>(k.alg);
  const memory::desc src({k.n, k.c, k.h, k.w}, dt, memory::format_tag::nchw);
  const memory::desc dst({k.n, k.c, k.oh, k.ow}, dt, memory::format_tag::nchw);
  const memory::dims kernel = {k.kernel[0], k.kernel[1]}, strides = {k.stride[0], k.stride[1]},
                     pad = {k.padding[0], k.padding[1]};
  try {
    const dnnl::pooling_forward::primitive_desc fwd(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, pad, pad),
        engine());
    const dnnl::pooling_backward::primitive_desc bwd(
        dnnl::pooling_backward::desc(alg, src, dst, strides, kernel, pad, pad), engine(), fwd);
    p = std::make_unique<PoolPrims>(
        PoolPrims{dnnl::pooling_forward(fwd), dnnl::pooling_backward(bwd), src, dst, fwd.workspace_desc()});
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return cache.emplace(k, std::move(p)).first->second.get();
}

PoolKey make_key(DType dt, const Shape& src, const Shape& dst, const Pool2dParams& p) {
  const dnnl::algorithm alg = p.is_max              ? dnnl::algorithm::pooling_max
                              : p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding;
  PoolKey k{};
  k.dt = static_cast<int64_t>(to_dnnl(dt));
  k.alg = static_cast<int64_t>(alg);
  k.n = src[0], k.c = src[1], k.h = src[2], k.w = src[3], k.oh = dst[2], k.ow = dst[3];
  for (int i = 0; i < 2; ++i) k.kernel[i] = p.kernel[i], k.stride[i] = p.stride[i], k.padding[i] = p.padding[i];
  return k;
}

// The primitives in the tensors' own dtype, or the float32 ones (then `widened` is set) where oneDNN lacks it.
const PoolPrims& select(DType dt, const Shape& src, const Shape& dst, const Pool2dParams& p, bool& widened) {
  const PoolPrims* prims = dt == DType::Float16 ? nullptr : cached(make_key(dt, src, dst, p));
  widened = prims == nullptr;
  if (widened) prims = cached(make_key(DType::Float32, src, dst, p));
  CASTOR_ASSERT(prims, "oneDNN has no float32 pooling");
  return *prims;
}

}  // namespace

Tensor pool2d_forward(const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  if (src.dtype() == DType::Float64) return pool2d_forward_ref(src, dst, p);
  try {
    bool widened = false;
    const PoolPrims& prims = select(src.dtype(), src.shape(), dst.shape(), p, widened);
    const Tensor s = widened ? widen(src) : src, d = widened ? empty(dst.shape(), DType::Float32) : dst;
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, as_memory(prims.src, s)}, {DNNL_ARG_DST, as_memory(prims.dst, d)}};
    Tensor workspace;
    if (p.is_max) {
      workspace = empty({static_cast<int64_t>(prims.workspace.get_size())}, DType::UInt8);
      args[DNNL_ARG_WORKSPACE] = as_memory(prims.workspace, workspace);
    }
    prims.fwd.execute(stream(), args);
    stream().wait();
    if (widened) copy(d, dst);
    return workspace;
  } catch (const dnnl::error& e) {
    throw Error(detail::cat(p.is_max ? "max_pool2d" : "avg_pool2d", ": oneDNN could not run ", src.describe(), ": ",
                            e.what()));
  }
}

void pool2d_backward(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src, const Pool2dParams& p) {
  if (diff_dst.dtype() == DType::Float64) return pool2d_backward_ref(diff_dst, workspace, diff_src, p);
  try {
    bool widened = false;
    const PoolPrims& prims = select(diff_dst.dtype(), diff_src.shape(), diff_dst.shape(), p, widened);
    const Tensor dy = widened ? widen(diff_dst) : diff_dst;
    const Tensor dx = widened ? empty(diff_src.shape(), DType::Float32) : diff_src;
    std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, as_memory(prims.dst, dy)},
                                            {DNNL_ARG_DIFF_SRC, as_memory(prims.src, dx)}};
    if (p.is_max) args[DNNL_ARG_WORKSPACE] = as_memory(prims.workspace, workspace);
    prims.bwd.execute(stream(), args);
    stream().wait();
    if (widened) copy(dx, diff_src);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat(p.is_max ? "max_pool2d" : "avg_pool2d", " backward: oneDNN could not run ",
                            diff_dst.describe(), ": ", e.what()));
  }
}

}  // namespace castor::kernels
