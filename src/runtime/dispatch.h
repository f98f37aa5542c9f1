// The one seam every public op passes through: autocast rewrites its inputs, observers (explain, profiler) see it.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "castor/allocator.h"
#include "castor/op_kind.h"
#include "castor/tensor.h"

namespace castor {

// What an observer sees of one op: the inputs before and after autocast and the output.
struct OpEvent {
  OpKind op;
  const std::vector<Tensor>* given;   // as the caller passed them
  const std::vector<Tensor>* inputs;  // as the op ran on them
  const Tensor* out;
  double seconds;
  bool backward;                // a backward rule rather than a forward op
  double autocast_seconds = 0;  // spent casting the inputs (cache lookups included) before the op ran
  int depth = 0;                // 0: called by the user; > 0: run inside another op or inside a backward rule
};

// Marks the ops run while it lives as nested one level deeper (OpScope and the backward engine use it).
class OpNesting {
 public:
  OpNesting();
  ~OpNesting();
  OpNesting(const OpNesting&) = delete;
  OpNesting& operator=(const OpNesting&) = delete;
  int depth() const { return depth_; }  // the depth at entry

 private:
  int depth_;
};

// Receives every op on this thread while installed (see ObserverGuard).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_op(const OpEvent& e) = 0;
  // A user-registered op (amp::CustomOp) by name: its inputs as given and as autocast cast them, and its output.
  virtual void on_custom_op(const std::string& name, CastPolicy policy, const std::vector<Tensor>& given,
                            const std::vector<Tensor>& ran, const Tensor& out) {}
};
OpObserver* op_observer();
void set_op_observer(OpObserver* o);

// Applies autocast to an op's inputs on entry and reports the op to the observer on exit.
class OpScope {
 public:
  OpScope(OpKind op, std::vector<Tensor> inputs);
  const Tensor& operator[](size_t i) const { return inputs_[i]; }
  const std::vector<Tensor>& inputs() const { return inputs_; }
  Tensor done(Tensor out);

 private:
  OpNesting nesting_;
  OpKind op_;
  AllocationLabel label_;  // names the op in an out-of-memory error
  std::vector<Tensor> given_, inputs_;
  std::chrono::steady_clock::time_point start_;
  double autocast_seconds_ = 0;
};

}  // namespace castor
