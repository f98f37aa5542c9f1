// Reductions as typed definitions: sum, mean, max/min along a dim, softmax and log-softmax. Their forwards are the
// public functions of castor/ops.h, defined beside these backwards in reduction.cpp.
#pragma once
#include "ops/op_def.h"

namespace castor {

// dst = src summed over `dims` (sorted, wrapped; all for a 0-dim src), kept as size-1 dims with keepdim.
template <>
struct OpDef<OpKind::Sum> {
  struct Params {
    Shape dims;
    bool keepdim;
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src averaged over `dims`, `count` elements per output.
template <>
struct OpDef<OpKind::Mean> {
  struct Params {
    Shape dims;
    bool keepdim;
    double count;
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// max/min along `dim`: values (dst) and the int64 indices they came from; the gradient goes to those indices.
struct ExtremeDimDef {
  struct Params {
    int64_t dim;
    bool keepdim;
  };
  struct Saved {
    SavedTensor indices;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};
template <>
struct OpDef<OpKind::MaxDim> : ExtremeDimDef {};
template <>
struct OpDef<OpKind::MinDim> : ExtremeDimDef {};

// softmax / log-softmax along `dim`; the backward reads the output only.
struct SoftmaxDef {
  struct Params {
    int64_t dim;
  };
  struct Saved {
    SavedTensor dst;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};
template <>
struct OpDef<OpKind::Softmax> : SoftmaxDef {};
template <>
struct OpDef<OpKind::LogSoftmax> : SoftmaxDef {};

}  // namespace castor
