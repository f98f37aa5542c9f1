// castor train --dry-run: each rank's memory plan for --nproc ranks at ZeRO stages 0-3, from the sharding plan.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "castor/dist.h"
#include "castor/optim.h"
#include "castor/tokenizer.h"
#include "castor/trainer.h"
#include "train/family.h"
#include "train/lora_run.h"
#include "train/task.h"

namespace castor::train {

namespace {

// Bytes rank 0 (whose slice is the largest: dist::shard_of gives the padding to the last ranks) holds between steps.
struct StagePlan {
  int zero = 0;
  double weights = 0, weight_copies = 0, masters = 0, moments = 0, gradients = 0;
  double in_flight = 0;  // held only during a step: stage 3's gathered block and the next one prefetched
  double total() const { return weights + weight_copies + masters + moments + gradients; }
};

// The optimizer's state bytes for `n` elements of a parameter of `shape` (its slice when sharded).
double moment_bytes(const TrainConfig& c, const Shape& shape, int64_t n) {
  switch (c.optimizer) {
    case OptimizerKind::Sgd: return c.momentum > 0 ? 4.0 * n : 0.0;
    case OptimizerKind::AdamW8bit: {
      const optim::AdamW8bitOptions o;
      if (!optim::AdamW8bit::is_8bit(shape, o)) return 8.0 * n;
      return 2.0 * n + 8.0 * ((n + o.block_size - 1) / o.block_size);  // two codes, two float32 absmax a block
    }
    default: return 8.0 * n;  // Adam, AdamW: two float32 moments
  }
}

// The transformer block a parameter belongs to ("layers.3", "transformer.h.3"), or "" for one outside the blocks.
std::string block_of(const std::string& name) {
  size_t at = 0;
  while ((at = name.find('.', at)) != std::string::npos) {
    size_t end = at + 1;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > at + 1 && end < name.size() && name[end] == '.') return name.substr(0, end);
    ++at;
  }
  return "";
}

StagePlan plan_stage(const TrainConfig& c, const nn::Module& model, int world, int zero) {
  StagePlan s;
  s.zero = zero;
  const int stage = world > 1 ? zero : 0;  // (one process shards nothing)
  const int64_t align = shard_alignment(c);
  const bool sixteen = c.amp == amp::OptLevel::O2 || c.amp == amp::OptLevel::O3;
  std::map<std::string, double> blocks;
  for (const auto& [name, p] : model.named_parameters()) {
    const int64_t n = p.numel(), slice = dist::shard_of(n, 0, world, align).length;
    const double size = static_cast<double>(dtype_size(sixteen ? p.dtype() : DType::Float32));
    // Stage 3 shards the blocks' weights; the rest (embeddings, final norm, output layer) stays whole.
    const std::string block = block_of(name);
    s.weights += size * (stage >= 3 && !block.empty() ? slice : n);
    if (stage >= 3) blocks[block] += size * n;
    if (!p.requires_grad()) continue;
    const int64_t owned = stage >= 1 ? slice : n;  // masters and state: the rank's slice from stage 1
    // O1 keeps 16-bit copies of the weights for the next forward, unless blocks are recomputed.
    if (c.amp == amp::OptLevel::O1 && c.recompute != Recompute::Blocks) s.weight_copies += dtype_size(c.dtype) * n;
    if (c.amp == amp::OptLevel::O2 && p.dtype() != DType::Float32) s.masters += 4.0 * owned;
    s.moments += moment_bytes(c, p.shape(), owned);
    // Stages 0-1: the gradient in the weight's dtype, and with several ranks DDP's float32 bucket buffers (kept);
    // from stage 2 the float32 slice of the average (a bucket's gradients are freed once reduce-scattered).
    s.gradients += stage >= 2 ? 4.0 * slice : size * n + (world > 1 ? 4.0 * n : 0.0);
  }
  blocks.erase("");
  double first = 0, second = 0;  // the two largest blocks
  for (const auto& [b, bytes] : blocks) {
    second = std::max(second, std::min(first, bytes));
    first = std::max(first, bytes);
  }
  s.in_flight = first + second;
  return s;
}

// The model of `c`'s sizes, its weights never drawn nor touched (nn::LoadInitGuard: the layers' own dtypes at O2/O3).
std::shared_ptr<models::LanguageModel> plan_model(TrainConfig& c) {
  const Family& f = family(c);
  if (!c.init.empty()) f.take_init_sizes(c, "");
  if (c.vocab_size == 0) {
    const std::string dir = data_dir(c);
    CASTOR_CHECK(!data::token_record_path(dir).empty(), "--dry-run: give --vocab-size (or --init, or a --data-dir ",
                 "with a tokenizer record): ", dir, " has none");
    c.vocab_size = data::Tokenizer::recorded_vocab_size(dir);
    if (f.pads_vocab && c.vocab_size > 1024) c.vocab_size = (c.vocab_size + 63) / 64 * 64;
  }
  f.check(c);
  const bool sixteen = c.amp == amp::OptLevel::O2 || c.amp == amp::OptLevel::O3;
  nn::LoadInitGuard empty(sixteen ? c.dtype : DType::Float32);
  return f.make(c, c.vocab_size, c.seed);
}

}  // namespace

Json run_dry_run(TrainConfig c) {
  CASTOR_CHECK(is_language_model(c.model), "--dry-run: plans language models (--model gpt, llama, ...), not --model ",
               name(c.model));
  const std::shared_ptr<models::LanguageModel> model = plan_model(c);
  if (c.lora_rank > 0) apply_run_lora(c, *model);
  const int world = std::max(1, c.nproc);  // (0: not given)
  const auto [trainable, all] = parameter_counts(*model);
  const double gib = double(int64_t{1} << 30);
  std::printf(
      "memory plan per rank, %d rank%s, %s, %s: %lld parameters (%lld trainable), between steps (GiB; "
      "activations and buffers in flight left out)\n",
      world, world > 1 ? "s" : "", precision_name(c).c_str(), name(c.optimizer), static_cast<long long>(all),
      static_cast<long long>(trainable));
  std::printf("%-6s %9s %9s %9s %9s %9s %9s %11s\n", "zero", "weights", "copies", "masters", "state", "grads", "total",
              "+gathered");
  Json::Array stages;
  for (int zero = 0; zero <= 3; ++zero) {
    const StagePlan s = plan_stage(c, *model, world, zero);
    std::printf("%-6s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %11.3f\n",
                (std::to_string(zero) + (zero == c.zero ? " *" : "")).c_str(), s.weights / gib, s.weight_copies / gib,
                s.masters / gib, s.moments / gib, s.gradients / gib, s.total() / gib, s.in_flight / gib);
    stages.push_back(Json::Object{{"zero", zero},
                                  {"weights_bytes", s.weights},
                                  {"weight_copies_bytes", s.weight_copies},
                                  {"masters_bytes", s.masters},
                                  {"state_bytes", s.moments},
                                  {"gradients_bytes", s.gradients},
                                  {"total_bytes", s.total()},
                                  {"gathered_bytes", s.in_flight}});
  }
  return Json::Object{{"dry_run", true}, {"nproc", world},         {"zero", c.zero},
                      {"params", all},   {"trainable", trainable}, {"stages", stages}};
}

}  // namespace castor::train
