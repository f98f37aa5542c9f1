// `castor eval`: the evaluation of a castor checkpoint, or of weights without castor metadata given their model and
// dataset, with the per-class table of an image classifier.
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "castor/amp.h"
#include "castor/checkpoint.h"
#include "castor/formats.h"
#include "castor/gguf.h"
#include "castor/nn.h"
#include "castor/trainer.h"
#include "castor/model_source.h"
#include "train/lm_scoring.h"
#include "train/lora_run.h"
#include "train/progress.h"
#include "train/task.h"

namespace castor::train {

namespace {

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
  } else if (formats::is_source(e.path, formats::SourceFormat::Gguf)) {  // (its tensors loaded into the model: blocks)
    model_file.metadata = formats::gguf_metadata(formats::read_gguf_header(e.path), e.path,
                                                 name(e.data.value_or(Dataset::Tokens)));
  } else {
    model_file = formats::load_weights_file(e.path, name(e.data.value_or(Dataset::Tokens)));
  }
  const Json recorded = castor_config(model_file.metadata, file);
  if (!recorded.is_null()) {
    c = resume_config(TrainConfig{}, recorded, e.path);
    if (!recorded.find("amp")) c.amp = amp::OptLevel::O0;  // another tool's model (no run recorded): float32
    if (const Json* names = recorded.find("class_names"); names && names->is_array())
      for (const Json& n : names->as_array()) recorded_classes.push_back(n.is_string() ? n.as_string() : n.dump());
    CASTOR_CHECK(!e.model || *e.model == c.model, "--model ", name(*e.model), ": ", e.path, " holds a ", name(c.model));
    CASTOR_CHECK(!e.data || *e.data == c.data, "--data ", name(*e.data), ": ", e.path, " was trained on ",
                 name(c.data));
  } else {
    CASTOR_CHECK(e.model && e.data, e.path,
                 ": no castor metadata (castor.config); say what it holds with --model and --data");
    c.model = *e.model;
    c.data = *e.data;
    c.amp = amp::OptLevel::O0;  // weights without castor metadata are evaluated in float32
  }
  take_eval_settings(e, c, model_file, recorded);
  if (!e.lora_base.empty()) {
    CASTOR_CHECK(c.lora_rank > 0, "--lora-base: ", e.path, " is not a LoRA run's (castor train --lora-rank)");
    c.init = e.lora_base;  // (checked against the recorded checksum as it loads)
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
  // A GGUF file's weights are read straight into a model made without memory for them, the quantized matrices kept in
  // their blocks (as castor sample and eval --text do); nothing to train, so no optimizer.
  const bool gguf = formats::is_source(e.path, formats::SourceFormat::Gguf);
  Run run;
  if (gguf) {
    nn::LoadInitGuard empty(DType::Float32, /*placeholders=*/true);
    run.model = task->make_model(c);
  } else {
    run = build_run(c, *task, 1, /*load_init=*/false);
  }
  try {
    if (gguf)
      formats::load_weights_into(*run.model, e.path, nullptr, /*keep_blocks=*/true);
    else
      load_model_file(*run.model, model_file.tensors, model_file.metadata, e.path);
  } catch (const Error& err) {
    const std::string msg = err.what();  // (the GGUF reader's name the file already)
    throw Error(msg.rfind(e.path, 0) == 0 ? msg : detail::cat(e.path, ": ", msg));
  }
  if (gguf) run.amp = amp::initialize(*run.model, {}, c.amp, c.dtype);
  if (!e.lora.empty()) {
    CASTOR_CHECK(c.lora_rank == 0, "--lora: ", e.path, " is a LoRA run's checkpoint (its own adapters); give its base");
    apply_peft_adapter(*run.model, c.model, e.path, e.lora);
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
