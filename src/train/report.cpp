// Renders the run report: three SVG line charts (loss, test accuracy, loss scale) in one HTML page.
#include "castor/report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace castor::train {

namespace {

struct Series {
  std::vector<double> x, y;
};

// One chart: a polyline of `s`, optional red markers at `marks` (x positions), axis labels at the extremes.
std::string chart(const std::string& title, const Series& s, const std::vector<double>& marks, bool log_y) {
  constexpr double W = 640, H = 220, L = 60, R = 10, T = 24, B = 28;
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "'>"
    << "<text x='" << L << "' y='16' font-size='13' font-family='sans-serif'>" << title << "</text>";
  if (s.x.empty()) return o.str() + "<text x='60' y='110' font-size='12'>no data</text></svg>";
  auto ty = [&](double v) { return log_y ? std::log2(std::max(v, 1e-30)) : v; };
  double x0 = *std::min_element(s.x.begin(), s.x.end()), x1 = *std::max_element(s.x.begin(), s.x.end());
  double y0 = ty(s.y[0]), y1 = y0;
  for (double v : s.y)
    if (std::isfinite(ty(v))) y0 = std::min(y0, ty(v)), y1 = std::max(y1, ty(v));
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (ty(y) - y0) / (y1 - y0)) * (H - T - B); };
  o << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
    << "' fill='none' stroke='#999'/>";
  for (double m : marks)
    o << "<line x1='" << px(m) << "' x2='" << px(m) << "' y1='" << T << "' y2='" << H - B
      << "' stroke='#e33' stroke-opacity='0.5'/>";
  o << "<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  for (size_t i = 0; i < s.x.size(); ++i)
    if (std::isfinite(ty(s.y[i]))) o << px(s.x[i]) << "," << py(s.y[i]) << " ";
  o << "'/>";
  auto label = [&](double v) {
    std::ostringstream l;
    l.precision(4);
    l << (log_y ? std::exp2(v) : v);
    return l.str();
  };
  o << "<text x='4' y='" << T + 10 << "' font-size='11'>" << label(y1) << "</text>"
    << "<text x='4' y='" << H - B << "' font-size='11'>" << label(y0) << "</text>"
    << "<text x='" << L << "' y='" << H - 8 << "' font-size='11'>step " << x0 << "</text>"
    << "<text x='" << W - R - 80 << "' y='" << H - 8 << "' font-size='11'>step " << x1 << "</text></svg>";
  return o.str();
}

}  // namespace

std::string render_report(const std::string& title, const std::vector<StepRecord>& steps,
                          const std::vector<EpochRecord>& epochs) {
  Series loss, scale, acc;
  std::vector<double> skipped;
  for (const StepRecord& r : steps) {
    loss.x.push_back(r.step);
    loss.y.push_back(r.loss);
    scale.x.push_back(r.step);
    scale.y.push_back(r.loss_scale);
    if (r.skipped) skipped.push_back(r.step);
  }
  for (const EpochRecord& e : epochs) {
    acc.x.push_back(e.step);
    acc.y.push_back(100 * e.test_accuracy);
  }
  std::ostringstream o;
  o << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" << title << "</title></head>"
    << "<body style='font-family:sans-serif'><h2>" << title << "</h2>"
    << "<p>" << steps.size() << " logged steps, " << skipped.size()
    << " skipped (overflow) steps marked in red.</p>"
    << chart("training loss", loss, skipped, false) << "<br>"
    << chart("test accuracy (%) per epoch", acc, {}, false) << "<br>"
    << chart("loss scale (log scale)", scale, skipped, true) << "<table border='1' cellpadding='4'>"
    << "<tr><th>epoch</th><th>step</th><th>train loss</th><th>test loss</th><th>test accuracy</th><th>images/s</th></tr>";
  for (const EpochRecord& e : epochs)
    o << "<tr><td>" << e.epoch << "</td><td>" << e.step << "</td><td>" << e.train_loss << "</td><td>" << e.test_loss
      << "</td><td>" << 100 * e.test_accuracy << "%</td><td>" << e.images_per_sec << "</td></tr>";
  o << "</table></body></html>\n";
  return o.str();
}

}  // namespace castor::train
