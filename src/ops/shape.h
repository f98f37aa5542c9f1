// Shape ops as typed definitions: the views (view, permute, expand, slice), clone, cat and gather. Their forwards
// are the Tensor methods (castor/tensor.h: view and reshape, permute, expand, slice, clone and contiguous) and the
// public functions of castor/ops.h (cat, stack, gather), defined beside these backwards in shape.cpp.
#pragma once
#include "ops/op_def.h"

namespace castor {

// dst = src viewed as `shape` (one -1 inferred); the gradient is reshaped back.
template <>
struct OpDef<OpKind::View> {
  struct Params {};
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src with its dims in `order`; the gradient is permuted back.
template <>
struct OpDef<OpKind::Permute> {
  struct Params {
    Shape order;  // wrapped
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src broadcast to `shape` (stride 0 along new and size-1 dims; -1 keeps a size); the gradient is summed back.
template <>
struct OpDef<OpKind::Expand> {
  struct Params {};
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src[start:end:step] along dim (bounds clamped as Python's); the gradient is placed back among zeros.
template <>
struct OpDef<OpKind::Slice> {
  struct Params {
    int64_t dim, start, step;
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = a copy of src (clone keeps src's layout, contiguous gives the one asked for).
template <>
struct OpDef<OpKind::Clone> {
  struct Params {};
  struct Saved {};
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
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
