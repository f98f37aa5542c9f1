// DistributedDataParallel: rank 0's initial state, gradient buckets launched from post-accumulate hooks, no_sync.
#include "castor/ddp.h"

#include <algorithm>
#include <chrono>

#include "castor/autograd.h"
#include "castor/ops.h"

namespace castor::nn {

std::vector<std::vector<size_t>> plan_buckets(const std::vector<int64_t>& bytes, int64_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = bytes.size(); k-- > 0;) {
    if (buckets.empty() || (filled > 0 && filled + bytes[k] > cap_bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += bytes[k];
  }
  return buckets;
}

namespace {

// Every rank must wrap the same architecture: collectives over buffers of different sizes are undefined behaviour in
// MPI (Open MPI corrupts memory), so the wrapper compares tensor and element counts first and raises on every rank.
void check_same_model(const Module& module, dist::ProcessGroup& group) {
  int64_t tensors = 0, elements = 0;
  for (const NamedTensors& list : {module.named_parameters(), module.named_buffers()})
    for (const auto& [name, t] : list) {
      ++tensors;
      elements += t.numel();
    }
  const Tensor all = group.all_gather(tensor({static_cast<double>(tensors), static_cast<double>(elements)}, {2},
                                             DType::Int64));  // (world, 2)
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  for (int r = 1; r < group.size(); ++r)
    CASTOR_CHECK(v[2 * r] == v[0] && v[2 * r + 1] == v[1], "DistributedDataParallel: rank ", r, "'s model has ",
                 v[2 * r], " parameter and buffer tensors with ", v[2 * r + 1], " elements, rank 0's ", v[0], " with ",
                 v[1], "; every rank must wrap the same model");
}

}  // namespace

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;
    // Of each parameter in `flat`; with reduce_scatter in each rank's part of it (rank q's slice of parameter j at
    // q * numel / world + offsets[j]), where each slice takes shards[j].chunk elements.
    std::vector<int64_t> offsets;
    std::vector<dist::Shard> shards;
    int64_t numel = 0;
    size_t pending = 0;  // gradients not yet accumulated in this backward
    Tensor flat;         // (numel) float32: the gradients, divided by the world size
    Tensor wire;         // flat, or its 16-bit copy with compression
    Tensor mine;         // reduce_scatter: this rank's part (numel / world), in the wire's dtype
    std::unique_ptr<dist::Work> work;
  };

  dist::ProcessGroup& group;
  DDPOptions options;
  std::vector<Tensor> params;
  std::vector<size_t> bucket_of;
  // Tied parameters (one tensor under several names, as a GPT's wte and lm_head): a backward accumulates into them
  // once per use, so no hook can tell their last gradient; they go in a bucket of their own, launched at the end.
  std::vector<bool> tied;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  std::vector<Tensor> shard_grads;  // reduce_scatter: this rank's slice of each parameter's averaged gradient
  size_t next_launch = 0;           // buckets launch in index order on every rank
  bool syncing = false;             // a synchronised backward is in progress
  bool no_sync = false;
  DDPStats stats;

