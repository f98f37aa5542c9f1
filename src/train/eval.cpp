// `castor eval`: the evaluation of a castor checkpoint, or of weights without castor metadata given their model and
// dataset, with the per-class table of an image classifier.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/safetensors.h"
#include "castor/trainer.h"
#include "castor/model_source.h"
#include "train/family.h"
#include "train/lm_scoring.h"
#include "train/lora_run.h"
#include "train/progress.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// The sizes of language-model weights without castor metadata, from their tensors' shapes (a GPT's nanoGPT names, a
// Llama's llama2.c/Castor names), --n-head (no shape holds it) and a Llama's --block-size (nor that: its context and
// window); the tensors as the model's state dict (a GPT's lm_head tied to wte).
void take_shapes(const EvalConfig& e, TrainConfig& c, LoadedTensors& file) {
  if (family_of(c.model) == family_named("gpt")) {  // (a row function of train/family.h once a third family reads it)
    formats::GPTWeights w = formats::gpt_weights_from_safetensors(std::move(file.tensors), file.metadata, e.n_head,
                                                                e.path);
    const models::GPTConfig& g = w.config;
    c.n_layer = g.n_layer, c.n_head = g.n_head, c.n_embd = g.n_embd, c.block_size = g.block_size;
    c.vocab_size = g.vocab_size, c.real_vocab_size = g.real_vocab_size, c.bias = g.bias;
    w.state["lm_head.weight"] = w.state.at("transformer.wte.weight");
    file.tensors = std::move(w.state);
    return;
  }
  auto need = [&](const std::string& name) -> const Tensor& {
    auto it = file.tensors.find(name);
    CASTOR_CHECK(it != file.tensors.end() && it->second.dim() == 2, e.path, ": no 2-D tensor ", name,
                 " (expected a Llama's names: tok_embeddings, layers.N.attention.wq, ...)");
    return it->second;
  };
  const Tensor& embeddings = need("tok_embeddings.weight");  // (V, dim)
  c.vocab_size = embeddings.size(0), c.n_embd = embeddings.size(1);
  c.n_layer = 0;
  while (file.tensors.count(detail::cat("layers.", c.n_layer, ".attention_norm.weight"))) ++c.n_layer;
  CASTOR_CHECK(c.n_layer > 0, e.path, ": no tensor layers.0.attention_norm.weight (expected a Llama's names)");
  CASTOR_CHECK(e.n_head > 0, e.path, ": the number of heads is not recorded in the file; give it (--n-head)");
  CASTOR_CHECK(e.block_size > 0, e.path,
               ": a Llama's context length is not recorded in the file; give it (--block-size)");
  CASTOR_CHECK(c.n_embd % e.n_head == 0, "--n-head ", e.n_head, ": does not divide ", e.path, "'s dim ", c.n_embd);
  c.n_head = e.n_head, c.block_size = e.block_size;
  c.n_kv_head = need("layers.0.attention.wk.weight").size(0) / (c.n_embd / e.n_head);  // (Hkv D, dim)
  formats::Llama2cConfig sizes;
  sizes.dim = c.n_embd, sizes.hidden_dim = need("layers.0.feed_forward.w1.weight").size(0);  // (hidden, dim)
  c.multiple_of = formats::llama2c_multiple_of(sizes, e.path);
  // Tied unless output.weight holds other values (a file may store the shared tensor twice).
  const auto output = file.tensors.find("output.weight");
  if (output != file.tensors.end()) {
    const Tensor a = output->second.to(DType::Float32).contiguous(), b = embeddings.to(DType::Float32).contiguous();
    c.untied = a.shape() != b.shape() || std::memcmp(a.data_ptr(), b.data_ptr(), b.nbytes()) != 0;
  }
  if (!c.untied) file.tensors["output.weight"] = embeddings;
}

