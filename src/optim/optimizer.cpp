// The optimizer base: gradient staging, float32 master weights, rounding back into 16-bit parameters, state dicts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/optim.h"
#include "core/parallel.h"
#include "optim/write_back.h"

namespace castor::optim {

namespace {

// Whether `g` is a sharded slot's gradient of its slice alone (else it is the whole parameter's).
bool is_slice_grad(const ParamSlot& slot, const Tensor& g, bool sharded) {
  return sharded && g.dim() == 1 && g.numel() == slot.shard.length && g.shape() != slot.param.shape();
}

// The float32 gradient of a slot's slice (the whole parameter unsharded): the staged one, or param.grad() widened;
// undefined when there is none.
Tensor float32_grad(const ParamSlot& slot, bool sharded) {
  const bool staged = slot.staged_grad().defined();
  Tensor g = staged ? slot.staged_grad() : slot.param.grad();
  if (!g.defined()) return g;
  if (is_slice_grad(slot, g, sharded)) return g.detach().to(DType::Float32).contiguous();
  CASTOR_CHECK(g.shape() == slot.param.shape(), "optimizer step: ", staged ? "staged gradient " : "gradient ",
               g.describe(), " does not match parameter ", slot.param.describe());
  if (sharded) g = g.detach().contiguous().view({-1}).narrow(0, slot.shard.begin, slot.shard.length);
  return g.detach().to(DType::Float32).contiguous();
}

// This rank's slice of a slot's parameter: a view of its flattened elements, or of the slice ZeRO-3 keeps of it.
Tensor param_slice(const ParamSlot& slot) {
  if (slot.kept_slice.defined()) return slot.kept_slice.narrow(0, 0, slot.shard.length);
  return slot.param.detach().view({-1}).narrow(0, slot.shard.begin, slot.shard.length);
}

// The float32 master of a 16-bit slot: its slice when sharded.
Tensor make_master(const ParamSlot& slot, bool sharded) {
  return (sharded ? param_slice(slot) : slot.param.detach()).to(DType::Float32).contiguous();
}

std::string slot_key(const char* kind, size_t g, size_t i) {
  return std::string(kind) + "." + std::to_string(g) + "." + std::to_string(i);
}

// Splits "<g>.<i>.<name>" (name may be absent) into numbers and name; false if malformed.
bool parse_slot_key(const std::string& rest, size_t& g, size_t& i, std::string& name) {
  std::istringstream in(rest);
  std::string gs, is;
  if (!std::getline(in, gs, '.') || !std::getline(in, is, '.')) return false;
  std::getline(in, name);
  auto all_digits = [](const std::string& s) {
    return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!all_digits(gs) || !all_digits(is)) return false;
  g = std::stoul(gs);
  i = std::stoul(is);
  return true;
}

// Every rank's updated slice of each parameter into every rank's parameter, in place (in its own dtype; no whole
// copy): the collectives are launched together and waited for.
void all_gather_params(dist::ProcessGroup& group, const std::vector<const ParamSlot*>& slots) {
  std::vector<std::unique_ptr<dist::Work>> gathers;
  for (const ParamSlot* slot : slots)
    gathers.push_back(group.all_gather_slices_async(slot->param.detach(), slot->shard.chunk));
  for (std::unique_ptr<dist::Work>& g : gathers) g->wait();
}

// Every live optimizer, for staged_grad().
std::mutex g_live_mutex;
std::set<Optimizer*> g_live;

}  // namespace

Optimizer::Optimizer() {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  g_live.insert(this);
}

Optimizer::~Optimizer() {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  g_live.erase(this);
}

void release_step_interceptor(const StepInterceptor* interceptor) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  for (Optimizer* o : g_live)
    if (o->step_interceptor() == interceptor) o->set_step_interceptor(nullptr);
}

