// Layer ops as typed definitions: conv2d, its fusion with max pooling and ReLU, batch norm, max and average pooling.
// Their forwards are the F:: functions of castor/functional.h, defined beside these backwards in layers.cpp; both
// run on the layer kernels (kernels/layers.h) in the dtype the forward ran in; none has a double backward.
#pragma once
#include "kernels/layers.h"
#include "ops/op_def.h"

namespace castor {

// dst (N, O, OH, OW) = conv2d(src (N, C, H, W), weights (O, C/groups, kh, kw)) + bias (O), laid out as src
// (kernels::layer_format). Backward-data is skipped when src needs no gradient (a network's first layer).
template <>
struct OpDef<OpKind::Conv2d> {
  struct Params {
    kernels::Conv2dParams conv;
  };
  struct Saved {
    SavedTensor src, weights;  // src laid out as the output, weights contiguous
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// relu(max_pool2d(conv2d(src, weights, bias, stride, padding), pool_kernel)) as one op on channels-last float32 and
// 16-bit inputs (a slice of the batch at a time); elsewhere the ops unfused. Backward: the pooling's (the ReLU's
// folded in), then the convolution's.
template <>
struct OpDef<OpKind::Conv2dMaxPool2dRelu> {
  struct Params {
    kernels::Conv2dParams conv;
    Shape conv_shape;  // the convolution's output (N, O, OH, OW)
    kernels::Pool2dParams pool;
  };
  struct Saved {
    SavedTensor src, weights, workspace;  // src channels-last; the pooling's workspace
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Batch norm of src (N, C) or (N, C, H, W) over all but C, with batch statistics (training, which also updates the
// running ones) or the running ones; statistics, scale and shift are float32 (float64 for float64 data), and so are
// the weight and bias gradients (the engine casts them to the parameters' dtypes).
template <>
struct OpDef<OpKind::BatchNorm> {
  struct Params {
    bool training;
    double eps;
  };
  struct Saved {
    SavedTensor src, mean, var, scale, shift;  // src (N, C, H, W) laid out as the output; scale, shift if given
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// What max and average pooling keep for backward: the window and the output's memory format.
struct PoolOpParams {
  kernels::Pool2dParams pool;
  MemoryFormat format;  // of the output
};

// Max pooling of src (N, C, H, W) (a stride of {0, 0} is the kernel); `relu` folds a ReLU of the result into the
// kernel where it can (channels-last, small windows), else applies it after.
template <>
struct OpDef<OpKind::MaxPool2d> {
  using Params = PoolOpParams;
  struct Saved {
    SavedTensor workspace;  // with the ReLU folded in, it routes no gradient where the ReLU gives none
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// Average pooling of src (N, C, H, W) (a stride of {0, 0} is the kernel).
template <>
struct OpDef<OpKind::AvgPool2d> {
  using Params = PoolOpParams;
  struct Saved {};
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
