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
  std::string out =
      "profile: top ops by time in training steps (each op includes the ops it is made of and its "
      "autograd recording; evaluation passes are left out)\n";
  const size_t shown = std::min(top, rows.size());
  int op_width = 2, dtype_width = 6;  // the columns fit the longest entry shown
  for (size_t i = 0; i < shown; ++i) {
    op_width = std::max(op_width, static_cast<int>(std::get<0>(rows[i].first).size()));
    dtype_width = std::max(dtype_width, static_cast<int>(std::get<2>(rows[i].first).size()));
  }
  auto row = [&](const std::string& op, const char* pass, const std::string& dtypes, const std::string& rest) {
    char head[512];
    std::snprintf(head, sizeof(head), "%-*s  %-8s  %-*s", op_width, op.c_str(), pass, dtype_width, dtypes.c_str());
    out += head + rest + "\n";
  };
  char rest[64];
  std::snprintf(rest, sizeof(rest), " %8s %10s %6s", "calls", "total ms", "share");
  row("op", "pass", "dtypes", rest);
  for (size_t i = 0; i < shown; ++i) {
    const auto& [key, t] = rows[i];
    std::snprintf(rest, sizeof(rest), " %8lld %10.1f %5.1f%%", static_cast<long long>(t.calls), 1e3 * t.seconds,
                  all > 0 ? 100 * t.seconds / all : 0.0);
    row(std::get<0>(key), std::get<1>(key) ? "backward" : "forward", std::get<2>(key), rest);
  }
  return out;
}

}  // namespace castor::train