namespace {

// The slot of each live optimizer that holds one of `params` (a parameter, or its master weight), each optimizer's
// step interceptor asked first to prepare its gradients (once).
using Owner = std::pair<Optimizer*, const ParamSlot*>;
std::vector<std::optional<Owner>> prepared_owners(const std::vector<Tensor>& params) {
  std::map<const TensorImpl*, Owner> owner;
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    for (Optimizer* o : g_live)
      for (const ParamGroup& group : o->param_groups())
        for (const ParamSlot& slot : group.slots) {
          owner[slot.param.impl()] = {o, &slot};
          if (slot.master.defined()) owner[slot.master.impl()] = {o, &slot};
        }
  }
  std::set<Optimizer*> prepared;
  std::vector<std::optional<Owner>> out;
  for (const Tensor& p : params) {
    auto it = owner.find(p.impl());
    out.push_back(it == owner.end() ? std::nullopt : std::optional<Owner>(it->second));
    if (it == owner.end()) continue;
    Optimizer* o = it->second.first;
    if (o->step_interceptor() && prepared.insert(o).second) o->step_interceptor()->prepare_gradients(*o);
    CASTOR_CHECK(!o->has_folded_multipliers(),
                 "the optimizer's gradients are unscaled and clipped inside its next step (GradScaler::unscale_clip_): "
                 "read or clip them before unscale_clip_, or use unscale_ and clip_grad_norm_");
  }
  return out;
}

Tensor step_grad(const Tensor& p, const std::optional<Owner>& owner) {
  if (!owner) return p.grad();
  const ParamSlot& slot = *owner->second;
  return slot.staged_grad().defined() ? slot.staged_grad() : slot.param.grad();
}

}  // namespace

std::vector<Tensor> step_grads(const std::vector<Tensor>& params) {
  const std::vector<std::optional<Owner>> owners = prepared_owners(params);
  std::vector<Tensor> grads;
  for (size_t k = 0; k < params.size(); ++k) grads.push_back(step_grad(params[k], owners[k]));
  return grads;
}

NormParts step_grad_norm_parts(const std::vector<Tensor>& params) {
  const std::vector<std::optional<Owner>> owners = prepared_owners(params);
  NormParts out;
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor g = step_grad(params[k], owners[k]);
    out.grads.push_back(g);
    dist::ProcessGroup* group = owners[k] ? owners[k]->first->shard_group() : nullptr;
    if (!g.defined() || !group) {
      out.parts.push_back(g);
      continue;
    }
    CASTOR_CHECK(!out.group || out.group == group,
                 "clip_grad_norm_: parameters of optimizers sharded over "
                 "different process groups");
    out.group = group;
    const ParamSlot& slot = *owners[k]->second;
    const bool slice = is_slice_grad(slot, g, true);
    out.parts.push_back(slice ? g : g.contiguous().view({-1}).narrow(0, slot.shard.begin, slot.shard.length));
  }
  return out;
}

void Optimizer::add_param_group(const std::vector<Tensor>& params, double lr, double weight_decay) {
  CASTOR_CHECK(!params.empty(), "add_param_group: empty parameter list");
  CASTOR_CHECK(lr >= 0, "add_param_group: invalid lr ", lr, " (must be >= 0)");
  CASTOR_CHECK(weight_decay >= 0, "add_param_group: invalid weight_decay ", weight_decay, " (must be >= 0)");
  ParamGroup group;
  group.lr = lr;
  group.weight_decay = weight_decay;
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& p = params[k];
    CASTOR_CHECK(p.defined(), "add_param_group: parameter ", k, " is undefined");
    CASTOR_CHECK(p.dtype() == DType::Float32 || is_16bit_float(p.dtype()), "add_param_group: parameter ", k, " is ",
                 p.describe(), "; only float32, float16 and bfloat16 parameters can be optimized");
    CASTOR_CHECK(p.is_leaf(), "add_param_group: parameter ", k, " is not a leaf tensor");
    CASTOR_CHECK(p.is_contiguous(), "add_param_group: parameter ", k, " (", p.describe(), ") is not contiguous");
    auto same = [&](const ParamSlot& s) { return s.param.is_same(p); };
    bool dup = std::any_of(group.slots.begin(), group.slots.end(), same);
    for (const ParamGroup& other : groups_) dup = dup || std::any_of(other.slots.begin(), other.slots.end(), same);
    CASTOR_CHECK(!dup, "add_param_group: parameter ", k, " appears in more than one parameter group");
    ParamSlot slot;
    slot.param = p;
    slot.shard = shard_group_ ? dist::shard_of(p.numel(), shard_group_->rank(), shard_group_->size(), shard_alignment())
                              : dist::Shard{p.numel(), 0, p.numel()};
    if (master_weights_ && is_16bit_float(p.dtype())) slot.master = make_master(slot, shard_group_ != nullptr);
    group.slots.push_back(std::move(slot));
  }
  groups_.push_back(std::move(group));
}

