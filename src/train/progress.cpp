// The terminal progress line of `castor train`: fields by priority, trimmed to the terminal's width.
#include "train/progress.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace castor::train {

std::string clock_text(double seconds) {
  const long long s = std::isfinite(seconds) && seconds > 0 ? std::llround(seconds) : 0;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

double remaining_seconds(const ProgressState& s) {
  const int64_t done = s.step - s.start_step;  // (a resumed run's earlier steps took none of elapsed_seconds)
  return done > 0 ? s.elapsed_seconds / static_cast<double>(done) * static_cast<double>(s.total_steps - s.step) : 0;
}

std::string fit_fields(const std::vector<std::string>& fields, int width) {
  std::string text;
  for (const std::string& f : fields) {
    const size_t extra = (text.empty() ? 0 : 2) + f.size();
    if (text.size() + extra > static_cast<size_t>(std::max(width, 0))) break;
    text += (text.empty() ? "" : "  ") + f;
  }
  return text;
}

std::string progress_line(const ProgressState& s, int width) {
  char buf[64];
  const double remaining = remaining_seconds(s);
  std::vector<std::string> fields;  // most important first
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof(buf), fmt, args...);
    fields.push_back(buf);
  };
  add("epoch %lld/%lld", static_cast<long long>(s.epoch), static_cast<long long>(s.epochs));
  add("step %lld/%lld", static_cast<long long>(s.step), static_cast<long long>(s.total_steps));
  add("loss %.4f", s.loss);
  add("%s<%s", clock_text(s.elapsed_seconds).c_str(), clock_text(remaining).c_str());
  add("%.0f %s/s", s.examples_per_sec, s.unit);
  if (s.mfu > 0) add("MFU %.0f%%", 100 * s.mfu);
  add("lr %.2g", s.lr);
  if (s.loss_scaling) add("scale %g", s.loss_scale);

  std::string text = fit_fields(fields, width);
  // The bar takes what is left, between 10 and 30 columns, or is left out.
  const int room = width - static_cast<int>(text.size()) - 3;
  if (room >= 10) {
    const int bar = std::min(room, 30);
    const int filled = s.total_steps > 0
                           ? static_cast<int>(bar * std::min<int64_t>(s.step, s.total_steps) / s.total_steps)
                           : 0;
    text = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(bar - filled), ' ') +
           "] " + text;
  }
  return text;
}

int terminal_width(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

}  // namespace castor::train
