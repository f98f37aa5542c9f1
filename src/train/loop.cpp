// The training loop: micro-batches and optimizer steps, metrics, evaluations, checkpoints, divergence and interrupts.
#include "train/loop.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "castor/allocator.h"
#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/dist.h"
#include "castor/explain.h"
#include "castor/fs.h"
#include "castor/functional.h"
#include "castor/lm_batch.h"
#include "castor/ops.h"
#include "castor/report.h"
#include "castor/trainer.h"
#include "train/divergence.h"
#include "train/keep_best.h"
#include "castor/checkpoint.h"
#include "train/lm_scoring.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/run_log.h"
#include "train/step_batches.h"
#include "train/throughput.h"

namespace castor::train {

using Clock = std::chrono::steady_clock;

namespace {

// The explain rows with the module each op belongs to: the module whose parameters it used (conv1 for conv1.weight),
// for an op without parameters (relu, pooling) the module of the op before it ("(input)" before the first), and for
// an op run inside another (listed before it) the module of that op.
std::vector<amp::ExplainRow> with_modules(std::vector<amp::ExplainRow> rows, const nn::Module& model) {
  std::map<const TensorImpl*, std::string> owner;
  for (const auto& [name, t] : model.named_parameters()) {
    const size_t dot = name.rfind('.');
    owner[t.impl()] = dot == std::string::npos ? std::string("(model)") : name.substr(0, dot);
  }
  std::string current = "(input)";
  for (amp::ExplainRow& r : rows) {
    if (r.depth > 0) continue;
    for (const TensorImpl* in : r.inputs)
      if (auto it = owner.find(in); it != owner.end()) current = it->second;
    r.module = current;
  }
  std::string enclosing = current;
  for (size_t i = rows.size(); i-- > 0;) {
    if (rows[i].depth == 0)
      enclosing = rows[i].module;
    else
      rows[i].module = enclosing;
  }
  return rows;
}

// The first interrupting signal (0: none yet); set by the signal thread install_interrupt_handlers() starts.
std::atomic<int> g_interrupt{0};
// Whether the handler says what it does (rank 0 only: every rank of a job gets the signal).
std::atomic<bool> g_say_interrupt{true};

void on_interrupt(int sig) {
  int none = 0;
  if (!g_interrupt.compare_exchange_strong(none, sig)) _exit(128 + sig);  // the second one: stop at once
  static const char msg[] = "\ncastor: finishing this step to write a checkpoint (interrupt again to stop at once)\n";
  if (!g_say_interrupt.load()) return;
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

// ZeRO-3: the blocks' weights whole while it lives, for what runs on some ranks only (--eval-task's scoring, whose
// ranks score different numbers of items).
class WholeWeights {
 public:
  explicit WholeWeights(nn::ShardedBlocks* z) : z_(z) {
    if (z_) z_->gather_all();
  }
  ~WholeWeights() {
    if (z_) z_->release_all();
  }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  nn::ShardedBlocks* z_;
};

// The training loop with its logging, checkpoints, divergence and interrupt checks.
// The metrics a run's evaluations log: the task's, and --eval-task's scores.
std::vector<std::string> metric_keys(const Task& task, const TrainConfig& c) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : task.evaluation_keys(Evaluation{})) keys.push_back(key);
  if (!c.eval_task.empty())
    for (const std::string& k : task_score_keys(c)) keys.push_back(k);
  return keys;
}

class Trainer {
 public:
  Trainer(const TrainConfig& c, Task& task, Run& run, Json config, TrainState state, int64_t total_steps,
          int64_t epochs, FlopRate flops)
      : c_(c),
        task_(task),
        run_(run),
        config_(std::move(config)),
        state_(state),
        total_(total_steps),
        rank0_(dist::rank() == 0),
        world_(dist::world_size()),
        batches_(task, c.grad_accum, world_),
        divergence_(run.amp->scaler().is_enabled() && run.amp->properties().loss_scale.is_dynamic()),
        task_scorer_(c.eval_task.empty() ? nullptr : std::make_unique<TrainTaskScorer>(c)),
        keep_best_(c.out, c.keep_best, c.early_stop, metric_keys(task, c)),
        epochs_(epochs) {
    if (rank0_) log_.emplace(c, task, total_steps, epochs, /*append=*/!c.resume.empty(), flops, state.step);
    CASTOR_CHECK(c.task_format.empty() || !c.eval_task.empty(), "--task-format: applies to --eval-task");
  }

