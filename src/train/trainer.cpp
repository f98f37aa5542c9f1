// `castor train`: opens the run directory (new, or resumed from its recording and checkpoint), builds the task and
// the run from the config, records config.json and hands over to the training loop (src/train/loop.cpp).
#include "castor/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <tuple>

#include "castor/allocator.h"
#include "castor/checkpoint.h"
#include "castor/dist.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/model_source.h"
#include "castor/optim.h"
#include "castor/tokenizer.h"
#include "train/loop.h"
#include "train/lora_run.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// A run's directory taken, and for a resumed run the checkpoint it continues from and the settings it recorded.
struct OpenRun {
  std::unique_ptr<FileLock> lock;  // rank 0's, for the run's lifetime
  std::optional<Checkpoint> ck;    // a resumed run's
  std::string resume_from;         // the checkpoint's folder
  Json recorded;
  bool created = false;      // rank 0 made the run directory (a new run's, not there before)
  bool default_out = false;  // --out was not given: the run directory is announced with the settings
};

// Resolves --resume and --out, takes the run directory (rank 0; the other ranks wait until it is set up), and for a
// resumed run reads the checkpoint and turns `c` into the recorded config with the flags a resume may change.
// A run resumed under the other of adamw and adamw8bit (--convert-optimizer-state, which resume_config requires):
// the checkpoint's optimizer state quantised to 8 bits, or back to float32.
void convert_optimizer_state(Checkpoint& ck, OptimizerKind to, const std::string& what) {
  const std::string prefix = "amp.optimizer.0.";
  StateDict sd;
  for (auto it = ck.state.begin(); it != ck.state.end();)
    if (it->first.rfind(prefix, 0) == 0) {
      sd[it->first.substr(prefix.size())] = it->second;
      it = ck.state.erase(it);
    } else {
      ++it;
    }
  try {
    sd = to == OptimizerKind::AdamW8bit ? optim::adamw_state_to_8bit(sd, {}) : optim::adamw8bit_state_to_32bit(sd);
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": --convert-optimizer-state: ", e.what()));
  }
  for (auto& [k, t] : sd) ck.state[prefix + k] = std::move(t);
}

OpenRun open_run(TrainConfig& c, int rank, int world) {
  CASTOR_CHECK(!c.given("--out") || !c.out.empty(),
               "--out: empty (the run directory; leave the flag out for runs/DATE-...)");
  CASTOR_CHECK(c.lora_base.empty() || !c.resume.empty(),
               "--lora-base: re-points a resumed LoRA run's base (with --resume); a new run's base is --init");
  OpenRun r;
  std::string run_dir;
  if (!c.resume.empty()) {
    std::tie(run_dir, r.resume_from) = resolve_resume(c.resume);
    if (!c.given("--out")) c.out = run_dir;
  }
  if (c.out.empty()) {
    c.out = default_out(c);
    r.default_out = true;
  }
  // config.json, metrics and checkpoints record these paths in JSON, which holds only UTF-8 text.
  for (const auto& [flag, value] : {std::pair{"--out", c.out}, std::pair{"--data-dir", c.data_dir},
                                    std::pair{"--init", c.init}, std::pair{"--resume", c.resume}})
    CASTOR_CHECK(is_valid_utf8(value), flag, " ", printable(value),
                 ": not valid UTF-8; a run records its paths in "
                 "JSON, which holds only UTF-8 text: rename it");
  std::error_code ec;
  const bool continuing = !c.resume.empty() && fs::equivalent(run_dir, c.out, ec);
  r.created = rank == 0 && !continuing && !fs::exists(c.out, ec);
  if (rank == 0) r.lock = own_run_dir(c, continuing);
  if (world > 1) dist::barrier();
  if (!c.resume.empty()) {
    r.ck = read_checkpoint(r.resume_from, &r.resume_from);
    r.recorded = recorded_config(*r.ck, r.resume_from);
    c = resume_config(c, r.recorded, r.resume_from);
    resume_batch_size(c, r.recorded, world);
    if (!c.lora_base.empty()) {
      CASTOR_CHECK(c.lora_rank > 0, "--lora-base: ", r.resume_from, " is not a LoRA run's (castor train --lora-rank)");
      c.init = c.lora_base;  // (checked against the recorded checksum as it loads)
    }
    if (const Json* was = r.recorded.find("optimizer");
        was && was->is_string() && was->as_string() != name(c.optimizer))
      convert_optimizer_state(*r.ck, c.optimizer, r.resume_from);
  }

  return r;
}

