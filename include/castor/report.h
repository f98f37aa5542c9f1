// A self-contained HTML report of a training run, rebuilt from its whole metrics.jsonl (resumed parts included).
#pragma once
#include <string>
#include <vector>

#include "castor/explain.h"
#include "castor/json.h"

namespace castor::train {

// An HTML page with inline SVG charts (no scripts, no external files): the run's settings (config.json), loss
// (window means and single steps), test accuracy at each evaluation, loss scale with skipped steps marked, peak
// memory, the per-epoch table, the last evaluation by class (`by_class`: {"classes": [{name, accuracy, images}],
// "confusion_matrix": rows of true classes}, as `castor eval` prints; null: none) and the per-op dtype table of one
// forward pass (`op_dtypes`, may be empty).
std::string render_report(const std::string& title, const Json& config, const std::vector<Json>& records,
                          const std::vector<amp::ExplainRow>& op_dtypes, const Json& by_class = Json());

}  // namespace castor::train
