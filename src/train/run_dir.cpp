// The run directory: ownership and locking, resume's paths and recording, and the training state of checkpoints.
#include "train/run_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>

#include "castor/dist.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "train/lora_run.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

constexpr int kStateVersion = 1;

// Prefixes every key of `sd` into `out`.
void put(StateDict& out, const std::string& prefix, const StateDict& sd) {
  for (const auto& [k, v] : sd) out[prefix + k] = v;
}
StateDict take(const StateDict& in, const std::string& prefix) {
  StateDict out;
  for (const auto& [k, v] : in)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v;
  return out;
}

Tensor i64(int64_t v) { return scalar_tensor(static_cast<double>(v), DType::Int64); }

// A non-negative integer counter of the state; NaN, fractions, negatives and wrong shapes are errors.
int64_t counter(const Checkpoint& ck, const std::string& key, const std::string& what) {
  auto it = ck.state.find(key);
  CASTOR_CHECK(it != ck.state.end() && it->second.numel() == 1, what, ": the training state has no ", key);
  const double v = it->second.to(DType::Float64).item();
  CASTOR_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9e15, what, ": the training state's ", key,
               " is ", v, ", not a non-negative integer");
  return static_cast<int64_t>(v);
}

// The files a run writes in its directory (besides its lock file and checkpoints).
constexpr const char* kRunFiles[] = {"config.json", "metrics.jsonl", "metrics.csv", "report.html", "summary.json"};

}  // namespace

namespace {

// A sharded run's model file, a tensor at a time in name order (Checkpoint::model_each), as Amp::model_state_dict
// has it: a weight with a float32 master (O2) as its master, gathered from the ranks' slices; a ZeRO-3 block's
// weight gathered from its slices; the rest as every rank holds it. No rank holds more than one whole tensor of them.
std::vector<Checkpoint::LazyTensor> model_each(const Run& run) {
  std::map<const TensorImpl*, const optim::ParamSlot*> master_of;
  for (const optim::ParamGroup& g : run.opt->param_groups())
    for (const optim::ParamSlot& slot : g.slots)
      if (slot.master.defined()) master_of[slot.param.impl()] = &slot;
  std::map<std::string, Tensor> params;  // (a tied parameter under its first name: the one a master replaces)
  for (const auto& [name, p] : run.model->named_parameters()) params.emplace(name, p);
  std::vector<Checkpoint::LazyTensor> out;
  for (const auto& [name, t] : run.model->state_dict()) {
    const auto p = params.find(name);
    const auto slot = p == params.end() ? master_of.end() : master_of.find(p->second.impl());
    if (slot != master_of.end()) {
      out.push_back(
          {name, DType::Float32, t.shape(), [&opt = *run.opt, s = slot->second] { return opt.whole_master(*s); }});
      continue;
    }
    // (a tied name of a sharded block weight shares its storage: the same slices)
    Tensor sharded;
    for (const auto& [n, q] : params)
      if (run.zero3 && q.impl()->storage == t.impl()->storage && run.zero3->holds(q)) sharded = q;
    if (sharded.defined())
      out.push_back({name, t.dtype(), t.shape(), [z = run.zero3, sharded] { return z->whole(sharded); }});
    else
      out.push_back({name, t.dtype(), t.shape(), [t] { return t; }});
  }
  return out;
}

}  // namespace

Checkpoint TrainState::save(const Run& run, const Json& config, bool slices) const {
  Checkpoint ck;
  if (slices)
    ck.model_each = model_each(run);
  else
    ck.model = run.amp->model_state_dict();
  ck.model_meta = {
      {"format", "pt"}, {"castor.model", config.at("model").as_string()}, {"castor.config", config.dump()}};
  keep_adapters(ck, config);
  // (the optimizer's state too, as aliases: the checkpoint is written before training goes on)
  std::map<std::string, optim::Optimizer::SliceOf> where;
  amp::PrecisionState ps = run.amp->precision_state(/*copies=*/false, slices ? &where : nullptr);
  put(ck.state, "amp.", ps.tensors);
  for (const auto& [key, w] : where) {
    auto it = ck.state.find("amp." + key);
    ck.shard["amp." + key] = it->second;
    ck.shard_where["amp." + key] = {w.shape, w.begin};
    ck.state.erase(it);
  }
  for (const auto& [k, v] : ps.metadata) ck.state_meta["amp." + k] = v;
  if (run.sched) put(ck.state, "scheduler.", run.sched->state_dict());
  const Generator::State st = default_generator().state();
  Tensor rng = empty({static_cast<int64_t>(st.size())}, DType::Int64);
  for (size_t i = 0; i < st.size(); ++i) rng.data<int64_t>()[i] = static_cast<int64_t>(st[i]);
  ck.state["rng.default"] = rng;
  ck.state["progress.step"] = i64(step);
  ck.state["progress.epoch"] = i64(epoch);
  ck.state["progress.batch"] = i64(batch);
  ck.state_meta["config"] = config.dump();
  ck.state_meta["castor.train_state_version"] = std::to_string(kStateVersion);
  return ck;
}

