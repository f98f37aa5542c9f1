// The n-dimensional CPU tensor: shared storage, shape/strides/offset views, dtype, and autograd metadata.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "castor/check.h"
#include "castor/device.h"
#include "castor/dtype.h"

namespace castor {

using Shape = std::vector<int64_t>;
class Tensor;

// How a 4-D (N, C, H, W) tensor lies in memory, as PyTorch's torch.memory_format: row-major in that order, or
// channels-last (N, H, W, C order in memory, strides (HWC, 1, WC, C)), the layout the layer kernels run fastest on.
// The shape is (N, C, H, W) either way; only the strides differ.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };
struct Node;

// A reference-counted buffer. The version counter is shared by every view and bumped by each in-place write.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  DType dtype;  // the dtype the bytes are counted under in the allocator statistics
  Device device = Device::CPU;
  uint32_t version = 0;
  Storage(size_t nbytes, DType dtype);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

// A gradient hook: gets the gradient, returns a replacement or an undefined Tensor to keep it.
using GradHook = std::function<Tensor(const Tensor&)>;
// A post-accumulate hook: gets the leaf after backward has accumulated a gradient into its .grad.
using PostAccumulateGradHook = std::function<void(const Tensor&)>;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;
  DType dtype = DType::Float32;
  bool requires_grad = false;        // leaves only; a non-leaf requires grad through grad_fn
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf (or of a non-leaf with retain_grad)
  std::shared_ptr<Node> grad_fn;     // the op that made this tensor, null for leaves
  std::vector<GradHook> hooks;       // leaf hooks (non-leaf hooks live on grad_fn)
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;  // leaves only
  bool retains_grad = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // Metadata.
  const Shape& shape() const { return d().shape; }
  const Shape& sizes() const { return d().shape; }
  const Shape& strides() const { return d().strides; }
  int64_t dim() const { return static_cast<int64_t>(d().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return d().dtype; }
  Device device() const { return d().storage->device; }
  int64_t storage_offset() const { return d().offset; }
  size_t element_size() const { return dtype_size(d().dtype); }
  size_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  bool is_contiguous(MemoryFormat format) const;
  // ChannelsLast for a channels-last tensor that is not also contiguous (C == 1 or H == W == 1 makes it both),
  // else Contiguous: the layout that results derived from this tensor take (PyTorch's suggest_memory_format).
  MemoryFormat suggest_memory_format() const;
  // Non-overlapping and dense: the elements fill numel consecutive slots in some order of the dims, so a kernel may
  // treat two tensors of one shape and the same strides as flat arrays.
  bool is_dense() const;
  uint32_t version() const { return d().storage->version; }
  void bump_version() const { ++d().storage->version; }
  std::string describe() const;  // "float32[2, 3]"

  void* data_ptr() const;
  template <class T>
  T* data() const {
    CASTOR_CHECK(dtype_of<T>() == dtype(), "data<", dtype_name(dtype_of<T>()), ">() called on a ", describe(),
                 " tensor");
    return static_cast<T*>(data_ptr());
  }
  double item() const;  // the value of a one-element tensor, as double
  template <class T>
  std::vector<T> to_vector() const;  // a contiguous copy of the elements, converted to T

  // Autograd.
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const { return d().grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return d().grad_fn; }
  Tensor grad() const { return Tensor(d().grad); }
  void set_grad(const Tensor& g) const { d().grad = g.impl_; }
  void backward(const Tensor& gradient = {}, bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;  // shares storage, no history
  void register_hook(GradHook hook) const;
  // Runs `hook(leaf)` each time backward has accumulated into this leaf's .grad
  // (torch.Tensor.register_post_accumulate_grad_hook); DistributedDataParallel launches its buckets from these.
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  void retain_grad() const;

  // Views: share storage with this tensor.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Views of consecutive pieces along `dim` (torch.split / torch.chunk): pieces of split_size (the last may be
  // smaller), or `chunks` pieces of ceil(size / chunks) (fewer when they run out).
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // Copies.
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;  // this tensor if already so laid out
  Tensor clone() const;          // keeps a dense tensor's layout (PyTorch's preserve_format)
  Tensor to(DType dtype) const;  // differentiable cast, keeping a dense layout; this tensor if already that dtype
  Tensor float_() const { return to(DType::Float32); }
  Tensor half() const { return to(DType::Float16); }
  Tensor bfloat16() const { return to(DType::BFloat16); }
  Tensor double_() const { return to(DType::Float64); }

  // In-place ops: bump the version counter. On a tensor that requires grad they are recorded like
  // PyTorch's (the tensor's history is rebased); on a leaf that requires grad they raise outside no_grad.
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasting, converting copy
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& clamp_(double min, double max);

 private:
  // The implementation of a defined tensor; castor::Error on an undefined one (`Tensor t;`).
  TensorImpl& d() const {
    if (!impl_) [[unlikely]]
      throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

// Factories. Shapes follow PyTorch: {} is a scalar (0-dim) tensor.
Tensor empty(const Shape& shape, DType dtype = DType::Float32, MemoryFormat format = MemoryFormat::Contiguous);
// A tensor with the given dense strides (as a dense tensor's, see Tensor::is_dense).
Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype);
Tensor zeros(const Shape& shape, DType dtype = DType::Float32);
Tensor ones(const Shape& shape, DType dtype = DType::Float32);
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32);
Tensor scalar_tensor(double value, DType dtype = DType::Float32);
Tensor arange(int64_t n, DType dtype = DType::Int64);
// The *_like factories keep a dense tensor's strides (PyTorch's preserve_format); others get contiguous ones.
Tensor empty_like(const Tensor& t);
Tensor empty_like(const Tensor& t, DType dtype);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// A tensor of `shape` and `dtype` holding `values` (converted from double; exact for every value 16-bit can hold).
Tensor tensor(const std::vector<double>& values, const Shape& shape, DType dtype = DType::Float32);
Tensor tensor(std::initializer_list<double> values, DType dtype = DType::Float32);
// Copies raw elements of type `dtype` from `data`.
Tensor from_blob(const void* data, const Shape& shape, DType dtype);

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
Shape channels_last_strides(const Shape& shape);  // of a 4-D (N, C, H, W) shape
// Both dense, of one shape, with the same strides wherever a dim has more than one element: element i of one lies
// where element i of the other does, so kernels may pair them up as flat arrays.
bool same_layout(const Tensor& a, const Tensor& b);
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);  // negative dims count from the end

}  // namespace castor
