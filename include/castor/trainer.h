// The `castor` command's jobs: train (with checkpoints and exact resume), eval, and info.
#pragma once
#include <string>
#include <vector>

#include "castor/json.h"
#include "castor/train_config.h"

namespace castor::train {

// Runs a training job; prints progress and per-epoch lines, writes config.json, metrics.jsonl, checkpoints
// and report.html under cfg.out, and returns the summary (also printed as the last stdout line). Holds an
// exclusive lock on cfg.out throughout. After an interrupt (see below) it checkpoints the finished step and
// returns early with "interrupted_by_signal" in the summary; a resumed run that is already complete returns
// {"already_complete": true, ...} and changes nothing.
Json run_train(TrainConfig cfg);

// Makes the first SIGINT/SIGTERM/SIGHUP ask a running run_train to stop after its step (with a checkpoint);
// a second one exits at once with status 128 + signal.
void install_interrupt_handlers();

// `castor eval`: test-set accuracy and loss of a castor checkpoint, or of weights without castor metadata
// (e.g. written by PyTorch) given their model and dataset.
Json run_eval(const EvalConfig& cfg);

// `castor info FILE|DIR`: tensors, dtypes, shapes, parameter counts, metadata and precision state of a checkpoint.
std::string run_info(const std::vector<std::string>& args);

}  // namespace castor::train
