// The training job: data, model, optimizer, opt level, the loop, metrics, checkpoints, exact resume.
#include "castor/trainer.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <iostream>
#include <memory>

#include "castor/allocator.h"
#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/checkpoint.h"
#include "castor/data.h"
#include "castor/fs.h"
#include "castor/functional.h"
#include "castor/lr_scheduler.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/report.h"
#include "castor/explain.h"
#include "train/profiler.h"
#include "train/run_log.h"

namespace castor::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kStateVersion = 1;

struct Datasets {
  ImageDataset train, test;
  data::Normalization norm;
};

Datasets load_data(const TrainConfig& c) {
  Datasets d;
  if (c.data == "fashion-mnist") {
    const std::string dir = c.data_dir.empty() ? "/usr/share/datasets/fashion-mnist" : c.data_dir;
    d.train = load_fashion_mnist(dir, /*train=*/true);
    d.test = load_fashion_mnist(dir, /*train=*/false);
  } else if (c.data == "cifar10") {
    const std::string dir = c.data_dir.empty() ? "cifar-10-batches-bin" : c.data_dir;
    d.train = load_cifar10(dir, /*train=*/true);
    d.test = load_cifar10(dir, /*train=*/false);
  } else {
    // One draw split in two, so train and test share the class patterns.
    const int64_t n_test = std::max<int64_t>(c.synthetic_size / 4, 1);
    ImageDataset all = data::make_synthetic(c.synthetic_size + n_test, 3, 32, 32, 10, c.seed + 7);
    const int64_t sz = 3 * 32 * 32;
    d.train = {c.synthetic_size, 3, 32, 32, {}, {}, 10};
    d.test = {n_test, 3, 32, 32, {}, {}, 10};
    d.train.images.assign(all.images.begin(), all.images.begin() + c.synthetic_size * sz);
    d.train.labels.assign(all.labels.begin(), all.labels.begin() + c.synthetic_size);
    d.test.images.assign(all.images.begin() + c.synthetic_size * sz, all.images.end());
    d.test.labels.assign(all.labels.begin() + c.synthetic_size, all.labels.end());
  }
  d.norm = data::compute_normalization(d.train);
  return d;
}

Json config_json(const TrainConfig& c, const Datasets& d) {
  Json::Object o;
  o["data"] = c.data;
  o["data_dir"] = c.data_dir;
  o["model"] = c.model;
  o["amp"] = c.amp;
  o["dtype"] = dtype_name(c.dtype);
  o["stochastic_rounding"] = c.stochastic_rounding;
  o["optimizer"] = c.optimizer;
  o["lr"] = c.lr;
  o["momentum"] = c.momentum;
  o["weight_decay"] = c.weight_decay;
  o["schedule"] = c.schedule;
  o["loss_scale"] = c.loss_scale ? Json(*c.loss_scale) : Json("dynamic");
  o["clip_grad_norm"] = c.clip_grad_norm;
  o["grad_accum"] = c.grad_accum;
  o["label_smoothing"] = c.label_smoothing;
  o["eval_every"] = c.eval_every;
  o["batch_size"] = c.batch_size;
  o["epochs"] = c.epochs;
  o["steps"] = c.steps;
  o["augment"] = c.augment;
  o["seed"] = c.seed;
  o["threads"] = omp_get_max_threads();
  o["deterministic"] = c.deterministic;
  o["checkpoint_every"] = c.checkpoint_every;
  o["keep"] = c.keep;
  o["init"] = c.init;
  o["synthetic_size"] = c.synthetic_size;
  Json::Array mean, std;
  for (double v : d.norm.mean) mean.push_back(v);
  for (double v : d.norm.std) std.push_back(v);
  o["normalization"] = Json::Object{{"mean", mean}, {"std", std}};
  o["input_shape"] = Json::Array{d.train.channels, d.train.height, d.train.width};
  o["num_classes"] = d.train.num_classes;
  return o;
}

