// LoRA on a Llama read from a Hugging Face directory, or from a file of the same values (a GGUF file's), against
// tests/oracle/lora_oracle.py's PEFT-style LoRA on the Hugging Face model: what tests/formats/hf_test.cpp and
// tests/formats/gguf_reader_test.cpp share.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "castor/functional.h"
#include "castor/hf.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "nn/lora_twin.h"

namespace castor::test {

// `model` with its adapters attached (B drawn): its logits, loss and adapter gradients on (x, y) within 1e-5 of the
// oracle's on the Hugging Face directory `hf_dir`, the adapters crossing under Hugging Face's names, q_proj's and
// k_proj's B rows (and their gradients) in its rotary order; `scaling` the adapters' alpha / r.
inline void expect_hf_lora_matches_oracle(models::Llama& model, const std::string& hf_dir, const std::string& name,
                                          double scaling, const Tensor& x, const Tensor& y) {
  const models::LlamaConfig& mc = model.config();
  const StateDict adapters = formats::hf_adapters(mc, nn::lora_state_dict(model), /*to_castor=*/false);
  const StateDict out = lora_oracle_grads(
      name, detail::cat("{\"model\": \"hf\", \"dir\": \"", hf_dir, "\", \"scaling\": ", scaling, "}"), adapters,
      {{"x", x}, {"y", y}});
  ASSERT_FALSE(out.empty());
  StateDict want = {{"loss", out.at("loss")}, {"logits", out.at("logits")}, {"base_grads", out.at("base_grads")}};
  StateDict grads;
  for (const auto& [n, t] : adapters) grads.emplace(n, out.at("grad." + n));
  for (const auto& [n, g] : formats::hf_adapters(mc, grads, /*to_castor=*/true)) want.emplace("grad." + n, g);
  const Tensor logits = model(x);
  const Tensor loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  loss.backward();
  EXPECT_TRUE(close(logits, want.at("logits"), 0, 1e-5));
  EXPECT_NEAR(loss.item(), want.at("loss").item(), 1e-5);
  expect_adapter_grads(model, want, 1e-5);
}

}  // namespace castor::test
