// The parts castor train and castor eval build from a config: the task, the evaluation loop, the model with its
// optimizer, opt level and schedule, and what config.json records.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "castor/autograd.h"
#include "castor/checkpoint.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/lm_batch.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/trainer.h"
#include "castor/version.h"
#include "train/family.h"
#include "train/lora_run.h"
#include "train/task.h"

namespace castor::train {

namespace {

// The parameters that train (a LoRA base's are frozen: no optimizer state).
std::vector<Tensor> trainable(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// SGD, or Adam/AdamW/AdamW8bit over the task's parameter groups (the second without weight decay).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const Task& task, const nn::Module& model) {
  if (c.optimizer == OptimizerKind::Sgd)
    return std::make_unique<optim::SGD>(
        trainable(model.parameters()),
        optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  const auto [all_decay, all_no_decay] = task.param_groups(model);
  const std::vector<Tensor> decay = trainable(all_decay), no_decay = trainable(all_no_decay);
  optim::AdamOptions o{.lr = c.lr, .beta2 = c.beta2, .weight_decay = c.weight_decay};
  std::unique_ptr<optim::Optimizer> opt;
  if (c.optimizer == OptimizerKind::AdamW8bit)
    opt = std::make_unique<optim::AdamW8bit>(
        decay, optim::AdamW8bitOptions{.lr = c.lr, .beta2 = c.beta2, .weight_decay = c.weight_decay});
  else if (c.optimizer == OptimizerKind::Adam)
    opt = std::make_unique<optim::Adam>(decay, o);
  else
    opt = optim::make_adamw(decay, o);
  if (!no_decay.empty()) opt->add_param_group(no_decay, c.lr, /*weight_decay=*/0.0);
  return opt;
}

// The --schedule of `total_steps` steps (none: null).
std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainConfig& c, optim::Optimizer& opt, int64_t total_steps) {
  if (c.schedule == Schedule::Step)
    return std::make_unique<optim::StepLR>(opt, std::max<int64_t>(total_steps / 3, 1), 0.1);
  if (c.schedule == Schedule::Cosine) return std::make_unique<optim::CosineAnnealingLR>(opt, total_steps);
  if (c.schedule == Schedule::WarmupCosine)
    return std::make_unique<optim::WarmupCosineLR>(opt, c.warmup_steps, total_steps, c.min_lr);
  if (c.schedule == Schedule::OneCycle)
    return std::make_unique<optim::OneCycleLR>(opt, optim::OneCycleLROptions{{c.lr}, total_steps});
  return nullptr;
}

}  // namespace

std::pair<int64_t, int64_t> parameter_counts(const nn::Module& model) {
  int64_t trainable = 0, all = 0;
  for (const Tensor& p : model.parameters()) {
    all += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  return {trainable, all};
}

std::string trainable_parameters_text(int64_t trainable, int64_t all) {
  auto grouped = [](int64_t n) {  // Python's format(n, ",d")
    std::string digits = std::to_string(n), out;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  };
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%.4f", all > 0 ? 100.0 * static_cast<double>(trainable) / all : 0.0);
  return "trainable params: " + grouped(trainable) + " || all params: " + grouped(all) + " || trainable%: " + percent;
}

std::string trainable_parameters_text(const nn::Module& model) {
  const auto [trainable, all] = parameter_counts(model);
  return trainable_parameters_text(trainable, all);
}

void Task::load_init(nn::Module& model, const TrainConfig& c) const {
  model.load_state_dict(models::load_weights_file(c.init, "").tensors, /*strict=*/true);
}

std::unique_ptr<Task> make_task(TrainConfig& c, int rank, int world, bool new_run) {
  if (is_language_model(c.model)) return make_lm_task(c, rank, world, new_run);
  return make_image_task(c, rank, world);
}

Evaluation evaluate(const Task& task, nn::Module& model, const amp::Amp& amp, int64_t batch_size) {
  model.eval();
  NoGradGuard no_grad;
  const int64_t K = task.num_classes(), n = task.eval_batches(batch_size);
  std::vector<double> sums(static_cast<size_t>(3 + K * K), 0.0);  // loss sum, correct, examples, the confusion counts
  const int world = dist::world_size();
  for (int64_t i = dist::rank(); i < n; i += world) {
    const Batch b = task.eval_batch(i, batch_size);
    Tensor logits;
    {
      auto fw = amp.forward();
      logits = model(b.input);  // at O2/O3 the patched forward casts the input
    }
    const Tensor flat = logits.reshape({-1, logits.size(-1)}), target = b.target.reshape({-1});
    // Targets of data::kIgnoreIndex (a fine-tuning row's prompt and padding) are left out of all three.
    sums[0] += F::cross_entropy(flat, target, F::Reduction::Sum, 0.0, data::kIgnoreIndex).item();
    const auto predicted = argmax(flat, 1).to_vector<int64_t>(), truth = target.to_vector<int64_t>();
    for (size_t k = 0; k < truth.size(); ++k) {
      if (truth[k] == data::kIgnoreIndex) continue;
      sums[1] += predicted[k] == truth[k];
      if (K > 0) sums[static_cast<size_t>(3 + truth[k] * K + predicted[k])] += 1;
      sums[2] += 1;
    }
  }
  model.train();
  if (world > 1) {
    Tensor t = tensor(sums, {static_cast<int64_t>(sums.size())}, DType::Float64);
    dist::all_reduce(t);
    sums = t.to_vector<double>();
  }
  Evaluation ev{sums[0] / sums[2], sums[1] / sums[2], {}};
  for (size_t k = 3; k < sums.size(); ++k) ev.confusion.push_back(static_cast<int64_t>(sums[k]));
  return ev;
}

Run build_run(const TrainConfig& c, const Task& task, int64_t total_steps, bool load_init) {
  Run r;
  manual_seed(c.seed);
  r.model = task.make_model(c);
  check_lora_base(c);
  if (!c.init.empty() && (load_init || c.lora_rank > 0)) {  // (a LoRA run's checkpoints hold its adapters only)
    try {
      task.load_init(*r.model, c);
    } catch (const Error& e) {
      const std::string msg = e.what();  // names the file when reading it failed; name the flag too
      throw Error(msg.rfind(c.init, 0) == 0 ? "--init " + msg : detail::cat("--init ", c.init, ": ", msg));
    }
  }
  if (c.lora_rank > 0) apply_run_lora(c, *r.model);
  // Every rank starts from rank 0's weights; the wrapper is made before amp::initialize (which changes the
  // parameters in place), so O2/O3 masters copy the broadcast values.
  if (dist::world_size() > 1) {
    if (c.sync_batchnorm) nn::convert_sync_batchnorm(*r.model);
    nn::DDPOptions o;
    if (c.compress_grads != Compression::None)
      o.compression = c.compress_grads == Compression::BFloat16 ? DType::BFloat16 : DType::Float16;
    r.ddp = std::make_shared<nn::DistributedDataParallel>(r.model, o);
  }
  r.opt = make_optimizer(c, task, *r.model);
  amp::Overrides ov;
  if (c.loss_scale) ov.loss_scale = Json(*c.loss_scale).dump();
  if (c.stochastic_rounding) {
    ov.rounding = optim::Rounding::Stochastic;
    ov.rounding_seed = c.seed;
  }
  r.amp = amp::initialize(*r.model, {r.opt.get()}, c.amp, c.dtype, ov);
  r.sched = make_scheduler(c, *r.opt, total_steps);
  return r;
}

std::string figure(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

Json build_json() {
  return Json::Object{{"castor_version", CASTOR_VERSION}, {"git_commit", git_commit()}, {"host_cpu", host_cpu()}};
}

Json config_json(const TrainConfig& c, const Task& task, int64_t schedule_steps) {
  Json o = settings_json(c);
  o["threads"] = omp_get_max_threads();
  o["nproc"] = dist::world_size();
  o["schedule_steps"] = schedule_steps;
  if (!c.precision_reason.empty()) o["precision_auto"] = c.precision_reason;  // why amp and dtype are what they are
  task.record(o);
  if (const Family* f = family_of(c.model)) o["model_config"] = f->describe(c);  // the model, described
  const Json build = build_json();
  for (const auto& [k, v] : build.as_object()) o[k] = v;
  o["started"] = utc_now();
  return o;
}

}  // namespace castor::train
