// Crash-safe checkpoint directories: temp dir, fsync, checksummed commit marker, rename; keep the newest K.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "castor/formats.h"
#include "castor/json.h"
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

// A checkpoint directory holding this file (the LoRA runs whose frozen base is its model.safetensors, one absolute path
// a line) is never pruned.
inline constexpr const char* kLoraRunsFile = "LORA_RUNS";

// Writes `run_dir`/checkpoints/step-<step> atomically: files into a temp directory, each fsynced, the COMMIT
// marker (holding each file's checksum) last, the directory renamed into place and its parent fsynced. Then
// deletes all but the newest `keep` complete checkpoints and those a LoRA run is built on (kLoraRunsFile). Returns
// the checkpoint's path. A failure leaves older checkpoints intact.
std::string write_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt, int64_t keep);

// `castor train --keep-best`: RUN/best becomes a copy of the complete checkpoint directory `checkpoint` (hard links
// where the file system allows them: a checkpoint's files are never rewritten in place) with best.json `best`
// ({"metric", "value", "step"}); outside checkpoints/, so --keep's pruning never removes it. Replaced whole: the new
// copy is made beside it and renamed into place. castor::Error naming the directory on failure (the old copy kept).
void keep_best_checkpoint(const std::string& run_dir, const std::string& checkpoint, const Json& best);
// RUN/best/best.json, or null when the run kept none.
Json read_best(const std::string& run_dir);

// The newest complete checkpoint (one with a COMMIT marker) under `run_dir`/checkpoints, if any; not verified.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// True when `path` is a checkpoint folder (holds a COMMIT marker).
bool is_checkpoint_dir(const std::string& path);

// Reads a checkpoint directory, verifying the checksums its COMMIT marker records; castor::Error naming the file
// on anything missing, damaged or corrupt. A marker recording no checksums (builds before 2026-11-24) is refused:
// damage to such a checkpoint could not be detected. Given a run directory, reads its newest intact checkpoint,
// warning on stderr about each newer damaged one it passes over. `used`, when given, receives the checkpoint's path.
Checkpoint read_checkpoint(const std::string& path, std::string* used = nullptr);

using formats::castor_config;  // (castor/formats.h)

// Removes the temp folders killed runs left under `run_dir`/checkpoints (call only while owning the run).
void remove_stale_temps(const std::string& run_dir);

}  // namespace castor::train
