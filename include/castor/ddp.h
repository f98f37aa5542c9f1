// nn::DistributedDataParallel: PyTorch DDP for Castor - gradients averaged across ranks in buckets that overlap backward.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "castor/dist.h"
#include "castor/nn.h"

namespace castor::nn {

struct DDPOptions {
  double bucket_cap_mb = 25;  // gradients are sent in buckets of about this size (PyTorch's bucket_cap_mb)
  // Float16 or BFloat16: each bucket travels in that type, pre-divided by the world size, with each addition done
  // in float32 (DDP's fp16_compress_hook / bf16_compress_hook); unset: float32 on the wire.
  std::optional<DType> compression;
  // false: every bucket is sent when backward has finished (for measuring what the overlap saves).
  bool overlap = true;
  // ZeRO-2: each bucket is reduce-scattered instead of all-reduced, so rank r receives only the average of its slice
  // of every parameter (dist::shard_of with this alignment: the optimizer's Optimizer::shard slices), kept in
  // shard_grads(); each parameter's .grad is dropped as soon as its bucket is sent.
  bool reduce_scatter = false;
  int64_t shard_alignment = 1;
};

// Where the time of the latest synchronised backward went (for benchmarks).
struct DDPStats {
  double wait_seconds = 0;                   // at the end of backward, waiting for all-reduces still in flight
  int64_t buckets_launched_in_backward = 0;  // before the last gradient arrived
};

// Wraps `module` for data-parallel training, as torch.nn.parallel.DistributedDataParallel:
// - at construction the ranks check that they wrap models of the same tensor and element counts (a castor::Error on
//   every rank otherwise), then every parameter and buffer takes rank 0's values;
// - parameters are grouped into buckets of about bucket_cap_mb in reverse registration order (the order backward
//   produces their gradients); when the last gradient of a bucket has been accumulated (a post-accumulate hook),
//   the bucket is copied into one buffer, divided by the world size and all-reduced without blocking, so the
//   communication overlaps the rest of backward; buckets are sent in the same order on every rank;
// - when backward ends, the remaining buckets are sent, all are waited for, and each parameter's .grad becomes the
//   average over ranks (a parameter without a gradient gets the average of the others', zeros if none had one);
// - inside no_sync(), backward only accumulates locally; the next backward outside it averages the sum.
// Parameter names gain the prefix "module." as in PyTorch; module() is the wrapped model (save its state dict).
// BatchNorm layers keep per-rank batch and running statistics, as in DDP (see SyncBatchNorm2d for the alternative).
// Use with amp::initialize(*ddp_or_model, ...) either way round; GradScaler decides skips across ranks.
class DistributedDataParallel : public Module {
 public:
  explicit DistributedDataParallel(ModulePtr module, DDPOptions options = {}, dist::ProcessGroup* group = nullptr);
  ~DistributedDataParallel() override;
  Tensor forward(const Tensor& input) override { return (*module_)(input); }
  std::string type_name() const override { return "DistributedDataParallel"; }
  const ModulePtr& module() const { return module_; }

  // While the returned guard lives, backward does not synchronise gradients (gradient accumulation).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // The buckets as indices into module()->parameters(), in the order they are sent.
  std::vector<std::vector<size_t>> buckets() const;
  DDPStats stats() const;
  // With reduce_scatter, after a synchronised backward: each parameter that gets a gradient, with the float32 average
  // over ranks of this rank's slice of it.
  std::vector<std::pair<Tensor, Tensor>> shard_grads() const;

  struct Reducer;

 private:
  ModulePtr module_;
  std::shared_ptr<Reducer> reducer_;  // the hooks hold it weakly
};

// ZeRO-3 (DeepSpeed's stage 3, FSDP's FULL_SHARD) for groups of parameters used together (a language model's
// blocks): each rank keeps only its slice of every parameter of the groups (dist::shard_of with `align`, in the
// parameter's own dtype), and between uses the parameters hold no storage. gather(g) makes group g's parameters
// whole on every rank (all_gather_into, the group's parameters launched together); release(g) keeps this rank's
// slice of what they hold and frees the rest (the memory goes once no autograd graph holds a view of it). Every
// rank must gather the same groups in the same order. prefetch(g) starts group g's gather without waiting (one at a
// time; the gather(g) that follows waits for it), so it overlaps the work before that (Open MPI moves it on inside
// any MPI call, such as DDP's tests of its buckets during backward). gather_all() makes every group whole until
// release_all(): release(g) does nothing meanwhile. add(g, params) takes group g (in any order: a file may give the
// blocks out of order) whose parameters are whole (each rank keeps its slice of them, with `broadcast` rank 0's
// values) and releases it: a model can be sharded a block at a time as it is built (nn::BlockInitGuard), never whole. The groups stay released when it is destroyed (gather_all
// first to keep the model).
class ShardedBlocks {
 public:
  ShardedBlocks(dist::ProcessGroup& group, int64_t align);
  ShardedBlocks(std::vector<std::vector<Tensor>> groups, dist::ProcessGroup& group, int64_t align);
  void add(size_t g, const std::vector<Tensor>& params, bool broadcast);
  size_t size() const { return groups_.size(); }
  void gather(size_t g);
  void prefetch(size_t g);
  void release(size_t g);
  void gather_all();
  void release_all();
  // gather(g) and release(g) of every group in order: the collectives of a forward over the groups, without it (a
  // rank with no batch left in an evaluation the others go on with).
  void gather_each();
  // Every sharded parameter with the slice this rank keeps of it (shard.chunk elements of its dtype), where an
  // optimizer updates it (optim::Optimizer::keep_param_slice).
  std::vector<std::pair<Tensor, Tensor>> slices() const;
  // Whether `param` is one of its parameters.
  bool holds(const Tensor& param) const { return index_.count(param.impl()) > 0; }
  // A copy of released parameter `param` whole, in its dtype (a collective: every rank calls it for the same
  // parameters in the same order); the parameter stays released. For writing a checkpoint a tensor at a time.
  Tensor whole(const Tensor& param) const;
  // This rank's slice of `value` (the whole parameter's values, any floating dtype: rounded to the parameter's) into
  // the slice it keeps of released parameter `param`; castor::Error for a shape other than the parameter's.
  void load(const Tensor& param, const Tensor& value);

 private:
  struct Param {
    Tensor param, slice;  // slice: (chunk) in param's dtype
    dist::Shard shard;
  };
  // A group's gather in flight: each parameter's whole storage (numel elements) and its collective.
  struct Gathering {
    size_t group = 0;
    std::vector<Tensor> wholes;
    std::vector<std::unique_ptr<dist::Work>> works;
  };
  Gathering launch(size_t g) const;
  const Param& find(const Tensor& param) const;
  std::vector<std::vector<Param>> groups_;
  std::map<const TensorImpl*, std::pair<size_t, size_t>> index_;  // a parameter's group and place in it
  std::vector<bool> whole_;
  std::optional<Gathering> prefetched_;
  dist::ProcessGroup& group_;
  int64_t align_;
  bool held_ = false;  // gather_all in effect
};

// The buckets of parameters of `bytes` (in registration order): reverse order, each holding parameters until
// adding the next would pass cap_bytes (a parameter larger than the cap gets its own bucket).
std::vector<std::vector<size_t>> plan_buckets(const std::vector<int64_t>& bytes, int64_t cap_bytes);

}  // namespace castor::nn
