// The run directory: where a run's files go and who owns them, the state its checkpoints hold beyond the model, and
// what a resumed run takes from its recording.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/output_dir.h"
#include "castor/train_config.h"
#include "train/task.h"

namespace castor::train {

// Everything a checkpoint holds besides the model: precision and optimizer state, schedule, RNG and position.
struct TrainState {
  int64_t step = 0, epoch = 0, batch = 0;  // steps done; the epoch and batch within it that come next

  // The checkpoint of `run` at this position; `config` is the run's recorded settings.
  // Sharded (ZeRO, `slices`): every rank calls it, and the optimizer's sharded tensors are this rank's slices in
  // ck.shard (for write_sharded_checkpoint).
  Checkpoint save(const Run& run, const Json& config, bool slices = false) const;
  // Validates `ck` (`what` names it) and restores it into `run`: every counter a finite integer consistent with
  // the others, `batches_per_epoch` and `grad_accum` batches per step, the RNG state whole; the model and
  // precision state check their shapes.
  static TrainState load(const Checkpoint& ck, Run& run, int64_t batches_per_epoch, int64_t grad_accum,
                         const std::string& what);
};

// The run directory of `--resume PATH` (a run directory, or a checkpoint folder inside one) and the checkpoint
// to start from (a folder, or the run directory: its newest intact checkpoint).
std::pair<std::string, std::string> resolve_resume(const std::string& path);

// The run directory of a new run without --out: runs/<date>-<time>-<model>-<precision>, a new one each time (as timm
// and Lightning do); every rank of a job takes rank 0's clock.
std::string default_out(const TrainConfig& c);

// Takes ownership of the run directory `c.out` for the run's lifetime: creates it, locks it, refuses (or with
// --overwrite clears) another run's files in a new run, removes stale temp folders, checks `checkpoints`.
// In a data-parallel job only rank 0 calls it (the other ranks write nothing).
std::unique_ptr<FileLock> own_run_dir(const TrainConfig& c, bool continuing);

// castor export's rule for an output (`flag`'s value `out`; every writer calls it before anything is written): a
// directory output (`dir_files` given: the files its writer writes, `what` the writer) as check_output_dir says (no
// symbolic link, no run directory, nothing but those files), a file as check_replaceable says; and never one of
// `inputs` (the export's source: its checkpoint, run directory or model file; the --init a run records, the base a
// LoRA run records, --lora-base), inside one, holding one, or inside any run's checkpoint folder: a merged export
// written over its own base would leave the LoRA run unable to resume or merge again. castor::Error, one line.
void check_export_out(const std::string& flag, const std::string& out, const OwnsEntry& dir_files,
                      const std::string& what, const std::vector<std::string>& inputs);

// The settings a checkpoint recorded (an object with the schedule's length, or its steps/epochs in older ones).
Json recorded_config(const Checkpoint& ck, const std::string& what);
// The schedule length a resumed run keeps: what its first run recorded (older records: its own steps/epochs).
int64_t recorded_schedule_steps(const Json& recorded, int64_t steps_per_epoch);
// --batch-size of a resumed run: the recorded global batch (batch x ranks) split among this job's ranks, with a note
// when the number of ranks changed.
void resume_batch_size(TrainConfig& c, const Json& recorded, int world);
// What the schedule does past the step it was set up for, printed when a resumed run extends it; and a note when the
// warmup takes the whole schedule (the learning rate never reaches --lr).
void check_extension(const TrainConfig& c, int64_t schedule_steps, int64_t total_steps);

}  // namespace castor::train
