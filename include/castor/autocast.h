// Automatic mixed precision: the thread-local autocast state, its RAII guard, and user-registered op policies.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "castor/op_kind.h"
#include "castor/tensor.h"

namespace castor::amp {

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::BFloat16;  // the lower-precision dtype: Float16 or BFloat16
  bool cache_enabled = true;
};

AutocastState autocast_state();
bool is_autocast_enabled();

// torch.autocast as a scope: casting follows the op policy table while alive. Nestable; a disabled guard
// inside an enabled one turns casting off and restores the outer state on exit. The cast cache is cleared
// when the outermost enabled region exits.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::BFloat16, bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState prev_;
};

// The function form: runs fn inside an autocast region and returns its result.
template <class F>
auto autocast(DType dtype, F&& fn, bool enabled = true) {
  AutocastGuard guard(dtype, enabled);
  return fn();
}

// The inputs an op of `policy` sees under the current autocast state (used by ops; also for custom ops).
std::vector<Tensor> cast_inputs(CastPolicy policy, const std::vector<Tensor>& inputs);
// Applies op's policy from the table (called by every op on entry while autocast is on).
std::vector<Tensor> apply_autocast(OpKind op, const std::vector<Tensor>& inputs);

// A user op's autocast policy, registered by name (torch.library's autocast kernels; custom_fwd(cast_inputs=...)).
// Copyable handle to a registry entry that lives for the process.
class CustomOp {
 public:
  struct Entry;  // the registry's record (opaque)
  const std::string& name() const;
  CastPolicy policy() const;
  // The inputs as autocast hands them to this op under the current state (a Banned op raises, naming the
  // alternative given at registration); inputs pass unchanged when autocast is off.
  std::vector<Tensor> cast_inputs(const std::vector<Tensor>& inputs) const;
  // Casts the inputs, runs fn on them and reports the op to an active ExplainGuard (explain.h). Except for
  // PassThrough ops, fn runs with autocast off (as custom_fwd does), so its inner ops keep the chosen dtype.
  Tensor operator()(const std::vector<Tensor>& inputs,
                    const std::function<Tensor(const std::vector<Tensor>&)>& fn) const;

 private:
  friend CustomOp register_op(const std::string&, CastPolicy, const std::string&);
  explicit CustomOp(const Entry* e) : entry_(e) {}
  const Entry* entry_;
};

// Registers `name` with `policy`; registering it again with the same policy returns the same op, with another
// policy (or a built-in op's name) raises. `banned_alternative` is named in the error of a Banned op.
CustomOp register_op(const std::string& name, CastPolicy policy, const std::string& banned_alternative = "");

// True if `t` is a cast the cache currently holds (for the explain report).
bool is_cached_cast(const Tensor& t);

// Number of float32 -> 16-bit casts the cache has served, made, and taken from an optimizer's kept copy (for tests
// and the overhead benchmark).
struct CastCacheStats {
  int64_t hits = 0, misses = 0, kept = 0, entries = 0;
};
CastCacheStats cast_cache_stats();
void clear_cast_cache();

// Casts kept across steps. A float32 leaf that autocast cast in a forward is updated by the optimizer step after
// it; the step rounds the updated value to 16 bits in its own pass (round to nearest even: the bits of
// param.to(dtype)) and keeps it, and the next forward takes that copy instead of casting the weight again, if the
// weight has not changed since (its version).
// The dtype param was cast to since the last keep_cast, if it was (the optimizer asks before its update).
std::optional<DType> cast_to_keep(const Tensor& param);
// copy (contiguous, 16-bit, owned by the caller, which must not write it while a forward may use it) holds param
// rounded to nearest even at param's current version.
void keep_cast(const Tensor& param, const Tensor& copy);

}  // namespace castor::amp
