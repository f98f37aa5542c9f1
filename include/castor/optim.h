// Optimizers with float32 master state (SGD, Adam, AdamW, 8-bit AdamW) following PyTorch 1.13's update formulas.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/dist.h"
#include "castor/random.h"
#include "castor/state_dict.h"
#include "castor/tensor.h"

namespace castor::optim {

// One parameter as the optimizer sees it. The math is float32 whatever the parameter's dtype:
//  - `master` is the float32 master weight of a 16-bit parameter when master weights are on (Apex O2),
//    undefined otherwise (a float32 parameter is updated in place; a 16-bit one without a master through a
//    float32 temporary, then rounded back).
//  - a float32 gradient may be staged for the next step (Optimizer::stage_float32_grad: GradScaler::unscale_
//    stages the unscaled gradients); when none is, step() reads param.grad() and widens it. A step clears it.
//  - `state` holds the per-parameter state, float32 like PyTorch's: "step" (0-dim), "exp_avg",
//    "exp_avg_sq", "max_exp_avg_sq" (Adam), "momentum_buffer" (SGD with momentum); AdamW8bit's 8-bit states are
//    uint8 codes and float32 block absmaxes (see AdamW8bit).
// Sharded (Optimizer::shard, ZeRO), `master` and every state of the parameter's shape hold only this rank's slice
// of the flattened parameter (`shard`), and a state of blocks (AdamW8bit's absmaxes) the slice's blocks.
struct ParamSlot {
  Tensor param;
  Tensor master;
  std::map<std::string, Tensor> state;
  dist::Shard shard;  // this rank's slice of the flattened parameter (the whole of it unsharded)
  // ZeRO-3 (Optimizer::keep_param_slice): the parameter's own storage between uses, this rank's slice of it
  // (shard.chunk elements of its dtype); the step updates the parameter there. Undefined otherwise.
  Tensor kept_slice;
  // The float32 gradient staged for the next step, undefined when none is.
  const Tensor& staged_grad() const { return staged_grad_; }

 private:
  friend class Optimizer;
  Tensor staged_grad_;
  Tensor grad_buffer_;  // float32, contiguous, kept between steps (Optimizer::float32_grad_buffer)
  Tensor cast_copy_;    // a float32 parameter rounded to 16 bits by the step for autocast (amp::keep_cast)
};

struct ParamGroup {
  std::vector<ParamSlot> slots;
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::string name;  // optional, for reports
};

// How an updated float32 value is written back into a 16-bit parameter: round to nearest even, or
// stochastic rounding (rounds up with probability equal to the distance from the value below, so the
// expected result is exact; the random bits come from rounding_generator(), so runs are reproducible).
enum class Rounding { Nearest, Stochastic };

// Where an update's float32 result goes besides the master: a 16-bit parameter, rounded to nearest or
// stochastically with random bits seeded per block from `key` (one key per parameter and step).
struct WriteBack {
  Tensor param;
  bool stochastic = false;
  uint64_t key = 0;
};

// One parameter's share of a step's multi-tensor pass: body(b, e) updates elements [b, e) of its n, where b is a
// multiple of `unit` (a multiple of kBlock, 2048) and e = min(n, b + unit). Every block is independent of the
// others, so the step runs the blocks of all parameters in one parallel loop. n = 0: the update did its work.
struct BlockPass {
  int64_t n = 0;
  int64_t unit = 2048;
  std::function<void(int64_t, int64_t)> body;
};

class Optimizer;

// Stands in for a plain Optimizer::step() (Apex's patched optimizer.step): amp::initialize installs one so that
// `opt.step()` after `scale_loss` unscales once, skips on inf/NaN and updates the scale.
class StepInterceptor {
 public:
  virtual ~StepInterceptor() = default;
  // Called by step() instead of the update; takes the step through its own path (which ends in apply_step()).
  virtual void intercept_step(Optimizer& optimizer) = 0;
  // Called before the optimizer's gradients are read outside a step (master_params, clip_grad_norm_): makes
  // them the ones the step will use (unscales them once).
  virtual void prepare_gradients(Optimizer& optimizer) = 0;
};

class Optimizer {
 public:
  Optimizer();
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // With a step interceptor installed, hands the step to it; otherwise apply_step().
  void step();
  // Applies one update to every parameter that has a gradient (staged, or in .grad) and counts
  // the step, bypassing any interceptor (GradScaler calls it once the gradients are unscaled and finite).
  void apply_step();
  // Not owned; nullptr removes it. An interceptor calls release_step_interceptor() when it goes away.
  void set_step_interceptor(StepInterceptor* interceptor) { interceptor_ = interceptor; }
  StepInterceptor* step_interceptor() const { return interceptor_; }
  // Drops (set_to_none) or zeroes every .grad, and clears every staged gradient.
  void zero_grad(bool set_to_none = true);