  // Runs to the end (or an interrupt); returns the summary line, also written to summary.json.
  Json run() {
    const auto wall_start = Clock::now();
    setup_peak_ = memory_stats().peak_bytes;  // (the model built, a checkpoint read: before the first step)
    reset_peak_memory_stats();
    std::unique_ptr<Profiler> profiler = c_.profile ? std::make_unique<Profiler>() : nullptr;
    last_save_ = Clock::now();
    const bool was_done = state_.step >= total_;
    while (state_.step < total_ && !interrupted()) {
      task_.start_epoch(state_.epoch, state_.batch);
      EpochTotals e;
      const auto epoch_start = Clock::now();
      while (state_.step < total_ && !interrupted()) {
        auto batch = batches_.next(/*first=*/micro_ == 0);
        if (!batch) break;
        if (!micro_batch(*batch, e)) continue;  // the step needs more micro-batches
        if (due_for_checkpoint()) checkpoint();
      }
      if (interrupted()) break;
      end_epoch(e, std::chrono::duration<double>(Clock::now() - epoch_start).count());
    }
    // A signal during the final evaluation comes after the last step: the report below finishes the run.
    if (interrupted() && state_.step < total_) return stop_interrupted();
    if (was_done) {  // resumed after its last step without its report (or its epoch end): evaluate again for it
      if (rank0_)
        std::fprintf(stderr, "castor train: %s finished at step %lld without its report; writing it\n", c_.out.c_str(),
                     static_cast<long long>(state_.step));
      if (state_.batch >= task_.batches_per_epoch())
        end_epoch(EpochTotals{}, 0);  // as a resume mid-run does at an epoch end cut off by a kill
      else
        last_eval_ = evaluate_now();
    }
    if (log_) log_->measure_peak_if_unknown(throughput_.steady_rate());
    Json summary = summary_json();
    summary["wall_seconds"] = std::chrono::duration<double>(Clock::now() - wall_start).count();
    const Json build = build_json();
    for (const auto& [k, v] : build.as_object()) summary[k] = v;
    summary["finished"] = utc_now();
    if (stopped_early_) summary["stopped_early"] = true;
    if (!c_.keep_best.empty()) summary["best"] = read_best(c_.out);
    if (!rank0_) return summary;
    // The report covers the whole run, resumed parts included, from metrics.jsonl.
    const std::string title = detail::cat("castor: ", name(c_.model), " on ", name(c_.data), ", ",
                                          amp::opt_level_name(c_.amp));
    const Json classes = last_eval_ ? task_.by_class(*last_eval_) : Json();
    atomic_write_file(c_.out + "/report.html",
                      render_report(title, config_, read_metrics(c_.out), op_dtypes_, classes));
    if (profiler) std::fprintf(stderr, "%s", profiler->table(15).c_str());
    atomic_write_file(c_.out + "/summary.json", summary.dump(2) + "\n");
    return summary;
  }

 private:
  struct EpochTotals {
    double loss = 0, examples = 0;
    int64_t batches = 0;
  };

  // A signal asked to stop: this process's flag, or with several ranks the flag of any rank as of the last step
  // (all-reduced with the loss, so every rank stops after the same step).
  bool interrupted() const { return world_ == 1 ? g_interrupt.load() != 0 : stop_all_; }

  // The micro-batch's loss to backpropagate, and its part of the step's loss: the batch mean over --grad-accum;
  // a masked task's batch sum over the step's targets (times the ranks, whose gradients DDP averages), so the step's
  // gradient is that of PyTorch's cross_entropy(ignore_index=-100) over the whole step (a step without targets has
  // zero gradients, and is not applied).
  std::pair<Tensor, double> micro_loss(const Batch& batch) {
    if (!task_.masked()) {
      Tensor loss = task_.loss(*run_.model, batch, F::Reduction::Mean, c_.label_smoothing);
      return {c_.grad_accum > 1 ? loss / static_cast<double>(c_.grad_accum) : loss, loss.item()};
    }
    Tensor sum = task_.loss(*run_.model, batch, F::Reduction::Sum, c_.label_smoothing);
    const double scale = batches_.step_targets() > 0 ? world_ / batches_.step_targets() : 0.0;
    if (batch.targets == 0) ++batches_without_targets_;
    return {sum * scale, sum.item() * scale};
  }

