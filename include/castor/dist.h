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

// Ends every rank of the job at once with `code` (MPI_Abort); a plain process exits. For errors after which
// the other ranks would otherwise wait for this one forever.
[[noreturn]] void abort(int code);

}  // namespace castor::dist
