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

ShardedBlocks::ShardedBlocks(std::vector<std::vector<Tensor>> groups, dist::ProcessGroup& group, int64_t align)
    : group_(group) {
  for (const std::vector<Tensor>& params : groups) {
    std::vector<Param> ps;
    for (const Tensor& p : params) {
      CASTOR_CHECK(p.is_contiguous() && is_floating(p.dtype()), "ZeRO-3: cannot shard parameter ", p.describe(),
                   " (contiguous floating-point parameters only)");
      const dist::Shard sh = dist::shard_of(p.numel(), group.rank(), group.size(), align);
      Tensor slice = zeros({sh.chunk}, p.dtype());  // (chunk), the padding zero
      ps.push_back({p, slice, sh});
    }
    groups_.push_back(std::move(ps));
    whole_.push_back(true);
  }
  for (size_t g = 0; g < groups_.size(); ++g) release(g);
}

void ShardedBlocks::gather(size_t g) {
  CASTOR_ASSERT(g < groups_.size(), "ZeRO-3: no parameter group ", g);
  if (whole_[g]) return;
  struct Pending {
    const Param* p;
    Tensor whole;  // (world * chunk)
    std::unique_ptr<dist::Work> work;
  };
  std::vector<Pending> pending;
  for (const Param& p : groups_[g]) {
    Tensor whole = empty({p.shard.chunk * group_.size()}, p.param.dtype());
    pending.push_back({&p, whole, group_.all_gather_into_async(whole, p.slice)});
  }
  for (Pending& q : pending) {
    q.work->wait();
    TensorImpl& impl = *q.p->param.impl();
    impl.storage = q.whole.impl()->storage;
    impl.offset = 0;
  }
  whole_[g] = true;
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

void ShardedBlocks::gather_all() {
  for (size_t g = 0; g < groups_.size(); ++g) gather(g);
  held_ = true;
}

void ShardedBlocks::release_all() {
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
