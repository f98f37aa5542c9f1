// AdamW steps of a GPT loaded from llm.c's checkpoint format on llm.c-order batches (LmBatchSource sequential): the
// Castor side of the llm.c interop check, shared by tests/train/llmc_test.cpp (a small config, in CI) and
// bench/llmc_interop_bench.cpp (GPT-2 124M). The PyTorch side is tests/oracle/llmc_oracle.py.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "castor/autocast.h"
#include "castor/functional.h"
#include "castor/llmc.h"
#include "castor/lm_batch.h"
#include "castor/optim.h"

namespace castor::test {

struct LlmcSteps {
  std::vector<double> losses;  // batch i's loss before step i's update
  double seconds = 0;          // the steps' time
};

// Loads `model_bin`, trains `steps` AdamW steps (betas 0.9/0.999, eps 1e-8, weight decay on dim >= 2 tensors only,
// no clipping) on `tokens_bin` in llm.c's order with B rows of T tokens; the loss is over the real vocabulary (V of
// the header: the model's logits leave the padding out, as llm.c's softmax does). bf16: forward and loss under bfloat16 autocast (O1).
inline LlmcSteps llmc_train_steps(const std::string& model_bin, const std::string& tokens_bin, int64_t B, int64_t T,
                                  int64_t steps, double lr, double weight_decay, bool bf16) {
  formats::GPTWeights w = formats::read_llmc_checkpoint(model_bin);
  auto model = models::gpt(w.config);
  model->load_state_dict(w.state);
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = lr, o.weight_decay = weight_decay;
  optim::Adam opt(decay, o);
  opt.add_param_group(no_decay, lr, 0.0);
  data::TokenFile file(tokens_bin);
  data::LmBatchSource batches(file, {.batch_size = B, .block_size = T, .order = data::LmOrder::Sequential});
  const int64_t V = w.config.real_vocab_size;
  LlmcSteps out;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const data::LmBatch b = batches.next();
    Tensor loss;
    {
      amp::AutocastGuard autocast(DType::BFloat16, /*enabled=*/bf16);
      const Tensor logits = (*model)(b.x);  // (B, T, V): the GPT leaves the padding columns out
      loss = F::cross_entropy(logits.reshape({B * T, V}), b.y.reshape({B * T}));
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    out.losses.push_back(loss.item());
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace castor::test
