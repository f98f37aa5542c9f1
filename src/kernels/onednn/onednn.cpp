// The process-wide oneDNN CPU engine and stream, and the dtype mapping.
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static thread_local dnnl::stream s(engine());
  return s;
}

dnnl::memory::data_type to_dnnl(DType d) {
  switch (d) {
    case DType::Float32: return dnnl::memory::data_type::f32;
    case DType::BFloat16: return dnnl::memory::data_type::bf16;
    case DType::Float16: return dnnl::memory::data_type::f16;
    case DType::Int32: return dnnl::memory::data_type::s32;
    case DType::UInt8: return dnnl::memory::data_type::u8;
    default: break;
  }
  throw Error(detail::cat("oneDNN has no ", dtype_name(d), " data type"));
}

}  // namespace castor::kernels
