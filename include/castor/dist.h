// Data-parallel communication (torch.distributed for Castor): a process group over Open MPI, world size 1 without it.
#pragma once
#include <memory>
#include <string>

#include "castor/tensor.h"

namespace castor::dist {

enum class ReduceOp { Sum, Max };

// A collective in flight (torch.distributed's Work). wait() blocks until it is done; test() only drives it
// forward and says whether it is. Both raise castor::Error naming the failed call. Destroying a Work that has
// not finished waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

// The collectives a backend provides. Every rank must call them in the same order with tensors of the same
// shape and dtype. Tensors are contiguous and are updated in place.
//   all_reduce: float32 and float64 with Sum or Max; float16 and bfloat16 with Sum, where each addition is done
//     in float32 and rounded once to the 16-bit type (with two ranks the result is the float32 sum, rounded once).
//     The reduction order depends only on the world size, so results are the same on every rank and in every run.
//   broadcast: `t` takes root's values. all_gather: a (world size, *t.shape) tensor of every rank's `t`.
//   reduce_scatter: `in` holds world size equal contiguous chunks of out.numel() elements; rank r's `out` becomes the
//     sum over ranks of chunk r (the dtypes and additions of all_reduce, Sum only; with two ranks each element is
//     the same a + b as all_reduce's, so the two agree bit for bit).
//   all_gather_into: `out` (world size x in.numel() elements, in's dtype) becomes every rank's `in`, rank order.
//   all_gather_slices: `t` (contiguous, n elements) cut as shard_of(n, r, world, align) cuts it, `chunk` elements a
//     rank (the last parts shorter or empty, no padding): rank r's part of `t` holds its values, and afterwards every
//     rank's `t` holds every rank's part, in place (ZeRO's weights gathered without a second whole copy).
//   The _async variants return at once; `in` and `out` must stay untouched until the Work is done (it holds them).
// A new backend (NCCL for GPUs, say) implements this class; see docs/distributed.md.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string backend() const = 0;  // "mpi", "local"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  virtual std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual Tensor all_gather(const Tensor& t) = 0;
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in) = 0;
  virtual std::unique_ptr<Work> all_gather_into_async(const Tensor& out, const Tensor& in) = 0;
  // (default: through all_gather_into and a padded copy; the MPI group gathers in place)
  virtual std::unique_ptr<Work> all_gather_slices_async(const Tensor& t, int64_t chunk);
  virtual void reduce_scatter(const Tensor& out, const Tensor& in) { reduce_scatter_async(out, in)->wait(); }
  virtual void all_gather_into(const Tensor& out, const Tensor& in) { all_gather_into_async(out, in)->wait(); }
  // Blocking all_reduce: all_reduce_async and wait, unless the backend has a faster blocking collective.
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
};

// Sets up the default group once (later calls do nothing): under mpirun (OMPI_COMM_WORLD_SIZE set) it initialises
// MPI and makes MPI errors return codes, which become castor::Error; in a plain process it is a group of one that
// makes no MPI calls. The functions below call it on first use.
void init();
// The default group, and the environment's view of it.
ProcessGroup& default_group();
int rank();
int world_size();
int local_rank();  // among the ranks on this machine
int local_size();
bool is_launched_by_mpirun();       // the process runs under mpirun (without calling MPI)
std::string mpi_library_version();  // the MPI library's own line ("Open MPI v4.1.4, ..."); needs no init()

// The default group's collectives (see ProcessGroup).
void barrier();
void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);
void broadcast(const Tensor& t, int root = 0);
Tensor all_gather(const Tensor& t);
void reduce_scatter(const Tensor& out, const Tensor& in);
std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in);
void all_gather_into(const Tensor& out, const Tensor& in);
std::unique_ptr<Work> all_gather_into_async(const Tensor& out, const Tensor& in);

// A tensor of `numel` elements cut into `world` contiguous slices for sharding (ZeRO, llm.c's zero_stage): each rank
// owns `chunk` elements, the smallest multiple of `align` with chunk * world >= numel (the tensor padded to
// chunk * world), so every slice starts at a multiple of `align` (AdamW8bit's blocks never straddle two ranks).
// Rank r's slice is [r * chunk, r * chunk + chunk) of the padded tensor; `begin` and `length` are its part inside
// the tensor (length is 0 for a rank past the end).
struct Shard {
  int64_t chunk = 0;
  int64_t begin = 0;
  int64_t length = 0;
};
Shard shard_of(int64_t numel, int rank, int world, int64_t align = 1);

// Ends every rank of the job at once with `code` (MPI_Abort); a plain process exits. For errors after which
// the other ranks would otherwise wait for this one forever.
[[noreturn]] void abort(int code);

}  // namespace castor::dist
