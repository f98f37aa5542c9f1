// A self-contained HTML report of a training run: loss, accuracy and loss scale over steps, skipped steps marked.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace castor::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0, loss_scale = 1, lr = 0;
  bool skipped = false;
};

struct EpochRecord {
  int64_t epoch = 0, step = 0;
  double train_loss = 0, test_loss = 0, test_accuracy = 0, images_per_sec = 0;
};

// An HTML page with inline SVG charts (no scripts, no external files).
std::string render_report(const std::string& title, const std::vector<StepRecord>& steps,
                          const std::vector<EpochRecord>& epochs);

}  // namespace castor::train