void Optimizer::set_keep_casts(bool on) {
  keep_casts_ = on;
  if (!on)
    for (ParamGroup& group : groups_)
      for (ParamSlot& slot : group.slots) slot.cast_copy_ = Tensor();
}

void Optimizer::set_master_weights(bool on) {
  master_weights_ = on;
  for (ParamGroup& group : groups_)
    for (ParamSlot& slot : group.slots) {
      if (!is_16bit_float(slot.param.dtype())) continue;
      slot.master = on ? make_master(slot, shard_group_ != nullptr) : Tensor();
    }
}

void Optimizer::set_rounding(Rounding r, uint64_t seed) {
  rounding_ = r;
  rounding_gen_.manual_seed(seed);
}

void Optimizer::step() {
  if (interceptor_)
    interceptor_->intercept_step(*this);
  else
    apply_step();
}

void Optimizer::apply_step() {
  NoGradGuard no_grad;
  // Per slot with a gradient: the update's scalars and state set up, its element loop kept for the one pass.
  struct Planned {
    ParamSlot* slot;
    Tensor w, g;  // kept alive for the pass
    BlockPass pass;
    std::optional<WriteBack> write_back;  // one the update did not take: rounded after the pass
    bool keep;
  };
  std::vector<Planned> planned;
  for (ParamGroup& group : groups_) {
    for (ParamSlot& slot : group.slots) {
      const bool sharded = shard_group_ != nullptr;
      Tensor g = float32_grad(slot, sharded);
      if (!g.defined()) continue;
      const bool narrow = is_16bit_float(slot.param.dtype());
      // The parameter, or this rank's slice of it (ZeRO).
      const Tensor target = sharded ? param_slice(slot) : slot.param.detach();
      Tensor w = !narrow ? target : slot.master.defined() ? slot.master : target.to(DType::Float32).contiguous();
      // A 16-bit parameter is rounded from w inside the update's pass if it takes the write-back, else after it.
      const bool stochastic = narrow && rounding_ == Rounding::Stochastic;
      if (narrow) pending_write_back_ = WriteBack{target, stochastic, stochastic ? rounding_gen_.next_u64() : 0};
      // A float32 parameter the last forward cast under autocast: its 16-bit copy for the next forward, rounded to
      // nearest even in the same pass (into a new buffer while an earlier forward's graph still holds the old one).
      // Sharded, the pass sees only a slice: each forward casts afresh.
      const std::optional<DType> keep = narrow || !keep_casts_ || sharded ? std::nullopt
                                                                          : amp::cast_to_keep(slot.param);
      if (keep) {
        Tensor& copy = slot.cast_copy_;
        if (!copy.defined() || copy.dtype() != *keep || copy.shape() != slot.param.shape() ||
            copy.impl()->storage.use_count() > 1)
          copy = empty(slot.param.shape(), *keep);
        pending_write_back_ = WriteBack{copy};
      }
      BlockPass pass = update(group, slot, w, g);
      std::optional<WriteBack> rest = pending_write_back_;
      pending_write_back_.reset();
      planned.push_back({&slot, std::move(w), std::move(g), std::move(pass), std::move(rest), keep.has_value()});
    }
  }
  // The multi-tensor pass: every block of every slot, in one parallel loop.
  std::vector<std::pair<int32_t, int64_t>> blocks;  // (planned index, first element)
  int64_t total = 0;
  for (size_t k = 0; k < planned.size(); ++k) {
    const BlockPass& p = planned[k].pass;
    for (int64_t b = 0; b < p.n; b += p.unit) blocks.emplace_back(static_cast<int32_t>(k), b);
    total += p.n;
  }
  const int64_t count = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (total > kParallelGrain)
  for (int64_t j = 0; j < count; ++j) {
    const BlockPass& p = planned[static_cast<size_t>(blocks[j].first)].pass;
    p.body(blocks[j].second, std::min(p.n, blocks[j].second + p.unit));
  }
  for (Planned& p : planned)
    if (p.write_back) kernels::round_into_16bit(p.w.data<float>(), round_into(*p.write_back));
  if (shard_group_) {
    std::vector<const ParamSlot*> updated;
    for (const Planned& p : planned)
      if (!p.slot->kept_slice.defined()) updated.push_back(p.slot);
    all_gather_params(*shard_group_, updated);
  }
  for (Planned& p : planned) {
    p.slot->param.bump_version();
    if (p.keep) amp::keep_cast(p.slot->param, p.slot->cast_copy_);
    p.slot->staged_grad_ = Tensor();
  }
  grad_inv_scale_ = grad_clip_ = 1.0f;
  folded_ = false;
  ++step_count_;
}