  Reducer(dist::ProcessGroup& g, DDPOptions o, std::vector<Tensor> p, std::vector<bool> t)
      : group(g), options(o), params(std::move(p)), tied(std::move(t)), shard_grads(params.size()) {
    std::vector<int64_t> bytes;
    std::vector<size_t> index, tied_params;  // plan_buckets' k -> parameter
    for (size_t k = 0; k < params.size(); ++k) {
      if (tied[k]) {
        tied_params.push_back(k);
        continue;
      }
      index.push_back(k);
      bytes.push_back(params[k].numel() * 4);
    }
    auto plan = plan_buckets(bytes, static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024));
    for (auto& bucket : plan)
      for (size_t& k : bucket) k = index[k];
    if (!tied_params.empty()) plan.push_back(tied_params);
    bucket_of.resize(params.size());
    for (size_t b = 0; b < plan.size(); ++b) {
      Bucket bucket;
      bucket.params = plan[b];
      for (size_t k : plan[b]) {
        bucket_of[k] = b;
        bucket.offsets.push_back(bucket.numel);
        if (options.reduce_scatter) {
          bucket.shards.push_back(
              dist::shard_of(params[k].numel(), group.rank(), group.size(), options.shard_alignment));
          bucket.numel += bucket.shards.back().chunk;
        } else {
          bucket.numel += params[k].numel();
        }
      }
      if (options.reduce_scatter) bucket.numel *= group.size();
      buckets.push_back(std::move(bucket));
    }
  }

  // A gradient has been accumulated into parameter k.
  void on_grad(size_t k) {
    if (no_sync) return;
    if (!syncing) start_backward();
    if (tied[k]) return;  // launched with its own bucket at the end
    Bucket& b = buckets[bucket_of[k]];
    CASTOR_CHECK(!ready[k], "DistributedDataParallel: parameter ", k,
                 " received a second gradient in one backward "
                 "(a parameter used twice in one forward is not supported)");
    ready[k] = true;
    --b.pending;
    if (options.overlap)
      while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++);
    // Open MPI moves non-blocking collectives forward only inside MPI calls: test the ones in flight. A finished
    // reduce-scatter hands its slices over and frees its buffers at once (stage 2 holds no whole gradient).
    for (size_t i = 0; i < next_launch; ++i)
      if (buckets[i].work && buckets[i].work->test() && options.reduce_scatter) collect_slices(buckets[i]);
  }

  // reduce_scatter: a bucket's finished collective into shard_grads, its buffers freed.
  void collect_slices(Bucket& b) {
    NoGradGuard no_grad;
    b.work->wait();
    b.work.reset();
    const Tensor mine = b.mine.to(DType::Float32);
    for (size_t j = 0; j < b.params.size(); ++j) {
      // (rounded to the parameter's dtype, as the replicated .grad would be: the same bits either way)
      // (a float32 slice that is part of the bucket's is copied: a view would keep the whole of `mine` alive)
      const DType dtype = params[b.params[j]].dtype();
      const Tensor g = mine.narrow(0, b.offsets[j], b.shards[j].length);
      shard_grads[b.params[j]] = dtype != DType::Float32 ? g.to(dtype).to(DType::Float32)
                                 : b.params.size() == 1  ? g
                                                         : g.clone();
    }
    b.flat = b.wire = b.mine = Tensor();  // (the bucket's buffers are not held between steps)
  }

  void start_backward() {
    syncing = true;
    next_launch = 0;
    ready.assign(params.size(), false);
    for (Bucket& b : buckets) b.pending = b.params.size();
    shard_grads.assign(params.size(), Tensor());
    stats = {};
    autograd::queue_callback([weak = weak_self] {
      if (auto self = weak.lock()) self->finalize();
    });
  }

  void launch(size_t index) {
    Bucket& b = buckets[index];
    // reduce_scatter: at most two buckets in flight (the one before is waited for), so the float32 buffers of every
    // bucket are never alive at once: stage 2 holds no whole gradient (DeepSpeed's reduce_bucket_size).
    if (options.reduce_scatter && index > 0 && buckets[index - 1].work) collect_slices(buckets[index - 1]);
    NoGradGuard no_grad;
    // reduce_scatter of a bucket of one float32 gradient already laid out as the ranks' slices (no padding): sent from
    // the gradient itself, not a copy (the largest ones alone in their buckets: a language model's head, embedding).
    const Tensor& first = params[b.params[0]];
    const Tensor g0 = first.grad();
    const bool in_place = options.reduce_scatter && b.params.size() == 1 && g0.defined() &&
                          g0.dtype() == DType::Float32 && g0.is_contiguous() && g0.numel() == b.numel &&
                          g0.impl()->storage.use_count() == 1;
    if (in_place) {
      b.flat = g0.detach().view({-1});
      first.set_grad(Tensor());
    } else if (!b.flat.defined()) {
      b.flat = empty({b.numel}, DType::Float32);
    }
    for (size_t j = 0; j < b.params.size() && !in_place; ++j) {
      const Tensor& p = params[b.params[j]];
      if (options.reduce_scatter) {
        pack_slices(b, j, p);
        p.set_grad(Tensor());  // (every rank keeps only its slice)
        continue;
      }
      Tensor dst = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape());
      if (p.grad().defined())
        dst.copy_(p.grad());
      else
        dst.zero_();
    }
    b.flat.mul_(1.0 / group.size());
    b.wire = options.compression ? b.flat.to(*options.compression) : b.flat;
    if (options.reduce_scatter) {
      b.mine = empty({b.numel / group.size()}, b.wire.dtype());  // (new each time: shard_grads may alias it)
      b.work = group.reduce_scatter_async(b.mine, b.wire);
    } else {
      b.work = group.all_reduce_async(b.wire, dist::ReduceOp::Sum);
    }
    if (syncing && std::any_of(ready.begin(), ready.end(), [](bool r) { return !r; }))
      ++stats.buckets_launched_in_backward;
  }

  // Parameter j's gradient (zeros without one) cut into every rank's part of the bucket, padding zeroed.
  void pack_slices(Bucket& b, size_t j, const Tensor& p) {
    const int64_t part = b.numel / group.size(), chunk = b.shards[j].chunk, n = p.numel();
    const Tensor g = p.grad().defined() ? p.grad().contiguous().view({-1}) : Tensor();
    for (int q = 0; q < group.size(); ++q) {
      Tensor dst = b.flat.narrow(0, q * part + b.offsets[j], chunk);
      const int64_t begin = std::min(n, q * chunk), len = std::min(n, begin + chunk) - begin;
      if (g.defined() && len > 0)
        dst.narrow(0, 0, len).copy_(g.narrow(0, begin, len));
      else
        dst.narrow(0, 0, len).zero_();
      if (len < chunk) dst.narrow(0, len, chunk - len).zero_();
    }
  }

  void finalize() {
    const auto t0 = std::chrono::steady_clock::now();
    ready.assign(params.size(), true);  // (launches from here on are not counted as overlapped)
    while (next_launch < buckets.size()) launch(next_launch++);
    NoGradGuard no_grad;
    for (Bucket& b : buckets) {
      if (options.reduce_scatter) {
        if (b.work) collect_slices(b);  // (else collected during backward)
        continue;
      }
      b.work->wait();
      b.work.reset();
      if (b.wire.dtype() != DType::Float32) b.flat.copy_(b.wire);
      for (size_t j = 0; j < b.params.size(); ++j) {
        const Tensor& p = params[b.params[j]];
        Tensor src = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape());
        if (p.grad().defined())
          p.grad().copy_(src);
        else
          p.set_grad(src.to(p.dtype()).clone());
      }
    }
    syncing = false;
    stats.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  std::weak_ptr<Reducer> weak_self;
};

