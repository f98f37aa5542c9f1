// Element-wise ops as typed definitions: arithmetic, unary maps, clamp, where and dtype casts. Their forwards are
// the public functions of castor/ops.h (and Tensor::to), defined beside these backwards in elementwise.cpp.
#pragma once
#include "ops/op_def.h"

namespace castor {

// The shape a and b broadcast to (PyTorch's rules); `op` names the op in the error.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// dst = a + alpha * b (broadcast), or a + scalar (one input: add(a, double)).
template <>
struct OpDef<OpKind::Add> {
  struct Params {
    double alpha;
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = a - alpha * b (broadcast).
template <>
struct OpDef<OpKind::Sub> {
  struct Params {
    double alpha;
  };
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = a * b (broadcast; saves both), or a * scalar (one input: mul(a, double); saves nothing).
template <>
struct OpDef<OpKind::Mul> {
  struct Params {
    double scalar;  // mul(a, double) only
  };
  struct Saved {
    SavedTensor a, b;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = a / b (broadcast), floating.
template <>
struct OpDef<OpKind::Div> {
  struct Params {};
  struct Saved {
    SavedTensor a, b;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Neg> {
  struct Params {};
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src ^ exponent.
template <>
struct OpDef<OpKind::Pow> {
  struct Params {
    double exponent;
  };
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Unary maps; each saves what its derivative reads: the input (src) or the output (dst).
template <>
struct OpDef<OpKind::Exp> {
  struct Params {};
  struct Saved {
    SavedTensor dst;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Log> {
  struct Params {};
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Sqrt> {
  struct Params {};
  struct Saved {
    SavedTensor dst;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Abs> {
  struct Params {};
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Relu> {
  struct Params {};
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Sigmoid> {
  struct Params {};
  struct Saved {
    SavedTensor dst;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

template <>
struct OpDef<OpKind::Tanh> {
  struct Params {};
  struct Saved {
    SavedTensor dst;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = min(max(src, min), max); the gradient passes where min <= src <= max.
template <>
struct OpDef<OpKind::Clamp> {
  struct Params {
    double min, max;
  };
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = cond ? a : b (broadcast); cond is saved expanded to dst's shape.
template <>
struct OpDef<OpKind::Where> {
  struct Params {};
  struct Saved {
    SavedTensor cond;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src in another floating dtype (Tensor::to, autocast's casts); the engine casts the gradient back.
template <>
struct OpDef<OpKind::Cast> {
  struct Params {};
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