void Optimizer::zero_grad(bool set_to_none) {
  clear_staged_grads();
  for (ParamGroup& group : groups_)
    for (ParamSlot& slot : group.slots) {
      Tensor g = slot.param.grad();
      if (!g.defined()) continue;
      if (set_to_none)
        slot.param.set_grad(Tensor());
      else
        g.detach().zero_();
    }
}

WriteBack Optimizer::take_write_back() {
  WriteBack wb = pending_write_back_.value_or(WriteBack{});
  pending_write_back_.reset();
  return wb;
}

void Optimizer::stage_float32_grad(size_t group, size_t index, Tensor grad32) {
  CASTOR_CHECK(group < groups_.size() && index < groups_[group].slots.size(), "stage_float32_grad: no parameter ",
               index, " in group ", group);
  ParamSlot& slot = groups_[group].slots[index];
  CASTOR_CHECK(grad32.dtype() == DType::Float32 &&
                   (grad32.shape() == slot.param.shape() || is_slice_grad(slot, grad32, shard_group_ != nullptr)),
               "stage_float32_grad: ", grad32.describe(), " is not a float32 gradient for parameter ",
               slot.param.describe());
  slot.staged_grad_ = std::move(grad32);
}

Tensor Optimizer::float32_grad_buffer(size_t group, size_t index) {
  CASTOR_CHECK(group < groups_.size() && index < groups_[group].slots.size(), "float32_grad_buffer: no parameter ",
               index, " in group ", group);
  ParamSlot& slot = groups_[group].slots[index];
  if (!slot.grad_buffer_.defined() || slot.grad_buffer_.shape() != slot.param.shape())
    slot.grad_buffer_ = empty(slot.param.shape(), DType::Float32);
  return slot.grad_buffer_;
}

std::vector<Tensor> Optimizer::staged_grads() const {
  std::vector<Tensor> out;
  for (const ParamGroup& group : groups_)
    for (const ParamSlot& slot : group.slots) out.push_back(slot.staged_grad_);
  return out;
}

