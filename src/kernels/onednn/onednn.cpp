// The process-wide oneDNN CPU engine and stream, and the dtype mapping.
#include "kernels/onednn/onednn.h"

#include <string>

#include "castor/backends.h"
#include "kernels/kernels.h"

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

bool native_products(DType dt) {
  static const bool bf16 = backends::bf16_dot_units() != nullptr;
  return dt == DType::Float32 || (dt == DType::BFloat16 && bf16);
}

namespace {

std::string onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2_VNNI";
    case dnnl_cpu_isa_avx512_mic: return "AVX512_MIC";
    case dnnl_cpu_isa_avx512_mic_4ops: return "AVX512_MIC_4OPS";
    case dnnl_cpu_isa_avx512_core: return "AVX512_CORE";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX512_CORE_VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX512_CORE_BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX512_CORE_AMX";
    default: return "ISA " + std::to_string(static_cast<int>(isa));
  }
}

}  // namespace

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         ", dispatching to " + onednn_isa_name(dnnl_get_effective_cpu_isa());
}

}  // namespace castor::kernels

namespace castor::backends {

const char* bf16_dot_units() {
  // oneDNN's effective ISA is the CPU's, lowered by ONEDNN_MAX_CPU_ISA; its AMX level includes AMX-BF16 and its
  // AVX512_CORE_BF16 level the AVX512_BF16 dot products (vdpbf16ps).
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if (isa == dnnl_cpu_isa_avx512_core_amx) return "amx_bf16";
  if (isa == dnnl_cpu_isa_avx512_core_bf16) return "avx512_bf16";
  return nullptr;
}

}  // namespace castor::backends