void write_text(const std::string& path, const std::string& text) {
  atomic_write_file(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// The run's model, optimizer, opt level and scheduler, built from a config.
struct Run {
  nn::ModulePtr model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  std::unique_ptr<optim::LRScheduler> sched;
};

Run build_run(const TrainConfig& c, const Datasets& d, int64_t total_steps) {
  Run r;
  manual_seed(c.seed);
  r.model = models::make_model(c.model, d.train.channels, d.train.height, d.train.width, d.train.num_classes);
  if (!c.init.empty()) {
    LoadedTensors init = load_safetensors(c.init);
    try {
      r.model->load_state_dict(init.tensors, /*strict=*/true);
    } catch (const Error& e) {
      throw Error(detail::cat("--init ", c.init, ": ", e.what()));
    }
  }
  const std::vector<Tensor> params = r.model->parameters();
  if (c.optimizer == "sgd") {
    r.opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum,
                                                                   .weight_decay = c.weight_decay});
  } else {
    optim::AdamOptions o{.lr = c.lr, .weight_decay = c.weight_decay};
    r.opt = c.optimizer == "adam" ? std::make_unique<optim::Adam>(params, o) : optim::make_adamw(params, o);
  }
  amp::Overrides ov;
  if (c.loss_scale) ov.loss_scale = Json(*c.loss_scale).dump();
  if (c.stochastic_rounding) {
    ov.rounding = optim::Rounding::Stochastic;
    ov.rounding_seed = c.seed;
  }
  r.amp = amp::initialize(*r.model, {r.opt.get()}, amp::parse_opt_level(c.amp), c.dtype, ov);
  if (c.schedule == "step")
    r.sched = std::make_unique<optim::StepLR>(*r.opt, std::max<int64_t>(total_steps / 3, 1), 0.1);
  else if (c.schedule == "cosine")
    r.sched = std::make_unique<optim::CosineAnnealingLR>(*r.opt, total_steps);
  else if (c.schedule == "onecycle")
    r.sched = std::make_unique<optim::OneCycleLR>(*r.opt, optim::OneCycleLROptions{{c.lr}, total_steps});
  return r;
}

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

// The dtype batches are fed in: the model's dtype under O2/O3, float32 otherwise.
DType input_dtype(const amp::Amp& amp) { return amp.properties().cast_model_type.value_or(DType::Float32); }

struct Evaluation {
  double loss = 0, accuracy = 0;
};

Evaluation evaluate(nn::Module& model, const amp::Amp& amp, const ImageDataset& ds, const data::Normalization& norm,
                    int64_t batch_size) {
  model.eval();
  NoGradGuard no_grad;
  data::DataLoader loader(ds, {.batch_size = batch_size, .shuffle = false, .norm = norm});
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    data::Batch b = loader.make_batch(0, i);
    Tensor logits;
    {
      auto fw = amp.forward();
      logits = model(b.images.to(input_dtype(amp)));
    }
    loss_sum += F::cross_entropy(logits.float_(), b.labels, F::Reduction::Sum).item();
    correct += static_cast<int64_t>(sum(eq(argmax(logits, 1), b.labels)).item());
  }
  model.train();
  return {loss_sum / static_cast<double>(ds.n), static_cast<double>(correct) / static_cast<double>(ds.n)};
}

}  // namespace

