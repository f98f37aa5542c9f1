// Every op row's test case: the inputs OpTable differentiates and autocasts, and the cases TorchParity compares
// against PyTorch (tests/autograd/op_cases.h).
#include "autograd/op_cases.h"

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"

namespace castor::test {

namespace {

struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::FunctionCtx& ctx, const Inputs& in) {
    ctx.save_for_backward({in[0]});
    return in[0] * in[0] * in[0];
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx& ctx, const Tensor& g) {
    const Tensor& x = ctx.saved_tensors()[0];
    return {g * x * x * 3.0};
  }
};

Tensor idx(std::vector<double> v, Shape s) { return tensor(v, s, DType::Int64); }

}  // namespace

const std::map<OpKind, OpCase>& op_cases() {
  using V = const Inputs&;
  using P = CastPolicy;
  const Shape m{3, 4};
  static const std::map<OpKind, OpCase> cases = {
      // clang-format off
      {OpKind::Add, {P::Promote, "TorchParity", [](V x) { return add(x[0], x[1], 2.0); }, {m, m}}},
      {OpKind::Sub, {P::Promote, "TorchParity", [](V x) { return sub(x[0], x[1]); }, {m, {4}}}},
      {OpKind::Mul, {P::Promote, "TorchParity", [](V x) { return x[0] * x[1]; }, {m, m}}},
      {OpKind::Div, {P::Promote, "TorchParity", [](V x) { return x[0] / x[1]; }, {m, m}, true}},
      {OpKind::Neg, {P::PassThrough, "TorchParity", [](V x) { return -x[0]; }, {m}}},
      {OpKind::Pow, {P::Float32, "TorchParity", [](V x) { return pow(x[0], 3.0); }, {m}}},
      {OpKind::Exp, {P::Float32, "TorchParity", [](V x) { return exp(x[0]); }, {m}}},
      {OpKind::Log, {P::Float32, "TorchParity", [](V x) { return log(x[0]); }, {m}, true}},
      {OpKind::Sqrt, {P::PassThrough, "TorchParity", [](V x) { return sqrt(x[0]); }, {m}, true}},
      {OpKind::Abs, {P::PassThrough, "TorchParity", [](V x) { return abs(x[0]); }, {m}}},
      {OpKind::Relu, {P::PassThrough, "TorchParity", [](V x) { return relu(x[0]); }, {m}}},
      {OpKind::Sigmoid, {P::PassThrough, "TorchParity", [](V x) { return sigmoid(x[0]); }, {m}}},
      {OpKind::Tanh, {P::PassThrough, "TorchParity", [](V x) { return tanh(x[0]); }, {m}}},
      {OpKind::Gelu, {P::PassThrough, "TorchParity", [](V x) { return gelu(x[0], true); }, {m}}},
      {OpKind::Silu, {P::PassThrough, "TorchParity", [](V x) { return silu(x[0]); }, {m}}},
      {OpKind::Clamp, {P::PassThrough, "TorchParity", [](V x) { return clamp(x[0], -0.5, 0.7); }, {m}}},
      {OpKind::Where,
       {P::Promote, "TorchParity", [](V x) { return where(gt(x[0].detach(), x[1].detach()), x[0], x[1]); },
        {m, m}}},
      {OpKind::Cast,
       {P::PassThrough, "TorchParity", [](V x) { return x[0].to(DType::Float32).to(DType::Float64); }, {m},
        false, 1e-2, 1e-4, false}},
      {OpKind::Sum, {P::Float32, "TorchParity", [](V x) { return sum(x[0], {1}); }, {m}}},
      {OpKind::Mean, {P::Float32, "TorchParity", [](V x) { return mean(x[0], {0}); }, {m}}},
      {OpKind::MaxDim, {P::PassThrough, "TorchParity", [](V x) { return max(x[0], 1).first; }, {m}}},
      {OpKind::MinDim, {P::PassThrough, "TorchParity", [](V x) { return min(x[0], 0).first; }, {m}}},
      {OpKind::Softmax, {P::Float32, "TorchParity", [](V x) { return softmax(x[0], 1); }, {m}}},
      {OpKind::LogSoftmax, {P::Float32, "TorchParity", [](V x) { return log_softmax(x[0], 0); }, {m}}},
      {OpKind::Matmul,
       {P::LowerPrecision, "TorchParity", [](V x) { return matmul(x[0], x[1]); }, {{2, 3, 4}, {4, 5}}}},
      {OpKind::Mm, {P::LowerPrecision, "TorchParity", [](V x) { return mm(x[0], x[1]); }, {m, {4, 2}}}},
      {OpKind::Bmm,
       {P::LowerPrecision, "TorchParity", [](V x) { return bmm(x[0], x[1]); }, {{2, 3, 4}, {2, 4, 5}}}},
      {OpKind::Addmm,
       {P::LowerPrecision, "TorchParity", [](V x) { return addmm(x[0], x[1], x[2]); }, {{2}, m, {4, 2}}}},
      // Views and copies keep their input's dtype and pass no OpScope.
      {OpKind::View, {P::PassThrough, "TorchParity", [](V x) { return x[0].view({4, 3}); }, {m}, false, 1e-6,
                      1e-6, false}},
      {OpKind::Permute, {P::PassThrough, "TorchParity", [](V x) { return x[0].permute({1, 0}); }, {m}, false,
                         1e-6, 1e-6, false}},
      {OpKind::Expand, {P::PassThrough, "TorchParity", [](V x) { return x[0].expand({2, 3, 4}); }, {m}, false,
                        1e-6, 1e-6, false}},
      {OpKind::Slice, {P::PassThrough, "TorchParity", [](V x) { return x[0].slice(1, 1, 4, 2); }, {m}, false,
                       1e-6, 1e-6, false}},
      {OpKind::Clone, {P::PassThrough, "TorchParity", [](V x) { return x[0].clone(); }, {m}, false, 1e-6,
                       1e-6, false}},
      {OpKind::Cat, {P::Promote, "TorchParity", [](V x) { return cat({x[0], x[1]}, 1); }, {m, {3, 2}}}},
      {OpKind::Stack, {P::Promote, "TorchParity", [](V x) { return stack({x[0], x[1]}, 0); }, {m, m}}},
      {OpKind::Gather,
       {P::PassThrough, "TorchParity",
        [](V x) { return gather(x[0], 1, idx({0, 3, 1, 1, 2, 0}, {3, 2})); }, {m}}},
      {OpKind::MaskedFill,
       {P::PassThrough, "TorchParity", [](V x) { return masked_fill(x[0], gt(x[0].detach(), zeros({})), 1.5); },
        {m}}},
      {OpKind::Linear,
       {P::LowerPrecision, "Gpt.Float32MatchesPyTorch", [](V x) { return F::linear(x[0], x[1], x[2]); },
        {{2, 3, 4}, {5, 4}, {5}}}},
      {OpKind::Conv2d,
       {P::LowerPrecision, "Functional.Conv2dMatchesTorch",
        [](V x) { return F::conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}); }, {{1, 2, 4, 4}, {3, 2, 3, 3}, {3}}}},
      {OpKind::Conv2dMaxPool2dRelu,
       {P::LowerPrecision, "ConvPoolFusion.MatchesTheThreeOpsBitForBit",
        [](V x) { return F::conv2d_max_pool2d_relu(x[0], x[1], x[2], {1, 1}, {1, 1}, {2, 2}); },
        {{1, 2, 4, 4}, {3, 2, 3, 3}, {3}}}},
      {OpKind::BatchNorm,
       {P::PassThrough, "Functional.BatchNormMatchesTorch",
        [](V x) { return F::batch_norm(x[0], {}, {}, x[1], x[2], /*training=*/true); }, {{3, 2, 2, 2}, {2}, {2}}}},
      {OpKind::MaxPool2d,
       {P::PassThrough, "Functional.PoolingMatchesTorch", [](V x) { return F::max_pool2d(x[0], {2, 2}); },
        {{1, 2, 4, 4}}}},
      {OpKind::AvgPool2d,
       {P::PassThrough, "Functional.PoolingMatchesTorch", [](V x) { return F::avg_pool2d(x[0], {2, 2}); },
        {{1, 2, 4, 4}}}},
      {OpKind::Dropout,  // the same mask at every call: the default generator reseeded
       {P::PassThrough, "FunctionalDropout.StatisticsAndBackwardMask",
        [](V x) {
          manual_seed(5);
          return F::dropout(x[0], 0.5, /*training=*/true);
        },
        {m}}},
      {OpKind::Embedding,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::embedding(idx({1, 0, 1}, {3}), x[0]); },
        {{2, 4}}}},
      {OpKind::LayerNorm,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::layer_norm(x[0], {4}, x[1], x[2]); },
        {m, {4}, {4}}}},
      {OpKind::RmsNorm,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::rms_norm(x[0], {4}, x[1]); }, {m, {4}}}},
      {OpKind::ScaledDotProductAttention,
       {P::LowerPrecision, "TransformerOps.MatchPyTorch",
        [](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); },
        {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}}}},
      {OpKind::QkvAttention,
       {P::LowerPrecision, "TransformerOps.MatchPyTorch", [](V x) { return F::qkv_attention(x[0], /*n_head=*/2); },
        {{1, 3, 3 * 4}}}},
      // Both pairings, at positions from 1 and from 2 (tables of different lengths), and llama3 rope scaling whose
      // three pairs fall in its high, medium and low frequency bands.
      {OpKind::RotaryEmbedding,
       {P::PassThrough, "TorchParity",
        [](V x) {
          const F::RopeScaling llama3{F::RopeScaling::Type::Llama3, 8.0, 1.0, 4.0, 256};
          return F::rotary_embedding(x[0], /*start_pos=*/1, /*theta=*/500.0) +
                 F::rotary_embedding(x[0], /*start_pos=*/2, 10000.0, F::RotaryPairing::RotateHalf) +
                 F::rotary_embedding(x[0], /*start_pos=*/3, 10000.0, F::RotaryPairing::Interleaved, llama3);
        },
        {{2, 3, 2, 6}}}},
      {OpKind::SwiGlu, {P::Promote, "TorchParity", [](V x) { return F::swiglu(x[0], x[1]); }, {m, m}}},
      {OpKind::CrossEntropy,
       {P::Float32InKernel, "TransformerOps.MatchPyTorch",
        [](V x) { return F::cross_entropy(x[0], idx({2, 0, 3}, {3})); }, {m}}},
      {OpKind::LinearCrossEntropy,
       {P::LowerPrecision, "LinearCrossEntropy.MatchesLinearThenCrossEntropy",
        [](V x) {  // 5 of 6 classes (a padded head), 4 logits a chunk: rows and class blocks of one and two
          return F::linear_cross_entropy(x[0], x[1], idx({2, 0, 4, 1}, {4}), F::Reduction::Mean, 0.1, -100, 5, 4);
        },
        {{4, 3}, {6, 3}}}},
      {OpKind::NllLoss,
       {P::Float32, "Functional.LossesMatchTorch", [](V x) { return F::nll_loss(x[0], idx({2, 0, 3}, {3})); }, {m}}},
      {OpKind::MseLoss,
       {P::Float32, "Functional.LossesMatchTorch", [](V x) { return F::mse_loss(x[0], x[1]); }, {m, m}}},
      {OpKind::BinaryCrossEntropyWithLogits,
       {P::Float32, "Functional.LossesMatchTorch",
        [](V x) { return F::binary_cross_entropy_with_logits(x[0], ones_like(x[0].detach()) * 0.25); }, {m}}},
      {OpKind::BinaryCrossEntropy,
       {P::Banned, "Functional.LossesMatchTorch",
        [](V x) { return F::binary_cross_entropy(sigmoid(x[0]), ones_like(x[0].detach()) * 0.25); }, {m}}},
      {OpKind::Function,
       {P::PassThrough, "AutogradFunction.GradientsMatchFiniteDifferences", [](V x) { return Cube::apply({x[0]}); },
        {m}, false, 1e-6, 1e-6, /*scoped=*/false}},  // its own policy: AutogradFunction.CustomFwdAndBwd*
      // clang-format on
  };
  return cases;
}

