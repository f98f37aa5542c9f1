// Every op Castor records or dispatches, in one X-macro table with its autocast policy (PyTorch's CastPolicy).
#pragma once
#include <cstdint>

namespace castor {

// How autocast treats an op's floating-point inputs:
//   LowerPrecision: cast float32 inputs to the autocast dtype (GEMMs, convolutions).
//   Float32: cast 16-bit inputs to float32 (exp, log, softmax, reductions, losses, norm statistics).
//   Promote: cast all inputs to the widest floating type among them.
//   PassThrough: run in the input dtype (element-wise, pooling, views).
//   Banned: raise, naming the safe alternative (binary cross entropy on probabilities).
//   Float32InKernel: Float32's numbers without its copies: the kernel reads 16-bit inputs as they are and computes
//     in float32 (a widening is exact, so the values are those of casting first); gradients come back in the
//     inputs' dtypes as through a cast. For ops over large inputs (cross-entropy over a 50,257-word vocabulary).
enum class CastPolicy : uint8_t { LowerPrecision, Float32, Promote, PassThrough, Banned, Float32InKernel };

// _(Enum, name, CastPolicy). Each row has its definition OpDef<OpKind::Enum> (src/ops/): forward,
// params, named saved tensors and backward together; docs/transformers.md compares the policies with PyTorch's.
#define CASTOR_FORALL_OPS(_)                                                                                           \
  /* element-wise */                                                                                                   \
  _(Add, "add", Promote)                                                                                               \
  _(Sub, "sub", Promote)                                                                                               \
  _(Mul, "mul", Promote)                                                                                               \
  _(Div, "div", Promote)                                                                                               \
  _(Neg, "neg", PassThrough)                                                                                           \
  _(Pow, "pow", Float32)                                                                                               \
  _(Exp, "exp", Float32)                                                                                               \
  _(Log, "log", Float32)                                                                                               \
  _(Sqrt, "sqrt", PassThrough)                                                                                         \
  _(Abs, "abs", PassThrough)                                                                                           \
  _(Relu, "relu", PassThrough)                                                                                         \
  _(Sigmoid, "sigmoid", PassThrough)                                                                                   \
  _(Tanh, "tanh", PassThrough)                                                                                         \
  _(Gelu, "gelu", PassThrough)                                                                                         \
  _(Silu, "silu", PassThrough)                                                                                         \
  _(Clamp, "clamp", PassThrough)                                                                                       \
  _(Where, "where", Promote)                                                                                           \
  _(Cast, "to", PassThrough)                                                                                           \
  /* reductions */                                                                                                     \
  _(Sum, "sum", Float32)                                                                                               \
  _(Mean, "mean", Float32)                                                                                             \
  _(MaxDim, "max", PassThrough)                                                                                        \
  _(MinDim, "min", PassThrough)                                                                                        \
  _(Softmax, "softmax", Float32)                                                                                       \
  _(LogSoftmax, "log_softmax", Float32)                                                                                \
  /* linear algebra */                                                                                                 \
  _(Matmul, "matmul", LowerPrecision)                                                                                  \
  _(Mm, "mm", LowerPrecision)                                                                                          \
  _(Bmm, "bmm", LowerPrecision)                                                                                        \
  _(Addmm, "addmm", LowerPrecision) /* bias + (M, K) x (K, N), one rounding: linear's fused path */                    \
  /* shape and data movement */                                                                                        \
  _(View, "view", PassThrough)                                                                                         \
  _(Permute, "permute", PassThrough)                                                                                   \
  _(Expand, "expand", PassThrough)                                                                                     \
  _(Slice, "slice", PassThrough)                                                                                       \
  _(Clone, "clone", PassThrough)                                                                                       \
  _(Cat, "cat", Promote)                                                                                               \
  _(Stack, "stack", Promote)                                                                                           \
  _(Gather, "gather", PassThrough)                                                                                     \
  /* neural-network layers and losses */                                                                               \
  _(Linear, "linear", LowerPrecision)                                                                                  \
  _(Conv2d, "conv2d", LowerPrecision)                                                                                  \
  _(Conv2dMaxPool2dRelu, "conv2d_max_pool2d_relu", LowerPrecision) /* F::conv2d_max_pool2d_relu, one node */           \
  _(BatchNorm, "batch_norm", PassThrough) /* statistics in float32, output in the input's dtype, as PyTorch */         \
  _(MaxPool2d, "max_pool2d", PassThrough)                                                                              \
  _(AvgPool2d, "avg_pool2d", PassThrough)                                                                              \
  _(Dropout, "dropout", PassThrough)                                                                                   \
  /* transformers */                                                                                                   \
  _(Embedding, "embedding", PassThrough)                                                                               \
  _(LayerNorm, "layer_norm", PassThrough) /* statistics in float32, output in the input's dtype */                     \
  _(RmsNorm, "rms_norm", PassThrough)     /* likewise */                                                               \
  _(ScaledDotProductAttention, "scaled_dot_product_attention", LowerPrecision) /* fused; softmax statistics float32 */ \
  _(QkvAttention, "qkv_attention", LowerPrecision)    /* fused; q, k, v split from one (B, T, 3C) input */             \
  _(RotaryEmbedding, "rotary_embedding", PassThrough) /* element-wise rotation, float32 inside */                      \
  _(SwiGlu, "swiglu", Promote)                        /* silu(a) * b fused: mul's policy */                            \
  _(MaskedFill, "masked_fill", PassThrough)                                                                            \
  _(CrossEntropy, "cross_entropy", Float32InKernel)                                                                    \
  _(LinearCrossEntropy, "linear_cross_entropy", LowerPrecision) /* linear's policy; the loss as cross_entropy's */     \
  _(NllLoss, "nll_loss", Float32)                                                                                      \
  _(MseLoss, "mse_loss", Float32)                                                                                      \
  _(BinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits", Float32)                                         \
  _(BinaryCrossEntropy, "binary_cross_entropy", Banned)                                                                \
  /* user-defined (autograd::Function): cast by its own registered policy, if any */                                   \
  _(Function, "function", PassThrough)

enum class OpKind : uint16_t {
#define CASTOR_OP_ENUM(e, n, p) e,
  CASTOR_FORALL_OPS(CASTOR_OP_ENUM)
#undef CASTOR_OP_ENUM
};

#define CASTOR_OP_COUNT(e, n, p) +1
inline constexpr int kNumOps = 0 CASTOR_FORALL_OPS(CASTOR_OP_COUNT);
#undef CASTOR_OP_COUNT

struct OpInfo {
  const char* name;
  CastPolicy policy;
};

inline constexpr OpInfo kOpInfo[] = {
#define CASTOR_OP_INFO(e, n, p) {n, CastPolicy::p},
    CASTOR_FORALL_OPS(CASTOR_OP_INFO)
#undef CASTOR_OP_INFO
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == kNumOps, "an op lacks its info");

inline const char* op_name(OpKind op) { return kOpInfo[static_cast<int>(op)].name; }
inline CastPolicy op_policy(OpKind op) { return kOpInfo[static_cast<int>(op)].policy; }
const char* policy_name(CastPolicy p);

}  // namespace castor
