// Shape ops as typed definitions: the views (view, permute, expand, slice), clone, cat and gather.
#pragma once
#include <optional>

#include "autograd/op_def.h"

namespace castor {

// `shape` with its one -1 inferred for `numel` elements, checked (op names it in errors).
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);
// Strides for viewing x as `shape` without a copy, or none where impossible (PyTorch's computeStride).
std::optional<Shape> view_strides(const Tensor& x, const Shape& shape);

// dst = src viewed as `shape` (one -1 inferred); the gradient is reshaped back.
template <>
struct OpDef<OpKind::View> {
  struct Params {};
  struct Saved {};
  static Tensor forward(const Tensor& src, const Shape& shape);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src with its dims in `order`; the gradient is permuted back.
template <>
struct OpDef<OpKind::Permute> {
  struct Params {
    Shape order;  // wrapped
  };
  struct Saved {};
  static Tensor forward(const Tensor& src, const Shape& dims);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src broadcast to `shape` (stride 0 along new and size-1 dims; -1 keeps a size); the gradient is summed back.
template <>
struct OpDef<OpKind::Expand> {
  struct Params {};
  struct Saved {};
  static Tensor forward(const Tensor& src, const Shape& shape);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src[start:end:step] along dim (bounds clamped as Python's); the gradient is placed back among zeros.
template <>
struct OpDef<OpKind::Slice> {
  struct Params {
    int64_t dim, start, step;
  };
  struct Saved {};
  static Tensor forward(const Tensor& src, int64_t dim, int64_t start, int64_t end, int64_t step);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// A copy of src into `dst` (the caller chooses its layout: clone keeps src's, contiguous asks for one).
template <>
struct OpDef<OpKind::Clone> {
  struct Params {};
  struct Saved {};
  static Tensor forward(const Tensor& src, Tensor dst);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = the tensors joined along dim, of their result_type; each gradient is its part of diff_dst.
template <>
struct OpDef<OpKind::Cat> {
  struct Params {
    int64_t dim;
    Shape sizes;  // of each input along dim
  };
  struct Saved {};
  static Tensor forward(const std::vector<Tensor>& tensors, int64_t dim);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst[i][j] = src[i][index[i][j]] along dim (index int64, src's shape outside dim); the gradient is scattered back.
template <>
struct OpDef<OpKind::Gather> {
  struct Params {
    int64_t dim;
  };
  struct Saved {
    SavedTensor index;  // contiguous
  };
  static Tensor forward(const Tensor& src, int64_t dim, const Tensor& index);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
