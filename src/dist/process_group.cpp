// The default process group: Open MPI's communicator under mpirun, a group of one in a plain process.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "castor/dist.h"
#include "castor/half.h"
#include "castor/ops.h"

namespace castor::dist {

namespace {

// An MPI return code as a castor::Error naming the call (the communicator returns codes, see init()).
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(detail::cat(call, " failed: ", len > 0 ? std::string(text, len) : "MPI error " + std::to_string(rc)));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// in_out[i] = in[i] + in_out[i], added in float32 and rounded once to the 16-bit type T.
template <class T>
void add_16bit(void* in, void* in_out, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(in_out);
  for (int i = 0; i < *len; ++i) b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

class MpiWork : public Work {
 public:
  MpiWork(MPI_Request request, const char* what, std::vector<Tensor> keep, std::vector<int> counts = {})
      : request_(request), what_(what), keep_(std::move(keep)), counts_(std::move(counts)) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), detail::cat("MPI_Wait (", what_, ")").c_str());
  }
  bool test() override {
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), detail::cat("MPI_Test (", what_, ")").c_str());
    return done != 0;
  }

 private:
  MPI_Request request_;
  const char* what_;
  std::vector<Tensor> keep_;  // the buffers MPI reads and writes stay alive until the collective ends
  std::vector<int> counts_;   // and the counts and displacements of a v-collective (MPI reads them until then too)
};

class DoneWork : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

void check_dense(const Tensor& t, const char* what) {
  CASTOR_CHECK(t.defined() && t.is_contiguous(), "dist::", what, ": expected a contiguous tensor, got ",
               t.defined() ? t.describe() : std::string("an undefined tensor"));
}

// all_gather_slices' `chunk` for `t` over `world` ranks: every element in some rank's part.
void check_slices(const Tensor& t, int64_t chunk, int world) {
  check_dense(t, "all_gather_slices");
  CASTOR_CHECK(chunk >= 0 && chunk * world >= t.numel(), "dist::all_gather_slices: ", world, " parts of ", chunk,
               " elements do not cover ", t.describe());
}

// `out` and `in` of a reduce_scatter (in holds `world` chunks of out's size) or all_gather_into (out holds them).
void check_scatter_pair(const Tensor& chunk, const Tensor& whole, int world, const char* what) {
  check_dense(chunk, what);
  check_dense(whole, what);
  CASTOR_CHECK(chunk.dtype() == whole.dtype() && whole.numel() == chunk.numel() * world, "dist::", what, ": ",
               whole.describe(), " is not ", world, " chunks of ", chunk.describe());
}

// A group of one: every collective leaves the tensor as it is.
class LocalGroup : public ProcessGroup {
 public:
  std::string backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_dense(t, "all_reduce");
    return std::make_unique<DoneWork>();
  }
  void broadcast(const Tensor& t, int root) override {
    CASTOR_CHECK(root == 0, "dist::broadcast: root ", root, " is not a rank of a group of one");
  }
  Tensor all_gather(const Tensor& t) override { return t.unsqueeze(0).clone(); }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(out, in, 1, "reduce_scatter");
    if (!out.is_same(in)) Tensor(out).copy_(in.view(out.shape()));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_gather_into_async(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(in, out, 1, "all_gather_into");
    if (!out.is_same(in)) Tensor(out).copy_(in.view(out.shape()));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_gather_slices_async(const Tensor& t, int64_t chunk) override {
    check_slices(t, chunk, 1);
    return std::make_unique<DoneWork>();
  }
};