// This process's OpenMP threads and float32 convolution algorithm.
void set_threads(const TrainConfig& c) {
  if (c.threads > 0)
    omp_set_num_threads(c.threads);
  else if (dist::local_size() > 1)  // the machine's cores shared among its ranks
    omp_set_num_threads(std::max(1, omp_get_num_procs() / dist::local_size()));
  if (c.deterministic) omp_set_dynamic(0);
  backends::set_conv_algorithm(c.conv_algorithm);
}

// Whether a resumed run wrote its report after the checkpoint it resumes from. A run stopped after its last step but
// before its epoch end or report (killed during the final evaluation) finishes them; a summary older than the
// checkpoint is an earlier run's (one resumed from an older checkpoint).
bool reported(const TrainConfig& c, const OpenRun& r) {
  const auto written = [&](const std::string& f) {
    std::error_code ec;
    const auto t = fs::last_write_time(f, ec);
    return ec ? fs::file_time_type::min() : t;
  };
  return r.ck && fs::exists(c.out + "/report.html") &&
         written(c.out + "/summary.json") >= written(r.resume_from + "/COMMIT");
}

// config.json: the recording, with provenance only: what --init and --data-dir were (absolute, so the run resumes
// from any directory) and the init file's checksum; once the first checkpoint exists, the run needs nothing outside
// its directory but the data.
Json run_config(const TrainConfig& c, const Task& task, int64_t schedule_steps, const OpenRun& r,
                const nn::Module& model) {
  Json config = config_json(c, task, schedule_steps);
  const auto [trainable, all] = parameter_counts(model);
  config["trainable_params"] = trainable, config["all_params"] = all;
  if (!c.data_dir.empty()) config["data_dir"] = absolute_path(c.data_dir);
  if (!c.init.empty()) {
    config["init"] = absolute_path(c.init);
    if (!r.ck)
      config["init_checksum"] = weights_checksum(c.init);
    else if (const Json* sum = r.recorded.find("init_checksum"))
      config["init_checksum"] = *sum;
  }
  if (const Json* why = r.ck ? r.recorded.find("precision_auto") : nullptr) config["precision_auto"] = *why;
  return config;
}

// As many of the settings as fit a terminal's width (all of them in a log).
void print_settings(const TrainConfig& c, int64_t total_steps, int world) {
  const std::vector<std::string> fields = {
      detail::cat("castor train: ", name(c.model), " on ", name(c.data)),
      detail::cat(precision_name(c), " (", amp::opt_level_name(c.amp), ")"),
      detail::cat(name(c.optimizer), " lr ", c.lr),
      detail::cat("batch ", c.batch_size * c.grad_accum * world),
      detail::cat(total_steps, " steps"),
      detail::cat(omp_get_max_threads(), " threads", world > 1 ? detail::cat(" per rank, ", world, " ranks") : "")};
  std::fprintf(stderr, "%s\n",
               fit_fields(fields, isatty(STDERR_FILENO) ? terminal_width(STDERR_FILENO) - 1 : INT32_MAX).c_str());
}

// A new full fine-tuning run from a GGUF file of quantized matrices: says that its blocks become float32 trainable
// weights (formats::gguf_quantized_note).
void note_dequantized_init(const TrainConfig& c) {
  if (c.lora_rank > 0 || c.init.empty() || !formats::is_source(c.init, formats::SourceFormat::Gguf)) return;
  const Metadata meta = formats::read_weights_header(c.init).metadata;
  if (const auto it = meta.find("gguf.quantized"); it != meta.end())
    std::fprintf(stderr, "castor train: --init %s holds %s (this run: dequantized)\n", c.init.c_str(),
                 it->second.c_str());
}

