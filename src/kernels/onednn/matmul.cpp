// Matrix products on oneDNN (float32, bfloat16) with cached primitives; float16 emulated on the float32 kernel.
#include <dnnl.hpp>

#include <mutex>
#include <unordered_map>

#include "kernels/kernels.h"
#include "kernels/onednn/fallback.h"
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

struct MatmulKey {
  int64_t dt;  // a memory::data_type; int64 so that the key has no padding bytes
  int64_t dims[4];        // B, M, N, K
  int64_t a_strides[3], b_strides[3];
  int64_t bias;  // 1: a bias (N) of the dtype, added before the rounding
};

memory::desc bias_desc(const MatmulKey& k) {
  return memory::desc({1, 1, k.dims[2]}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
}

// nullptr when oneDNN has no implementation for this dtype on this CPU (e.g. bf16 without AVX-512).
std::unique_ptr<dnnl::matmul> build(const MatmulKey& k) {
  const int64_t B = k.dims[0], M = k.dims[1], N = k.dims[2], K = k.dims[3];
  memory::desc a({B, M, K}, static_cast<memory::data_type>(k.dt), {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc b({B, K, N}, static_cast<memory::data_type>(k.dt), {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc c({B, M, N}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
  std::unique_ptr<dnnl::matmul> prim;
  try {
    const dnnl::matmul::desc d = k.bias ? dnnl::matmul::desc(a, b, bias_desc(k), c) : dnnl::matmul::desc(a, b, c);
    dnnl::matmul::primitive_desc pd(d, engine());
    prim = std::make_unique<dnnl::matmul>(pd);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return prim;
}

const dnnl::matmul* cached_matmul(const MatmulKey& k) {
  static PrimitiveCache<MatmulKey, dnnl::matmul> cache;
  return cache.get(k, build);
}

// (B, M, K) view metadata of a 2-D or 3-D tensor.
void batch_strides(const Tensor& t, int64_t out[3]) {
  if (t.dim() == 2) {
    out[0] = t.size(0) * t.size(1);
    out[1] = t.stride(0);
    out[2] = t.stride(1);
  } else {
    out[0] = t.stride(0);
    out[1] = t.stride(1);
    out[2] = t.stride(2);
  }
}

bool run_onednn(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  MatmulKey k{};
  k.dt = static_cast<int64_t>(to_dnnl(a.dtype()));
  k.bias = bias.defined();
  const int64_t B = a.dim() == 3 ? a.size(0) : 1;
  k.dims[0] = B;
  k.dims[1] = a.size(-2);
  k.dims[2] = b.size(-1);
  k.dims[3] = a.size(-1);
  batch_strides(a, k.a_strides);
  batch_strides(b, k.b_strides);
  const dnnl::matmul* prim = cached_matmul(k);
  if (!prim) return false;
  memory::desc ad({B, k.dims[1], k.dims[3]}, static_cast<memory::data_type>(k.dt), {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc bd({B, k.dims[3], k.dims[2]}, static_cast<memory::data_type>(k.dt), {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc cd({B, k.dims[1], k.dims[2]}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
  memory am(ad, engine(), a.data_ptr()), bm(bd, engine(), b.data_ptr()), cm(cd, engine(), dst.data_ptr());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (k.bias) args.insert({DNNL_ARG_BIAS, memory(bias_desc(k), engine(), bias.data_ptr())});
  prim->execute(stream(), args);
  stream().wait();
  return true;
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  CASTOR_ASSERT(a.dtype() == b.dtype() && a.dtype() == dst.dtype() && dst.is_contiguous(), "matmul kernel on ",
                a.describe(), ", ", b.describe(), " -> ", dst.describe());
  CASTOR_ASSERT(!bias.defined() || (bias.dtype() == dst.dtype() && bias.is_contiguous() && bias.dim() == 1 &&
                                    bias.size(0) == dst.size(-1)),
                "matmul kernel bias ", bias.describe(), " for ", dst.describe());
  if (dst.numel() == 0) return;
  if (a.size(-1) == 0 || a.dtype() == DType::Float64) return matmul_ref(a, b, dst, bias);
  // oneDNN reads inner-most strides of 1 in one of the last two dims; anything else is copied first.
  auto usable = [](const Tensor& t) { return t.stride(-1) == 1 || t.stride(-2) == 1; };
  const Tensor x = usable(a) ? a : a.contiguous(), y = usable(b) ? b : b.contiguous();
  try {
    if (a.dtype() != DType::Float16 && run_onednn(x, y, dst, bias)) return;
    // Emulation for dtypes without a oneDNN kernel here: exact widening to float32, float32 accumulation,
    // and one rounding of the result (the numerics of 16-bit tensor cores).
    CASTOR_ASSERT(is_16bit_float(a.dtype()), "no matmul kernel for ", dtype_name(a.dtype()));
    // The float32 copies keep the operands' layouts (a linear's transposed weight stays transposed), so widening
    // is a flat conversion rather than a transposing copy.
    const Tensor df = float_like(dst);
    CASTOR_ASSERT(run_onednn(widen(x), widen(y), df, widen(bias)), "oneDNN has no float32 matmul");
    round_into(df, dst);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("matmul: oneDNN could not run ", a.describe(), " x ", b.describe(), ": ", e.what()));
  }
}

}  // namespace castor::kernels
