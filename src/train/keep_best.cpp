// --keep-best and --early-stop (src/train/keep_best.h).
#include "train/keep_best.h"

#include <algorithm>
#include <cmath>

#include "castor/check.h"
#include "castor/checkpoint.h"

namespace castor::train {

KeepBest::KeepBest(const std::string& run_dir, const std::string& metric, int64_t early_stop,
                   const std::vector<std::string>& metrics)
    : metric_(metric), early_stop_(early_stop) {
  CASTOR_CHECK(early_stop == 0 || !metric.empty(), "--early-stop: needs the metric it watches (--keep-best METRIC)");
  if (metric.empty()) return;
  std::string listed;
  for (const std::string& k : metrics) listed += (listed.empty() ? "" : ", ") + k;
  CASTOR_CHECK(std::find(metrics.begin(), metrics.end(), metric) != metrics.end(), "--keep-best ", metric,
               ": not a metric of this run's evaluations (", listed, ")");
  const Json best = read_best(run_dir);
  if (const Json* m = best.is_object() ? best.find("metric") : nullptr; m && *m == Json(metric))
    best_ = best.at("value").as_double();
}

KeepBest::Verdict KeepBest::observe(const Task& task, const Evaluation& ev) {
  if (metric_.empty()) return Verdict::None;
  std::optional<double> value;
  for (const auto& [key, v] : task.evaluation_keys(ev))
    if (key == metric_) value = v;
  for (const auto& [key, v] : ev.task_scores)
    if (key == metric_) value = v;
  if (!value || !std::isfinite(*value)) return Verdict::None;
  const bool lower = metric_.ends_with("loss") || metric_.ends_with("perplexity");
  if (!best_ || (lower ? *value < *best_ : *value > *best_)) {
    best_ = *value;
    stale_ = 0;
    return Verdict::Better;
  }
  return early_stop_ > 0 && ++stale_ >= early_stop_ ? Verdict::Stop : Verdict::None;
}

}  // namespace castor::train
