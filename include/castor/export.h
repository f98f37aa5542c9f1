// The `castor export` command: a run's model, or a model file, in another tool's format (llm.c, nanoGPT, llama2.c,
// safetensors, GGUF, a Hugging Face directory, PEFT adapters).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "castor/dtype.h"
#include "castor/json.h"

namespace castor::train {

struct ExportConfig {
  // --format: a name of the export table (src/train/export.cpp: llmc, nanogpt, llama2c, safetensors, gguf, hf, peft); the old
  // flags --llmc, --nanogpt, --llama2c, --safetensors and --peft DIR are its spellings.
  std::string format;
  std::string type = "f32";  // --format gguf: the file's type (castor/gguf.h's gguf_file_types: f16, q8_0, q4_k_m, ...)
  int version = 0;           // --format llama2c: export.py's version, 0 or 1
  uint64_t max_shard_size = 5'000'000'000;  // --format hf: bytes per safetensors shard (--max-shard-size 5GB)
  // --format hf: the tensors' dtype; none: the source's (the Hugging Face directory the model came from, a LoRA run's
  // base: its torch_dtype), else the model's own
  std::optional<DType> dtype;
  bool merge_lora = false;  // a LoRA run: its base with the adapters merged (required for --llmc and --nanogpt)
  // (--peft DIR: --format peft --out DIR, a LoRA run's adapters in PEFT's format)
  std::string checkpoint;  // a run or checkpoint directory, or a weights file (llm.c .bin, llama2.c or safetensors)
  std::string out;
  std::string out_flag = "--out";  // the flag that named `out` (--peft DIR), for errors
  int64_t n_head = 0;              // for safetensors that do not record it
  std::string lora_base;           // a LoRA run's base where it is now (it moved since the run recorded it)
};
ExportConfig parse_export_flags(const std::vector<std::string>& args);
std::string export_help();
// Writes the file; returns a summary: {"out", "format", "n_layer", "n_head", "n_embd", "block_size", "vocab_size",
// "bytes"; llmc: "padded_vocab_size"; nanogpt: "optimizer", whether the AdamW state was written}; llama2c: {"out",
// "format", "version", llama2.c's header fields, "shared_classifier", "bytes", "tokenizer" (tokenizer.bin's path, or
// null when the run's tokenizer is not a bpe one)}; safetensors: {"from", "format", "model", "tensors", "out", "bytes"};
// gguf: {"from", "format", "arch", "type", "tensor_types" (ggml's type name -> tensors of it), "tokenizer",
// "vocab_size", "tensors", "out", "bytes", and for a quantized type "max_error" (the largest |x - dequantized x|)}.
Json run_export(const ExportConfig& c);

}  // namespace castor::train