void Optimizer::clear_staged_grads() {
  for (ParamGroup& group : groups_)
    for (ParamSlot& slot : group.slots) slot.staged_grad_ = Tensor();
  grad_inv_scale_ = grad_clip_ = 1.0f;
  folded_ = false;
}

void Optimizer::fold_into_step(float inv_scale, float clip_coef) {
  grad_inv_scale_ = inv_scale;
  grad_clip_ = clip_coef;
  folded_ = true;
}

StateDict Optimizer::state_dict(bool copies) const {
  return build_state_dict([&](const ParamSlot& slot, const std::string& name, const Tensor& t, const std::string&) {
    return shard_group_ ? gather_state(slot, name, t) : copies ? t.clone() : t.detach();
  });
}

StateDict Optimizer::build_state_dict(const StateTaker& take) const {
  StateDict sd;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string prefix = "group." + std::to_string(g) + ".";
    sd[prefix + "lr"] = scalar_tensor(group.lr, DType::Float64);
    sd[prefix + "weight_decay"] = scalar_tensor(group.weight_decay, DType::Float64);
    sd[prefix + "size"] = scalar_tensor(static_cast<double>(group.slots.size()), DType::Int64);
    for (size_t i = 0; i < group.slots.size(); ++i) {
      const ParamSlot& slot = group.slots[i];
      for (const auto& [name, t] : slot.state) {
        const std::string key = slot_key("state", g, i) + "." + name;
        sd[key] = take(slot, name, t, key);
      }
      const std::string key = slot_key("master", g, i);
      if (slot.master.defined()) sd[key] = take(slot, "", slot.master, key);
    }
  }
  sd["step_count"] = scalar_tensor(static_cast<double>(step_count_), DType::Int64);
  sd["skipped_steps"] = scalar_tensor(static_cast<double>(skipped_steps_), DType::Int64);
  const Generator::State gs = rounding_gen_.state();
  sd["rounding_generator"] = from_blob(gs.data(), {static_cast<int64_t>(gs.size())}, DType::Int64);
  return sd;
}

std::string Optimizer::state_layout(const ParamSlot& slot, const std::string& name, DType& dtype, Shape& shape) const {
  dtype = DType::Float32;
  shape = name == "step" ? Shape{} : slot.param.shape();
  return "";
}

