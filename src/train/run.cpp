// The parts castor train and castor eval build from a config: the task, the evaluation loop, the model with its
// optimizer, opt level and schedule, and what config.json records.
#include <omp.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "castor/allocator.h"
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
#include "castor/model_source.h"
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
  // A quantized base's Linears (and a GGUF base's embedding) hold no parameter: their weights count as the values
  // they hold.
  std::function<void(const nn::Module&)> count = [&](const nn::Module& m) {
    for (const auto& [name, child] : m.named_children()) {
      if (const auto* l = dynamic_cast<const nn::Linear*>(child.get()); l && l->quantized)
        all += l->quantized->rows * l->quantized->cols;
      else if (const auto* e = dynamic_cast<const nn::Embedding*>(child.get()); e && e->quantized)
        all += e->quantized->rows * e->quantized->cols;
      else
        count(*child);
    }
  };
  count(model);
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

Tensor Task::loss(nn::Module& model, const Batch& b, F::Reduction reduction, double label_smoothing) const {
  const Tensor logits = model(b.input);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.target.reshape({-1}), reduction, label_smoothing,
                          data::kIgnoreIndex);
}

std::pair<double, std::vector<int64_t>> Task::scores(nn::Module& model, const amp::Amp& amp, const Batch& b) const {
  Tensor logits;
  {
    auto fw = amp.forward();
    logits = model(b.input);  // at O2/O3 the patched forward casts the input
  }
  const Tensor flat = logits.reshape({-1, logits.size(-1)}), target = b.target.reshape({-1});
  return {F::cross_entropy(flat, target, F::Reduction::Sum).item(), argmax(flat, 1).to_vector<int64_t>()};
}

// The one choice between the two kinds of task.
std::unique_ptr<Task> make_task(TrainConfig& c, int rank, int world, bool new_run) {
  if (is_language_model(c.model)) return make_lm_task(c, rank, world, new_run);
  return make_image_task(c, rank, world);
}

void take_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors& file, const Json& recorded) {
  if (is_language_model(c.model)) return take_lm_eval_settings(e, c, file, recorded);
  take_image_eval_settings(e, c, file, recorded);
}