TrainState TrainState::load(const Checkpoint& ck, Run& run, int64_t batches_per_epoch, int64_t grad_accum,
                            const std::string& what) {
  auto version = ck.state_meta.find("castor.train_state_version");
  CASTOR_CHECK(version != ck.state_meta.end() && version->second == std::to_string(kStateVersion), what,
               ": the training state has version ",
               version == ck.state_meta.end() ? std::string("none") : printable(version->second),
               "; this build reads version ", kStateVersion);
  TrainState s;
  s.step = counter(ck, "progress.step", what);
  s.epoch = counter(ck, "progress.epoch", what);
  s.batch = counter(ck, "progress.batch", what);
  const int64_t steps_per_epoch = (batches_per_epoch + grad_accum - 1) / grad_accum;
  CASTOR_CHECK(s.batch <= batches_per_epoch && s.epoch <= s.step &&
                   s.step == s.epoch * steps_per_epoch + (s.batch + grad_accum - 1) / grad_accum,
               what, ": the training state's position (step ", s.step, ", epoch ", s.epoch, ", batch ", s.batch,
               ") is not one this run reaches with ", batches_per_epoch, " batches per epoch");
  auto rng = ck.state.find("rng.default");
  Generator::State st;
  CASTOR_CHECK(rng != ck.state.end() && rng->second.dtype() == DType::Int64 &&
                   rng->second.numel() == static_cast<int64_t>(st.size()),
               what, ": the training state's rng.default is missing or not ", st.size(), " int64 words");
  try {
    if (run.zero3)  // (a full fine-tuning whose blocks were sharded as built)
      load_sharded_model(*run.model, *run.zero3, ck.model);
    else
      load_model_file(*run.model, ck.model, ck.model_meta, what);
    amp::PrecisionState ps{take(ck.state, "amp."), {}};
    for (const auto& [k, v] : ck.state_meta)
      if (k.rfind("amp.", 0) == 0) ps.metadata[k.substr(4)] = v;
    run.amp->load_precision_state(ps);
    if (run.sched) run.sched->load_state_dict(take(ck.state, "scheduler."));
  } catch (const std::out_of_range& e) {
    throw Error(detail::cat(what, ": the training state is incomplete (", e.what(), ")"));
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": ", e.what()));
  }
  const std::vector<int64_t> words = rng->second.to_vector<int64_t>();
  for (size_t i = 0; i < st.size(); ++i) st[i] = static_cast<uint64_t>(words[i]);
  CASTOR_CHECK(st[0] | st[1] | st[2] | st[3], what,
               ": the training state's rng.default is all zero (no generator "
               "reaches that state)");
  default_generator().set_state(st);
  return s;
}

std::pair<std::string, std::string> resolve_resume(const std::string& path) {
  if (!is_checkpoint_dir(path)) {
    std::error_code ec;
    CASTOR_CHECK(fs::is_directory(path, ec), "--resume ", path, ": not a run directory");
    return {path, path};
  }
  // (a trailing slash, as tab completion writes it, names the same folder)
  const fs::path folder = fs::path(absolute_path(path)).parent_path();
  CASTOR_CHECK(folder.filename() == "checkpoints", "--resume ", path,
               ": a checkpoint folder outside a run directory (expected RUN/checkpoints/step-N); start a new run "
               "from its weights with --init ",
               path, "/model.safetensors");
  return {folder.parent_path().string(), path};
}

std::string default_out(const TrainConfig& c) {
  double now = static_cast<double>(std::time(nullptr));
  if (dist::world_size() > 1) {
    Tensor t = tensor({dist::rank() == 0 ? now : 0.0}, {1}, DType::Float64);
    dist::all_reduce(t);
    now = t.to_vector<double>()[0];
  }
  const std::time_t when = static_cast<std::time_t>(now);
  std::tm local{};
  localtime_r(&when, &local);
  char date[32];
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &local);
  const std::string base = detail::cat("runs/", date, "-", name(c.model), "-", precision_name(c));
  std::string out = base;
  std::error_code ec;
  for (int k = 2; dist::world_size() == 1 && fs::exists(out, ec); ++k) out = base + "-" + std::to_string(k);
  return out;
}