DistributedDataParallel::DistributedDataParallel(ModulePtr module, DDPOptions options, dist::ProcessGroup* group)
    : module_(register_module("module", std::move(module))) {
  CASTOR_CHECK(options.shard_alignment > 0, "DistributedDataParallel: shard_alignment must be positive, got ",
               options.shard_alignment);
  CASTOR_CHECK(options.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
               options.bucket_cap_mb);
  CASTOR_CHECK(!options.compression || is_16bit_float(*options.compression),
               "DistributedDataParallel: compression must be float16 or bfloat16, got ",
               dtype_name(*options.compression));
  dist::ProcessGroup& g = group ? *group : dist::default_group();
  check_same_model(*module_, g);
  // Every rank starts from rank 0's parameters and buffers (a parameter ZeRO-3 sharded as it was built holds no
  // storage: each rank's slice was taken from rank 0's values then, nn::ShardedBlocks::add).
  {
    NoGradGuard no_grad;
    for (const NamedTensors& list : {module_->named_parameters(), module_->named_buffers()})
      for (const auto& [name, t] : list) {
        if (t.numel() > 0 && t.impl()->storage->nbytes == 0) continue;
        Tensor buf = t.is_contiguous() ? t.detach() : t.contiguous();
        g.broadcast(buf, /*root=*/0);
        if (!t.is_contiguous()) t.detach().copy_(buf);
      }
  }
  // Tied parameters: listed once by parameters(), under each of their names by state_dict(). Frozen parameters (a
  // LoRA base) get no gradient, so no bucket: PyTorch's DDP leaves out parameters that do not require grad too.
  std::vector<Tensor> params;
  for (const Tensor& p : module_->parameters())
    if (p.requires_grad()) params.push_back(p);
  std::vector<bool> tied;
  const StateDict named = module_->state_dict();
  for (const Tensor& p : params)
    tied.push_back(std::count_if(named.begin(), named.end(), [&](const auto& e) {
                     return e.second.impl()->storage == p.impl()->storage &&
                            e.second.impl()->offset == p.impl()->offset && e.second.shape() == p.shape();
                   }) > 1);
  reducer_ = std::make_shared<Reducer>(g, options, std::move(params), std::move(tied));
  reducer_->weak_self = reducer_;
  for (size_t k = 0; k < reducer_->params.size(); ++k) {
    reducer_->params[k].register_post_accumulate_grad_hook([weak = std::weak_ptr<Reducer>(reducer_), k](const Tensor&) {
      if (auto r = weak.lock()) r->on_grad(k);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.reducer_->no_sync) {
  ddp_.reducer_->no_sync = true;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->no_sync = prev_; }

std::vector<std::vector<size_t>> DistributedDataParallel::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : reducer_->buckets) out.push_back(b.params);
  return out;
}

DDPStats DistributedDataParallel::stats() const { return reducer_->stats; }

std::vector<std::pair<Tensor, Tensor>> DistributedDataParallel::shard_grads() const {
  std::vector<std::pair<Tensor, Tensor>> out;
  for (size_t k = 0; k < reducer_->params.size(); ++k)
    if (reducer_->shard_grads[k].defined()) out.emplace_back(reducer_->params[k], reducer_->shard_grads[k]);
  return out;
}

}  // namespace castor::nn