class MpiGroup : public ProcessGroup {
 public:
  MpiGroup() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Only the thread that called init() communicates (the loader thread and OpenMP workers never do).
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit(finalize);
    }
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check_mpi(MPI_Op_create(&add_16bit<Half>, /*commute=*/1, &sum_f16_), "MPI_Op_create");
    check_mpi(MPI_Op_create(&add_16bit<BFloat16>, /*commute=*/1, &sum_bf16_), "MPI_Op_create");
  }

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    const auto [type, mpi_op] = reduction(t, op);
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count(t, "all_reduce"), type, mpi_op, comm_, &request),
              "MPI_Iallreduce");
    return std::make_unique<MpiWork>(request, "all_reduce", std::vector<Tensor>{t});
  }

  // (Open MPI's blocking all-reduce takes its tuned algorithms, faster than the non-blocking ones up to ~1 MB.)
  void all_reduce(const Tensor& t, ReduceOp op) override {
    const auto [type, mpi_op] = reduction(t, op);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), count(t, "all_reduce"), type, mpi_op, comm_), "MPI_Allreduce");
  }

  void broadcast(const Tensor& t, int root) override {
    check_dense(t, "broadcast");
    CASTOR_CHECK(root >= 0 && root < size_, "dist::broadcast: root ", root, " is not a rank of ", size_);
    check_mpi(MPI_Bcast(t.data_ptr(), count_bytes(t, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  Tensor all_gather(const Tensor& t) override {
    check_dense(t, "all_gather");
    Shape shape = t.shape();
    shape.insert(shape.begin(), size_);
    Tensor out = empty(shape, t.dtype());
    const int n = count_bytes(t, "all_gather");
    check_mpi(MPI_Allgather(t.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE, comm_), "MPI_Allgather");
    return out;
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(out, in, size_, "reduce_scatter");
    const auto [type, mpi_op] = reduction(out, ReduceOp::Sum);
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out, "reduce_scatter"), type, mpi_op,
                                        comm_, &request),
              "MPI_Ireduce_scatter_block");
    return std::make_unique<MpiWork>(request, "reduce_scatter", std::vector<Tensor>{out, in});
  }
  void reduce_scatter(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(out, in, size_, "reduce_scatter");
    const auto [type, mpi_op] = reduction(out, ReduceOp::Sum);
    check_mpi(
        MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out, "reduce_scatter"), type, mpi_op, comm_),
        "MPI_Reduce_scatter_block");
  }

  std::unique_ptr<Work> all_gather_into_async(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(in, out, size_, "all_gather_into");
    const int n = count_bytes(in, "all_gather_into");
    MPI_Request request;
    check_mpi(MPI_Iallgather(in.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE, comm_, &request),
              "MPI_Iallgather");
    return std::make_unique<MpiWork>(request, "all_gather_into", std::vector<Tensor>{out, in});
  }
  std::unique_ptr<Work> all_gather_slices_async(const Tensor& t, int64_t chunk) override {
    check_slices(t, chunk, size_);
    CASTOR_CHECK(t.numel() <= INT32_MAX, "dist::all_gather_slices: ", t.describe(), " has more than 2^31-1 elements");
    // counts[r], then displacements[r]: rank r's part, in elements of an unsigned type of the element's size
    std::vector<int> counts(2 * static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const int64_t begin = std::min(t.numel(), r * chunk);
      counts[static_cast<size_t>(r)] = static_cast<int>(std::min(t.numel(), begin + chunk) - begin);
      counts[static_cast<size_t>(size_ + r)] = static_cast<int>(begin);
    }
    MPI_Datatype type = MPI_UINT8_T;
    switch (dtype_size(t.dtype())) {
      case 2: type = MPI_UINT16_T; break;
      case 4: type = MPI_UINT32_T; break;
      case 8: type = MPI_UINT64_T; break;
      default: CASTOR_CHECK(dtype_size(t.dtype()) == 1, "dist::all_gather_slices: unsupported dtype ", t.describe());
    }
    MPI_Request request;
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t.data_ptr(), counts.data(), counts.data() + size_,
                              type, comm_, &request),
              "MPI_Iallgatherv");
    return std::make_unique<MpiWork>(request, "all_gather_slices", std::vector<Tensor>{t}, std::move(counts));
  }

  void all_gather_into(const Tensor& out, const Tensor& in) override {
    check_scatter_pair(in, out, size_, "all_gather_into");
    const int n = count_bytes(in, "all_gather_into");
    check_mpi(MPI_Allgather(in.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE, comm_), "MPI_Allgather");
  }

 private:
  // The MPI datatype and operation of an all-reduce of `t`.
  std::pair<MPI_Datatype, MPI_Op> reduction(const Tensor& t, ReduceOp op) const {
    check_dense(t, "all_reduce");
    const MPI_Op builtin = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    switch (t.dtype()) {
      case DType::Float32: return {MPI_FLOAT, builtin};
      case DType::Float64: return {MPI_DOUBLE, builtin};
      case DType::Int64: return {MPI_INT64_T, builtin};
      case DType::Float16:
      case DType::BFloat16:
        CASTOR_CHECK(op == ReduceOp::Sum, "dist::all_reduce: Max of ", t.describe(), " is not supported (Sum is)");
        return {MPI_UINT16_T, t.dtype() == DType::Float16 ? sum_f16_ : sum_bf16_};
      default: throw Error(detail::cat("dist::all_reduce: unsupported dtype ", t.describe()));
    }
  }
  static int count(const Tensor& t, const char* what) {
    CASTOR_CHECK(t.numel() <= INT32_MAX, "dist::", what, ": ", t.describe(), " has more than 2^31-1 elements");
    return static_cast<int>(t.numel());
  }
  static int count_bytes(const Tensor& t, const char* what) {
    CASTOR_CHECK(t.nbytes() <= INT32_MAX, "dist::", what, ": ", t.describe(), " is larger than 2 GiB");
    return static_cast<int>(t.nbytes());
  }
  static void finalize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op sum_f16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1;
};