std::unique_ptr<FileLock> own_run_dir(const TrainConfig& c, bool continuing) {
  std::error_code ec;
  fs::create_directories(c.out, ec);
  CASTOR_CHECK(!ec && fs::is_directory(c.out), "--out ", c.out,
               ": cannot create the directory: ", ec ? ec.message() : "not a directory");
  // A run's own files are never symbolic links: writing through one would replace whatever it points to.
  std::vector<std::string> own = {".castor.lock", "checkpoints", "checkpoints/HEAD"};
  own.insert(own.end(), std::begin(kRunFiles), std::end(kRunFiles));
  std::string links;
  for (const std::string& f : own)
    if (fs::is_symlink(c.out + "/" + f, ec)) links += (links.empty() ? "" : ", ") + f;
  CASTOR_CHECK(links.empty(), "--out ", c.out, ": symbolic links where a run writes its files (", links,
               "); a run directory's own files must not be links (remove them)");
  // Nor anything but regular files: a FIFO, device or folder named report.html would fail the run at its end (and
  // --overwrite must not delete a folder).
  for (const std::string& f : own) {
    if (f == "checkpoints") continue;
    try {
      check_replaceable(c.out + "/" + f);
    } catch (const Error& e) {
      throw Error(detail::cat("--out ", c.out, ": ", e.what(), " (where a run writes its ", f, ")"));
    }
  }
  // Ownership is decided before the lock file is made: a refused directory is left as it was (a lock file left behind
  // would make the same command take it for a Castor run directory the next time).
  const bool castor_dir = fs::exists(c.out + "/.castor.lock", ec);
  const bool has_metrics = fs::is_regular_file(c.out + "/metrics.jsonl", ec) &&
                           fs::file_size(c.out + "/metrics.jsonl", ec) > 0;
  const bool other_run = !continuing && (latest_checkpoint(c.out) || has_metrics);
  if (!continuing && !other_run && !castor_dir) {
    // Not a Castor run directory (no lock file ever made there): files a run writes belong to someone else.
    std::string foreign;
    for (const char* f : kRunFiles)
      if (fs::exists(c.out + "/" + f, ec)) foreign += (foreign.empty() ? "" : ", ") + std::string(f);
    CASTOR_CHECK(foreign.empty() || c.overwrite, "--out ", c.out, " is not a Castor run directory but holds ", foreign,
                 ", which a run would replace; choose another --out, or pass --overwrite to replace them");
  }
  auto lock = std::make_unique<FileLock>(c.out + "/.castor.lock");
  try {
    const std::string checkpoints = c.out + "/checkpoints";
    if (other_run) {
      CASTOR_CHECK(c.overwrite, "--out ", c.out,
                   " holds another run (checkpoints or metrics.jsonl); continue it with --resume ", c.out,
                   ", choose another --out, or pass --overwrite to replace it");
      fs::remove_all(c.out + "/checkpoints", ec);
      for (const char* f : kRunFiles) fs::remove_all(c.out + "/" + f, ec);
    } else if (!continuing && !castor_dir && c.overwrite) {
      for (const char* f : kRunFiles) fs::remove(c.out + "/" + f, ec);
    }
    remove_stale_temps(c.out);
    fs::create_directories(checkpoints, ec);
    CASTOR_CHECK(fs::is_directory(checkpoints) && access(checkpoints.c_str(), W_OK) == 0, "--out ", c.out, ": ",
                 checkpoints, " is not a writable directory");
  } catch (...) {
    if (!castor_dir) fs::remove(c.out + "/.castor.lock", ec);  // (made just now: the directory is not a run's)
    throw;
  }
  return lock;
}

void check_extension(const TrainConfig& c, int64_t schedule_steps, int64_t total_steps) {
  if (c.schedule == Schedule::WarmupCosine && c.warmup_steps >= schedule_steps)
    std::fprintf(stderr,
                 "note: --warmup-steps %lld is not below the schedule's %lld steps: the learning rate rises for the "
                 "whole run and never reaches --lr %g (no cosine decay)\n",
                 static_cast<long long>(c.warmup_steps), static_cast<long long>(schedule_steps), c.lr);
  if (c.schedule == Schedule::None || total_steps <= schedule_steps) return;
  CASTOR_CHECK(c.schedule != Schedule::OneCycle, "--steps/--epochs: the onecycle schedule ends at step ",
               schedule_steps,
               " and cannot run past it; start a new run (--init from the last checkpoint) to train longer");
  const char* past = c.schedule == Schedule::Cosine
                         ? "its cosine continues, so the learning rate rises again from its minimum"
                     : c.schedule == Schedule::WarmupCosine ? "the learning rate stays at --min-lr (nanoGPT's get_lr)"
                                                            : "the learning rate keeps dropping 10x every third of "
                                                              "that length";
  std::fprintf(stderr, "note: the %s schedule was set for %lld steps and keeps it; past step %lld %s\n",
               name(c.schedule), static_cast<long long>(schedule_steps), static_cast<long long>(schedule_steps), past);
}