// The rest of castor train once the run directory is open: the task, the run, config.json and the loop.
Json train_opened(TrainConfig& c, OpenRun& r, int rank, int world) {
  c.nproc = world;
  set_threads(c);
  const std::unique_ptr<Task> task = make_task(c, rank, world, /*new_run=*/!r.ck);
  const int64_t per_epoch = task->batches_per_epoch();
  const int64_t steps_per_epoch = (per_epoch + c.grad_accum - 1) / c.grad_accum;
  CASTOR_CHECK(c.steps > 0 || c.epochs <= INT64_MAX / steps_per_epoch, "--epochs ", c.epochs, ": too many steps");
  const int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * steps_per_epoch;
  const int64_t schedule_steps = r.ck ? recorded_schedule_steps(r.recorded, steps_per_epoch) : total_steps;
  CASTOR_CHECK(schedule_steps > 0, r.resume_from, ": the recorded schedule length ", schedule_steps,
               " is not positive");
  Run run = build_run(c, *task, schedule_steps, /*load_init=*/!r.ck);
  const std::string recompute = apply_recompute(c, *task, run);
  if (rank == 0 && c.recompute == Recompute::Auto) std::fprintf(stderr, "recompute %s\n", recompute.c_str());
  TrainState state;
  if (r.ck) {
    state = TrainState::load(*r.ck, run, per_epoch, c.grad_accum, r.resume_from);
    if (rank == 0)
      std::fprintf(stderr, "castor train: resuming from step %lld (checkpoint %s)\n",
                   static_cast<long long>(state.step), r.resume_from.c_str());
    // (its tensors are in the run now: not held beside it while it trains)
    r.ck->model.clear();
    r.ck->state.clear();
  }
  apply_zero3(c, run);
  // What the set-up freed (the float32 weights an O2 cast or a ZeRO-3 release dropped, a checkpoint's copies) goes
  // back to the system, not into the allocator's cache for the whole run.
  empty_cache();
  if (state.step >= total_steps && reported(c, r) && state.batch < per_epoch) {
    if (rank == 0)
      std::fprintf(stderr, "castor train: %s is already complete at step %lld (extend it with --steps or --epochs)\n",
                   c.out.c_str(), static_cast<long long>(state.step));
    return Json::Object{{"already_complete", true}, {"steps", state.step}, {"out", c.out}};
  }
  if (rank == 0) check_extension(c, schedule_steps, total_steps);
  const Json config = run_config(c, *task, schedule_steps, r, *run.model);
  if (rank == 0) {
    atomic_write_file(c.out + "/config.json", config.dump(2) + "\n");
    // The run's first line: what --precision auto (the default) chose here, and why (a resumed run keeps its
    // recorded precision, whatever this CPU has).
    if (!c.precision_reason.empty() && !r.ck)
      std::fprintf(stderr, "precision %s (%s)\n", precision_name(c).c_str(), c.precision_reason.c_str());
    if (r.default_out) std::fprintf(stderr, "castor train: run directory %s\n", c.out.c_str());
    print_settings(c, total_steps, world);
    if (!r.ck) note_dequantized_init(c);
    if (c.lora_rank > 0) std::fprintf(stderr, "%s\n", trainable_parameters_text(*run.model).c_str());
    if (c.lora_rank > 0) pin_lora_base(c);
  }
  const int64_t epochs = c.steps > 0 ? (total_steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs;
  return train_loop(c, *task, run, config, state, total_steps, epochs, task->flop_rate(c, *run.model));
}

}  // namespace

Json run_train(TrainConfig c) {
  dist::init();
  const int world = dist::world_size(), rank = dist::rank();
  announce_interrupts(rank == 0);
  CASTOR_CHECK(c.nproc == 0 || c.nproc == world, "--nproc ", c.nproc, ": this process is one of ", world,
               " ranks (run `castor train --nproc N` from a shell, or `mpirun -np N castor train`)");
  OpenRun r = open_run(c, rank, world);
  try {
    return train_opened(c, r, rank, world);
  } catch (...) {
    // A new run that fails before its first metrics line or checkpoint (missing data, a bad --init, ...) leaves no
    // run directory behind: it made one, and nothing in it is worth keeping.
    std::error_code ec;
    const auto metrics = fs::file_size(c.out + "/metrics.jsonl", ec);
    const bool logged = !ec && metrics > 0;
    if (r.created && !logged && !latest_checkpoint(c.out)) fs::remove_all(c.out, ec);
    throw;
  }
}

}  // namespace castor::train
