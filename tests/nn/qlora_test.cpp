// LoRA over a quantized frozen base (QLoRA): a Llama and a GPT whose Linears but the output hold their weights in each
// block type of the table, against PyTorch 1.13 LoRA (tests/oracle/lora_oracle.py) on the dense weights the blocks hold.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/quant.h"
#include "nn/lm_twin.h"
#include "nn/lora_twin.h"
#include "nn/tiny_gpt.h"
#include "nn/tiny_llama.h"
#include "test_util.h"

namespace castor {
namespace {

using quant::BlockType;

// 256 wide (rows of whole K-quant blocks: wq, wk, wv, wo, w1, w3 in 256 values, w2 in 768), 2 layers, 4 heads of
// 64 over 2 kv heads.
models::LlamaConfig wide_llama() {
  models::LlamaConfig c = test::tiny_llama_config(67);
  c.dim = 256, c.multiple_of = 256;
  return c;
}

// The base's tensors as the oracle reads them: each quantized Linear's weight as the float32 its blocks hold.
StateDict dense_weights(nn::Module& model) {
  StateDict weights;
  for (const auto& [k, v] : model.state_dict()) weights.emplace(k, v.to(DType::Float32));
  for (const auto& [path, layer] : nn::all_linear_layers(model)) {
    if (!layer->quantized) continue;
    Tensor w = empty({layer->out_features(), layer->in_features()});
    quant::dequantize_rows(*layer->quantized, 0, layer->out_features(), w.data<float>());
    weights.emplace(path + ".weight", w);
  }
  return weights;
}

// A family's model 256 wide and its config as the oracle reads it (", \"scaling\": ..." appended).
struct Family {
  const char* name;
  std::function<std::shared_ptr<models::LanguageModel>()> make;
  std::function<std::string(const std::string& extra)> config;
  size_t linears;  // adapted Linears (all but the output layer)
};

std::vector<Family> families() {
  const models::LlamaConfig llama = wide_llama();
  models::GPTConfig gpt = test::tiny_gpt_config(67);  // 4 heads of 64; c_attn, c_proj, c_fc and mlp.c_proj
  gpt.n_embd = 256, gpt.n_head = 4;
  return {{"llama", [=] { return models::llama(llama, 3); },
           [=](const std::string& extra) { return test::llama_config_json(llama, ", \"model\": \"llama\"" + extra); },
           14},  // 7 Linears a layer
          {"gpt", [=] { return models::gpt(gpt, 3); },
           [=](const std::string& extra) { return test::gpt_config_json(gpt, extra); }, 8}};
}

struct Case {
  BlockType type;
  bool double_quant;
};

// At O0 (float32): the loss, the logits and every adapter's gradient within 1e-5 of PyTorch's on the dequantized
// weights; the quantized layers keep no parameter (no dense copy of the base) and the output layer stays dense.
TEST(QLora, AdapterGradientsMatchPyTorchOnTheDequantizedBase) {
  for (const Family& f : families()) {
    for (const Case& k : {Case{BlockType::NF4, true}, Case{BlockType::NF4, false}, Case{BlockType::Q8_0, false},
                          Case{BlockType::Q4_0, false}, Case{BlockType::Q4_K, false}}) {
      SCOPED_TRACE(detail::cat(f.name, " ", quant::block_type(k.type).name, k.double_quant ? " double" : ""));
      const std::shared_ptr<models::LanguageModel> model = f.make();
      for (const auto& [path, layer] : nn::all_linear_layers(*model)) layer->quantize_weight(k.type, k.double_quant);
      EXPECT_FALSE(model->head().quantized);
      const StateDict own = model->state_dict();
      for (const auto& [path, layer] : nn::all_linear_layers(*model)) EXPECT_FALSE(own.count(path + ".weight")) << path;
      nn::LoraConfig cfg{.r = 4, .alpha = 8};
      EXPECT_EQ(nn::apply_lora(*model, cfg).size(), f.linears);
      test::randomize_lora_b(*model, 7);
      const Tensor x = test::random_token_batch(2, 16, 67, 1), y = test::random_token_batch(2, 16, 67, 2);
      const StateDict want = test::lora_oracle_grads(detail::cat("qlora_", f.name),
                                                     f.config(detail::cat(", \"scaling\": ", cfg.scaling())),
                                                     dense_weights(*model), {{"x", x}, {"y", y}});
      ASSERT_FALSE(want.empty());
      const Tensor logits = (*model)(x);
      const Tensor loss = F::cross_entropy(logits.reshape({-1, 67}), y.reshape({-1}));
      loss.backward();
      EXPECT_TRUE(test::close(logits, want.at("logits"), 1e-5, 1e-6));
      EXPECT_NEAR(loss.item(), want.at("loss").item(), 1e-5);
      test::expect_adapter_grads(*model, want, 1e-5);
    }
  }
}

// A quantized Linear's output and input gradient against linear with the dequantized dense weight and the bias, in
// float32 and bfloat16, with one tile and with several (a weight taller than a tile); the blocks get no gradient.
TEST(QLora, QuantizedLinearMatchesTheDenseProduct) {
  Generator gen(46);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{96, 256}, std::pair<int64_t, int64_t>{4608, 256}}) {
    for (DType dt : {DType::Float32, DType::BFloat16}) {
      SCOPED_TRACE(detail::cat(rows, " rows, ", dtype_name(dt)));
      nn::Linear layer(cols, rows);
      layer.quantize_weight(BlockType::Q4_K, false);
      layer.to(dt);
      EXPECT_EQ(layer.named_parameters().size(), 1u);  // the bias
      Tensor dense = empty({rows, cols});
      quant::dequantize_rows(*layer.quantized, 0, rows, dense.data<float>());
      const Tensor x = randn({3, 5, cols}, DType::Float32, &gen).to(dt).requires_grad_();
      const Tensor x2 = x.detach().requires_grad_(), g = randn({3, 5, rows}, DType::Float32, &gen).to(dt);
      const Tensor y = layer(x), want = F::linear(x2, dense.to(dt), layer.bias.detach());
      const double tol = dt == DType::Float32 ? 1e-5 : 1e-2;
      EXPECT_TRUE(test::close(y, want, tol, 1e-5));
      sum(y * g).backward();
      sum(want * g).backward();
      EXPECT_TRUE(test::close(x.grad(), x2.grad(), tol, 1e-5));
      EXPECT_TRUE(layer.bias.grad().defined());
    }
  }
}

}  // namespace
}  // namespace castor
