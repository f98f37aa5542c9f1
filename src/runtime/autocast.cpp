// Autocast: the thread-local state, the per-policy input casting, and the cast cache for float32 weights.
#include "castor/autocast.h"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "castor/autograd.h"
#include "ops/elementwise.h"
#include "runtime/dispatch.h"

namespace castor::amp {

namespace {

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  uint32_t version;
  Tensor cast;
};

thread_local AutocastState g_state;
thread_local int g_depth = 0;  // nesting of enabled regions; the cache lives while > 0
thread_local std::unordered_map<const TensorImpl*, CacheEntry> g_cache;
thread_local CastCacheStats g_cache_stats;

// The float32 leaves autocast has cast, and the 16-bit copies optimizers keep of them (keep_cast). Process-wide:
// an optimizer may step on another thread than the one running the forward.
struct Kept {
  std::weak_ptr<TensorImpl> source;
  DType dtype;
  bool used = false;               // cast since the last keep_cast (the next step should keep a copy)
  uint32_t version = 0;            // of the source when the copy was written
  std::weak_ptr<TensorImpl> copy;  // owned by the optimizer
};
std::mutex g_kept_mutex;
std::unordered_map<const TensorImpl*, Kept> g_kept;

// The entry of leaf t (a fresh one if t is new at this address), under g_kept_mutex.
Kept& kept_entry(const Tensor& t, DType dtype) {
  auto it = g_kept.find(t.impl());
  if (it != g_kept.end() && it->second.source.lock() == t.impl_ptr()) return it->second;
  for (auto e = g_kept.begin(); e != g_kept.end();) e = e->second.source.expired() ? g_kept.erase(e) : std::next(e);
  return g_kept[t.impl()] = Kept{t.impl_ptr(), dtype};
}

// t cast to dtype from the copy an optimizer kept when it last updated t, if t has not changed since: an alias of
// that copy recorded as the cast; undefined otherwise. Marks t as cast, so that the next step keeps a copy.
Tensor kept_cast(const Tensor& t, DType dtype) {
  std::lock_guard<std::mutex> lock(g_kept_mutex);
  Kept& k = kept_entry(t, dtype);
  k.used = true;
  const std::shared_ptr<TensorImpl> copy = k.copy.lock();
  if (k.dtype != dtype || !copy || k.version != t.version()) {
    k.dtype = dtype;
    return Tensor();
  }
  Tensor out = Tensor(copy).detach();
  record_op<OpKind::Cast>({t}, out, {}, {});
  return out;
}

// A float32 leaf weight cast to 16-bit once per outermost region (refreshed if the weight changed in place).
Tensor cached_cast(const Tensor& t, DType dtype) {
  const bool cacheable = g_state.cache_enabled && GradMode::is_enabled() && t.is_leaf() && t.requires_grad();
  if (!cacheable) return t.to(dtype);
  auto it = g_cache.find(t.impl());
  if (it != g_cache.end() && !it->second.source.expired() && it->second.version == t.version() &&
      it->second.cast.dtype() == dtype) {
    ++g_cache_stats.hits;
    return it->second.cast;
  }
  Tensor c = kept_cast(t, dtype);
  if (c.defined()) {
    ++g_cache_stats.kept;
  } else {
    ++g_cache_stats.misses;
    c = t.to(dtype);
  }
  g_cache[t.impl()] = {t.impl_ptr(), t.version(), c};
  return c;
}

bool castable(const Tensor& t) { return t.defined() && (t.dtype() == DType::Float32 || is_16bit_float(t.dtype())); }

}  // namespace

AutocastState autocast_state() { return g_state; }
bool is_autocast_enabled() { return g_state.enabled; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled, bool cache_enabled) : prev_(g_state) {
  CASTOR_CHECK(!enabled || is_16bit_float(dtype), "autocast: dtype must be float16 or bfloat16, got ",
               dtype_name(dtype));
  g_state = {enabled, enabled ? dtype : prev_.dtype, cache_enabled};
  if (enabled) ++g_depth;
}

AutocastGuard::~AutocastGuard() {
  if (g_state.enabled && --g_depth == 0) g_cache.clear();
  g_state = prev_;
}

std::vector<Tensor> cast_inputs(CastPolicy policy, const std::vector<Tensor>& inputs) {
  if (!g_state.enabled) return inputs;
  std::vector<Tensor> out = inputs;
  switch (policy) {
    case CastPolicy::LowerPrecision:
      for (Tensor& t : out)
        if (castable(t) && t.dtype() != g_state.dtype)
          t = t.dtype() == DType::Float32 ? cached_cast(t, g_state.dtype) : t.to(g_state.dtype);
      break;
    case CastPolicy::Float32:
      for (Tensor& t : out)
        if (castable(t)) t = t.to(DType::Float32);
      break;
    case CastPolicy::Promote: {
      std::optional<DType> widest;
      for (const Tensor& t : out)
        if (castable(t)) widest = widest ? promote_types(*widest, t.dtype()) : t.dtype();
      for (Tensor& t : out)
        if (castable(t)) t = t.to(*widest);
      break;
    }
    case CastPolicy::PassThrough: break;
    case CastPolicy::Banned: break;
    case CastPolicy::Float32InKernel: break;  // the kernel widens as it reads
  }
  return out;
}

