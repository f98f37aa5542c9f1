// Renders the run report: settings, SVG line charts (loss, test accuracy, loss scale), epochs and op dtypes.
#include "castor/report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace castor::train {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string number(double v, int precision = 4) {
  std::ostringstream o;
  o.precision(precision);
  o << v;
  return o.str();
}

struct Series {
  std::string name, color;
  bool dots = false;  // points instead of a line
  std::vector<double> x, y;
};

// One chart of several series over steps, with red lines at `marks`. Axes span the data (a single point gets
// a small margin around it and is labelled with its value).
std::string chart(const std::string& title, const std::vector<Series>& series, const std::vector<double>& marks,
                  bool log_y) {
  constexpr double W = 680, H = 230, L = 70, R = 12, T = 26, B = 30;
  auto ty = [&](double v) { return log_y ? std::log2(std::max(v, 1e-30)) : v; };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  size_t points = 0;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(ty(s.y[i]))) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, ty(s.y[i])), y1 = std::max(y1, ty(s.y[i]));
      ++points;
    }
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "'>"
    << "<text x='" << L << "' y='17' font-size='14' font-weight='bold'>" << escape(title) << "</text>";
  if (points == 0) return o.str() + "<text x='" + number(L) + "' y='110' font-size='13'>no data yet</text></svg>";
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) {
    const double pad = log_y ? 1 : std::max(std::fabs(y0) * 0.05, 1e-3);
    y0 -= pad, y1 += pad;
  }
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (ty(y) - y0) / (y1 - y0)) * (H - T - B); };
  auto value = [&](double v) { return number(log_y ? std::exp2(v) : v); };
  o << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
    << "' fill='none' stroke='#999'/>";
  for (int k = 0; k <= 2; ++k) {  // three horizontal grid lines with their values
    const double v = y0 + (y1 - y0) * k / 2, y = T + (1 - k / 2.0) * (H - T - B);
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y << "' y2='" << y << "' stroke='#eee'/>"
      << "<text x='" << L - 6 << "' y='" << y + 4 << "' font-size='11' text-anchor='end'>" << value(v) << "</text>";
  }
  for (double m : marks)
    o << "<line x1='" << px(m) << "' x2='" << px(m) << "' y1='" << T << "' y2='" << H - B
      << "' stroke='#e33' stroke-opacity='0.45'/>";
  double legend_x = L + 260;
  for (const Series& s : series) {
    if (s.dots || s.x.size() == 1) {
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(ty(s.y[i])))
          o << "<circle cx='" << px(s.x[i]) << "' cy='" << py(s.y[i]) << "' r='" << (s.dots ? 1.5 : 3.5)
            << "' fill='" << s.color << "'/>";
      if (points == 1) o << "<text x='" << px(s.x[0]) + 8 << "' y='" << py(s.y[0]) - 6 << "' font-size='12'>"
                         << number(s.y[0]) << " at step " << s.x[0] << "</text>";
    } else {
      o << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.6' points='";
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(ty(s.y[i]))) o << px(s.x[i]) << "," << py(s.y[i]) << " ";
      o << "'/>";
    }
    if (series.size() > 1) {
      o << "<rect x='" << legend_x << "' y='8' width='10' height='10' fill='" << s.color << "'/>"
        << "<text x='" << legend_x + 14 << "' y='17' font-size='12'>" << escape(s.name) << "</text>";
      legend_x += 20 + 7.0 * static_cast<double>(s.name.size());
    }
  }
  o << "<text x='" << L << "' y='" << H - 10 << "' font-size='11'>step " << x0 << "</text>"
    << "<text x='" << W - R << "' y='" << H - 10 << "' font-size='11' text-anchor='end'>step " << x1
    << "</text></svg>";
  return o.str();
}

double field(const Json& r, const char* key, double fallback = NAN) {
  const Json* v = r.find(key);
  return v != nullptr && v->is_number() ? v->as_double() : fallback;
}

}  // namespace

