// The op profiler behind `castor train --profile`.
#include "train/profiler.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace castor::train {

void Profiler::on_op(const OpEvent& e) {
  if (e.depth > 0) return;  // counted in the op or backward rule that ran it
  std::string dtypes;
  for (const Tensor& t : *e.inputs)
    if (t.defined()) dtypes += std::string(dtypes.empty() ? "" : ",") + dtype_name(t.dtype());
  if (e.out && e.out->defined()) dtypes += std::string(" -> ") + dtype_name(e.out->dtype());
  Total& t = totals_[{op_name(e.op), e.backward, dtypes}];
  t.seconds += e.seconds;
  ++t.calls;
}

std::string Profiler::table(size_t top) const {
  std::vector<std::pair<std::tuple<std::string, bool, std::string>, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0;
  for (const auto& r : rows) all += r.second.seconds;
  std::string out = "profile: top ops by time (each op includes the ops it is made of and its autograd recording)\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-20s %-9s %-40s %8s %10s %6s\n", "op", "pass", "dtypes", "calls", "total ms",
                "share");
  out += line;
  for (size_t i = 0; i < std::min(top, rows.size()); ++i) {
    const auto& [key, t] = rows[i];
    std::snprintf(line, sizeof(line), "%-20s %-9s %-40s %8lld %10.1f %5.1f%%\n", std::get<0>(key).c_str(),
                  std::get<1>(key) ? "backward" : "forward", std::get<2>(key).c_str(),
                  static_cast<long long>(t.calls), 1e3 * t.seconds, all > 0 ? 100 * t.seconds / all : 0.0);
    out += line;
  }
  return out;
}

}  // namespace castor::train