  // Staged float32 gradients: the next step uses the slot's staged gradient instead of widening .grad, then
  // clears it. `grad32` is float32 with the parameter's shape (any strides); sharded, also (shard.length) elements
  // of this rank's slice alone (ZeRO-2's reduce-scattered gradient).
  void stage_float32_grad(size_t group, size_t index, Tensor grad32);
  // A contiguous float32 tensor of the slot's shape to compute a staged gradient into, reused between steps and
  // never sharing storage with .grad.
  Tensor float32_grad_buffer(size_t group, size_t index);
  // Every slot's staged gradient in group order (undefined where none), and clearing them all.
  std::vector<Tensor> staged_grads() const;
  // Clears every staged gradient and the folded multipliers.
  void clear_staged_grads();
  // A GradScaler's unscale and a gradient clip folded into the next step (GradScaler::unscale_clip_): the update
  // reads each gradient g (staged or .grad, widened) as (g * inv_scale) * clip_coef in registers, each product
  // rounded to float32 as unscale_ and clip_grad_norm_ would store them, and .grad is left as it is (scaled).
  // A step, zero_grad and clear_staged_grads reset both to 1.
  void fold_into_step(float inv_scale, float clip_coef);
  bool has_folded_multipliers() const { return folded_; }

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Parameters must be float32/float16/bfloat16 contiguous leaves, each in one group only; lr and
  // weight_decay must be non-negative.
  void add_param_group(const std::vector<Tensor>& params, double lr, double weight_decay);

  // On: every 16-bit parameter (also ones added later) gets a float32 master copy, made from its current
  // value; the update goes to the master and the parameter is the master rounded. Off: masters are dropped.
  void set_master_weights(bool on);
  bool master_weights() const { return master_weights_; }
  // On (the default): a float32 parameter that autocast cast in the last forward gets its 16-bit copy for the next
  // forward rounded in the update's pass (amp::keep_cast; 2 bytes a parameter held between steps). Off: none is kept
  // (and those held are dropped), and each forward casts afresh, the same values: for memory (--recompute blocks,
  // whose forward holds one block's casts at a time).
  void set_keep_casts(bool on);
  bool keep_casts() const { return keep_casts_; }
  // ZeRO stage 1 (DeepSpeed's; llm.c's zero_stage 1): each rank of `group` keeps the float32 master weight and the
  // state of only its slice of every parameter (dist::shard_of, aligned to shard_alignment()), updates that slice,
  // and the step ends with every parameter all-gathered (in its own dtype), so all ranks hold the same weights. The
  // gradients read by a step are the whole parameter's (averaged by DDP; the step takes its slice) or a float32
  // slice staged with stage_float32_grad (ZeRO-2: shard_grads()). The updates are elementwise, so with nearest
  // rounding the weights are bit-equal to the unsharded optimizer's (stochastic rounding draws other bits). The
  // state dicts stay whole: state_dict() gathers every slice (a collective: every rank calls it) and
  // load_state_dict() takes a whole dict and keeps this rank's slices, so a checkpoint resumes on any world size.
  // Existing state is kept (resliced). nullptr: unsharded again.
  void shard(dist::ProcessGroup* group);
  dist::ProcessGroup* shard_group() const { return shard_group_; }
  // ZeRO-3, on a sharded optimizer: `param` lives between uses only as this rank's slice `slice` (shard.chunk
  // elements of its dtype; nn::ShardedBlocks gathers it for each use), so the step updates the slice there and
  // leaves that parameter out of its all-gather. False for a parameter it does not update (a frozen one);
  // castor::Error for a slice of the wrong size or dtype.
  bool keep_param_slice(const Tensor& param, const Tensor& slice);
  // Shards start at multiples of this many elements (AdamW8bit: its block size, so no block straddles two ranks).
  virtual int64_t shard_alignment() const { return 1; }
  // state_dict(copies = false) without the gathers: each sharded tensor is this rank's slice, flattened (aliases),
  // and `where` receives, under its key, the whole tensor's shape and the slice's first element in it (flattened).
  // Keys not in `where` are whole on every rank. For checkpoints that each rank writes its part of.
  struct SliceOf {
    Shape shape;
    int64_t begin = 0;
  };
  StateDict state_dict_slices(std::map<std::string, SliceOf>& where) const;
  // The slot's float32 master weight, whole (sharded: gathered from every rank, a collective); undefined if none.
  Tensor whole_master(const ParamSlot& slot) const;
  // The rounding applies to every write-back into a 16-bit parameter (with or without masters).
  void set_rounding(Rounding r, uint64_t seed = 0);
  Rounding rounding() const { return rounding_; }
  Generator& rounding_generator() { return rounding_gen_; }