Json run_train(TrainConfig c) {
  const auto wall_start = Clock::now();
  if (c.threads > 0) omp_set_num_threads(c.threads);
  if (c.deterministic) omp_set_dynamic(0);
  const bool resuming = !c.resume.empty();
  if (resuming && c.out == TrainConfig{}.out) c.out = c.resume;

  std::error_code ec;
  fs::create_directories(c.out, ec);
  CASTOR_CHECK(!ec && fs::is_directory(c.out), "--out ", c.out, ": cannot create the directory: ", ec.message());
  Datasets d = load_data(c);
  data::LoaderOptions lo{.batch_size = c.batch_size, .shuffle = true, .augment = c.augment == "standard",
                         .drop_last = true, .seed = c.seed, .norm = d.norm};
  data::DataLoader loader(d.train, lo);
  CASTOR_CHECK(loader.batches_per_epoch() > 0, "--batch-size ", c.batch_size, " is larger than the ", d.train.n,
               " training images");
  const int64_t steps_per_epoch = (loader.batches_per_epoch() + c.grad_accum - 1) / c.grad_accum;
  const int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * steps_per_epoch;
  Run run = build_run(c, d, total_steps);
  const Json config = config_json(c, d);

  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  if (resuming) {
    Checkpoint ck = read_checkpoint(c.resume);
    auto version = ck.state_meta.find("castor.train_state_version");
    CASTOR_CHECK(version != ck.state_meta.end() && version->second == std::to_string(kStateVersion), c.resume,
                 ": the training state has version ",
                 version == ck.state_meta.end() ? std::string("none") : version->second, "; this build reads version ",
                 kStateVersion);
    auto it = ck.state_meta.find("config");
    CASTOR_CHECK(it != ck.state_meta.end(), c.resume, ": the checkpoint has no recorded config");
    const Json saved = Json::parse(it->second);
    for (const char* key : {"model", "amp", "dtype", "optimizer", "data", "batch_size", "seed"})
      CASTOR_CHECK(saved.at(key) == config.at(key), c.resume, ": the checkpoint was made with ", key, " ",
                   saved.at(key).dump(), ", this run has ", config.at(key).dump());
    run.model->load_state_dict(ck.model, /*strict=*/true);
    amp::PrecisionState ps{take(ck.state, "amp."), {}};
    for (const auto& [k, v] : ck.state_meta)
      if (k.rfind("amp.", 0) == 0) ps.metadata[k.substr(4)] = v;
    run.amp->load_precision_state(ps);
    if (run.sched) run.sched->load_state_dict(take(ck.state, "scheduler."));
    Tensor rng = ck.state.at("rng.default");
    auto words = rng.to_vector<int64_t>();
    Generator::State st;
    for (size_t i = 0; i < st.size(); ++i) st[i] = static_cast<uint64_t>(words.at(i));
    default_generator().set_state(st);
    step = static_cast<int64_t>(ck.state.at("progress.step").item());
    epoch = static_cast<int64_t>(ck.state.at("progress.epoch").item());
    batch_in_epoch = static_cast<int64_t>(ck.state.at("progress.batch").item());
  }

  write_text(c.out + "/config.json", config.dump(2) + "\n");

  auto save = [&]() {
    Checkpoint ck;
    ck.model = run.amp->model_state_dict();
    ck.model_meta = {{"format", "pt"}, {"castor.model", c.model}, {"castor.config", config.dump()}};
    amp::PrecisionState ps = run.amp->precision_state();
    put(ck.state, "amp.", ps.tensors);
    for (const auto& [k, v] : ps.metadata) ck.state_meta["amp." + k] = v;
    if (run.sched) put(ck.state, "scheduler.", run.sched->state_dict());
    const Generator::State st = default_generator().state();
    Tensor rng = empty({static_cast<int64_t>(st.size())}, DType::Int64);
    for (size_t i = 0; i < st.size(); ++i) rng.data<int64_t>()[i] = static_cast<int64_t>(st[i]);
    ck.state["rng.default"] = rng;
    ck.state["progress.step"] = i64(step);
    ck.state["progress.epoch"] = i64(epoch);
    ck.state["progress.batch"] = i64(batch_in_epoch);
    ck.state_meta["config"] = config.dump();  // the precision state holds the optimizer's state too
    ck.state_meta["castor.train_state_version"] = std::to_string(kStateVersion);
    write_checkpoint(c.out, step, ck, c.keep);
  };

  std::unique_ptr<Profiler> profiler = c.profile ? std::make_unique<Profiler>() : nullptr;
  RunLog log(c, total_steps, c.steps > 0 ? (total_steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs,
             /*append=*/resuming);
  std::vector<amp::ExplainRow> op_dtypes;  // of this process's first forward pass, for the report
  reset_peak_memory_stats();
  double images = 0, train_seconds = 0;
  Evaluation last_eval;
  bool done = step >= total_steps;
  std::fprintf(stderr, "castor train: %s on %s, %s %s, %s lr %g, batch %lld, %lld steps, %d threads\n",
               c.model.c_str(), c.data.c_str(), c.amp.c_str(), c.amp == "O0" ? "float32" : dtype_name(c.dtype),
               c.optimizer.c_str(), c.lr, static_cast<long long>(c.batch_size * c.grad_accum),
               static_cast<long long>(total_steps), omp_get_max_threads());
  while (!done) {
    loader.start_epoch(epoch, batch_in_epoch);
    double epoch_loss = 0;
    int64_t epoch_batches = 0;
    const auto epoch_start = Clock::now();
    double epoch_images = 0;
    int64_t micro = 0;  // micro-batches whose gradients are summed so far
    double step_loss = 0, step_seconds = 0;
    while (auto batch = loader.next()) {
      const auto t0 = Clock::now();
      if (micro == 0) run.opt->zero_grad();
      Tensor loss;
      {
        std::optional<amp::ExplainGuard> explain;
        if (op_dtypes.empty()) explain.emplace();
        auto fw = run.amp->forward();
        // O2/O3 models take 16-bit input; their logits are widened before the loss, as Apex does.
        Tensor logits = (*run.model)(batch->images.to(input_dtype(*run.amp)));
        loss = F::cross_entropy(logits.float_(), batch->labels, F::Reduction::Mean, c.label_smoothing);
        if (explain) op_dtypes = explain->rows();
      }
      // Summed over grad_accum micro-batches, the gradients are those of the mean loss of one big batch.
      run.amp->scale_loss(c.grad_accum > 1 ? loss / static_cast<double>(c.grad_accum) : loss, *run.opt).backward();
      batch_in_epoch = batch->index + 1;
      images += static_cast<double>(batch->labels.numel());
      epoch_images += static_cast<double>(batch->labels.numel());
      step_loss += loss.item();
      step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      // A step takes grad_accum micro-batches, or what is left of the epoch.
      if (++micro < c.grad_accum && batch_in_epoch < loader.batches_per_epoch()) continue;
      const auto t1 = Clock::now();
      if (c.clip_grad_norm > 0) {
        run.amp->unscale_(*run.opt);
        amp::clip_grad_norm_(*run.opt, c.clip_grad_norm);
      }
      const bool stepped = run.amp->step(*run.opt);
      if (run.sched) run.sched->step();
      train_seconds += step_seconds + std::chrono::duration<double>(Clock::now() - t1).count();
      const double lv = step_loss / static_cast<double>(micro);
      micro = 0;
      step_loss = step_seconds = 0;
      ++step;
      epoch_loss += lv;
      ++epoch_batches;
      log.step({step, epoch, lv, run.opt->param_groups()[0].lr, run.amp->scaler().get_scale(), !stepped, images,
                train_seconds});
      done = step >= total_steps;
      // (an epoch's end evaluates anyway)
      if (c.eval_every > 0 && step % c.eval_every == 0 && !done && batch_in_epoch < loader.batches_per_epoch()) {
        const Evaluation e = evaluate(*run.model, *run.amp, d.test, d.norm, 256);
        log.evaluation(step, epoch, e.loss, e.accuracy);
      }
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) save();
      if (done) break;
    }
    const bool epoch_end = batch_in_epoch >= loader.batches_per_epoch();
    last_eval = evaluate(*run.model, *run.amp, d.test, d.norm, 256);
    const double ips = epoch_images / std::max(std::chrono::duration<double>(Clock::now() - epoch_start).count(), 1e-9);
    const double train_loss = epoch_batches ? epoch_loss / static_cast<double>(epoch_batches) : 0.0;
    const amp::GradScaler& scaler = run.amp->scaler();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "epoch %lld  train loss %.4f  test loss %.4f  test acc %.2f%%  %.0f img/s  scale %g  skipped %lld  "
                  "peak mem %.1f MiB",
                  static_cast<long long>(epoch), train_loss, last_eval.loss, 100 * last_eval.accuracy, ips,
                  scaler.get_scale(), static_cast<long long>(scaler.steps_skipped()),
                  memory_stats().peak_bytes / 1048576.0);
    log.epoch({{"epoch", epoch}, {"step", step}, {"train_loss", train_loss}, {"test_loss", last_eval.loss},
               {"test_accuracy", last_eval.accuracy}, {"images_per_sec", ips}, {"loss_scale", scaler.get_scale()},
               {"skipped_steps", scaler.steps_skipped()}, {"peak_memory_bytes", memory_stats().peak_bytes}},
              line);
    if (epoch_end) {
      ++epoch;
      batch_in_epoch = 0;
    }
    if (c.checkpoint_every == 0 || done) save();
  }
  // The report covers the whole run, resumed parts included, from metrics.jsonl.
  write_text(c.out + "/report.html", render_report("castor: " + c.model + " on " + c.data + ", " + c.amp, config,
                                                   read_metrics(c.out), op_dtypes));
  if (profiler) std::fprintf(stderr, "%s", profiler->table(15).c_str());
  Json::Object summary{{"test_accuracy", last_eval.accuracy},
                       {"test_loss", last_eval.loss},
                       {"train_images_per_sec", train_seconds > 0 ? images / train_seconds : 0.0},
                       {"steps", step},
                       {"skipped_steps", run.amp->scaler().steps_skipped()},
                       {"final_loss_scale", run.amp->scaler().get_scale()},
                       {"peak_memory_bytes", memory_stats().peak_bytes},
                       {"wall_seconds", std::chrono::duration<double>(Clock::now() - wall_start).count()},
                       {"out", c.out}};
  write_text(c.out + "/summary.json", Json(summary).dump(2) + "\n");
  return summary;
}

