// The layer kernel interface: convolution, batch norm and pooling on oneDNN (float32, bfloat16, emulated float16)
// and as plain reference loops (float64, and the oracle the oneDNN path is tested against).
#pragma once
#include <cstdint>

#include "castor/tensor.h"

namespace castor::kernels {

// Shapes are PyTorch's: activations (N, C, H, W), weights (O, C/groups, kh, kw). Weights and per-channel tensors
// are contiguous; activations are contiguous or channels-last (MemoryFormat), the reference loops' contiguous.
// Convolution takes each activation in either layout; batch norm and pooling want dst, diff_src and diff_dst laid
// out like src. Floating tensors of one call share a dtype unless said otherwise.

// The layout a layer's results take: channels-last when its input is (PyTorch's rule); contiguous for float64,
// which runs on the reference loops.
inline MemoryFormat layer_format(const Tensor& x) {
  return x.dtype() == DType::Float64 ? MemoryFormat::Contiguous : x.suggest_memory_format();
}

struct Conv2dParams {
  int64_t stride[2], padding[2], dilation[2], groups;
};

// dst (N, O, OH, OW) = conv(src (N, C, H, W), weights (O, C/groups, kh, kw)) + bias (O) (bias may be undefined).
void conv2d_forward(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                    const Conv2dParams& p);
// Any of diff_src, diff_weights, diff_bias may be undefined and is then not computed (src is only read when
// diff_weights is wanted, weights only when diff_src is).
void conv2d_backward(const Tensor& src, const Tensor& weights, const Tensor& diff_dst, const Tensor& diff_src,
                     const Tensor& diff_weights, const Tensor& diff_bias, const Conv2dParams& p);

// Batch norm of src (N, C, H, W); scale/shift (C) may be undefined (no affine). mean and var (C) are float32
// (float64 for a float64 src): written with the batch statistics (biased variance) when training, read as the
// running statistics otherwise. scale, shift and their gradients are float32 (float64 for float64).
void batch_norm_forward(const Tensor& src, const Tensor& scale, const Tensor& shift, const Tensor& mean,
                        const Tensor& var, const Tensor& dst, double eps, bool training);
// scale/shift are the forward's (oneDNN reads shift's presence); diff_scale/diff_shift may be undefined.
// `training` says whether mean/var were batch statistics (whose dependence on src is then differentiated) or
// constants.
void batch_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& scale, const Tensor& shift,
                         const Tensor& mean, const Tensor& var, const Tensor& diff_src, const Tensor& diff_scale,
                         const Tensor& diff_shift, double eps, bool training);

struct Pool2dParams {
  int64_t kernel[2], stride[2], padding[2];
  bool is_max;
  bool count_include_pad;  // average pooling only
  bool relu;               // max pooling on the fast channels-last kernel only: dst = relu(max), see below
};

// dst (N, C, OH, OW). Returns what max pooling's backward needs (oneDNN's workspace as uint8 bytes, or int64
// argmax offsets for float64); undefined for average pooling.
Tensor pool2d_forward(const Tensor& src, const Tensor& dst, const Pool2dParams& p);
void pool2d_backward(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src, const Pool2dParams& p);

// dst (N, O, PH, PW) = relu(max_pool2d(conv2d(src, weights, bias))) on channels-last tensors, with pooling's workspace
// (N, PH, PW, O) as max_pool2d_nhwc_forward keeps it (`pool` has relu set and fits that kernel), a slice of the batch
// at a time: the convolution's output (N, O, OH, OW) never exists whole, so it stays in the cache between the two
// instead of going to memory and back (16 MiB of bf16 for SimpleCNN's first layer at batch 256). Each slice computes
// exactly what the whole batch would.
void conv2d_max_pool_relu_forward(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                                  const Tensor& workspace, const Shape& conv_shape, const Conv2dParams& conv,
                                  const Pool2dParams& pool);

// Max pooling of channels-last src / dst (float32 and 16-bit), which pool2d_forward/backward pick for those. The fast
// kernel, for windows of at most 256 positions (255 with relu; max_pool2d_nhwc_fits), keeps a uint8 workspace: the
// argmax's position ky * kw + kx in its window per (N, OH, OW, C) output. With p.relu it writes relu(max) and the
// position 255 (no gradient) where the ReLU's gradient is zero, so that its backward is that of relu then pooling. The reference loops, which it matches bit for bit
// and which take the larger windows, keep the int32 argmax iy * W + ix. Each backward takes its forward's workspace.
bool max_pool2d_nhwc_fits(const Pool2dParams& p);
Tensor max_pool2d_nhwc_forward(const Tensor& src, const Tensor& dst, const Pool2dParams& p);
void max_pool2d_nhwc_forward_into(const Tensor& src, const Tensor& dst, const Tensor& workspace, const Pool2dParams& p);
void max_pool2d_nhwc_backward(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src,
                              const Pool2dParams& p);
Tensor max_pool2d_nhwc_forward_ref(const Tensor& src, const Tensor& dst, const Pool2dParams& p);
void max_pool2d_nhwc_backward_ref(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src);

// The reference loops behind the float64 path, for float64 tensors (the same contracts as above).
void conv2d_forward_ref(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                        const Conv2dParams& p);
void conv2d_backward_ref(const Tensor& src, const Tensor& weights, const Tensor& diff_dst, const Tensor& diff_src,
                         const Tensor& diff_weights, const Tensor& diff_bias, const Conv2dParams& p);
void batch_norm_forward_ref(const Tensor& src, const Tensor& scale, const Tensor& shift, const Tensor& mean,
                            const Tensor& var, const Tensor& dst, double eps, bool training);
void batch_norm_backward_ref(const Tensor& src, const Tensor& diff_dst, const Tensor& scale, const Tensor& shift,
                             const Tensor& mean, const Tensor& var, const Tensor& diff_src, const Tensor& diff_scale,
                             const Tensor& diff_shift, double eps, bool training);
Tensor pool2d_forward_ref(const Tensor& src, const Tensor& dst, const Pool2dParams& p);
void pool2d_backward_ref(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src,
                         const Pool2dParams& p);

// How many layout reorders the oneDNN convolution kernels have executed (for tests and the benchmark).
int64_t conv_reorder_count();
// How many convolution backward-data passes (diff_src) the oneDNN kernels have run (for tests).
int64_t conv_backward_data_count();
// How many convolution passes have run as Winograd (castor/backends.h; for tests).
int64_t conv_winograd_count();

}  // namespace castor::kernels
