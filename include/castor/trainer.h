// The `castor` command's jobs: train (with checkpoints and exact resume), eval, and info.
#pragma once
#include <string>
#include <vector>

#include "castor/json.h"
#include "castor/train_config.h"

namespace castor::train {

// Runs a training job; prints progress and per-epoch lines, writes config.json, metrics.jsonl, checkpoints
// and report.html under cfg.out, and returns the summary (also printed as the last stdout line). Holds an
// exclusive lock on cfg.out throughout. After an interrupt (see below) it checkpoints the finished step and
// returns early with "interrupted_by_signal" in the summary; a resumed run that is already complete returns
// {"already_complete": true, ...} and changes nothing.
Json run_train(TrainConfig cfg);

// How the idle OpenMP threads of a castor process wait: the environment variable libgomp reads as it loads (so the
// castor command sets it and runs itself again before any OpenMP code), its value, and why it was chosen.
struct OpenMpWait {
  const char* variable;  // "GOMP_SPINCOUNT" or "OMP_WAIT_POLICY"
  const char* value;     // "3000" (a bounded spin) or "passive" (threads sleep at once)
  std::string reason;
  std::string text() const;  // "OMP_WAIT_POLICY=passive (a large model: ...)"
};
// The wait of a `castor train` job on a machine of `cpus` cores whose other processes keep `busy_cores` of them
// running (busy_cores, measured before the job starts): passive where this job's threads would share cores with
// other work, or where its model is large (GPT-2 124M: a step's GEMMs dwarf the waits, and a spinning thread steals
// the issue slots of its SMT sibling), else a bounded spin (small models: a thread asleep wakes too late).
OpenMpWait choose_openmp_wait(const TrainConfig& c, int cpus, double busy_cores);
// The job whose wait `castor train` chooses: `c`, or for --resume the run's recorded settings (its model's sizes).
TrainConfig openmp_wait_job(const TrainConfig& c);
// The wait of the commands other than train: the bounded spin.
OpenMpWait default_openmp_wait();
// The wait variables set in this process ("OMP_WAIT_POLICY=passive", or "the runtime's default"), and with why: what
// the castor command chose ($CASTOR_OPENMP_WAIT), else those variables with "(given)" (config.json's "openmp_wait").
std::string openmp_wait_variables();
std::string openmp_wait_in_effect();
// This machine's cores online, and how many of them other processes keep busy over `window_ms` (/proc/stat; 0 when
// unreadable). Processes at a positive nice do not count: they yield their cores to a job at nice 0 or below, whose
// threads may spin beside them (beside builds at nice 19, llama-15m's step ran 1.3x faster spinning than asleep).
int online_cpus();
double busy_cores(int window_ms = 100);
// castor train --dry-run: prints each rank's memory plan for cfg.nproc ranks at ZeRO stages 0-3 (weights in the run's
// dtypes, O1's 16-bit copies, O2's float32 masters, the optimizer's state incl. AdamW8bit's codes and absmax, the
// gradients with DDP's float32 buckets or stage 2's float32 slices, stage 3's largest gathered block), bytes held
// between steps by rank 0 (the largest slice of dist::shard_of), activations left out: a lower bound of the peak. A
// language model only, built from the size flags (or --init's, or the --data-dir tokenizer's vocabulary) without
// drawing or touching its weights. Returns the plan (also printed as the last stdout line by `castor train`).
Json run_dry_run(TrainConfig cfg);

// Makes the first SIGINT/SIGTERM/SIGHUP ask a running run_train to stop after its step (with a checkpoint);
// a second one exits at once with status 128 + signal.
void install_interrupt_handlers();

// `castor eval`: test-set accuracy and loss of a castor checkpoint, or of weights without castor metadata
// (e.g. written by PyTorch) given their model and dataset.
Json run_eval(const EvalConfig& cfg);

// `castor info [--tensors] FILE|DIR`: a short summary of a checkpoint (model, step, precision, parameters, the run's
// last metrics, the checkpoints beside it); with --tensors every tensor's dtype and shape, and the metadata.
std::string run_info(const std::vector<std::string>& args);

// `castor env`: Castor's version and commit, the host CPU and ISA, oneDNN's version and the ISA it dispatches to,
// threads, and the MPI library.
std::string run_env();
// "AMD EPYC 9R14; ISA avx512_bf16 avx512f avx2 f16c" (from /proc/cpuinfo, with an ONEDNN_MAX_CPU_ISA cap noted).
std::string host_cpu();
// This CPU's GEMM ceiling in FLOP/s for `dtype` (float16 runs on float32 GEMMs, as Castor emulates it): the best of
// `reps` n^3 oneDNN matmuls after a warm-up one; MFU figures (castor train, the benchmarks) are taken against it.
double gemm_peak(DType dtype, int64_t n = 1024, int reps = 20);
// gemm_peak(dtype) of this machine (host CPU and ISA) at this process's thread count, measured once and cached in
// $XDG_CACHE_HOME/castor/gemm_peak.json (~/.cache/castor without it): the cached figure, or 0 when there is none yet.
double cached_gemm_peak(DType dtype);
// Measures gemm_peak(dtype) and caches the best figure seen so far (one measured while other processes held the
// cores understates the peak; a cache that cannot be written is left alone); returns that best figure.
double measure_gemm_peak(DType dtype);
// The git commit this build was configured from ("unknown" outside git).
const char* git_commit();

}  // namespace castor::train