  // Forward and backward of one micro-batch; an optimizer step once grad_accum of them (or the rest of the
  // epoch) have summed their gradients. Returns whether it stepped.
  bool micro_batch(const Batch& batch, EpochTotals& e) {
    const auto t0 = Clock::now();
    if (micro_ == 0) run_.opt->zero_grad();
    std::pair<Tensor, double> loss;
    {
      std::optional<amp::ExplainGuard> explain;  // the report's op dtype table, from the first forward
      if (op_dtypes_.empty()) explain.emplace();
      auto fw = run_.amp->forward();
      // At O2/O3 the patched forward casts the batch to the model's dtype and the logits back to float32.
      // The loss is computed in float32 from 16-bit logits as they are (no float32 copy of a GPT's vocabulary; a
      // language model's logits a chunk at a time, never whole).
      loss = micro_loss(batch);
      if (explain) op_dtypes_ = with_modules(explain->rows(), *run_.model);
    }
    // Summed over grad_accum micro-batches, the gradients are those of the mean loss of one big batch. With
    // several ranks, backward averages them across ranks, once per step (the other micro-batches run in no_sync).
    const int64_t next_batch = batch.index + 1;
    const bool last_micro = micro_ + 1 >= c_.grad_accum || next_batch >= task_.batches_per_epoch();
    {
      std::optional<nn::DistributedDataParallel::NoSync> no_sync;
      if (run_.ddp && !last_micro) no_sync.emplace(*run_.ddp);
      run_.amp->scale_loss(loss.first, *run_.opt).backward();
    }
    if (run_.zero3) run_.zero3->release_all();  // (the blocks a forward without recompute left gathered)
    if (run_.ddp && last_micro && c_.zero >= 2) stage_shard_grads();
    const double n = batch.examples * world_;  // the whole job's images or tokens
    throughput_.add_examples(n);
    e.examples += n;
    micro_loss_ += loss.second;
    if (++micro_ < c_.grad_accum && !last_micro) {
      throughput_.add_seconds(seconds_since(t0));
      return false;
    }
    const bool no_targets = task_.masked() && batches_.step_targets() == 0;
    // The unscale, inf check and clip folded into the step's pass (bit-equal to unscale_ + clip_grad_norm_).
    if (!no_targets && (c_.clip_grad_norm > 0 || run_.amp->scaler().is_enabled()))
      run_.amp->unscale_clip_(*run_.opt, std::max(0.0, c_.clip_grad_norm));
    const bool stepped = !no_targets && run_.amp->step(*run_.opt);
    if (run_.sched) run_.sched->step();
    double lv = task_.masked() ? micro_loss_ : micro_loss_ / static_cast<double>(micro_);
    if (world_ > 1) {
      // The mean loss over ranks; whether any rank was asked to stop or (by its own clock) is due a timed
      // checkpoint: decisions every rank must take at the same step.
      Tensor t = tensor({lv, g_interrupt.load() != 0 ? 1.0 : 0.0, minutes_due() ? 1.0 : 0.0}, {3}, DType::Float64);
      dist::all_reduce(t);
      const std::vector<double> v = t.to_vector<double>();
      lv = v[0] / world_;
      stop_all_ = v[1] > 0;
      minutes_due_all_ = v[2] > 0;
    }
    micro_ = 0;
    micro_loss_ = 0;
    ++state_.step;
    state_.batch = next_batch;
    throughput_.add_seconds(seconds_since(t0));
    throughput_.step_done();
    e.loss += lv;
    ++e.batches;
    divergence_.check(state_.step, lv, stepped || no_targets, run_.amp->scaler().get_scale());
    if (log_)
      log_->step({state_.step, state_.epoch + 1, lv, run_.opt->param_groups()[0].lr, run_.amp->scaler().get_scale(),
                  !stepped, throughput_.steady_rate(), run_.amp->scaler().is_enabled()});
    // (an epoch's end evaluates anyway)
    if (c_.eval_every > 0 && state_.step % c_.eval_every == 0 && state_.step < total_ &&
        next_batch < task_.batches_per_epoch()) {
      const Evaluation ev = evaluate_now();
      if (log_) log_->evaluation(state_.step, state_.epoch + 1, ev);
      after_evaluation(ev);
    }
    return true;
  }

