// Renders the run report: settings in groups, SVG charts (loss, test accuracy, train vs test loss, learning rate,
// throughput, loss scale), epochs and op dtypes.
#include "castor/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <tuple>

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

// A tick label: whole numbers in full (65536, not 6.554e+04), others with up to 4 significant digits.
std::string tick_text(double v) {
  if (std::fabs(v) < 1e-12) return "0";
  char buf[32];
  if (v == std::round(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

struct Series {
  std::string name, color;
  bool dots = false;  // points instead of a line
  std::vector<double> x, y;
};

struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
};

// Round ticks (1, 2 or 5 times a power of ten, at least `min_step` apart) covering [lo, hi]; the axis spans them.
Axis nice_axis(double lo, double hi, int target, double min_step = 0) {
  if (hi <= lo) {
    const double pad = std::max(std::fabs(lo) * 0.05, std::max(min_step, 1e-3));
    lo -= pad, hi += pad;
  }
  const double raw = std::max((hi - lo) / target, min_step), mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  Axis a{std::floor(lo / step) * step, std::ceil(hi / step) * step, {}};
  for (double t = a.lo; t <= a.hi + step * 1e-9; t += step) a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return a;
}

// Powers of two (the exponents a whole step apart) covering [lo, hi], both given as log2 values.
Axis pow2_axis(double lo, double hi) {
  lo = std::floor(lo), hi = std::ceil(hi);
  if (hi <= lo) lo -= 1, hi += 1;
  const double step = std::max(1.0, std::ceil((hi - lo) / 5));
  Axis a{lo, lo + step * std::ceil((hi - lo) / step), {}};
  for (double t = a.lo; t <= a.hi; t += step) a.ticks.push_back(t);
  return a;
}

struct ChartSpec {
  std::string title, y_title;
  bool log2_y = false;                               // the loss scale: powers of two
  std::optional<std::pair<double, double>> y_range;  // fixed (accuracy: 0-100)
  std::optional<std::pair<double, double>> x_range;  // the steps shown (all charts: the whole run's)
};

// One chart of several series over steps, with red lines at `marks`: axis titles, round ticks on both axes.
std::string chart(const ChartSpec& spec, const std::vector<Series>& series, const std::vector<double>& marks = {}) {
  constexpr double W = 540, H = 250, L = 64, R = 14, T = 28, B = 44;
  auto ty = [&](double v) { return spec.log2_y ? std::log2(std::max(v, 1e-30)) : v; };
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
  o << "<svg xmlns='http://www.w3.org/2000/svg' class='chart' width='" << W << "' height='" << H << "'>"
    << "<text x='" << L << "' y='17' font-size='14' font-weight='bold'>" << escape(spec.title) << "</text>";
  if (points == 0) return o.str() + "<text x='" + number(L) + "' y='110' font-size='13'>no data yet</text></svg>";
  if (spec.y_range) y0 = spec.y_range->first, y1 = spec.y_range->second;
  if (spec.x_range) x0 = std::min(x0, spec.x_range->first), x1 = std::max(x1, spec.x_range->second);
  const Axis xa = nice_axis(x0, x1, 6, /*min_step=*/1);
  const Axis ya = spec.log2_y ? pow2_axis(y0, y1) : nice_axis(y0, y1, 4);
  auto px = [&](double x) { return L + (x - xa.lo) / (xa.hi - xa.lo) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (ty(y) - ya.lo) / (ya.hi - ya.lo)) * (H - T - B); };
  o << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
    << "' fill='none' stroke='#999'/>";
  for (double v : ya.ticks) {
    const double y = T + (1 - (v - ya.lo) / (ya.hi - ya.lo)) * (H - T - B);
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y << "' y2='" << y << "' stroke='#eee'/>"
      << "<text class='ytick' x='" << L - 5 << "' y='" << y + 4 << "' font-size='11' text-anchor='end'>"
      << tick_text(spec.log2_y ? std::exp2(v) : v) << "</text>";
  }
  for (double v : xa.ticks)
    o << "<line x1='" << px(v) << "' x2='" << px(v) << "' y1='" << H - B << "' y2='" << H - B + 4
      << "' stroke='#999'/><text class='xtick' x='" << px(v) << "' y='" << H - B + 16
      << "' font-size='11' text-anchor='middle'>" << tick_text(v) << "</text>";
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 6 << "' font-size='12' text-anchor='middle'>step</text>"
    << "<text x='14' y='" << (T + H - B) / 2 << "' font-size='12' text-anchor='middle' transform='rotate(-90 14 "
    << (T + H - B) / 2 << ")'>" << escape(spec.y_title) << "</text>";
  for (double m : marks)
    o << "<line x1='" << px(m) << "' x2='" << px(m) << "' y1='" << T << "' y2='" << H - B
      << "' stroke='#e33' stroke-opacity='0.45'/>";
  double legend_x = L + 230;
  for (const Series& s : series) {
    if (s.dots || s.x.size() == 1) {
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(ty(s.y[i])))
          o << "<circle cx='" << px(s.x[i]) << "' cy='" << py(s.y[i]) << "' r='" << (s.dots ? 1.5 : 3.5) << "' fill='"
            << s.color << "'/>";
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
  o << "</svg>";
  return o.str();
}

double field(const Json& r, const char* key, double fallback = NAN) {
  const Json* v = r.find(key);
  return v != nullptr && v->is_number() ? v->as_double() : fallback;
}

// The settings in groups, leaving out those that do not apply to this run (momentum under Adam, synthetic_size for
// real data, ...); keys in no group are listed under "run", so none is lost.
std::string settings_tables(const Json& config) {
  if (!config.is_object()) return "";
  const Json::Object& c = config.as_object();
  auto text = [&](const char* key) {
    auto it = c.find(key);
    return it == c.end() ? std::string() : it->second.is_string() ? it->second.as_string() : it->second.dump();
  };
  const std::string data = text("data"), amp = text("amp"), optimizer = text("optimizer"), schedule = text("schedule");
  const bool ranks = c.count("nproc") && c.at("nproc").is_int() && c.at("nproc").as_int() > 1;
  auto applies = [&](const std::string& k) {
    if (k == "momentum") return optimizer == "sgd";
    if (k == "synthetic_size") return data == "synthetic";
    if (k == "image_size" || k == "val_split" || k == "skip_bad_images" || k == "image_cache_mb")
      return data == "folder";
    if (k == "dtype" || k == "loss_scale") return amp != "O0";
    if (k == "stochastic_rounding") return amp == "O3";
    if (k == "sync_batchnorm" || k == "compress_grads") return ranks;
    if (k == "schedule_steps") return schedule != "none";
    if (k == "init" || k == "data_dir") return !text(k.c_str()).empty();
    if (k == "castor_version" || k == "git_commit" || k == "host_cpu" || k == "started") return false;  // the header
    return true;
  };
  const std::vector<std::pair<const char*, std::vector<std::string>>> groups = {
      {"model", {"model", "init", "input_shape", "num_classes", "class_names"}},
      {"data",
       {"data", "data_dir", "image_size", "val_split", "skip_bad_images", "image_cache_mb", "synthetic_size", "augment",
        "normalization", "batch_size"}},
      {"precision", {"amp", "dtype", "loss_scale", "stochastic_rounding"}},
      {"optimizer", {"optimizer", "lr", "momentum", "weight_decay", "clip_grad_norm", "grad_accum", "label_smoothing"}},
      {"schedule", {"schedule", "schedule_steps", "epochs", "steps"}},
      {"run", {}}};
  std::vector<std::string> placed;
  for (const auto& g : groups) placed.insert(placed.end(), g.second.begin(), g.second.end());
  std::ostringstream o;
  o << "<div class='grid'>";
  for (const auto& [group, keys] : groups) {
    std::vector<std::string> shown = keys;
    if (keys.empty())  // "run": everything else
      for (const auto& [k, v] : c)
        if (std::find(placed.begin(), placed.end(), k) == placed.end()) shown.push_back(k);
    o << "<table class='settings'><tr><th colspan='2'>" << group << "</th></tr>";
    for (const std::string& k : shown)
      if (c.count(k) && applies(k))
        o << "<tr><th>" << escape(k) << "</th><td>" << escape(text(k.c_str())) << "</td></tr>";
    o << "</table>";
  }
  o << "</div>";
  return o.str();
}

// The first and last step of the records: every chart spans them, so the charts line up.
std::optional<std::pair<double, double>> step_range(const std::vector<Json>& records) {
  std::optional<std::pair<double, double>> steps;
  for (const Json& r : records)
    if (const double step = field(r, "step"); std::isfinite(step))
      steps = steps ? std::pair{std::min(steps->first, step), std::max(steps->second, step)} : std::pair{step, step};
  return steps;
}

// The last evaluation's accuracy per class and its confusion matrix (none without classes).
std::string class_tables(const Json& by_class) {
  std::ostringstream o;
  if (!by_class.is_object() || !by_class.find("classes") || !by_class.find("confusion_matrix")) return "";
  const Json::Array& classes = by_class.at("classes").as_array();
  o << "<h3>Test set by class (last evaluation)</h3><div class='grid'><table><tr><th>#</th><th>class</th>"
    << "<th>accuracy</th><th>images</th></tr>";
  for (size_t i = 0; i < classes.size(); ++i)
    o << "<tr><td>" << i << "</td><td>" << escape(classes[i].at("name").as_string()) << "</td><td>"
      << number(100 * classes[i].at("accuracy").as_double()) << "%</td><td>" << classes[i].at("images").dump()
      << "</td></tr>";
  o << "</table><table class='confusion'><tr><th>true \\ predicted</th>";
  for (size_t i = 0; i < classes.size(); ++i) o << "<th>" << i << "</th>";
  o << "</tr>";
  const Json::Array& rows = by_class.at("confusion_matrix").as_array();
  for (size_t t = 0; t < rows.size(); ++t) {
    o << "<tr><th>" << t << " " << escape(classes[t].at("name").as_string()) << "</th>";
    const Json::Array& row = rows[t].as_array();
    for (size_t p = 0; p < row.size(); ++p)  // the diagonal (right) in bold
      o << "<td" << (p == t ? " style='font-weight:bold'" : "") << ">" << row[p].dump() << "</td>";
    o << "</tr>";
  }
  o << "</table></div>";
  return o.str();
}

// The dtypes each op of one forward pass ran in, by module.
std::string op_dtype_table(const std::vector<amp::ExplainRow>& op_dtypes) {
  std::ostringstream o;
  if (op_dtypes.empty()) return "";
  o << "<h3>Op dtypes (one forward pass, by module)</h3><table><tr><th>op</th><th>policy</th><th>inputs</th>"
    << "<th>ran in</th><th>output</th><th>why</th></tr>";
  auto dtypes = [](const std::vector<DType>& v) {
    std::string s;
    for (DType d : v) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
    return s;
  };
  std::string module;
  for (size_t i = 0; i < op_dtypes.size(); ++i) {
    const amp::ExplainRow& r = op_dtypes[i];
    if (!r.module.empty() && (i == 0 || r.module != module))  // a heading row where the module changes
      o << "<tr><th colspan='6' class='module'>" << escape(r.module) << "</th></tr>";
    module = r.module;
    o << "<tr><td>" << escape(r.op) << "</td><td>" << policy_name(r.policy) << "</td><td>" << dtypes(r.given)
      << "</td><td>" << dtypes(r.ran) << "</td><td>" << (r.out ? dtype_name(*r.out) : "-") << "</td><td>"
      << escape(r.why) << "</td></tr>";
  }
  o << "</table>";
  return o.str();
}

// What a run's records name its figures: a language model's validation loss, perplexity and tokens/s, or a
// classifier's test loss, accuracy and images/s.
struct Figures {
  bool lm;
  const char *eval_key, *loss_key, *rate_key, *rate_name, *metric_name, *unit;
  double scale;  // accuracy in percent
};

Figures figures_of(const std::vector<Json>& records) {
  const bool lm = std::any_of(records.begin(), records.end(),
                              [](const Json& r) { return r.find("val_loss") || r.find("tokens_per_sec"); });
  if (lm) return {true, "val_perplexity", "val_loss", "tokens_per_sec", "tokens/s", "Validation perplexity", "", 1};
  return {false, "test_accuracy", "test_loss", "images_per_sec", "images/s", "Test accuracy", "%", 100};
}

// One row per epoch end.
std::string epoch_table(const std::vector<const Json*>& epochs, const Figures& f) {
  std::ostringstream o;
  o << "<h3>Epochs</h3><table><tr><th>epoch</th><th>step</th><th>train loss</th><th>"
    << (f.lm ? "validation loss</th><th>perplexity" : "test loss</th><th>test accuracy") << "</th><th>" << f.rate_name
    << "</th><th>skipped steps</th></tr>";
  for (const Json* e : epochs)
    o << "<tr><td>" << field(*e, "epoch") << "</td><td>" << field(*e, "step") << "</td><td>"
      << number(field(*e, "train_loss")) << "</td><td>" << number(field(*e, f.loss_key)) << "</td><td>"
      << number(f.scale * field(*e, f.eval_key)) << f.unit << "</td><td>" << number(field(*e, f.rate_key), 5)
      << "</td><td>" << field(*e, "skipped_steps", 0) << "</td></tr>";
  o << "</table>";
  return o.str();
}

// The page's head, styles, title and the line naming the Castor build, date and CPU.
std::string page_head(const std::string& title, const Json& config) {
  std::ostringstream o;
  o << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" << escape(title) << "</title>"
    << "<style>body{font-family:sans-serif;margin:24px;max-width:1140px}table{border-collapse:collapse;"
    << "font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.grid{display:flex;"
    << "flex-wrap:wrap;gap:10px;align-items:flex-start}th.module{background:#eef}.meta{color:#555;font-size:13px}"
    << ".stat{font-size:15px;border:1px solid #ccc;padding:14px 20px;width:500px}.stat b{font-size:34px;display:block}"
    << "</style></head><body><h2>" << escape(title) << "</h2>";
  auto meta = [&](const char* key) {
    const Json* v = config.is_object() ? config.find(key) : nullptr;
    return v && v->is_string() ? escape(v->as_string()) : std::string("unknown");
  };
  o << "<p class='meta'>Castor " << meta("castor_version") << " (commit " << meta("git_commit") << "), started "
    << meta("started") << " on " << meta("host_cpu") << "</p>";
  return o.str();
}

// The charts' series, read from the metrics records.
struct Charted {
  Series raw{"logged step", "#9ecae1", true}, smooth{"window mean", "#1f77b4"};
  Series scale{"loss scale", "#ff7f0e"}, lr{"learning rate", "#9467bd"}, speed;
  Series train_loss{"train (window mean)", "#1f77b4"}, test_loss, acc;
  Series task_loss{"held-out chat (--eval-task)", "#9467bd"};
  // --eval-task's scores, in percent
  Series task_acc{"acc", "#2ca02c"}, task_norm{"acc_norm", "#d62728"}, task_tokens{"acc_norm (token mean)", "#9467bd"};
  std::vector<double> skipped;
  std::vector<const Json*> epochs;
  double peak = 0;
  bool scaling = false;  // any step with a loss scale other than 1 (bf16 and O0 runs have none)
};

Charted charted(const std::vector<Json>& records, const Figures& f) {
  Charted c;
  c.speed = {f.rate_name, "#8c564b"};
  c.test_loss = {f.lm ? "validation" : "test", "#d62728"};
  c.acc = {f.lm ? "validation perplexity" : "test accuracy", "#2ca02c"};
  std::vector<std::pair<double, double>> acc_points, test_loss_points;  // (step, value) of each evaluation
  // (step, acc, acc_norm, acc_norm_tokens)
  std::vector<std::tuple<double, double, double, double>> task_points;
  for (const Json& r : records) {
    const double step = field(r, "step");
    c.peak = std::max(c.peak, field(r, "peak_memory_bytes", 0));
    if (r.find("train_loss") != nullptr) c.epochs.push_back(&r);
    if (r.find("task_loss") != nullptr) c.task_loss.x.push_back(step), c.task_loss.y.push_back(field(r, "task_loss"));
    if (r.find("task_acc") != nullptr)
      task_points.emplace_back(step, 100 * field(r, "task_acc"), 100 * field(r, "task_acc_norm"),
                               100 * field(r, "task_acc_norm_tokens"));
    if (r.find(f.eval_key) != nullptr) {
      acc_points.emplace_back(step, f.scale * field(r, f.eval_key));
      test_loss_points.emplace_back(step, field(r, f.loss_key));
    } else if (r.find("loss") != nullptr) {
      c.raw.x.push_back(step), c.raw.y.push_back(field(r, "loss"));
      if (r.find("loss_avg") != nullptr) {
        c.smooth.x.push_back(step), c.smooth.y.push_back(field(r, "loss_avg"));
        c.lr.x.push_back(step), c.lr.y.push_back(field(r, "lr"));
        c.speed.x.push_back(step), c.speed.y.push_back(field(r, f.rate_key));
      }
      c.scale.x.push_back(step), c.scale.y.push_back(field(r, "loss_scale"));
      c.scaling |= field(r, "loss_scale", 1) != 1;
      if (const Json* s = r.find("skipped"); s != nullptr && s->is_bool() && s->as_bool()) c.skipped.push_back(step);
    }
  }
  // Evaluations and epoch ends interleave by step; an epoch end at a step already evaluated is the same evaluation.
  auto by_step = [](const auto& a, const auto& b) { return a.first < b.first; };
  std::stable_sort(acc_points.begin(), acc_points.end(), by_step);
  std::stable_sort(test_loss_points.begin(), test_loss_points.end(), by_step);
  for (auto [x, y] : acc_points) c.acc.x.push_back(x), c.acc.y.push_back(y);
  for (auto [x, y] : test_loss_points) c.test_loss.x.push_back(x), c.test_loss.y.push_back(y);
  c.train_loss.x = c.smooth.x, c.train_loss.y = c.smooth.y;
  std::stable_sort(task_points.begin(), task_points.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  for (const auto& [x, a, n, t] : task_points) {
    c.task_acc.x.push_back(x), c.task_acc.y.push_back(a);
    c.task_norm.x.push_back(x), c.task_norm.y.push_back(n);
    c.task_tokens.x.push_back(x), c.task_tokens.y.push_back(t);
  }
  return c;
}

}  // namespace

std::string render_report(const std::string& title, const Json& config, const std::vector<Json>& records,
                          const std::vector<amp::ExplainRow>& op_dtypes, const Json& by_class) {
  const Figures f = figures_of(records);
  const bool lm = f.lm;
  const char *metric_name = f.metric_name, *unit = f.unit;
  const Charted c = charted(records, f);
  const Series& acc = c.acc;
  const std::optional<std::pair<double, double>> steps = step_range(records);

  std::ostringstream o;
  o << page_head(title, config);
  o << "<p>" << c.raw.x.size() << " logged steps; " << c.skipped.size()
    << " skipped (overflow) steps, marked in red; peak tensor memory " << number(c.peak / 1048576.0) << " MiB";
  if (!acc.y.empty())
    o << "; last " << (lm ? "validation perplexity " : "test accuracy ") << number(acc.y.back()) << unit;
  o << ".</p><div class='grid'>"
    << chart({"Training loss", "cross-entropy loss", false, {}, steps}, {c.smooth, c.raw}, c.skipped);
  if (acc.x.size() == 1)  // one evaluation: a number, not a chart of one point
    o << "<div class='stat'>" << metric_name << "<b>" << number(acc.y[0]) << unit << "</b>after step "
      << tick_text(acc.x[0]) << (lm ? " (validation loss " : " (test loss ") << number(c.test_loss.y[0]) << ")</div>";
  else if (lm)
    o << chart({metric_name, "perplexity", false, {}, steps}, {acc});
  else
    o << chart({metric_name, "accuracy (%)", false, std::pair{0.0, 100.0}, steps}, {acc});
  std::vector<Series> losses{c.train_loss, c.test_loss};
  if (!c.task_loss.x.empty()) losses.push_back(c.task_loss);
  if (c.test_loss.x.size() > 1)
    o << chart({lm ? "Train vs validation loss" : "Train vs test loss", "cross-entropy loss", false, {}, steps},
               losses);
  if (!c.task_acc.x.empty())
    o << chart({"Benchmark task (--eval-task)", "accuracy (%)", false, std::pair{0.0, 100.0}, steps},
               {c.task_acc, c.task_norm, c.task_tokens});
  o << chart({"Learning rate", "learning rate", false, {}, steps}, {c.lr})
    << chart({"Throughput", f.rate_name, false, {}, steps}, {c.speed});
  if (c.scaling) o << chart({"Loss scale", "loss scale (log scale)", /*log2_y=*/true, {}, steps}, {c.scale}, c.skipped);
  o << "</div>";

  o << epoch_table(c.epochs, f);

  o << class_tables(by_class);

  o << "<h3>Settings</h3>" << settings_tables(config);

  o << op_dtype_table(op_dtypes);
  o << "</body></html>\n";
  return o.str();
}

}  // namespace castor::train