std::vector<Tensor> apply_autocast(OpKind op, const std::vector<Tensor>& inputs) {
  CASTOR_CHECK(op_policy(op) != CastPolicy::Banned, op_name(op),
               " is unsafe to autocast (its float16 gradients lose precision and it saturates on probabilities "
               "near 0 or 1); use binary_cross_entropy_with_logits, which combines sigmoid and the loss and is "
               "safe under autocast, or run it outside autocast on float32 inputs");
  return cast_inputs(op_policy(op), inputs);
}

struct CustomOp::Entry {
  std::string name;
  CastPolicy policy;
  std::string banned_alternative;
};

namespace {
// Built on first use, so that ops may be registered during static initialization (a Function's autocast_op).
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<CustomOp::Entry>> ops;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

CustomOp register_op(const std::string& name, CastPolicy policy, const std::string& banned_alternative) {
  CASTOR_CHECK(!name.empty(), "amp::register_op: the op needs a name");
  for (int k = 0; k < kNumOps; ++k)
    CASTOR_CHECK(name != kOpInfo[k].name, "amp::register_op: \"", name, "\" is a built-in op (policy ",
                 policy_name(kOpInfo[k].policy), ")");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.ops.find(name);
  if (it != r.ops.end()) {
    CASTOR_CHECK(it->second->policy == policy, "amp::register_op: \"", name, "\" is already registered with policy ",
                 policy_name(it->second->policy), ", not ", policy_name(policy));
    return CustomOp(it->second.get());
  }
  auto entry = std::make_unique<CustomOp::Entry>(CustomOp::Entry{name, policy, banned_alternative});
  const CustomOp::Entry* e = entry.get();
  r.ops.emplace(name, std::move(entry));
  return CustomOp(e);
}

const std::string& CustomOp::name() const { return entry_->name; }
CastPolicy CustomOp::policy() const { return entry_->policy; }

std::vector<Tensor> CustomOp::cast_inputs(const std::vector<Tensor>& inputs) const {
  CASTOR_CHECK(!g_state.enabled || entry_->policy != CastPolicy::Banned, entry_->name,
               " is registered as unsafe to autocast",
               entry_->banned_alternative.empty() ? "" : "; use " + entry_->banned_alternative + " instead");
  return amp::cast_inputs(entry_->policy, inputs);
}

Tensor CustomOp::operator()(const std::vector<Tensor>& inputs,
                            const std::function<Tensor(const std::vector<Tensor>&)>& fn) const {
  const std::vector<Tensor> cast = cast_inputs(inputs);
  Tensor out;
  if (entry_->policy == CastPolicy::PassThrough || !g_state.enabled) {
    out = fn(cast);
  } else {
    AutocastGuard off(g_state.dtype, /*enabled=*/false);
    out = fn(cast);
  }
  if (OpObserver* o = op_observer()) o->on_custom_op(entry_->name, entry_->policy, inputs, cast, out);
  return out;
}

bool is_cached_cast(const Tensor& t) {
  for (const auto& [key, entry] : g_cache)
    if (entry.cast.is_same(t)) return true;
  return false;
}

CastCacheStats cast_cache_stats() {
  CastCacheStats s = g_cache_stats;
  s.entries = static_cast<int64_t>(g_cache.size());
  return s;
}

void clear_cast_cache() { g_cache.clear(); }

std::optional<DType> cast_to_keep(const Tensor& param) {
  std::lock_guard<std::mutex> lock(g_kept_mutex);
  auto it = g_kept.find(param.impl());
  if (it == g_kept.end() || it->second.source.lock() != param.impl_ptr() || !it->second.used) return std::nullopt;
  return it->second.dtype;
}

void keep_cast(const Tensor& param, const Tensor& copy) {
  CASTOR_ASSERT(param.dtype() == DType::Float32 && is_16bit_float(copy.dtype()) && copy.is_contiguous() &&
                    copy.shape() == param.shape(),
                "keep_cast: ", copy.describe(), " cannot be a cast of ", param.describe());
  std::lock_guard<std::mutex> lock(g_kept_mutex);
  Kept& k = kept_entry(param, copy.dtype());
  k = Kept{param.impl_ptr(), copy.dtype(), /*used=*/false, param.version(), copy.impl_ptr()};
}

}  // namespace castor::amp
