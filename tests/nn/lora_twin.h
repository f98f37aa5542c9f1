// What the LoRA tests against tests/oracle/lora_oracle.py share (tests/nn/lora_test.cpp on Castor's own models,
// tests/formats/hf_test.cpp on Hugging Face directories): adapters with a non-zero B, and the adapter-gradient check.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "castor/autograd.h"
#include "castor/lora.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "nn/lm_twin.h"
#include "test_util.h"

namespace castor::test {

// Draws every lora_B from N(0, 0.05) so that A's gradient is not zero (B starts at zero).
inline void randomize_lora_b(nn::Module& model, uint64_t seed) {
  Generator gen(seed);
  NoGradGuard no_grad;
  for (auto& [path, layer] : nn::lora_layers(model)) {
    Tensor w = layer->lora->lora_B->weight;
    w.copy_(normal(w.shape(), 0.0, 0.05, DType::Float32, &gen).to(w.dtype()));
  }
}

// lora_oracle.py's "grads" of `weights` (the base's and the adapters' tensors, or the adapters' alone where `config`
// names a Hugging Face directory) on `batch` ("x", "y"); empty when the oracle fails.
inline StateDict lora_oracle_grads(const std::string& name, const std::string& config, const StateDict& weights,
                                   const StateDict& batch) {
  const ScratchDir dir(name);
  save_safetensors(dir + "/weights.safetensors", weights);
  save_safetensors(dir + "/batch.safetensors", batch);
  if (!run_oracle("lora_oracle.py", {"grads", config, dir + "/weights.safetensors", dir + "/batch.safetensors",
                                     dir + "/out.safetensors"}))
    return {};
  return load_safetensors(dir + "/out.safetensors").tensors;
}

// Each trainable parameter's gradient within `tol` (relative L2) of lora_oracle.py's "grad.<name>" in `want` (Castor's
// names), one each; no frozen parameter got a gradient on either side.
inline void expect_adapter_grads(nn::Module& model, const StateDict& want, double tol) {
  int64_t adapters = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) {
      EXPECT_FALSE(p.grad().defined()) << name << " is frozen but got a gradient";
      continue;
    }
    ++adapters;
    ASSERT_TRUE(want.count("grad." + name)) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LE(rel_l2(p.grad(), want.at("grad." + name)), tol) << name;
  }
  EXPECT_EQ(adapters * 1u, want.size() - 3) << "adapters here and in the oracle";  // less loss, logits, base_grads
  EXPECT_EQ(want.at("base_grads").item(), 0.0);
}

}  // namespace castor::test
