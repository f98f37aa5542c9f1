// Crash-safe checkpoint directories: temp dir, fsync, checksummed commit marker, rename; keep the newest K.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "castor/dist.h"
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
  // ZeRO (write_sharded_checkpoint): this rank's slices of the sharded training-state tensors, flattened (their keys
  // are not in `state`), and where each lies in its whole tensor. read_checkpoint returns them whole in `state`.
  struct Slice {
    Shape shape;  // of the whole tensor
    int64_t begin = 0;
  };
  StateDict shard;
  std::map<std::string, Slice> shard_where;
  // ZeRO (write_sharded_checkpoint), in place of `model` (then empty): the model's tensors in name order, each made
  // only as it is written. `make` is a collective that every rank calls for each tensor in this order; it returns
  // the tensor whole (rank 0 writes it, the others drop it), so no rank holds the whole model at once.
  struct LazyTensor {
    std::string name;
    DType dtype;
    Shape shape;
    std::function<Tensor()> make;
  };
  std::vector<LazyTensor> model_each;
};

// A checkpoint directory holding this file (the LoRA runs whose frozen base is its model.safetensors, one absolute path
// a line) is never pruned.
inline constexpr const char* kLoraRunsFile = "LORA_RUNS";

// Writes `run_dir`/checkpoints/step-<step> atomically: files into a temp directory, each fsynced, the COMMIT
// marker (holding each file's checksum) last, the directory renamed into place and its parent fsynced. Then
// deletes all but the newest `keep` complete checkpoints and those a LoRA run is built on (kLoraRunsFile). Returns
// the checkpoint's path. A failure leaves older checkpoints intact.
std::string write_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt, int64_t keep);

// write_checkpoint for a sharded run, called by every rank of `group`: each rank writes its `ckpt.shard` into
// shard-<rank>-of-<world>.safetensors in the temp directory, rank 0 (whose `ckpt` holds the model and the rest of
// the state) adds the manifest (metadata "castor.shards" of train_state.safetensors: the shard files, and per tensor
// its shape and each rank's first element and length), the COMMIT marker with every file's checksum, and renames.
// A `ckpt.model_each` is written by rank 0 a tensor at a time while every rank makes each in turn. The checkpoint is
// complete only when every shard, the model and the manifest are; a failure on any rank is raised on every rank
// and leaves older checkpoints intact. Returns the checkpoint's path (on rank 0).
std::string write_sharded_checkpoint(const std::string& run_dir, int64_t step, Checkpoint& ckpt, int64_t keep,
                                     dist::ProcessGroup& group);

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

// Reads a checkpoint directory, verifying the checksums its COMMIT marker records (a sharded one's shards put
// together into whole tensors, whatever the world size now); castor::Error naming the file
// on anything missing, damaged or corrupt. A marker recording no checksums (builds before 2026-11-24) is refused:
// damage to such a checkpoint could not be detected. Given a run directory, reads its newest intact checkpoint,
// warning on stderr about each newer damaged one it passes over. `used`, when given, receives the checkpoint's path.
Checkpoint read_checkpoint(const std::string& path, std::string* used = nullptr);

using formats::castor_config;  // (castor/formats.h)

// Removes the temp folders killed runs left under `run_dir`/checkpoints (call only while owning the run).
void remove_stale_temps(const std::string& run_dir);

}  // namespace castor::train
