// The `castor` command's jobs: train (with checkpoints and exact resume), eval, and info.
#pragma once
#include <string>
#include <vector>

#include "castor/json.h"
#include "castor/train_config.h"

namespace castor::train {

// Runs a training job; prints progress and per-epoch lines, writes config.json, metrics.jsonl, checkpoints
// and report.html under cfg.out, and returns the summary (also printed as the last stdout line).
Json run_train(TrainConfig cfg);

// `castor eval --checkpoint DIR|FILE [--data-dir DIR] [--batch-size N]`: test-set accuracy and loss.
Json run_eval(const std::vector<std::string>& args);

// `castor info FILE|DIR`: tensors, dtypes, shapes, metadata and precision state of a checkpoint.
std::string run_info(const std::vector<std::string>& args);

}  // namespace castor::train