  // step() calls so far, and steps a GradScaler skipped (found inf/NaN gradients) and reported through
  // note_skipped_step(); LR schedulers use their sum for PyTorch's call-order warning.
  int64_t step_count() const { return step_count_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  void note_skipped_step() { ++skipped_steps_; }

  // Named tensors (copies; with copies false, aliases of the live state: for writing it out at once without a second
  // copy in memory), with groups g and slots i numbered in order:
  //   "state.<g>.<i>.<name>"  each slot state tensor (see ParamSlot)
  //   "master.<g>.<i>"        the float32 master weight, when there is one
  //   "group.<g>.lr", "group.<g>.weight_decay" (float64 0-dim), "group.<g>.size" (int64 0-dim, #params)
  //   "step_count", "skipped_steps" (int64 0-dim), "rounding_generator" (int64[6], the generator's state)
  // load_state_dict() takes such a dict for an optimizer with the same groups of the same shapes and
  // master-weight setting; it validates everything before changing anything and throws castor::Error
  // naming the offending key (unknown, missing, wrong shape or dtype, wrong parameter count).
  virtual StateDict state_dict(bool copies = true) const;
  virtual void load_state_dict(const StateDict& sd);

 protected:
  // The float32 update of one slot: `w` is the contiguous float32 weight to update in place, `g` its contiguous
  // float32 gradient (same shape). State tensors are created on first use, the step's scalars computed here, and
  // the element loop returned as a BlockPass that the step runs with every other slot's in one multi-tensor pass
  // (or done here, returning an empty pass). An update may take the slot's write-back (take_write_back()) and
  // round each block of w into the 16-bit parameter as soon as it is updated (Apex O2's master -> model copy in
  // the same pass); one that does not gets the whole write-back after the pass.
  virtual BlockPass update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) = 0;
  // The 16-bit parameter the running update() should round w into, with this step's rounding (param undefined:
  // none, the parameter is float32). Taking it makes the update responsible for the write.
  WriteBack take_write_back();
  // The names of the slot state this optimizer keeps (what load_state_dict accepts).
  virtual std::vector<std::string> state_names() const = 0;
  // The dtype and shape load_state_dict requires of state `name` of `slot` (float32 of the parameter's shape, 0-dim
  // for "step"); an empty message if the slot keeps it, else why not.
  virtual std::string state_layout(const ParamSlot& slot, const std::string& name, DType& dtype, Shape& shape) const;
  std::vector<ParamGroup> groups_;
  bool master_weights_ = false;
  bool keep_casts_ = true;
  Rounding rounding_ = Rounding::Nearest;
  Generator rounding_gen_;
  int64_t step_count_ = 0;
  int64_t skipped_steps_ = 0;
  StepInterceptor* interceptor_ = nullptr;
  // The multipliers folded into the next step (fold_into_step); update() passes them to its kernel.
  float grad_inv_scale_ = 1.0f, grad_clip_ = 1.0f;
  bool folded_ = false;

 private:
  std::optional<WriteBack> pending_write_back_;  // set while update() runs on a 16-bit parameter, until taken
  dist::ProcessGroup* shard_group_ = nullptr;    // ZeRO: sharded over this group
  // A state tensor of `slot` as the whole dict holds it, gathered from every rank's slice, and back ("" names the
  // master).
  struct SliceLayout;
  SliceLayout slice_layout(const ParamSlot& slot, const std::string& name) const;
  Tensor gather_state(const ParamSlot& slot, const std::string& name, const Tensor& t) const;
  // The state dict with each slot tensor (name "" for the master) as `take` returns it.
  using StateTaker =
      std::function<Tensor(const ParamSlot&, const std::string& name, const Tensor&, const std::string& key)>;
  StateDict build_state_dict(const StateTaker& take) const;
  Tensor slice_state(const ParamSlot& slot, const std::string& name, const Tensor& whole) const;
};

// Removes `interceptor` from every live optimizer that has it (safe whichever of them is destroyed first).
void release_step_interceptor(const StepInterceptor* interceptor);

// The gradients the next step of the live optimizers holding `params` will use, one per parameter (undefined
// where there is none): each such optimizer's step interceptor first prepares them (unscales them), then the
// staged float32 gradient is taken, else .grad. A float32 master weight stands for its 16-bit parameter.
std::vector<Tensor> step_grads(const std::vector<Tensor>& params);
// step_grads(params) (`grads`) and what of each this rank adds to their norm (`parts`): the whole gradient, or for a
// parameter of a sharded optimizer (ZeRO) this rank's slice of it, whose squares the ranks of `group` (nullptr:
// none is sharded) add up. castor::Error for optimizers sharded over different groups.
struct NormParts {
  std::vector<Tensor> grads, parts;
  dist::ProcessGroup* group = nullptr;
};
NormParts step_grad_norm_parts(const std::vector<Tensor>& params);

// torch.optim.SGD. lr and weight_decay here seed the first group (add_param_group sets its own).
struct SGDOptions {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  void validate() const;  // throws castor::Error naming the bad option
};
class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  const SGDOptions& options() const { return options_; }