const std::multimap<OpKind, ParityCase>& parity_cases() {
  using V = const Inputs&;
  const std::string two = "[normal(6, 7), normal(6, 7)]", one = "[normal(6, 7)]", pos = "[positive(6, 7)]";
  static const std::multimap<OpKind, ParityCase> cases = {
      {OpKind::Add, {"add", "exact:exact", two, "x[0] + x[1]", [](V x, DType) { return x[0] + x[1]; }}},
      {OpKind::Add,
       {"add_broadcast", "reduce:reduce", "[normal(64, 7), normal(7)]", "x[0] + x[1]",
        [](V x, DType) { return x[0] + x[1]; }, "[g, g.sum(0)]"}},
      {OpKind::Sub,
       {"sub_alpha", "exact:exact", two, "torch.sub(x[0], x[1], alpha=0.5)",
        [](V x, DType) { return sub(x[0], x[1], /*alpha=*/0.5); }}},
      {OpKind::Mul, {"mul", "exact:exact", two, "x[0] * x[1]", [](V x, DType) { return x[0] * x[1]; }}},
      {OpKind::Div,
       {"div", "exact:exact", "[normal(6, 7), positive(6, 7)]", "x[0] / x[1]", [](V x, DType) { return x[0] / x[1]; }}},
      {OpKind::Neg, {"neg", "exact:exact", one, "-x[0]", [](V x, DType) { return -x[0]; }}},
      {OpKind::Pow,
       {"pow3", "ulp:ulp", one, "x[0] ** 3", [](V x, DType) { return pow(x[0], /*exponent=*/3.0); },
        "[g * 3 * x[0] * x[0]]"}},
      {OpKind::Exp, {"exp", "ulp:ulp", one, "torch.exp(x[0])", [](V x, DType) { return exp(x[0]); }, "[g * y]"}},
      {OpKind::Log, {"log", "ulp:ulp", pos, "torch.log(x[0])", [](V x, DType) { return log(x[0]); }, "[g / x[0]]"}},
      {OpKind::Sqrt,
       {"sqrt", "exact:exact", pos, "torch.sqrt(x[0])", [](V x, DType) { return sqrt(x[0]); }, "[g / (2 * y)]"}},
      {OpKind::Abs, {"abs", "exact:exact", one, "torch.abs(x[0])", [](V x, DType) { return abs(x[0]); }}},
      {OpKind::Relu,
       {"relu", "exact:exact", one, "torch.relu(x[0])", [](V x, DType) { return relu(x[0]); },
        "[torch.where(y <= 0, torch.zeros_like(g), g)]"}},
      {OpKind::Sigmoid,
       {"sigmoid", "ulp:ulp", one, "torch.sigmoid(x[0])", [](V x, DType) { return sigmoid(x[0]); },
        "[torch.ops.aten.sigmoid_backward(g, y)]"}},
      {OpKind::Tanh,
       {"tanh", "ulp:ulp", one, "torch.tanh(x[0])", [](V x, DType) { return tanh(x[0]); },
        "[torch.ops.aten.tanh_backward(g, y)]"}},
      // gelu in every dtype from float64: PyTorch's float32 forms cancel for x << 0 (hundreds of float32 ulps).
      {OpKind::Gelu, {"gelu", "ulp:ulp", one, "F.gelu(x[0])", [](V x, DType) { return gelu(x[0]); }, "", "float64"}},
      {OpKind::Gelu,
       {"gelu_tanh", "ulp:ulp", one, "F.gelu(x[0], approximate='tanh')",
        [](V x, DType) { return gelu(x[0], /*tanh_approximate=*/true); }, "", "float64"}},
      {OpKind::Silu,
       {"silu", "ulp:ulp", one, "F.silu(x[0])", [](V x, DType) { return silu(x[0]); },
        "[torch.ops.aten.silu_backward(g, x[0])]"}},
      {OpKind::Clamp,
       {"clamp", "exact:exact", one, "torch.clamp(x[0], -0.5, 0.75)",
        [](V x, DType) { return clamp(x[0], -0.5, 0.75); },
        "[torch.where((x[0] >= -0.5) & (x[0] <= 0.75), g, torch.zeros_like(g))]"}},
      {OpKind::Where,
       {"where", "exact:exact", "[boolean(6, 7), normal(6, 7), normal(6, 7)]", "torch.where(x[0], x[1], x[2])",
        [](V x, DType) { return where(x[0], x[1], x[2]); }}},
      {OpKind::Cast,
       {"cast_from", "exact:exact", one, "x[0].to(torch.bfloat16 if x[0].dtype == torch.float32 else torch.float32)",
        [](V x, DType) { return x[0].to(x[0].dtype() == DType::Float32 ? DType::BFloat16 : DType::Float32); }}},
      {OpKind::Cast,
       {"cast_to", "exact:exact", "[special_f32()]", "x[0].to(d)", [](V x, DType d) { return x[0].to(d); }, "",
        "native", "float16 bfloat16"}},
      {OpKind::Sum,
       {"sum_dim", "reduce:reduce", "[normal(5, 300, 3)]", "x[0].sum(1)", [](V x, DType) { return sum(x[0], {1}); },
        "[g.unsqueeze(1).expand_as(x[0])]"}},
      {OpKind::Sum,
       {"sum_all", "reduce:reduce", "[normal(40, 50)]", "x[0].sum()", [](V x, DType) { return sum(x[0]); },
        "[g.expand_as(x[0])]"}},
      {OpKind::Mean,
       {"mean_dim", "reduce:reduce", "[normal(7, 300)]", "x[0].mean(-1)", [](V x, DType) { return mean(x[0], {-1}); },
        "[(g.unsqueeze(-1) / x[0].shape[-1]).expand_as(x[0])]"}},
      {OpKind::MaxDim,
       {"max_dim", "exact:exact", one, "x[0].max(1).values", [](V x, DType) { return max(x[0], /*dim=*/1).first; }}},
      {OpKind::MinDim,
       {"min_dim", "exact:exact", one, "x[0].min(0).values", [](V x, DType) { return min(x[0], /*dim=*/0).first; }}},
      {OpKind::Softmax,
       {"softmax", "ulp:reduce", "[normal(6, 9)]", "torch.softmax(x[0], -1)",
        [](V x, DType) { return softmax(x[0], -1); },
        "[torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32)]"}},
      {OpKind::Softmax,
       {"softmax_dim0", "ulp:reduce", "[normal(6, 9)]", "torch.softmax(x[0], 0)",
        [](V x, DType) { return softmax(x[0], 0); },
        "[torch.ops.aten._softmax_backward_data(g, y, 0, torch.float32)]"}},
      {OpKind::LogSoftmax,
       {"log_softmax", "ulp:reduce", "[normal(6, 9)]", "torch.log_softmax(x[0], -1)",
        [](V x, DType) { return log_softmax(x[0], -1); },
        "[torch.ops.aten._log_softmax_backward_data(g, y, -1, torch.float32)]"}},
      // Products in float32 for 16-bit cases: without AVX-512 PyTorch's CPU bfloat16 gemm accumulates in bfloat16.
      {OpKind::Matmul,
       {"matmul_batched", "reduce:reduce", "[normal(2, 1, 5, 32), normal(3, 32, 4)]", "torch.matmul(x[0], x[1])",
        [](V x, DType) { return matmul(x[0], x[1]); },
        "[torch.matmul(g, x[1].transpose(-1, -2)).sum(1, keepdim=True), torch.matmul(x[0].transpose(-1, -2), g).sum(0)]",
        "float32"}},
      {OpKind::Mm,
       {"mm", "reduce:reduce", "[normal(16, 64), normal(64, 8)]", "x[0] @ x[1]",
        [](V x, DType) { return mm(x[0], x[1]); }, "[g @ x[1].t(), x[0].t() @ g]", "float32"}},
      {OpKind::Bmm,
       {"bmm", "reduce:reduce", "[normal(3, 5, 32), normal(3, 32, 4)]", "torch.bmm(x[0], x[1])",
        [](V x, DType) { return bmm(x[0], x[1]); },
        "[torch.bmm(g, x[1].transpose(1, 2)), torch.bmm(x[0].transpose(1, 2), g)]", "float32"}},
      {OpKind::Addmm,
       {"addmm", "reduce:reduce", "[normal(8), normal(16, 64), normal(64, 8)]", "torch.addmm(x[0], x[1], x[2])",
        [](V x, DType) { return addmm(x[0], x[1], x[2]); }, "[g.sum(0), g @ x[2].t(), x[1].t() @ g]", "float32"}},
      {OpKind::View,
       {"view", "exact:exact", one, "x[0].view(7, 6)",
        [](V x, DType) {
          return x[0].view({7, 6});
        }}},
      {OpKind::Permute,
       {"permute", "exact:exact", "[normal(3, 4, 5)]", "x[0].permute(1, 0, 2)",
        [](V x, DType) {
          return x[0].permute({1, 0, 2});
        }}},
      {OpKind::Expand,
       {"expand", "exact:reduce", "[normal(1, 6, 7)]", "x[0].expand(3, 6, 7)",
        [](V x, DType) {
          return x[0].expand({3, 6, 7});
        },
        "[g.sum(0, keepdim=True)]"}},
      {OpKind::Slice,
       {"slice", "exact:exact", one, "x[0][:, 1:6:2]", [](V x, DType) { return x[0].slice(1, 1, 6, 2); }}},
      {OpKind::Clone, {"clone", "exact:exact", one, "x[0].clone()", [](V x, DType) { return x[0].clone(); }}},
      {OpKind::Cat,
       {"cat", "exact:exact", "[normal(6, 7), normal(6, 3)]", "torch.cat([x[0], x[1]], 1)",
        [](V x, DType) {
          return cat({x[0], x[1]}, /*dim=*/1);
        }}},
      {OpKind::Stack,
       {"stack", "exact:exact", two, "torch.stack([x[0], x[1]], 0)",
        [](V x, DType) {
          return stack({x[0], x[1]}, /*dim=*/0);
        }}},
      {OpKind::Gather,
       {"gather", "exact:reduce", "[normal(6, 7), index(7, 6, 4)]", "torch.gather(x[0], 1, x[1])",
        [](V x, DType) { return gather(x[0], /*dim=*/1, x[1]); }, "[torch.zeros_like(x[0]).scatter_add(1, x[1], g)]"}},
      // RoPE against llama2.c's apply_rotary_emb and Hugging Face's rotate_half written out in the oracle
      // (tests/oracle/ops_oracle.py), gradients by PyTorch's autograd through them; 16-bit: computed in float32 from
      // the 16-bit inputs, rounded once.
      {OpKind::RotaryEmbedding,
       {"rope_interleaved", "reduce:reduce", "[normal(2, 9, 3, 16)]", "rope_interleaved(x[0], 0, 10000.0)",
        [](V x, DType) { return F::rotary_embedding(x[0]); },
        "[torch.autograd.grad(rope_interleaved(x[0].requires_grad_(), 0, 10000.0), x[0], g)[0]]", "float32"}},
      {OpKind::RotaryEmbedding,
       {"rope_interleaved_offset", "reduce:reduce", "[normal(1, 5, 2, 64)]", "rope_interleaved(x[0], 300, 500.0)",
        [](V x, DType) { return F::rotary_embedding(x[0], /*start_pos=*/300, /*theta=*/500.0); },
        "[torch.autograd.grad(rope_interleaved(x[0].requires_grad_(), 300, 500.0), x[0], g)[0]]", "float32"}},
      {OpKind::RotaryEmbedding,
       {"rope_rotate_half", "reduce:reduce", "[normal(2, 9, 3, 16)]", "rope_rotate_half(x[0], 0, 10000.0)",
        [](V x, DType) { return F::rotary_embedding(x[0], 0, 10000.0, F::RotaryPairing::RotateHalf); },
        "[torch.autograd.grad(rope_rotate_half(x[0].requires_grad_(), 0, 10000.0), x[0], g)[0]]", "float32"}},
      {OpKind::RotaryEmbedding,
       {"rope_rotate_half_offset", "reduce:reduce", "[normal(1, 5, 2, 64)]", "rope_rotate_half(x[0], 300, 500.0)",
        [](V x, DType) { return F::rotary_embedding(x[0], 300, 500.0, F::RotaryPairing::RotateHalf); },
        "[torch.autograd.grad(rope_rotate_half(x[0].requires_grad_(), 300, 500.0), x[0], g)[0]]", "float32"}},
      // Hugging Face's rope_scaling (modeling_rope_utils.py written out in tests/oracle/rope.py): linear, and llama3
      // (Llama 3.2's factors; head size 64 at theta 500000 puts pairs in its high, medium and low bands).
      {OpKind::RotaryEmbedding,
       {"rope_linear", "reduce:reduce", "[normal(1, 5, 2, 16)]",
        "rope_interleaved(x[0], 300, 10000.0, {'rope_type': 'linear', 'factor': 4.0})",
        [](V x, DType) {
          return F::rotary_embedding(x[0], 300, 10000.0, F::RotaryPairing::Interleaved,
                                     {F::RopeScaling::Type::Linear, 4.0});
        },
        "[torch.autograd.grad(rope_interleaved(x[0].requires_grad_(), 300, 10000.0, {'rope_type': 'linear', "
        "'factor': 4.0}), x[0], g)[0]]",
        "float32"}},
      {OpKind::RotaryEmbedding,
       {"rope_llama3", "reduce:reduce", "[normal(1, 5, 2, 64)]",
        "rope_interleaved(x[0], 3000, 500000.0, {'rope_type': 'llama3', 'factor': 32.0, 'low_freq_factor': 1.0, "
        "'high_freq_factor': 4.0, 'original_max_position_embeddings': 8192})",
        [](V x, DType) {
          return F::rotary_embedding(x[0], 3000, 500000.0, F::RotaryPairing::Interleaved,
                                     {F::RopeScaling::Type::Llama3, 32.0, 1.0, 4.0, 8192});
        },
        "[torch.autograd.grad(rope_interleaved(x[0].requires_grad_(), 3000, 500000.0, {'rope_type': 'llama3', "
        "'factor': 32.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': "
        "8192}), x[0], g)[0]]",
        "float32"}},
      // SwiGLU against llama2.c's FeedForward gate, F.silu(w1 x) * w3 x; the 16-bit backward PyTorch's formulas in
      // float32.
      {OpKind::SwiGlu,
       {"swiglu", "ulp:reduce", "[normal(6, 7), normal(6, 7)]", "F.silu(x[0]) * x[1]",
        [](V x, DType) { return F::swiglu(x[0], x[1]); },
        "[torch.ops.aten.silu_backward(g * x[1], x[0]), g * F.silu(x[0])]", "float32"}},
      {OpKind::MaskedFill,
       {"masked_fill", "exact:exact", "[normal(6, 7), boolean(6, 7)]", "x[0].masked_fill(x[1], 2.5)",
        [](V x, DType) { return masked_fill(x[0], x[1], /*value=*/2.5); }}},
  };
  return cases;
}

}  // namespace castor::test
