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

namespace castor::models {

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcModelVersion = 3;      // float32 tensors
constexpr int32_t kLlmcModelVersionBf16 = 5;  // bfloat16 tensors (llm.c's CUDA trainer), read only

// A GPT's settings and weights, as files hold them: nanoGPT names, float32, lm_head.weight left out (tied to wte).
struct GPTWeights {
  GPTConfig config;
  StateDict state;
};

// An llm.c checkpoint's header: the config it gives (as read_llmc_checkpoint's) and its tensors' dtype (float32, or
// bfloat16 for version 5), checked against the file's size; castor::Error naming the file as read_llmc_checkpoint.
struct LlmcHeader {
  GPTConfig config;
  DType dtype = DType::Float32;
};
LlmcHeader read_llmc_header(const std::string& path);
// The tensors of an llm.c checkpoint of `config`, nanoGPT names and shapes, in the file's order.
std::vector<std::pair<std::string, Shape>> llmc_tensors(const GPTConfig& config);

// A weights file's format from its first bytes: llm.c's magic number, llama2.c's v1 magic number, a safetensors
// header (a u64 length that fits the file, then '{'), or else a llama2.c v0 file (no magic number: a 7-int header
// whose sizes give exactly the file's size, read_llama2c_header's checks); castor::Error "PATH: not a safetensors,
// llm.c or llama2.c file (...)" otherwise, with what reading it as a v0 file found; "PATH: a GGUF file ..." for one
// (written, not read).
enum class WeightsFormat { Llmc, Safetensors, Llama2c };
WeightsFormat weights_format(const std::string& path);

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
void write_llmc_checkpoint(const std::string& path, const GPT& model);
void write_llmc_checkpoint(const std::string& path, const GPTWeights& weights);

// The config of nanoGPT-named weights from their shapes (n_layer, n_embd, block_size, vocab_size, bias), with
// `n_head` given; checks that `state` holds exactly a GPT's tensors with their shapes (lm_head.weight, when there,
// equal to transformer.wte.weight; torch.compile's "_orig_mod." prefix and nanoGPT's attention-mask buffers
// ".attn.bias" of shape (1, 1, T, T) are dropped) and converts them to float32. castor::Error naming `what`.
GPTWeights gpt_weights_from_state_dict(StateDict state, int64_t n_head, const std::string& what);

// The --init of a GPT: an llm.c checkpoint (told apart by its magic number) or a safetensors file with nanoGPT names
// (a llama2.c file: castor::Error naming it, a Llama's).
// For safetensors, n_head comes from castor metadata ("castor.config" with "n_head") or else `n_head` (0: none given,
// an error naming the file); a file's own value that differs from a given `n_head` is an error too.
GPTWeights load_gpt_init(const std::string& path, int64_t n_head = 0);

// The same from loaded safetensors (a checkpoint's model.safetensors and its metadata).
GPTWeights gpt_weights_from_safetensors(StateDict tensors, const Metadata& metadata, int64_t n_head,
                                        const std::string& what);

// A weights file as `castor eval` reads it (or a Hugging Face directory: castor/hf.h's tensors and hf_metadata's):
// safetensors as they are; an llm.c checkpoint as its tensors with nanoGPT
// names (lm_head.weight = wte) and the metadata a float32 GPT checkpoint trained on `data` (a --data name) would
// record ("castor.config": model gpt, the sizes, amp O0), plus "llmc.header" (the header, as text); a llama2.c file
// as load_llama2c_weights_file gives it. castor::Error "PATH: not a safetensors, llm.c or llama2.c file (...)" for
// anything else (weights_format).
LoadedTensors load_weights_file(const std::string& path, const std::string& data);
// load_weights_file's tensors one at a time (its names, each in the file's dtype), each read from the file straight
// into a tensor of its own as it is given to `take` and dropped after it: a Hugging Face directory, a safetensors file
// or an llm.c checkpoint is never held whole (a llama2.c file is read whole first: its versions 1 and 2 are not
// plain tensors).
void read_weights_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take);
// Loads `path`'s weights (read_weights_each) into `model` strictly, tensor by tensor, each copied into its parameter
// or buffer in place and in that tensor's dtype (a 16-bit parameter made under nn::LoadInitGuard takes a float32
// file's values rounded once, as a float32 load then a cast would): the model is never held twice. A tensor of the
// model tied to another (GPT's lm_head, a tied Llama output) needs none of its own; torch.compile's "_orig_mod."
// prefix is dropped and nanoGPT's attention-mask buffers ".attn.bias" of 4 dimensions are skipped. castor::Error
// naming `path` and the tensor for one the model lacks, one of another shape, or a model tensor the file does not give.
void load_weights_into(nn::Module& model, const std::string& path);
// The same, names, dtypes, shapes and metadata only (`castor info`: the data is not read); "castor.config" without
// "data" for llm.c and llama2.c files.
SafetensorsFile read_weights_header(const std::string& path);

}  // namespace castor::models
