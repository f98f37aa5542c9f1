// What Castor runs on: the host CPU and its ISA, oneDNN's version and dispatch, threads, MPI (`castor env`, reports).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "castor/autograd.h"
#include "castor/dist.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/opt_level.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/trainer.h"
#include "castor/version.h"
#include "kernels/kernels.h"

namespace castor::train {

const char* git_commit() { return CASTOR_GIT_COMMIT; }

double gemm_peak(DType dtype, int64_t n, int reps) {
  NoGradGuard no_grad;
  if (dtype == DType::Float16) dtype = DType::Float32;
  Generator gen(1);  // its own: a run's generator state is part of its checkpoints
  const Tensor a = randn({n, n}, DType::Float32, &gen).to(dtype), b = randn({n, n}, DType::Float32, &gen).to(dtype);
  mm(a, b);
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / best;
}

namespace {

// The cache file and this machine's key in it.
std::string peak_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return std::string(xdg) + "/castor/gemm_peak.json";
  return home && *home ? std::string(home) + "/.cache/castor/gemm_peak.json" : std::string();
}
std::string peak_key(DType dtype) {
  return detail::cat(host_cpu(), " | ", dtype_name(dtype == DType::Float16 ? DType::Float32 : dtype), " | ",
                     omp_get_max_threads(), " threads");
}
Json read_peak_cache(const std::string& path) {
  try {
    const std::vector<uint8_t> bytes = read_file(path, 1 << 20);
    Json j = Json::parse(std::string(bytes.begin(), bytes.end()));
    return j.is_object() ? j : Json(Json::Object{});
  } catch (const Error&) {
    return Json::Object{};  // none yet, or unreadable: measured again
  }
}

}  // namespace

double cached_gemm_peak(DType dtype) {
  const std::string path = peak_cache_path();
  if (path.empty() || !file_exists(path)) return 0;
  const Json cache = read_peak_cache(path);
  const Json* v = cache.find(peak_key(dtype));
  return v && v->is_number() && v->as_double() > 0 ? v->as_double() : 0;
}

double measure_gemm_peak(DType dtype) {
  double peak = gemm_peak(dtype);
  const std::string path = peak_cache_path();
  if (path.empty()) return peak;
  Json cache = read_peak_cache(path);
  if (const Json* v = cache.find(peak_key(dtype)); v && v->is_number()) peak = std::max(peak, v->as_double());
  cache[peak_key(dtype)] = peak;
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    atomic_write_file(path, cache.dump(2) + "\n");
  } catch (const Error&) {
    // (a read-only home: the next run measures again)
  }
  return peak;
}

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

std::string openmp_wait_variables() {
  std::string wait;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* v = std::getenv(name)) wait += std::string(wait.empty() ? "" : ", ") + name + "=" + v;
  return wait.empty() ? std::string("the runtime's default") : wait;
}

std::string openmp_wait_in_effect() {
  if (const char* chosen = std::getenv("CASTOR_OPENMP_WAIT")) return chosen;
  const std::string wait = openmp_wait_variables();
  return std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") ? wait + " (given)" : wait;
}

std::string run_env() {
  std::string out;
  out += std::string("castor   ") + CASTOR_VERSION + " (commit " + git_commit() + ")\n";
  out += "cpu      " + host_cpu() + "\n";
  out += "oneDNN   " + kernels::onednn_description() + "\n";
  const char* omp = std::getenv("OMP_NUM_THREADS");
  out += "threads  " + std::to_string(omp_get_max_threads()) + " OpenMP threads (" +
         std::to_string(std::thread::hardware_concurrency()) + " cores online" +
         (omp ? std::string(", OMP_NUM_THREADS=") + omp : std::string()) + ")\n";
  // How idle OpenMP threads wait (the castor command chooses when neither is given: tools/castor.cpp).
  out += "openmp   idle threads: " + openmp_wait_variables() + "\n";
  out += "mpi      " + dist::mpi_library_version() + "\n";
  // What `castor train --precision auto` would train in here.
  const amp::AutoPrecision a = amp::auto_precision();
  TrainConfig c;
  c.amp = a.level;
  c.dtype = a.dtype;
  out += "precision " + precision_name(c) + " (" + a.reason + ")\n";
  return out;
}

}  // namespace castor::train
