// OpScope: autocast on entry, observers on exit.
#include "runtime/dispatch.h"

#include "castor/autocast.h"

namespace castor {

namespace {
thread_local OpObserver* g_observer = nullptr;
thread_local int g_depth = 0;
}  // namespace

OpNesting::OpNesting() : depth_(g_depth++) {}
OpNesting::~OpNesting() { --g_depth; }

OpObserver* op_observer() { return g_observer; }
void set_op_observer(OpObserver* o) { g_observer = o; }

OpScope::OpScope(OpKind op, std::vector<Tensor> inputs) : op_(op), label_(op_name(op)), inputs_(std::move(inputs)) {
  if (g_observer) start_ = std::chrono::steady_clock::now();
  if (amp::is_autocast_enabled()) {
    if (g_observer) given_ = inputs_;
    inputs_ = amp::apply_autocast(op, inputs_);
    if (g_observer) {
      const auto now = std::chrono::steady_clock::now();
      autocast_seconds_ = std::chrono::duration<double>(now - start_).count();
      start_ = now;
    }
  }
}

Tensor OpScope::done(Tensor out) {
  if (g_observer) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    g_observer->on_op(
        {op_, given_.empty() ? &inputs_ : &given_, &inputs_, &out, s, false, autocast_seconds_, nesting_.depth()});
  }
  return out;
}

}  // namespace castor
