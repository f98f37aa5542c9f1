// nn::ShardedBlocks: ZeRO-3's parameter sharding - each rank keeps its slice of a group's weights and gathers the
// whole group only while it runs.
#include "castor/autograd.h"
#include "castor/ddp.h"
#include "castor/ops.h"

namespace castor::nn {

namespace {

// The storage a released parameter points at: none (its shape stays; nothing may read it until it is gathered).
std::shared_ptr<Storage> no_storage(DType dtype) { return std::make_shared<Storage>(0, dtype); }

}  // namespace

ShardedBlocks::ShardedBlocks(dist::ProcessGroup& group, int64_t align) : group_(group), align_(align) {}

ShardedBlocks::ShardedBlocks(std::vector<std::vector<Tensor>> groups, dist::ProcessGroup& group, int64_t align)
    : ShardedBlocks(group, align) {
  for (size_t g = 0; g < groups.size(); ++g) add(g, groups[g], /*broadcast=*/false);
}

void ShardedBlocks::add(size_t g, const std::vector<Tensor>& params, bool broadcast) {
  NoGradGuard no_grad;
  if (g >= groups_.size()) {
    groups_.resize(g + 1);
    whole_.resize(g + 1, false);
  }
  CASTOR_ASSERT(groups_[g].empty(), "ZeRO-3: parameter group ", g, " added twice");
  std::vector<Param> ps;
  for (const Tensor& p : params) {
    CASTOR_CHECK(p.is_contiguous() && is_floating(p.dtype()), "ZeRO-3: cannot shard parameter ", p.describe(),
                 " (contiguous floating-point parameters only)");
    if (broadcast) group_.broadcast(p.detach(), 0);
    const dist::Shard sh = dist::shard_of(p.numel(), group_.rank(), group_.size(), align_);
    Tensor slice = zeros({sh.chunk}, p.dtype());  // (chunk), the padding zero
    index_[p.impl()] = {g, ps.size()};
    ps.push_back({p, slice, sh});
  }
  groups_[g] = std::move(ps);
  whole_[g] = true;
  release(g);
}

const ShardedBlocks::Param& ShardedBlocks::find(const Tensor& param) const {
  const auto it = index_.find(param.impl());
  CASTOR_ASSERT(it != index_.end(), "ZeRO-3: ", param.describe(), " is not a sharded parameter");
  return groups_[it->second.first][it->second.second];
}

Tensor ShardedBlocks::whole(const Tensor& param) const {
  NoGradGuard no_grad;
  const Param& p = find(param);
  Tensor out = empty({p.param.numel()}, p.param.dtype());
  if (p.shard.length > 0) out.narrow(0, p.shard.begin, p.shard.length).copy_(p.slice.narrow(0, 0, p.shard.length));
  group_.all_gather_slices_async(out, p.shard.chunk)->wait();
  return out.view(p.param.shape());
}

void ShardedBlocks::load(const Tensor& param, const Tensor& value) {
  NoGradGuard no_grad;
  const Param& p = find(param);
  CASTOR_CHECK(value.shape() == p.param.shape() && is_floating(value.dtype()), "ZeRO-3: ", value.describe(),
               " does not fit parameter ", p.param.describe());
  if (p.shard.length > 0)
    Tensor(p.slice)
        .narrow(0, 0, p.shard.length)
        .copy_(value.contiguous().view({-1}).narrow(0, p.shard.begin, p.shard.length));
}

ShardedBlocks::Gathering ShardedBlocks::launch(size_t g) const {
  NoGradGuard no_grad;
  Gathering out;
  out.group = g;
  for (const Param& p : groups_[g]) {
    // (this rank's slice in its place, the other ranks' gathered around it: no padded copy)
    Tensor whole = empty({p.param.numel()}, p.param.dtype());
    if (p.shard.length > 0) whole.narrow(0, p.shard.begin, p.shard.length).copy_(p.slice.narrow(0, 0, p.shard.length));
    out.works.push_back(group_.all_gather_slices_async(whole, p.shard.chunk));
    out.wholes.push_back(std::move(whole));
  }
  return out;
}

void ShardedBlocks::gather(size_t g) {
  CASTOR_ASSERT(g < groups_.size(), "ZeRO-3: no parameter group ", g);
  if (whole_[g]) return;
  std::optional<Gathering> started;
  if (prefetched_ && prefetched_->group == g) started.swap(prefetched_);
  Gathering gathering = started ? std::move(*started) : launch(g);
  for (size_t k = 0; k < groups_[g].size(); ++k) {
    gathering.works[k]->wait();
    TensorImpl& impl = *groups_[g][k].param.impl();
    impl.storage = gathering.wholes[k].impl()->storage;
    impl.offset = 0;
  }
  whole_[g] = true;
}

void ShardedBlocks::prefetch(size_t g) {
  CASTOR_ASSERT(g < groups_.size(), "ZeRO-3: no parameter group ", g);
  if (whole_[g] || prefetched_) return;
  prefetched_ = launch(g);
}

void ShardedBlocks::release(size_t g) {
  CASTOR_ASSERT(g < groups_.size(), "ZeRO-3: no parameter group ", g);
  if (held_ || !whole_[g]) return;
  NoGradGuard no_grad;
  for (Param& p : groups_[g]) {
    if (p.shard.length > 0)
      p.slice.narrow(0, 0, p.shard.length).copy_(p.param.detach().view({-1}).narrow(0, p.shard.begin, p.shard.length));
    TensorImpl& impl = *p.param.impl();
    impl.storage = no_storage(impl.dtype);
    impl.offset = 0;
  }
  whole_[g] = false;
}

void ShardedBlocks::gather_each() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    gather(g);
    release(g);
  }
}

void ShardedBlocks::gather_all() {
  for (size_t g = 0; g < groups_.size(); ++g) gather(g);
  held_ = true;
}

void ShardedBlocks::release_all() {
  prefetched_.reset();  // (waits for a gather no one used)
  held_ = false;
  for (size_t g = 0; g < groups_.size(); ++g) release(g);
}

std::vector<std::pair<Tensor, Tensor>> ShardedBlocks::slices() const {
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const std::vector<Param>& ps : groups_)
    for (const Param& p : ps) out.emplace_back(p.param, p.slice);
  return out;
}

}  // namespace castor::nn