// The weights at `path` (a run or checkpoint directory, or a safetensors file) and the config they were trained with
// (from castor's metadata, or --model and --data); `recorded_classes`: the class names the run recorded.
LoadedTensors load_for_eval(const EvalConfig& e, TrainConfig& c, std::vector<std::string>& recorded_classes) {
  LoadedTensors model_file;
  std::string file = e.path;  // the model file, for errors
  // (a Hugging Face directory is read as a weights file)
  if (formats::is_source(e.path, formats::SourceFormat::CastorDir)) {
    Checkpoint ck = read_checkpoint(e.path, &file);
    file += "/model.safetensors";
    model_file = {std::move(ck.model), std::move(ck.model_meta)};
  } else {
    model_file = formats::load_weights_file(e.path, name(e.data.value_or(Dataset::Tokens)));
  }
  if (const Json recorded = castor_config(model_file.metadata, file); !recorded.is_null()) {
    c = resume_config(TrainConfig{}, recorded, e.path);
    if (!recorded.find("amp")) c.amp = amp::OptLevel::O0;  // another tool's model (no run recorded): float32
    if (const Json* names = recorded.find("class_names"); names && names->is_array())
      for (const Json& n : names->as_array()) recorded_classes.push_back(n.is_string() ? n.as_string() : n.dump());
    CASTOR_CHECK(!e.model || *e.model == c.model, "--model ", name(*e.model), ": ", e.path, " holds a ", name(c.model));
    CASTOR_CHECK(!e.data || *e.data == c.data, "--data ", name(*e.data), ": ", e.path, " was trained on ",
                 name(c.data));
    if (is_language_model(c.model)) take_model_vocabulary(c, e.path, recorded);  // (a llama2.c file's tokenizer.bin)
  } else {
    CASTOR_CHECK(e.model && e.data, e.path,
                 ": no castor metadata (castor.config); say what it holds with --model and --data");
    c.model = *e.model;
    c.data = *e.data;
    c.amp = amp::OptLevel::O0;  // weights without castor metadata are evaluated in float32
    if (is_language_model(c.model)) take_shapes(e, c, model_file);
  }
  if (!e.lora_base.empty()) {
    CASTOR_CHECK(c.lora_rank > 0, "--lora-base: ", e.path, " is not a LoRA run's (castor train --lora-rank)");
    c.init = e.lora_base;  // (checked against the recorded checksum as it loads)
  }
  if (e.block_size > 0 && is_language_model(c.model)) {
    // The evaluation window: the model keeps its context (its description), the task reads windows of --block-size.
    if (!c.model_config.is_object()) c.model_config = family(c).describe(c);
    // (the context a description gives: a Llama's max_seq_len, a GPT's block_size)
    const Json* context = c.model_config.find("max_seq_len") ? c.model_config.find("max_seq_len")
                                                             : c.model_config.find("block_size");
    CASTOR_CHECK(!context || !context->is_int() || e.block_size <= context->as_int(), "--block-size ", e.block_size,
                 ": ", e.path, " reads at most ", context->dump(), " positions");
    c.block_size = e.block_size;
  }
  if (!e.data_dir.empty()) c.data_dir = e.data_dir;
  c.eval_iters = 0;  // a language model's whole validation split
  if (e.dtype == DType::Float32) {
    c.amp = amp::OptLevel::O0;
  } else if (e.dtype) {
    c.dtype = *e.dtype;
    if (c.amp == amp::OptLevel::O0) c.amp = amp::OptLevel::O1;
  }
  return model_file;
}

}  // namespace

Json run_eval(const EvalConfig& e) {
  if (!e.task.empty()) return run_task_eval(e);
  if (!e.text.empty()) return run_perplexity_eval(e);
  TrainConfig c;
  std::vector<std::string> recorded_classes;
  const LoadedTensors model_file = load_for_eval(e, c, recorded_classes);
  for (const auto& [name, t] : model_file.tensors) formats::check_finite(e.path, name, t);
  const std::unique_ptr<Task> task = make_task(c, /*rank=*/0, /*world=*/1, /*new_run=*/false);
  Run run = build_run(c, *task, 1, /*load_init=*/false);
  try {
    load_model_file(*run.model, model_file.tensors, model_file.metadata, e.path);
  } catch (const Error& err) {
    throw Error(detail::cat(e.path, ": ", err.what()));
  }
  if (!e.lora.empty()) {
    CASTOR_CHECK(c.lora_rank == 0, "--lora: ", e.path, " is a LoRA run's checkpoint (its own adapters); give its base");
    CASTOR_CHECK(is_language_model(c.model), "--lora: ", e.path, " is a ", name(c.model), ", not a language model");
    merge_peft_adapter(*run.model, c.model, e.path, e.lora);
  }
  const std::vector<std::string> classes = task->classes();
  CASTOR_CHECK(recorded_classes.empty() || recorded_classes == classes, e.path,
               ": the model was trained on other "
               "classes than --data-dir ",
               data_dir(c), " holds (", recorded_classes.size(), " recorded, ", classes.size(),
               " found, or in another order)");
  const Evaluation ev = evaluate(*task, *run.model, *run.amp,
                                 e.batch_size > 0 ? e.batch_size : task->eval_batch_size());
  // On a terminal too narrow for the confusion matrix, the per-class columns alone (the JSON has the matrix).
  const int width = isatty(STDERR_FILENO) ? terminal_width(STDERR_FILENO) - 1 : INT32_MAX;
  std::fputs(task->eval_text(ev, width).c_str(), stderr);
  Json out = task->eval_json(ev);
  out["checkpoint"] = e.path;
  return out;
}

}  // namespace castor::train