  // ZeRO-2: the optimizer's step reads the slices of the gradients DDP reduce-scattered (their .grad is dropped).
  void stage_shard_grads() {
    std::map<const TensorImpl*, Tensor> slice;
    for (const auto& [p, g] : run_.ddp->shard_grads()) slice[p.impl()] = g;
    auto& groups = run_.opt->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].slots.size(); ++i)
        if (auto it = slice.find(groups[g].slots[i].param.impl()); it != slice.end())
          run_.opt->stage_float32_grad(g, i, it->second);
  }

  void end_epoch(const EpochTotals& e, double seconds) {
    const bool epoch_end = state_.batch >= task_.batches_per_epoch();
    // The last step goes to disk before the final evaluation (a long one for a language model's validation split):
    // a kill during it loses no training, and --resume evaluates again and writes the report.
    if (state_.step >= total_ && !saved_now()) checkpoint();
    last_eval_ = evaluate_now();
    if (log_) {
      const auto& scaler = run_.amp->scaler();
      log_->epoch({state_.epoch + 1, state_.step, e.batches ? e.loss / static_cast<double>(e.batches) : 0.0,
                   e.examples / std::max(seconds, 1e-9), scaler.get_scale(), scaler.steps_skipped(),
                   scaler.is_enabled()},
                  *last_eval_);
    }
    if (epoch_end) {
      ++state_.epoch;
      state_.batch = 0;
    }
    if ((c_.checkpoint_every == 0 || state_.step >= total_) && !saved_now()) checkpoint();
    if (!stopped_early_) after_evaluation(*last_eval_);
  }

  // The test set's loss and accuracy, and --eval-task's scores; its ops are left out of --profile's table (which is
  // about training).
  Evaluation evaluate_now() {
    OpObserver* profiler = op_observer();
    set_op_observer(nullptr);
    // ZeRO-3: each block gathered as the forward reaches it, every rank taking the same number of turns.
    nn::ShardedBlocks* z = run_.zero3.get();
    Evaluation ev = evaluate(task_, *run_.model, *run_.amp, task_.eval_batch_size(),
                             z ? std::function<void()>([z] { z->gather_each(); }) : nullptr);
    if (task_scorer_) {
      const WholeWeights whole(z);  // (its ranks score different numbers of items)
      ev.task_scores = task_scorer_->score(dynamic_cast<models::LanguageModel&>(*run_.model), *run_.amp);
    }
    set_op_observer(profiler);
    return ev;
  }

  // --keep-best: a better value of its metric copies this step's checkpoint (written now if it is not yet) to
  // RUN/best; --early-stop: that many evaluations in a row without one end the run after this step.
  void after_evaluation(const Evaluation& ev) {
    const KeepBest::Verdict verdict = keep_best_.observe(task_, ev);
    if (verdict == KeepBest::Verdict::Better) {
      if (!saved_now()) checkpoint();
      if (rank0_)
        keep_best_checkpoint(
            c_.out, *latest_checkpoint(c_.out),
            Json::Object{{"metric", c_.keep_best}, {"value", keep_best_.best()}, {"step", state_.step}});
    } else if (verdict == KeepBest::Verdict::Stop && state_.step < total_) {
      if (log_) log_->finish_progress_line();
      if (rank0_)
        std::fprintf(stderr,
                     "castor train: stopping early at step %lld: %lld evaluations without a better %s than %g\n",
                     static_cast<long long>(state_.step), static_cast<long long>(keep_best_.stale()),
                     c_.keep_best.c_str(), keep_best_.best());
      stopped_early_ = true;
      total_ = state_.step;
    }
  }

  // Whether the newest checkpoint holds the current position already.
  bool saved_now() const { return saved_ == std::tuple{state_.step, state_.epoch, state_.batch}; }

  bool due_for_checkpoint() const {
    if (c_.checkpoint_every > 0 && state_.step % c_.checkpoint_every == 0) return true;
    return world_ == 1 ? minutes_due() : minutes_due_all_;
  }
  bool minutes_due() const {
    const double minutes = std::chrono::duration<double>(Clock::now() - last_save_).count() / 60;
    return c_.checkpoint_minutes > 0 && minutes >= c_.checkpoint_minutes;
  }

  // Writes a checkpoint of the current state, refusing to replace good ones with non-finite weights.
  // With several ranks (whose weights are equal) rank 0 writes it, and the others wait until it is on disk.
  void checkpoint() {
    // At a step boundary the next step sets the gradients to none anyway: not held beside the write.
    if (micro_ == 0) run_.opt->zero_grad();
    // Sharded (ZeRO): every rank writes its slices of the optimizer's state, rank 0 the rest and the manifest, and
    // the model a tensor at a time, each gathered as rank 0 writes it.
    const bool sharded = run_.opt->shard_group() != nullptr;
    if (rank0_ || sharded) {
      Checkpoint ck = state_.save(run_, config_, sharded);
      const int64_t step = state_.step;
      auto check_finite = [step](const std::string& name, const Tensor& t) {
        CASTOR_CHECK(!is_floating(t.dtype()) || isfinite_all(t), "diverged at step ", step, ": ", name,
                     " is not finite (try a lower --lr); the newest checkpoint holds the last finite state");
      };
      if (rank0_) {
        for (const auto& [name, t] : ck.model) check_finite(name, t);
        for (Checkpoint::LazyTensor& t : ck.model_each)
          t.make = [make = std::move(t.make), name = t.name, check_finite] {
            Tensor made = make();
            check_finite(name, made);
            return made;
          };
      }
      if (sharded)
        write_sharded_checkpoint(c_.out, state_.step, ck, c_.keep, *run_.opt->shard_group());
      else
        write_checkpoint(c_.out, state_.step, ck, c_.keep);
    }
    if (world_ > 1) dist::barrier();
    saved_ = {state_.step, state_.epoch, state_.batch};
    last_save_ = Clock::now();
  }

  // Checkpoints the finished step and says how to go on; the summary carries the signal for the exit status.
  Json stop_interrupted() {
    if (log_) log_->finish_progress_line();
    if (!saved_now()) checkpoint();
    if (rank0_)
      std::fprintf(stderr, "interrupted at step %lld; continue with: castor train --resume %s\n",
                   static_cast<long long>(state_.step), c_.out.c_str());
    Json summary = summary_json();
    summary["interrupted_by_signal"] = g_interrupt.load();
    return summary;
  }

  Json summary_json() const {
    const auto& scaler = run_.amp->scaler();
    // (an interrupted run may stop before its first evaluation: null, not a made-up 0)
    Json summary = Json::Object{{"steps", state_.step},
                                {"skipped_steps", scaler.steps_skipped()},
                                {"final_loss_scale", scaler.get_scale()},
                                {"peak_memory_bytes", memory_stats().peak_bytes},
                                {"setup_peak_memory_bytes", setup_peak_},
                                {"lost_metric_lines", log_ ? log_->lost_lines() : 0},
                                {"nproc", world_},
                                {"out", c_.out}};
    const auto [trainable, all] = parameter_counts(*run_.model);
    summary["trainable_params"] = trainable, summary["all_params"] = all;
    // The steady rate is what a long run sees; the whole run's rate is beside it.
    const double whole = throughput_.whole_rate();
    const double per_sec = throughput_.steady_rate();
    if (task_.masked()) summary["batches_without_targets"] = batches_without_targets_;
    task_.summary_keys(summary, last_eval_ ? &*last_eval_ : nullptr, per_sec);
    if (log_) summary[detail::cat("train_", task_.rate_key(), "_whole_run")] = whole;
    if (log_ && log_->mfu(per_sec) > 0) summary["mfu"] = log_->mfu(per_sec);
    return summary;
  }

  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  const TrainConfig& c_;
  Task& task_;
  Run& run_;
  const Json config_;
  TrainState state_;
  int64_t total_;     // the steps to run (--early-stop ends the run sooner)
  const bool rank0_;  // prints, and writes metrics, report and checkpoints
  const int world_;
  std::optional<RunLog> log_;  // rank 0's
  StepBatches batches_;
  DivergenceGuard divergence_;
  std::unique_ptr<TrainTaskScorer> task_scorer_;  // --eval-task's
  KeepBest keep_best_;
  Throughput throughput_;
  std::vector<amp::ExplainRow> op_dtypes_;  // of this process's first forward pass, for the report
  std::optional<Evaluation> last_eval_;     // the newest epoch-end evaluation
  const int64_t epochs_;
  double micro_loss_ = 0;
  int64_t micro_ = 0;                                // micro-batches whose gradients are summed so far
  int64_t batches_without_targets_ = 0;              // masked tasks: this rank's micro-batches with no target (loss 0)
  bool stop_all_ = false, minutes_due_all_ = false;  // as of the last step, over all ranks
  std::tuple<int64_t, int64_t, int64_t> saved_{-1, -1, -1};  // (step, epoch, batch) of the newest checkpoint
  Clock::time_point last_save_;
  bool stopped_early_ = false;
  int64_t setup_peak_ = 0;  // the allocator's peak before the first step
};

}  // namespace

Json train_loop(const TrainConfig& c, Task& task, Run& run, const Json& config, TrainState state, int64_t total_steps,
                int64_t epochs, FlopRate flops) {
  return Trainer(c, task, run, config, state, total_steps, epochs, flops).run();
}

void announce_interrupts(bool say) { g_say_interrupt = say; }

void install_interrupt_handlers() {
  // The signals are blocked in this thread and so in every thread it starts (OpenMP's, oneDNN's, the data loader's)
  // and taken by one thread of their own, so no handler ever interrupts a compute thread: with a handler, a signal
  // landing in oneDNN's sgemm was followed now and then by heap corruption there (RunDir.Sig* under load).
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (int sig = 0;;)
      if (sigwait(&set, &sig) == 0) on_interrupt(sig);
  }).detach();
}

}  // namespace castor::train