void check_export_out(const std::string& flag, const std::string& out, const OwnsEntry& dir_files,
                      const std::string& what, const std::vector<std::string>& inputs) {
  try {
    if (dir_files)
      check_output_dir(flag, out, dir_files, what);
    else
      check_replaceable(out);
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(msg.rfind(flag, 0) == 0 ? msg : detail::cat(flag, ": ", msg));
  }
  const std::string target = absolute_path(out);
  const auto inside = [](const std::string& path, const std::string& dir) {
    return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
  };
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    const std::string source = absolute_path(input);
    // The input itself, a file in it (a new file beside it replaces nothing), or a directory holding it.
    const bool is = target == source, in = exists && inside(target, source), holds = inside(source, target);
    CASTOR_CHECK(!is && !in && !holds, flag, ": ", out,
                 is   ? " is "
                 : in ? " is inside "
                      : " holds ",
                 input,
                 ", which this export reads (its source, or the base or --init its run records); an export never "
                 "replaces its own input: give another ",
                 flag);
  }
  // Nor any run's own files: its checkpoints (a LoRA run may be built on one), its config.json and metrics.
  const fs::path parent = fs::path(target).parent_path();
  const std::string name = fs::path(target).filename().string();
  const bool run_file = std::find(std::begin(kRunFiles), std::end(kRunFiles), name) != std::end(kRunFiles);
  CASTOR_CHECK(!fs::exists(parent / ".castor.lock", ec) || !run_file, flag, ": ", out, " is the run directory ",
               parent.string(), "'s own ", name, "; give another ", flag);
  for (fs::path dir = parent; dir.has_relative_path(); dir = dir.parent_path())
    CASTOR_CHECK(!is_checkpoint_dir(dir.string()), flag, ": ", out, " is inside the checkpoint ", dir.string(),
                 " (a run resumes from it; LoRA runs may be built on it); give another ", flag);
}

Json recorded_config(const Checkpoint& ck, const std::string& what) {
  auto it = ck.state_meta.find("config");
  CASTOR_CHECK(it != ck.state_meta.end(), what, ": the checkpoint has no recorded config");
  try {
    Json recorded = Json::parse(it->second);
    for (const char* key : {"schedule_steps", "steps", "epochs"})
      CASTOR_CHECK(!recorded.find(key) || recorded.at(key).is_int(), "\"", key, "\" is not an integer");
    return recorded;
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": the recorded config is invalid: ", e.what()));
  }
}

int64_t recorded_schedule_steps(const Json& recorded, int64_t steps_per_epoch) {
  if (const Json* s = recorded.find("schedule_steps")) return s->as_int();
  const int64_t steps = recorded.at("steps").as_int(), epochs = recorded.at("epochs").as_int();
  CASTOR_CHECK(steps > 0 || epochs <= INT64_MAX / steps_per_epoch, "the recorded --epochs ", epochs, " is too many");
  return steps > 0 ? steps : epochs * steps_per_epoch;
}

void resume_batch_size(TrainConfig& c, const Json& recorded, int world) {
  const Json* n = recorded.find("nproc");
  const int64_t recorded_world = n && n->is_int() && n->as_int() > 0 ? n->as_int() : 1;
  const int64_t global = recorded.at("batch_size").as_int() * recorded_world;
  if (c.given("--batch-size"))
    CASTOR_CHECK(c.batch_size * world == global, "--batch-size ", c.batch_size, ": with ", world,
                 " ranks the global batch would be ", c.batch_size * world, ", the run's is ", global,
                 " (keep it: --batch-size ", global / world, ")");
  CASTOR_CHECK(global % world == 0, "--resume: the run's global batch of ", global, " does not split evenly among ",
               world, " ranks");
  c.batch_size = global / world;
  if (recorded_world != world && dist::rank() == 0)
    std::fprintf(stderr,
                 "note: the run was recorded with %lld ranks and continues on %d with the same global batch "
                 "of %lld; the gradients are summed in another order, so it is no longer bit-exact\n",
                 static_cast<long long>(recorded_world), world, static_cast<long long>(global));
}

}  // namespace castor::train