Json run_eval(const EvalConfig& e) {
  const bool dir = fs::is_directory(e.path);
  LoadedTensors model_file = dir ? LoadedTensors{} : load_safetensors(e.path);
  if (dir) {
    Checkpoint ck = read_checkpoint(e.path);
    model_file = {ck.model, ck.model_meta};
  }
  TrainConfig c;
  c.amp = "O0";  // weights without castor metadata are evaluated in float32
  auto it = model_file.metadata.find("castor.config");
  if (it != model_file.metadata.end()) {
    const Json cfg = Json::parse(it->second);
    c.data = cfg.at("data").as_string();
    c.model = cfg.at("model").as_string();
    c.amp = cfg.at("amp").as_string();
    c.dtype = parse_dtype(cfg.at("dtype").as_string());
    c.seed = static_cast<uint64_t>(cfg.at("seed").as_int());
    c.synthetic_size = cfg.at("synthetic_size").as_int();
    c.data_dir = cfg.at("data_dir").as_string();
    CASTOR_CHECK(e.model.empty() || e.model == c.model, "--model ", e.model, ": ", e.path, " holds a ", c.model);
    CASTOR_CHECK(e.data.empty() || e.data == c.data, "--data ", e.data, ": ", e.path, " was trained on ", c.data);
  } else {
    CASTOR_CHECK(!e.model.empty() && !e.data.empty(), e.path,
                 ": no castor metadata (castor.config); say what it holds with --model and --data");
    c.model = e.model;
    c.data = e.data;
  }
  if (!e.data_dir.empty()) c.data_dir = e.data_dir;
  Datasets d = load_data(c);
  Run run = build_run(c, d, 1);
  try {
    run.model->load_state_dict(model_file.tensors, /*strict=*/true);
  } catch (const Error& err) {
    throw Error(detail::cat(e.path, ": ", err.what()));
  }
  const Evaluation ev = evaluate(*run.model, *run.amp, d.test, d.norm, e.batch_size);
  return Json::Object{{"test_accuracy", ev.accuracy}, {"test_loss", ev.loss}, {"images", d.test.n},
                      {"checkpoint", e.path}};
}

