// The explain report: an OpObserver that records each forward op's input/output dtypes and autocast's reason.
#include "castor/explain.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <unordered_set>

#include "castor/autocast.h"
#include "runtime/dispatch.h"

namespace castor::amp {

namespace {
thread_local ExplainGuard* g_active = nullptr;

std::string dtype_list(const std::vector<DType>& ds) {
  std::string s;
  for (size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + std::string(dtype_name(ds[i]));
  return s;
}
}  // namespace

struct ExplainGuard::Recorder : OpObserver {
  ExplainGuard* owner = nullptr;
  OpObserver* prev = nullptr;
  std::vector<ExplainRow> rows;
  std::unordered_set<const TensorImpl*> seen_casts;  // cached casts already reported once

  void on_op(const OpEvent& e) override {
    if (!e.backward && g_active == owner)
      owner->record(op_name(e.op), op_policy(e.op), *e.given, *e.inputs, *e.out, e.depth);
    if (prev) prev->on_op(e);
  }
  void on_custom_op(const std::string& name, CastPolicy policy, const std::vector<Tensor>& given,
                    const std::vector<Tensor>& ran, const Tensor& out) override {
    if (g_active == owner) owner->record(name, policy, given, ran, out);
    if (prev) prev->on_custom_op(name, policy, given, ran, out);
  }
};

ExplainGuard::ExplainGuard() : recorder_(std::make_unique<Recorder>()), prev_active_(g_active) {
  recorder_->owner = this;
  recorder_->prev = op_observer();
  set_op_observer(recorder_.get());
  g_active = this;
}

ExplainGuard::~ExplainGuard() {
  set_op_observer(recorder_->prev);
  g_active = prev_active_;
}

ExplainGuard* ExplainGuard::active() { return g_active; }

const std::vector<ExplainRow>& ExplainGuard::rows() const { return recorder_->rows; }

void ExplainGuard::record(const std::string& op, CastPolicy policy, const std::vector<Tensor>& given,
                          const std::vector<Tensor>& ran, const Tensor& out, int depth) {
  const AutocastState st = autocast_state();
  ExplainRow row{op, policy, st.enabled, {}, {}, {}, {}};
  row.depth = depth;
  std::vector<std::string> reasons;
  for (size_t i = 0; i < given.size() && i < ran.size(); ++i) {
    if (!given[i].defined()) continue;
    row.inputs.push_back(given[i].impl());
    row.given.push_back(given[i].dtype());
    row.ran.push_back(ran[i].dtype());
    if (given[i].dtype() == ran[i].dtype()) continue;
    const bool weight = given[i].is_leaf() && given[i].requires_grad();
    std::string r = std::string(dtype_name(given[i].dtype())) + (weight ? " weight" : " input " + std::to_string(i)) +
                    " cast to " + dtype_name(ran[i].dtype()) + " (" + policy_name(policy);
    if (is_cached_cast(ran[i])) r += recorder_->seen_casts.insert(ran[i].impl()).second ? "; cached" : "; from cache";
    reasons.push_back(r + ")");
  }
  if (out.defined()) row.out = out.dtype();
  if (reasons.empty()) {
    const bool never = std::any_of(row.given.begin(), row.given.end(),
                                   [](DType d) { return d != DType::Float32 && !is_16bit_float(d); });
    if (!st.enabled)
      reasons.push_back("autocast off");
    else if (policy == CastPolicy::PassThrough)
      reasons.push_back("runs in its input dtype (pass_through)");
    else if (never)
      reasons.push_back("float64/integer inputs are never cast");
    else
      reasons.push_back("inputs already " + dtype_list(row.ran) + " (" + policy_name(policy) + ")");
  }
  for (size_t k = 0; k < reasons.size(); ++k) row.why += (k ? "; " : "") + reasons[k];
  recorder_->rows.push_back(std::move(row));
}

ExplainSummary ExplainGuard::summary() const {
  ExplainSummary s;
  for (const ExplainRow& r : rows()) {
    ++s.ops;
    if (r.out && is_16bit_float(*r.out))
      ++s.ops_16bit;
    else if (r.out && *r.out == DType::Float32)
      ++s.ops_float32;
    else
      ++s.ops_other;
    for (size_t i = 0; i < r.given.size(); ++i) s.casts += r.given[i] != r.ran[i];
    for (size_t p = r.why.find("from cache"); p != std::string::npos; p = r.why.find("from cache", p + 1))
      ++s.cache_hits;
  }
  return s;
}

std::string ExplainGuard::table() const {
  std::vector<std::array<std::string, 4>> cells = {{"op", "policy", "inputs -> output", "why"}};
  for (const ExplainRow& r : rows()) {
    std::string io = "(" + dtype_list(r.given) + ")";
    if (r.ran != r.given) io += " as (" + dtype_list(r.ran) + ")";
    io += " -> " + std::string(r.out ? dtype_name(*r.out) : "none");
    cells.push_back({r.op, policy_name(r.policy), io, r.why});
  }
  std::array<size_t, 3> width{};
  for (const auto& c : cells)
    for (size_t k = 0; k < 3; ++k) width[k] = std::max(width[k], c[k].size());
  std::ostringstream os;
  for (const auto& c : cells) {
    for (size_t k = 0; k < 3; ++k) os << c[k] << std::string(width[k] - c[k].size() + 2, ' ');
    os << c[3] << "\n";
  }
  const ExplainSummary s = summary();
  os << s.ops << " ops: " << s.ops_16bit << " in 16-bit, " << s.ops_float32 << " in float32, " << s.ops_other
     << " other; " << s.casts << " input casts, " << s.cache_hits << " served by the cast cache\n";
  return os.str();
}

}  // namespace castor::amp
