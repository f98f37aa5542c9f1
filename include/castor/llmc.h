// GPT weights between Castor and other tools: llm.c's checkpoint format (gpt2_124M.bin) and safetensors with
// nanoGPT names, read into a GPTConfig plus a StateDict with nanoGPT names (docs/language-models.md, "llm.c interop").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "castor/models.h"
#include "castor/nn.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"

namespace castor::formats {

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcModelVersion = 3;      // float32 tensors
constexpr int32_t kLlmcModelVersionBf16 = 5;  // bfloat16 tensors (llm.c's CUDA trainer), read only

// A GPT's settings and weights, as files hold them: nanoGPT names, float32, lm_head.weight left out (tied to wte).
struct GPTWeights {
  models::GPTConfig config;
  StateDict state;
};

// An llm.c checkpoint's header: the config it gives (as read_llmc_checkpoint's) and its tensors' dtype (float32, or
// bfloat16 for version 5), checked against the file's size; castor::Error naming the file as read_llmc_checkpoint.
struct LlmcHeader {
  models::GPTConfig config;
  DType dtype = DType::Float32;
};
LlmcHeader read_llmc_header(const std::string& path);
// The tensors of an llm.c checkpoint of `config`, nanoGPT names and shapes, in the file's order.
std::vector<std::pair<std::string, Shape>> llmc_tensors(const models::GPTConfig& config);

// Reads llm.c's checkpoint: int32 header[256] = {20240326, 3, maxT, V, L, NH, C, Vp, ...}, then float32 wte (Vp, C),
// wpe (maxT, C), ln1w, ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w, ln2b
// (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw, lnfb (C). config: vocab_size = Vp,
// real_vocab_size = V, block_size = maxT, bias true. Version 5 files (the same layout in bfloat16, as llm.c's CUDA
// trainer writes them) are read too, widened to float32. castor::Error (one line naming the file) on a wrong magic or
// version, header values out of range, or a size other than exactly 1024 + 4 (version 5: 2) x (number of floats) bytes.
GPTWeights read_llmc_checkpoint(const std::string& path);

// Writes `model` in llm.c's format, whole (temp file, fsync, rename: a failure leaves any old file intact). V is
// config.real_vocab_size (vocab_size when 0), Vp config.vocab_size. A GPT without biases (bias=false) is written
// with zero biases, which compute the same function.
void write_llmc_checkpoint(const std::string& path, const models::GPT& model);
void write_llmc_checkpoint(const std::string& path, const GPTWeights& weights);

// The config of nanoGPT-named weights from their shapes (n_layer, n_embd, block_size, vocab_size, bias), with
// `n_head` given; checks that `state` holds exactly a GPT's tensors with their shapes (lm_head.weight, when there,
// equal to transformer.wte.weight; torch.compile's "_orig_mod." prefix and nanoGPT's attention-mask buffers
// ".attn.bias" of shape (1, 1, T, T) are dropped) and converts them to float32. castor::Error naming `what`.
GPTWeights gpt_weights_from_state_dict(StateDict state, int64_t n_head, const std::string& what);

// The --init of a GPT: an llm.c checkpoint or a safetensors file with nanoGPT names (castor/model_source.h tells them
// apart; another format: castor::Error naming it).
// For safetensors, n_head comes from castor metadata ("castor.config" with "n_head") or else `n_head` (0: none given,
// an error naming the file); a file's own value that differs from a given `n_head` is an error too.
GPTWeights load_gpt_init(const std::string& path, int64_t n_head = 0);

// The same from loaded safetensors (a checkpoint's model.safetensors and its metadata).
GPTWeights gpt_weights_from_safetensors(StateDict tensors, const Metadata& metadata, int64_t n_head,
                                        const std::string& what);

// The model settings a GPT run of an llm.c file's config would record: "castor.config" (with "data" when given) and
// "llmc.header" (the header, as text).
Metadata llmc_metadata(const LlmcHeader& header, const std::string& data);

}  // namespace castor::formats