// The waits of a padded all-gather, then the copy of its result into the tensor.
class CopyBackWork : public Work {
 public:
  CopyBackWork(std::unique_ptr<Work> work, Tensor padded, Tensor t)
      : work_(std::move(work)), padded_(std::move(padded)), t_(std::move(t)) {}
  void wait() override {
    if (!work_) return;
    work_->wait();
    finish();
  }
  bool test() override {
    if (work_ && work_->test()) finish();
    return !work_;
  }

 private:
  void finish() {
    t_.copy_(padded_.narrow(0, 0, t_.numel()).view(t_.shape()));
    work_.reset();
    padded_ = Tensor();
  }
  std::unique_ptr<Work> work_;
  Tensor padded_, t_;
};

std::once_flag g_once;
std::unique_ptr<ProcessGroup> g_group;

}  // namespace

std::unique_ptr<Work> ProcessGroup::all_gather_slices_async(const Tensor& t, int64_t chunk) {
  check_slices(t, chunk, size());
  const Tensor flat = t.view({-1});
  const int64_t begin = std::min(t.numel(), rank() * chunk), length = std::min(t.numel(), begin + chunk) - begin;
  Tensor mine = zeros({chunk}, t.dtype());
  mine.narrow(0, 0, length).copy_(flat.narrow(0, begin, length));
  Tensor padded = empty({chunk * size()}, t.dtype());
  std::unique_ptr<Work> work = all_gather_into_async(padded, mine);
  return std::make_unique<CopyBackWork>(std::move(work), std::move(padded), flat);
}

bool is_launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  MPI_Get_library_version(text, &n);
  std::string v(text, static_cast<size_t>(n));
  v = v.substr(0, v.find_first_of("\n,"));  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return v;
}

void init() {
  std::call_once(g_once, [] {
    if (is_launched_by_mpirun())
      g_group = std::make_unique<MpiGroup>();
    else
      g_group = std::make_unique<LocalGroup>();
  });
}

ProcessGroup& default_group() {
  init();
  return *g_group;
}

int rank() { return default_group().rank(); }
int world_size() { return default_group().size(); }
int local_rank() { return is_launched_by_mpirun() ? env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0) : 0; }
int local_size() { return is_launched_by_mpirun() ? env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1) : 1; }

void barrier() { default_group().barrier(); }
void all_reduce(const Tensor& t, ReduceOp op) { default_group().all_reduce(t, op); }
std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) { return default_group().all_reduce_async(t, op); }
void broadcast(const Tensor& t, int root) { default_group().broadcast(t, root); }
Tensor all_gather(const Tensor& t) { return default_group().all_gather(t); }
void reduce_scatter(const Tensor& out, const Tensor& in) { default_group().reduce_scatter(out, in); }
std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in) {
  return default_group().reduce_scatter_async(out, in);
}
void all_gather_into(const Tensor& out, const Tensor& in) { default_group().all_gather_into(out, in); }
std::unique_ptr<Work> all_gather_into_async(const Tensor& out, const Tensor& in) {
  return default_group().all_gather_into_async(out, in);
}

Shard shard_of(int64_t numel, int rank, int world, int64_t align) {
  CASTOR_ASSERT(numel >= 0 && world > 0 && rank >= 0 && rank < world && align > 0);
  Shard s;
  const int64_t per = (numel + world - 1) / world;
  s.chunk = (per + align - 1) / align * align;
  s.begin = std::min(numel, rank * s.chunk);
  s.length = std::min(numel, s.begin + s.chunk) - s.begin;
  return s;
}

void abort(int code) {
  if (g_group && g_group->backend() == "mpi") MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace castor::dist