std::string render_report(const std::string& title, const Json& config, const std::vector<Json>& records,
                          const std::vector<amp::ExplainRow>& op_dtypes) {
  Series raw{"logged step", "#9ecae1", true}, smooth{"window mean", "#1f77b4"};
  Series acc{"test accuracy", "#2ca02c"}, scale{"loss scale", "#ff7f0e"};
  std::vector<double> skipped;
  std::vector<const Json*> epochs;
  double peak = 0;
  for (const Json& r : records) {
    const double step = field(r, "step");
    peak = std::max(peak, field(r, "peak_memory_bytes", 0));
    if (r.find("train_loss") != nullptr) {
      epochs.push_back(&r);
    } else if (r.find("test_accuracy") != nullptr) {
      acc.x.push_back(step), acc.y.push_back(100 * field(r, "test_accuracy"));
    } else if (r.find("loss") != nullptr) {
      raw.x.push_back(step), raw.y.push_back(field(r, "loss"));
      if (r.find("loss_avg") != nullptr) smooth.x.push_back(step), smooth.y.push_back(field(r, "loss_avg"));
      scale.x.push_back(step), scale.y.push_back(field(r, "loss_scale"));
      if (const Json* s = r.find("skipped"); s != nullptr && s->is_bool() && s->as_bool()) skipped.push_back(step);
    }
  }
  for (const Json* e : epochs) acc.x.push_back(field(*e, "step")), acc.y.push_back(100 * field(*e, "test_accuracy"));
  // Evaluations and epoch ends interleave by step.
  std::vector<size_t> order(acc.x.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return acc.x[a] < acc.x[b]; });
  Series acc_sorted{acc.name, acc.color};
  for (size_t i : order) acc_sorted.x.push_back(acc.x[i]), acc_sorted.y.push_back(acc.y[i]);

  std::ostringstream o;
  o << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" << escape(title) << "</title>"
    << "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;"
    << "font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.grid{display:flex;"
    << "flex-wrap:wrap;gap:8px}</style></head><body><h2>" << escape(title) << "</h2>";
  o << "<p>" << raw.x.size() << " logged steps; " << skipped.size()
    << " skipped (overflow) steps, marked in red; peak tensor memory " << number(peak / 1048576.0) << " MiB";
  if (!acc_sorted.y.empty()) o << "; last test accuracy " << number(acc_sorted.y.back()) << "%";
  o << ".</p><div class='grid'>" << chart("training loss", {smooth, raw}, skipped, false)
    << chart("test accuracy (%)", {acc_sorted}, {}, false) << chart("loss scale (log scale)", {scale}, skipped, true)
    << "</div>";

  o << "<h3>Epochs</h3><table><tr><th>epoch</th><th>step</th><th>train loss</th><th>test loss</th>"
    << "<th>test accuracy</th><th>images/s</th><th>skipped steps</th></tr>";
  for (const Json* e : epochs)
    o << "<tr><td>" << field(*e, "epoch") << "</td><td>" << field(*e, "step") << "</td><td>"
      << number(field(*e, "train_loss")) << "</td><td>" << number(field(*e, "test_loss")) << "</td><td>"
      << number(100 * field(*e, "test_accuracy")) << "%</td><td>" << number(field(*e, "images_per_sec"), 5)
      << "</td><td>" << field(*e, "skipped_steps", 0) << "</td></tr>";
  o << "</table>";

  o << "<h3>Settings</h3><table>";
  if (config.is_object())
    for (const auto& [k, v] : config.as_object())
      o << "<tr><th>" << escape(k) << "</th><td>" << escape(v.is_string() ? v.as_string() : v.dump()) << "</td></tr>";
  o << "</table>";

  if (!op_dtypes.empty()) {
    o << "<h3>Op dtypes (one forward pass)</h3><table><tr><th>op</th><th>policy</th><th>inputs</th><th>ran in</th>"
      << "<th>output</th><th>why</th></tr>";
    auto dtypes = [](const std::vector<DType>& v) {
      std::string s;
      for (DType d : v) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
      return s;
    };
    for (const amp::ExplainRow& r : op_dtypes)
      o << "<tr><td>" << escape(r.op) << "</td><td>" << policy_name(r.policy) << "</td><td>" << dtypes(r.given)
        << "</td><td>" << dtypes(r.ran) << "</td><td>" << (r.out ? dtype_name(*r.out) : "-") << "</td><td>"
        << escape(r.why) << "</td></tr>";
    o << "</table>";
  }
  o << "</body></html>\n";
  return o.str();
}

}  // namespace castor::train
