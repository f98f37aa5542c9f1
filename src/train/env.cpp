// What Castor runs on: the host CPU and its ISA, oneDNN's version and dispatch, threads, MPI (`castor env`, reports).
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "castor/dist.h"
#include "castor/trainer.h"
#include "castor/version.h"

namespace castor::train {

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

const char* git_commit() { return CASTOR_GIT_COMMIT; }

std::string host_cpu() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU") model = line.substr(colon + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + line.substr(colon + 1) + " ";
  }
  std::string isa;
  for (const char* f : {"amx_bf16", "avx512_fp16", "avx512_bf16", "avx512f", "avx2", "f16c"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) isa += std::string(" ") + f;
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap) cap = std::getenv("DNNL_MAX_CPU_ISA");
  return model + "; ISA" + (isa.empty() ? " baseline x86-64" : isa) +
         (cap ? std::string(" (capped at ") + cap + " by ONEDNN_MAX_CPU_ISA)" : "");
}

std::string run_env() {
  const dnnl_version_t* v = dnnl_version();
  std::string out;
  out += std::string("castor   ") + CASTOR_VERSION + " (commit " + git_commit() + ")\n";
  out += "cpu      " + host_cpu() + "\n";
  out += "oneDNN   " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         ", dispatching to " + onednn_isa_name(dnnl_get_effective_cpu_isa()) + "\n";
  const char* omp = std::getenv("OMP_NUM_THREADS");
  out += "threads  " + std::to_string(omp_get_max_threads()) + " OpenMP threads (" +
         std::to_string(std::thread::hardware_concurrency()) + " cores online" +
         (omp ? std::string(", OMP_NUM_THREADS=") + omp : std::string()) + ")\n";
  out += "mpi      " + dist::mpi_library_version() + "\n";
  return out;
}

}  // namespace castor::train