void Optimizer::load_state_dict(const StateDict& sd) {
  auto expect = [&](const std::string& key, const Tensor& t, DType dtype, const Shape& shape) {
    CASTOR_CHECK(t.defined() && t.dtype() == dtype && t.shape() == shape, "load_state_dict: \"", key, "\" is ",
                 t.defined() ? t.describe() : "undefined", ", expected ", dtype_name(dtype), shape_str(shape));
  };
  auto get = [&](const std::string& key, DType dtype, const Shape& shape) -> const Tensor& {
    auto it = sd.find(key);
    CASTOR_CHECK(it != sd.end(), "load_state_dict: missing key \"", key, "\"");
    expect(key, it->second, dtype, shape);
    return it->second;
  };
  // Validate everything first, so a bad dict leaves the optimizer untouched.
  std::set<std::string> known = {"step_count", "skipped_steps", "rounding_generator"};
  get("step_count", DType::Int64, {});
  get("skipped_steps", DType::Int64, {});
  const Tensor& gen_state = get("rounding_generator", DType::Int64, {static_cast<int64_t>(Generator::State().size())});
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "group." + std::to_string(g) + ".";
    const int64_t n = static_cast<int64_t>(get(prefix + "size", DType::Int64, {}).item());
    CASTOR_CHECK(n == static_cast<int64_t>(groups_[g].slots.size()), "load_state_dict: \"", prefix, "size\" says ", n,
                 " parameters but the optimizer's group ", g, " has ", groups_[g].slots.size());
    for (const char* k : {"lr", "weight_decay"}) {
      const double v = get(prefix + k, DType::Float64, {}).item();
      CASTOR_CHECK(std::isfinite(v) && v >= 0, "load_state_dict: \"", prefix, k, "\" is ", v,
                   ", not a finite non-negative number");
    }
    for (const char* k : {"size", "lr", "weight_decay"}) known.insert(prefix + k);
    for (size_t i = 0; i < groups_[g].slots.size(); ++i) {
      const ParamSlot& slot = groups_[g].slots[i];
      const std::string mkey = slot_key("master", g, i);
      if (!master_weights_ || !is_16bit_float(slot.param.dtype())) continue;
      get(mkey, DType::Float32, slot.param.shape());
      known.insert(mkey);
    }
  }
  const std::vector<std::string> names = state_names();
  for (const auto& [key, t] : sd) {
    if (key.rfind("state.", 0) != 0) {
      CASTOR_CHECK(known.count(key), "load_state_dict: unexpected key \"", key, "\"",
                   key.rfind("master.", 0) == 0 ? " (this optimizer keeps no master weight for that parameter)" : "");
      continue;
    }
    size_t g = 0, i = 0;
    std::string name;
    CASTOR_CHECK(parse_slot_key(key.substr(6), g, i, name), "load_state_dict: malformed key \"", key, "\"");
    CASTOR_CHECK(g < groups_.size() && i < groups_[g].slots.size(), "load_state_dict: \"", key,
                 "\" refers to a parameter this optimizer does not have");
    CASTOR_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "load_state_dict: \"", key,
                 "\" is not a state this optimizer keeps");
    DType dtype = DType::Float32;
    Shape shape;
    const std::string why = state_layout(groups_[g].slots[i], name, dtype, shape);
    CASTOR_CHECK(why.empty(), "load_state_dict: \"", key, "\": ", why);
    expect(key, t, dtype, shape);
  }
  // Apply.
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    const std::string prefix = "group." + std::to_string(g) + ".";
    group.lr = sd.at(prefix + "lr").item();
    group.weight_decay = sd.at(prefix + "weight_decay").item();
    for (size_t i = 0; i < group.slots.size(); ++i) {
      ParamSlot& slot = group.slots[i];
      slot.state.clear();
      const Tensor& master = slot.master.defined() ? sd.at(slot_key("master", g, i)) : Tensor();
      if (slot.master.defined()) slot.master.copy_(shard_group_ ? slice_state(slot, "", master) : master);
    }
  }
  for (const auto& [key, t] : sd) {
    size_t g = 0, i = 0;
    std::string name;
    if (key.rfind("state.", 0) == 0 && parse_slot_key(key.substr(6), g, i, name))
      groups_[g].slots[i].state[name] = shard_group_ ? slice_state(groups_[g].slots[i], name, t) : t.clone();
  }
  step_count_ = static_cast<int64_t>(sd.at("step_count").item());
  skipped_steps_ = static_cast<int64_t>(sd.at("skipped_steps").item());
  Generator::State gs;
  std::memcpy(gs.data(), gen_state.contiguous().data_ptr(), sizeof(gs));
  rounding_gen_.set_state(gs);
}

void Optimizer::shard(dist::ProcessGroup* group) {
  if (group == shard_group_) return;
  for (const ParamGroup& pg : groups_)
    for (const ParamSlot& slot : pg.slots)
      CASTOR_ASSERT(!slot.kept_slice.defined(), "Optimizer::shard: a parameter lives as a ZeRO-3 slice");
  const StateDict whole = state_dict();  // (gathered when sharded now)
  shard_group_ = group;
  for (ParamGroup& pg : groups_)
    for (ParamSlot& slot : pg.slots) {
      const int64_t n = slot.param.numel();
      slot.shard = group ? dist::shard_of(n, group->rank(), group->size(), shard_alignment()) : dist::Shard{n, 0, n};
      if (slot.master.defined()) slot.master = make_master(slot, group != nullptr);
      slot.cast_copy_ = Tensor();
    }
  load_state_dict(whole);
}