Evaluation evaluate(const Task& task, nn::Module& model, const amp::Amp& amp, int64_t batch_size,
                    const std::function<void()>& idle) {
  model.eval();
  NoGradGuard no_grad;
  const int64_t K = task.num_classes(), n = task.eval_batches(batch_size);
  std::vector<double> sums(static_cast<size_t>(3 + K * K), 0.0);  // loss sum, correct, examples, the confusion counts
  const int world = dist::world_size();
  const int64_t turns = idle ? (n + world - 1) / world * world : n;
  for (int64_t i = dist::rank(); i < turns; i += world) {
    if (i >= n) {
      idle();
      continue;
    }
    const Batch b = task.eval_batch(i, batch_size);
    const auto [loss_sum, predicted] = task.scores(model, amp, b);
    sums[0] += loss_sum;  // targets of data::kIgnoreIndex (a fine-tuning row's prompt and padding) are left out
    const auto truth = b.target.reshape({-1}).to_vector<int64_t>();
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

namespace {

// ZeRO-3 sharding each block as the model is built (DeepSpeed's zero.Init): a full fine-tuning of a language model on
// several ranks. (A LoRA run's frozen base is sharded once built and loaded: apply_zero3.)
bool shards_as_built(const TrainConfig& c) {
  return c.zero >= 3 && dist::world_size() > 1 && c.lora_rank == 0 && is_language_model(c.model);
}

// load_weights_into's `filled` for a model sharded as it is built: each block given to `take` once the last of its
// parameters is read, so a file that stores the blocks one after another (safetensors' sorted names, a Hugging Face
// directory, GGUF) is never whole in memory; one that interleaves them (llm.c's) is, until its last block is read.
std::function<void(const std::string&)> take_blocks_when_read(nn::Module& model,
                                                              std::function<void(size_t, nn::Module&)> take) {
  nn::Sequential& blocks = dynamic_cast<models::LanguageModel&>(model).blocks();
  std::map<const TensorImpl*, size_t> owner;
  for (size_t i = 0; i < blocks.size(); ++i)
    for (const Tensor& p : blocks[i]->parameters()) owner[p.impl()] = i;
  auto block_of = std::make_shared<std::map<std::string, size_t>>();
  auto left = std::make_shared<std::vector<size_t>>(blocks.size(), 0);
  for (const auto& [name, p] : model.named_parameters())
    if (auto it = owner.find(p.impl()); it != owner.end()) {
      (*block_of)[name] = it->second;
      ++(*left)[it->second];
    }
  return [&blocks, block_of, left, take = std::move(take)](const std::string& name) {
    const auto it = block_of->find(name);
    if (it != block_of->end() && --(*left)[it->second] == 0) take(it->second, *blocks[it->second]);
  };
}

// ZeRO-3's blocks in the run: the optimizer updates their slices in place, and the model gathers each as it runs.
void use_sharded_blocks(Run& r, std::shared_ptr<nn::ShardedBlocks> zero3) {
  for (const auto& [param, slice] : zero3->slices()) r.opt->keep_param_slice(param, slice);  // (frozen: false)
  const std::weak_ptr<nn::ShardedBlocks> z = zero3;  // (the model does not keep its sharding alive)
  dynamic_cast<models::LanguageModel&>(*r.model).set_block_hooks({[z](size_t i) {
                                                                    if (auto s = z.lock()) s->gather(i);
                                                                  },
                                                                  [z](size_t i) {
                                                                    if (auto s = z.lock()) s->release(i);
                                                                  },
                                                                  [z](size_t i) {
                                                                    if (auto s = z.lock()) s->prefetch(i);
                                                                  }});
  r.zero3 = std::move(zero3);
}

}  // namespace

int64_t shard_alignment(const TrainConfig& c) {
  return c.optimizer == OptimizerKind::AdamW8bit ? optim::AdamW8bitOptions{}.block_size : 1;
}

Run build_run(const TrainConfig& c, const Task& task, int64_t total_steps, bool load_init) {
  Run r;
  manual_seed(c.seed);
  const bool loads = !c.init.empty() && (load_init || c.lora_rank > 0);  // (a LoRA run's checkpoints: adapters only)
  amp::Overrides ov;
  if (c.loss_scale) ov.loss_scale = *c.loss_scale;
  if (c.stochastic_rounding) {
    ov.rounding = optim::Rounding::Stochastic;
    ov.rounding_seed = c.seed;
  }
  // ZeRO-3 of a full fine-tuning: each block, as soon as it is drawn (or read from --init), is cast to the dtypes
  // amp::initialize gives it and each rank keeps its slice of rank 0's values: no rank holds more than its slices
  // and one whole block (beside the embeddings and output layer) while the model is built.
  std::shared_ptr<nn::ShardedBlocks> zero3;
  if (shards_as_built(c)) zero3 = std::make_shared<nn::ShardedBlocks>(dist::default_group(), shard_alignment(c));
  const amp::Properties props = amp::properties_for(c.amp, c.dtype, ov);
  const auto take_block = [&zero3, &props](size_t i, nn::Module& block) {
    amp::cast_parameters(block, props);
    zero3->add(i, block.parameters(), /*broadcast=*/true);
  };
  {
    // A LoRA run's base is frozen: at O1-O3 it is made in the 16-bit dtype the run keeps it in (amp::initialize).
    const bool frozen_16bit = c.lora_rank > 0 && c.amp != amp::OptLevel::O0;
    std::optional<nn::LoadInitGuard> empty;
    // (a LoRA run's Linear weights, and a sharded run's, hold no memory until loaded: a quantized one is never dense)
    if (loads) empty.emplace(frozen_16bit ? c.dtype : DType::Float32, /*placeholders=*/c.lora_rank > 0 || zero3);
    std::optional<nn::BlockInitGuard> sharded;
    if (zero3) sharded.emplace([&](nn::Module& block) { take_block(zero3->size(), block); });  // (in order)
    r.model = task.make_model(c);
  }
  check_lora_base(c);
  if (loads) {
    try {
      if (c.lora_rank > 0)
        load_base(*r.model, c.init, c);
      else
        formats::load_weights_into(*r.model, c.init, zero3 ? take_blocks_when_read(*r.model, take_block) : nullptr);
    } catch (const Error& e) {
      const std::string msg = e.what();  // names the file when reading it failed; name the flag too
      throw Error(msg.rfind(c.init, 0) == 0 ? "--init " + msg : detail::cat("--init ", c.init, ": ", msg));
    }
  }
  if (c.lora_rank > 0) apply_run_lora(c, *r.model);
  r.opt = make_optimizer(c, task, *r.model);
  CASTOR_ASSERT(r.opt->shard_alignment() == shard_alignment(c), "the optimizer's shard alignment is not the run's");
  // Every rank starts from rank 0's weights; the wrapper is made before amp::initialize (which changes the
  // parameters in place), so O2/O3 masters copy the broadcast values.
  if (dist::world_size() > 1) {
    if (c.sync_batchnorm) nn::convert_sync_batchnorm(*r.model);
    nn::DDPOptions o;
    if (c.compress_grads != Compression::None)
      o.compression = c.compress_grads == Compression::BFloat16 ? DType::BFloat16 : DType::Float16;
    o.reduce_scatter = c.zero >= 2;  // (into the optimizer's slices)
    o.shard_alignment = r.opt->shard_alignment();
    r.ddp = std::make_shared<nn::DistributedDataParallel>(r.model, o);
    // ZeRO: sharded before amp::initialize, which then makes each rank's slice of the O2/O3 masters only (never a
    // whole float32 copy of the model on every rank).
    if (c.zero > 0) r.opt->shard(&dist::default_group());
  }
  if (zero3) use_sharded_blocks(r, std::move(zero3));  // (the masters are made from the slices)
  r.amp = amp::initialize(*r.model, {r.opt.get()}, c.amp, c.dtype, ov);
  r.sched = make_scheduler(c, *r.opt, total_steps);
  return r;
}

namespace {

// The bytes the optimizer adds at its first step per trainable element: its moments (SGD's momentum buffer; 8-bit
// AdamW's two codes and a float32 absmax per block of each) and, at O1 without recompute, the 16-bit copies of the
// weights it keeps for the next forward.
double first_step_bytes(const TrainConfig& c, bool recompute) {
  const double moments = c.optimizer == OptimizerKind::Sgd         ? (c.momentum > 0 ? 4 : 0)
                         : c.optimizer == OptimizerKind::AdamW8bit ? 2 + 8.0 / optim::AdamW8bitOptions{}.block_size
                                                                   : 8;
  return moments + (c.amp == amp::OptLevel::O1 && !recompute ? 2 : 0);
}

// The allocator's peak over one forward and backward of a (1, T) batch of token 0, above what was held before it;
// the gradients are dropped after it and the default generator (dropout) restored.
double probe_peak(const Task& task, Run& r, int64_t T) {
  const Generator::State rng = default_generator().state();
  const Batch b{zeros({1, T}, DType::Int64), zeros({1, T}, DType::Int64), 0, static_cast<double>(T)};
  const int64_t base = memory_stats().current_bytes;
  reset_peak_memory_stats();
  {
    Tensor loss;
    {
      auto fw = r.amp->forward();
      loss = task.loss(*r.model, b, F::Reduction::Mean, 0.0);
    }
    loss.backward();
  }
  if (r.zero3) r.zero3->release_all();  // (the blocks a forward without recompute left gathered)
  const double peak = static_cast<double>(memory_stats().peak_bytes - base);
  r.opt->zero_grad();
  default_generator().set_state(rng);
  return peak;
}

// The peak of one step of (B, T) batches, estimated from probes of rows of t, 2t and 4t tokens as a + B (b T + c T^2).
double estimate_peak(const TrainConfig& c, const Task& task, Run& r, double held) {
  const int64_t T = c.block_size, B = c.batch_size;
  double activations;
  if (T < 4) {
    activations = B * probe_peak(task, r, T);
  } else {
    const int64_t t = std::min<int64_t>(16, T / 4);
    const double p1 = probe_peak(task, r, t), p2 = probe_peak(task, r, 2 * t), p3 = probe_peak(task, r, 4 * t);
    const double tt = static_cast<double>(t);
    const double quad = std::max(0.0, ((p3 - p2) - 2 * (p2 - p1)) / (6 * tt * tt));
    const double lin = std::max(0.0, (p2 - p1 - 3 * quad * tt * tt) / tt);
    const double fixed = p1 - lin * tt - quad * tt * tt;
    activations = fixed + B * (lin * T + quad * T * static_cast<double>(T));
  }
  return held + activations;
}

}  // namespace

std::string apply_recompute(const TrainConfig& c, const Task& task, Run& r) {
  auto* lm = dynamic_cast<models::LanguageModel*>(r.model.get());
  if (!lm) return "";
  // Under recompute the forward holds one block's 16-bit casts of the weights at a time: the optimizer keeps no copy of
  // them between steps either (2 bytes a trained parameter less, a cast a weight more per forward).
  const auto recompute = [&](bool on) {
    lm->set_recompute(on);
    r.opt->set_keep_casts(!on);
  };
  if (c.recompute != Recompute::Auto) {
    recompute(c.recompute == Recompute::Blocks);
    return name(c.recompute);
  }
  CASTOR_CHECK(c.memory_budget > 0, "--recompute auto: needs --memory-budget GiB (the memory the run may take)");
  int64_t trainable = 0;
  for (const Tensor& p : r.model->parameters())
    if (p.requires_grad()) trainable += p.numel();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double now = static_cast<double>(memory_stats().current_bytes);
  recompute(false);
  const double plain = estimate_peak(c, task, r, now + first_step_bytes(c, false) * trainable) / gib;
  recompute(true);
  const double recomputed = estimate_peak(c, task, r, now + first_step_bytes(c, true) * trainable) / gib;
  const bool blocks = plain > c.memory_budget;
  // (GiB to three significant digits; the smallest budget rounded up at the third)
  const double unit = std::pow(10.0, std::floor(std::log10(std::max(recomputed, 1e-9))) - 2);
  CASTOR_CHECK(recomputed <= c.memory_budget, "--memory-budget ", figure("%.3g", c.memory_budget),
               ": the run needs about ", figure("%.3g", recomputed),
               " GiB even with --recompute blocks; the smallest budget that fits is ",
               figure("%.3g", std::ceil(recomputed / unit) * unit), " (or a smaller --batch-size or --block-size)");
  recompute(blocks);
  return detail::cat("auto: ", blocks ? "blocks" : "none", " (estimated peak ", figure("%.3g", plain),
                     " GiB without recompute, ", figure("%.3g", recomputed), " GiB with; budget ",
                     figure("%.3g", c.memory_budget), " GiB)");
}

void apply_zero3(const TrainConfig& c, Run& r) {
  if (c.zero < 3 || dist::world_size() < 2 || r.zero3) return;  // (a full fine-tuning's blocks: sharded as built)
  auto* lm = dynamic_cast<models::LanguageModel*>(r.model.get());
  CASTOR_CHECK(lm, "--zero 3: shards a language model's blocks; --model ", name(c.model), " has none");
  std::vector<std::vector<Tensor>> groups;
  nn::Sequential& blocks = lm->blocks();
  for (size_t i = 0; i < blocks.size(); ++i) groups.push_back(blocks[i]->parameters());
  use_sharded_blocks(
      r, std::make_shared<nn::ShardedBlocks>(std::move(groups), dist::default_group(), r.opt->shard_alignment()));
}

void load_sharded_model(nn::Module& model, nn::ShardedBlocks& zero3, const StateDict& tensors) {
  StateDict rest = tensors;
  std::set<std::string> sharded;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!zero3.holds(p)) continue;
    const auto it = rest.find(name);
    CASTOR_CHECK(it != rest.end(), "Error(s) in loading state_dict for ", model.type_name(),
                 ": Missing key(s) in state_dict: \"", name, "\".");
    zero3.load(p, it->second);
    rest.erase(it);
    sharded.insert(name);
  }
  const nn::LoadResult loaded = model.load_state_dict(rest, /*strict=*/false);
  for (const std::string& key : loaded.missing_keys)
    CASTOR_CHECK(sharded.count(key), "Error(s) in loading state_dict for ", model.type_name(),
                 ": Missing key(s) in state_dict: \"", key, "\".");
  CASTOR_CHECK(loaded.unexpected_keys.empty(), "Error(s) in loading state_dict for ", model.type_name(),
               ": Unexpected key(s) in state_dict: \"", loaded.unexpected_keys.front(), "\".");
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
  o["openmp_wait"] = openmp_wait_in_effect();
  o["nproc"] = dist::world_size();
  o["schedule_steps"] = schedule_steps;
  if (!c.precision_reason.empty()) o["precision_auto"] = c.precision_reason;  // why amp and dtype are what they are
  task.record(o);
  if (const Family* f = family_of(c.model)) o["model_config"] = f->describe(c);  // the model, described
  record_lora_patterns(c, o);
  const Json build = build_json();
  for (const auto& [k, v] : build.as_object()) o[k] = v;
  o["started"] = utc_now();
  return o;
}

}  // namespace castor::train
