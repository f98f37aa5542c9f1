// The model a command reads from --checkpoint or --init (castor sample and castor export): a run's or checkpoint's
// (a LoRA run's merged into its base), or any file the format table reads (castor/model_source.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/llmc.h"
#include "castor/serialize.h"
#include "castor/state_dict.h"

namespace castor::train {

// A GPT's weights from a run or checkpoint directory or a weights file, with the run's settings (null when none); or a
// Llama's model (a run's built from its recorded settings, a llama2.c file's from its header) with its weights loaded.
struct LoadedGpt {
  formats::GPTWeights weights;
  Json config;
  std::string what;
  StateDict train_state;  // a checkpoint's train_state.safetensors (empty for a weights file or a LoRA run's)
  std::string run_dir;    // the run directory holding the checkpoint (empty when none)
  std::shared_ptr<models::LanguageModel> llama;  // a Llama's (weights then empty)
  bool lora = false;                             // a LoRA run's checkpoint: its base with the adapters merged
  Metadata meta;  // the model file's metadata (castor.config: a merged LoRA run's as a plain run's)
};

// A weights file or a run or checkpoint directory; a LoRA run's model file (in its checkpoint or alone) merged into its
// base (`lora_base`: where the base is now, when it moved). `keep_blocks` (castor sample and eval): a GGUF file's
// quantized Linear weights stay in their blocks (formats::load_weights_into), never dense.
LoadedGpt load_gpt(const std::string& path, int64_t n_head, const std::string& lora_base = "",
                   bool keep_blocks = false);

// A key of the model's recorded description (null when the run has none or it lacks the key).
Json described(const LoadedGpt& g, const char* key);

}  // namespace castor::train
