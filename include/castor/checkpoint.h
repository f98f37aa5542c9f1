// Crash-safe checkpoint directories: write into a temp dir, fsync, commit marker, rename; keep the newest K.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "castor/serialize.h"

namespace castor::train {

// What one checkpoint holds: the model (PyTorch names and layouts, loadable by PyTorch users) and the
// training state (optimizer, precision state, RNG, data position, step).
struct Checkpoint {
  StateDict model;
  Metadata model_meta;
  StateDict state;
  Metadata state_meta;
};

// Writes `run_dir`/checkpoints/step-<step> atomically: files into a temp directory, each fsynced, the COMMIT
// marker last, the directory renamed into place and its parent fsynced. Then deletes all but the newest
// `keep` complete checkpoints. Returns the checkpoint's path. A failure leaves older checkpoints intact.
std::string write_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt, int64_t keep);

// The newest complete checkpoint (one with a COMMIT marker) under `run_dir`/checkpoints, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// Reads a checkpoint directory (or a run directory: its latest checkpoint). castor::Error naming the file
// on anything missing or corrupt.
Checkpoint read_checkpoint(const std::string& path);

}  // namespace castor::train