bool Optimizer::keep_param_slice(const Tensor& param, const Tensor& slice) {
  CASTOR_CHECK(shard_group_, "keep_param_slice: the optimizer is not sharded (Optimizer::shard)");
  for (ParamGroup& pg : groups_)
    for (ParamSlot& slot : pg.slots) {
      if (!slot.param.is_same(param)) continue;
      CASTOR_CHECK(slice.dim() == 1 && slice.numel() == slot.shard.chunk && slice.dtype() == param.dtype() &&
                       slice.is_contiguous(),
                   "keep_param_slice: ", slice.describe(), " is not a slice of ", slot.shard.chunk, " elements for ",
                   param.describe());
      slot.kept_slice = slice;
      return true;
    }
  return false;
}

// Where a state tensor of a sharded slot lies: the master and the states of the parameter's shape are per element
// (shard.chunk a rank, padded), a state of blocks per shard_alignment() elements, "step" and other 0-dim ones whole
// on every rank. `name` "" is the master.
struct Optimizer::SliceLayout {
  bool whole = false;             // kept whole on every rank
  int64_t per_rank = 0;           // padded elements a rank
  int64_t begin = 0, length = 0;  // this rank's in the flattened whole tensor
  Shape shape;                    // of the whole tensor
};

Optimizer::SliceLayout Optimizer::slice_layout(const ParamSlot& slot, const std::string& name) const {
  SliceLayout l;
  DType dtype = DType::Float32;
  l.shape = slot.param.shape();
  if (!name.empty()) {
    const std::string why = state_layout(slot, name, dtype, l.shape);
    CASTOR_ASSERT(why.empty(), why);
  }
  const dist::Shard& sh = slot.shard;
  if (l.shape.empty()) {
    l.whole = true;
  } else if (l.shape == slot.param.shape()) {
    l.per_rank = sh.chunk, l.begin = sh.begin, l.length = sh.length;
  } else {  // blocks of shard_alignment() elements
    const int64_t b = shard_alignment();
    l.per_rank = sh.chunk / b, l.begin = sh.begin / b, l.length = (sh.length + b - 1) / b;
  }
  return l;
}

Tensor Optimizer::gather_state(const ParamSlot& slot, const std::string& name, const Tensor& t) const {
  const SliceLayout l = slice_layout(slot, name);
  if (l.whole) return t.clone();
  CASTOR_ASSERT(t.numel() == l.length, "a sharded state of ", t.numel(), " elements, expected ", l.length);
  Tensor mine = zeros({l.per_rank}, t.dtype());
  mine.narrow(0, 0, l.length).copy_(t.contiguous().view({-1}));
  Tensor all = empty({l.per_rank * shard_group_->size()}, t.dtype());
  shard_group_->all_gather_into(all, mine);
  return all.narrow(0, 0, shape_numel(l.shape)).clone().view(l.shape);
}

StateDict Optimizer::state_dict_slices(std::map<std::string, SliceOf>& where) const {
  if (!shard_group_) return state_dict(/*copies=*/false);
  return build_state_dict([&](const ParamSlot& slot, const std::string& name, const Tensor& t, const std::string& key) {
    const SliceLayout l = slice_layout(slot, name);
    if (l.whole) return t.detach();
    where[key] = {l.shape, l.begin};
    return t.detach().contiguous().view({-1});
  });
}

Tensor Optimizer::whole_master(const ParamSlot& slot) const {
  if (!slot.master.defined() || !shard_group_) return slot.master;
  return gather_state(slot, "", slot.master);
}

Tensor Optimizer::slice_state(const ParamSlot& slot, const std::string& name, const Tensor& whole) const {
  const SliceLayout l = slice_layout(slot, name);
  if (l.whole) return whole.clone();
  return whole.contiguous().view({-1}).narrow(0, l.begin, l.length).clone();
}

}  // namespace castor::optim
