// The Tensor structure: metadata, element access, unrecorded aliases and the allocating factories (no kernels, no autograd).
#include "castor/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>

#include "castor/allocator.h"
#include "castor/convert.h"
#include "core/view.h"

namespace castor {

Storage::Storage(size_t n, DType d) : nbytes(n), dtype(d) { data = allocate(n, d); }
Storage::~Storage() { deallocate(data, nbytes, dtype); }

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    CASTOR_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape), " has more elements than int64 holds");
  return n;
}

// The element count of a new tensor's shape; castor::Error naming `op` on a negative size, or when the elements'
// bytes or the strides (sizes of 0 counted as 1) overflow int64.
static int64_t checked_numel(const Shape& shape, size_t element_size, const char* op) {
  int64_t extent = static_cast<int64_t>(element_size);
  for (int64_t s : shape) {
    CASTOR_CHECK(s >= 0, op, ": negative size in shape ", shape_str(shape));
    CASTOR_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent), op, ": shape ", shape_str(shape),
                 " is too large (its bytes overflow int64)");
  }
  return shape_numel(shape);
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape channels_last_strides(const Shape& shape) {
  CASTOR_CHECK(shape.size() == 4, "channels-last needs a 4-D (N, C, H, W) shape, got ", shape_str(shape));
  auto at_least_1 = [](int64_t n) { return std::max<int64_t>(n, 1); };
  const int64_t c = at_least_1(shape[1]), wc = at_least_1(shape[3]) * c;
  return {at_least_1(shape[2]) * wc, 1, wc, c};
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  CASTOR_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for a tensor of ", ndim, " dims");
  return dim < 0 ? dim + n : dim;
}

void Tensor::throw_undefined() {
  throw Error("undefined tensor (a default-constructed Tensor holds no data; create it with a factory such as zeros)");
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return is_contiguous();
  if (dim() != 4) return false;
  const Shape expected = channels_last_strides(shape());
  for (size_t i = 0; i < 4; ++i)
    if (impl_->shape[i] != 1 && impl_->strides[i] != expected[i]) return false;
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  return !is_contiguous() && is_contiguous(MemoryFormat::ChannelsLast) ? MemoryFormat::ChannelsLast
                                                                       : MemoryFormat::Contiguous;
}

bool Tensor::is_dense() const {
  // Dims of size > 1 by increasing stride: each stride must be the product of the sizes before it.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t i = 0; i < impl_->shape.size(); ++i) {
    if (impl_->shape[i] == 0) return true;
    if (impl_->shape[i] != 1) dims.emplace_back(impl_->strides[i], impl_->shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || !a.is_dense() || !b.is_dense()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str(shape());
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(d().storage->data) + impl_->offset * static_cast<int64_t>(element_size());
}

double Tensor::item() const {
  CASTOR_CHECK(numel() == 1, "item(): a tensor of ", numel(), " elements (", describe(), ") has no single value");
  double v;
  convert(data_ptr(), dtype(), &v, DType::Float64, 1);
  return v;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous();
  std::vector<T> out(numel());
  convert(c.data_ptr(), dtype(), out.data(), dtype_of<T>(), out.size());
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), storage_offset()); }

// ---- factories ----

Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype) {
  const int64_t n = checked_numel(shape, dtype_size(dtype), "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(n) * dtype_size(dtype), dtype);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  Tensor t(std::move(impl));
  CASTOR_ASSERT(strides.size() == shape.size() && t.is_dense(), "empty_strided: strides ", shape_str(strides),
                " are not dense for shape ", shape_str(shape));
  return t;
}

Tensor empty(const Shape& shape, DType dtype, MemoryFormat format) {
  checked_numel(shape, dtype_size(dtype), "empty");  // before the strides are computed from it
  return empty_strided(
      shape, format == MemoryFormat::ChannelsLast ? channels_last_strides(shape) : contiguous_strides(shape), dtype);
}

Tensor empty_like(const Tensor& t) { return empty_like(t, t.dtype()); }
Tensor empty_like(const Tensor& t, DType dtype) {
  return t.is_dense() ? empty_strided(t.shape(), t.strides(), dtype) : empty(t.shape(), dtype);
}

Tensor arange(int64_t n, DType dtype) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  return tensor(v, {n}, dtype);
}

Tensor tensor(const std::vector<double>& values, const Shape& shape, DType dtype) {
  CASTOR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "tensor: ", values.size(),
               " values given for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::Float64, t.data_ptr(), dtype, values.size());
  return t;
}

Tensor tensor(std::initializer_list<double> values, DType dtype) {
  return tensor(std::vector<double>(values), {static_cast<int64_t>(values.size())}, dtype);
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes()) std::memcpy(t.data_ptr(), data, t.nbytes());
  return t;
}

}  // namespace castor