 protected:
  BlockPass update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) override;
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }

 private:
  SGDOptions options_;
};

// torch.optim.Adam, or torch.optim.AdamW with decoupled_weight_decay.
struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false;
  bool decoupled_weight_decay = false;  // true: AdamW
  void validate() const;                // throws castor::Error naming the bad option
  static AdamOptions adamw();           // PyTorch's AdamW defaults: decoupled, weight_decay 1e-2
};
class Adam : public Optimizer {
 public:
  Adam(const std::vector<Tensor>& params, AdamOptions options);
  const AdamOptions& options() const { return options_; }

 protected:
  BlockPass update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) override;
  std::vector<std::string> state_names() const override { return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }

 private:
  AdamOptions options_;
};
// AdamW: Adam with `options` and decoupled weight decay turned on (start from AdamOptions::adamw() for
// PyTorch's defaults).
std::unique_ptr<Adam> make_adamw(const std::vector<Tensor>& params, AdamOptions options);

// bitsandbytes' AdamW8bit (Dettmers et al. 2021, block-wise dynamic quantisation).
struct AdamW8bitOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  int64_t block_size = 2048;     // elements per absmax: a positive power of two
  int64_t min_8bit_size = 4096;  // parameters with fewer elements keep 32-bit states
  void validate() const;         // throws castor::Error naming the bad option
};
// AdamW whose two moments are kept in 8 bits: per block of block_size elements a float32 absmax, and per element
// a uint8 code into a 256-value dynamic map (signed for the first moment, unsigned for the second; see
// kernels::dynamic_map). A step dequantises, updates and requantises each block in one pass (the weight update uses
// the float32 moments before requantisation), with AdamW's scalars (PyTorch 1.13's, decoupled weight decay first).
// The master weights are kept as by any Optimizer. A parameter of fewer than min_8bit_size elements or of one
// dimension (norms, biases) keeps float32 "exp_avg"/"exp_avg_sq" updated exactly as AdamW's; the others keep
// "exp_avg_code" (uint8, the parameter's shape), "exp_avg_absmax" (float32, ceil(numel / block_size)) and
// "exp_avg_sq_code", "exp_avg_sq_absmax"; both kinds keep "step".
class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(const std::vector<Tensor>& params, AdamW8bitOptions options);
  const AdamW8bitOptions& options() const { return options_; }
  // Whether a parameter of this shape keeps 8-bit states.
  static bool is_8bit(const Shape& shape, const AdamW8bitOptions& options);
  void load_state_dict(const StateDict& sd) override;
  int64_t shard_alignment() const override { return options_.block_size; }

 protected:
  BlockPass update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) override;
  std::vector<std::string> state_names() const override {
    return {"step", "exp_avg", "exp_avg_sq", "exp_avg_code", "exp_avg_absmax", "exp_avg_sq_code", "exp_avg_sq_absmax"};
  }
  std::string state_layout(const ParamSlot& slot, const std::string& name, DType& dtype, Shape& shape) const override;

 private:
  AdamW8bitOptions options_;
};

// Converting an optimizer state dict between AdamW (Adam with decoupled weight decay, no AMSGrad) and AdamW8bit
// with `options` (switching optimizers on resume): the 8-bit slots' float32 moments quantised, and back
// (dequantised; the block size is read from the absmaxes' length). Everything else is kept. Throws castor::Error
// on a dict that is not of the optimizer converted from.
StateDict adamw_state_to_8bit(const StateDict& sd, const AdamW8bitOptions& options);
StateDict adamw8bit_state_to_32bit(const StateDict& sd);

}  // namespace castor::optim