std::string run_info(const std::vector<std::string>& args) {
  CASTOR_CHECK(args.size() == 1, "castor info: expected one FILE or DIR, got ", args.size(), " arguments");
  const std::string& path = args[0];
  std::vector<std::pair<std::string, LoadedTensors>> files;
  if (fs::is_directory(path)) {
    Checkpoint ck = read_checkpoint(path);
    files.push_back({"model.safetensors", {ck.model, ck.model_meta}});
    files.push_back({"train_state.safetensors", {ck.state, ck.state_meta}});
  } else {
    files.push_back({path, load_safetensors(path)});
  }
  std::string out;
  for (const auto& [name, f] : files) {
    int64_t bytes = 0, values = 0;
    out += name + ": " + std::to_string(f.tensors.size()) + " tensors\n";
    for (const auto& [k, t] : f.tensors) {
      out += "  " + k + "  " + dtype_name(t.dtype()) + shape_str(t.shape()) + "  " + std::to_string(t.numel()) + "\n";
      bytes += static_cast<int64_t>(t.nbytes());
      values += t.numel();
    }
    out += "  total " + std::to_string(values) + " values (parameters and buffers), " + std::to_string(bytes) +
           " bytes\n";
    for (const auto& [k, v] : f.metadata) out += "  metadata " + k + " = " + v + "\n";
  }
  return out;
}

}  // namespace castor::train
