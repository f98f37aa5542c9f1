// The autocast explain report: which dtype each op of a forward pass ran in, and why.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/op_kind.h"
#include "castor/tensor.h"

namespace castor::amp {

// One forward op as autocast treated it.
struct ExplainRow {
  std::string op;
  CastPolicy policy;
  bool autocast;                          // autocast was on for this op
  std::vector<DType> given, ran;          // input dtypes as passed and as the op ran on them (undefined inputs skipped)
  std::optional<DType> out;               // output dtype (none for an op without output)
  std::string why;                        // "float32 weight cast to bfloat16 (lower_precision; cached)", ...
  std::vector<const TensorImpl*> inputs;  // the given tensors' identities (to tell which module's parameters ran)
  std::string module;                     // left empty here; a caller that knows the model may name the op's module
  int depth = 0;                          // 0: called by the user; > 0: run inside another op (listed before it)
};

struct ExplainSummary {
  int64_t ops = 0, ops_16bit = 0, ops_float32 = 0, ops_other = 0;  // by output dtype
  int64_t casts = 0, cache_hits = 0;                               // inputs cast by autocast; served by the cache
};

// While alive, records every op on this thread (built-in ops and CustomOp calls), forwarding events to the
// observer installed before it. Scope it around one forward pass: the engine's backward events are left out,
// but ops a backward rule calls would be recorded like forward ones. Nestable: the innermost guard records.
class ExplainGuard {
 public:
  ExplainGuard();
  ~ExplainGuard();
  ExplainGuard(const ExplainGuard&) = delete;
  ExplainGuard& operator=(const ExplainGuard&) = delete;

  // Records one op by name (its observer does, for built-in ops and CustomOp calls).
  void record(const std::string& op, CastPolicy policy, const std::vector<Tensor>& given,
              const std::vector<Tensor>& ran, const Tensor& out, int depth = 0);

  const std::vector<ExplainRow>& rows() const;
  ExplainSummary summary() const;
  // A text table (op, policy, inputs -> output, why) followed by the summary line.
  std::string table() const;

  // The innermost guard alive on this thread, or null.
  static ExplainGuard* active();

 private:
  struct Recorder;  // the OpObserver installed while the guard lives
  std::unique_ptr<Recorder> recorder_;
  ExplainGuard* prev_active_;
};

}  // namespace castor::amp
