// `castor export`: a run's model (or any file the format table reads) in another tool's format, one writer per
// --format (llm.c's checkpoint, nanoGPT's ckpt.pt, llama2.c's files, safetensors, GGUF, a Hugging Face directory, PEFT
// adapters): the table export_formats() below.
#include "castor/export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "castor/autocast.h"
#include "castor/checkpoint.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/gguf.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/model_source.h"
#include "castor/ops.h"
#include "castor/output_dir.h"
#include "castor/chat_data.h"
#include "castor/tokenizer.h"
#include "castor/torch_save.h"
#include "train/metrics.h"
#include "train/cli.h"
#include "train/lora_run.h"
#include "train/family.h"
#include "train/loaded_model.h"
#include "train/run_dir.h"
#include "train/task.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;

// The size of a file just written (an export's summary line).
uint64_t file_bytes(const std::string& path) {
  uint64_t bytes = 0;
  read_file_range(path, 0, 0, bytes);
  return bytes;
}

// A size in bytes as transformers spells max_shard_size: a number with an optional unit, B, KB/MB/GB (powers of
// 1000) or KiB/MiB/GiB (powers of 1024).
uint64_t byte_size(const std::string& text, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && v * scale >= 1 && v * scale < 1.8e19) return static_cast<uint64_t>(v * scale);
  throw Error(detail::cat(flag, " ", text, ": not a size (\"5GB\", \"500MB\", \"2GiB\" or a number of bytes)"));
}

}  // namespace

std::unique_ptr<CLI::App> export_app(ExportConfig& c) {
  std::string names, formats_help;
  for (const ExportFormat& f : export_formats()) {
    names += detail::cat(names.empty() ? "" : ", ", f.name);
    formats_help += detail::cat("; ", f.name, ": ", f.help);
  }
  auto owner = make_app(
      "Writes a run's model (a GPT or a Llama; a LoRA run's merged, or its adapters alone) in another tool's format, "
      "--format " +
          names + formats_help + ".",
      "castor export");
  CLI::App& app = *owner;
  auto* format = app.add_option("--format", c.format, "the format to write: " + names)
                     ->check(CLI::IsMember(std::vector<std::string>(export_format_names())));
  // The old flags, spellings of --format (each excludes the others).
  std::vector<CLI::Option*> spellings;
  for (const ExportFormat& f : export_formats()) {
    if (!f.flag || f.name == std::string("peft")) continue;
    CLI::Option* o = app.add_flag_callback(
        f.flag, [&c, name = f.name] { c.format = name; }, detail::cat("--format ", f.name));
    o->excludes(format);
    for (CLI::Option* other : spellings) o->excludes(other);
    spellings.push_back(o);
  }
  app.add_option(
         "--type", c.type,
         "--format gguf: the file's type as llama-quantize names it: f32, f16, bf16 (Castor's conversions, "
         "rounding to nearest even), q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m (q3_k), q3_k_l, "
         "q4_k_s, q4_k_m (q4_k), q5_k_s, q5_k_m (q5_k) or q6_k: ggml's blocks, each tensor's type as "
         "llama-quantize mixes them without an importance matrix; norms and biases stay f32 (--format gguf-lora: "
         "f32, f16, bf16 or q8_0)")
      ->check(one_of(formats::gguf_file_type_names()));
  app.add_option("--version", c.version,
                 "--format llama2c: export.py's version, 0 (legacy_export) or 1 (version1_export)")
      ->check(CLI::IsMember({0, 1}));
  app.add_option_function<std::string>(
         "--max-shard-size", [&c](const std::string& v) { c.max_shard_size = byte_size(v, "--max-shard-size"); },
         "--format hf: the most bytes of one safetensors file, as transformers' save_pretrained (\"5GB\", \"500MB\", "
         "\"2GiB\" or bytes; default 5GB); past it the tensors go in shards with an index")
      ->default_str("5GB");
  add_dtype(app, c.dtype,
            "--format hf: the tensors' type, float32, bf16 or fp16 (default: the source's, the torch_dtype of the "
            "Hugging Face directory the model came from, a LoRA run's base included; else the model's own)");
  app.add_flag("--merge-lora", c.merge_lora,
               "a LoRA run (castor train --lora-rank): write its base with the adapters merged (W + scaling B A)");
  CLI::Option* peft = app.add_option_function<std::string>(
      "--peft",
      [&c](const std::string& dir) {
        c.format = "peft";
        c.out = dir;
        c.out_flag = "--peft";
      },
      "a LoRA run: write its adapters in Hugging Face PEFT's format into this directory (adapter_config.json, "
      "adapter_model.safetensors; castor train --init-lora reads them); --format peft --out DIR");
  peft->excludes(format);
  for (CLI::Option* o : spellings) peft->excludes(o);
  app.add_option("--checkpoint", c.checkpoint,
                 "a run or checkpoint directory, or an llm.c .bin, llama2.c model.bin or safetensors file")
      ->required();
  app.add_option("--out", c.out,
                 "the file to write (nanogpt: the directory of ckpt.pt; peft: the adapters' directory; replaced "
                 "whole, or left as it was on failure)")
      ->excludes(peft);
  add_n_head(app, c.n_head, "attention heads, for safetensors that do not record them");
  add_lora_base(app, c.lora_base, kLoraBaseHelp);
  return owner;
}

ExportConfig parse_export_flags(const std::vector<std::string>& args) {
  ExportConfig c;
  const auto app = export_app(c);
  parse_flags(*app, args, "export");
  CASTOR_CHECK(app->count("--version") == 0 || c.format == "llama2c", "--version: applies to --format llama2c only");
  CASTOR_CHECK(app->count("--type") == 0 || c.format == "gguf" || c.format == "gguf-lora",
               "--type: applies to --format gguf and gguf-lora only");
  CASTOR_CHECK(app->count("--max-shard-size") == 0 || c.format == "hf",
               "--max-shard-size: applies to --format hf only");
  CASTOR_CHECK(!c.dtype || c.format == "hf", "--dtype: applies to --format hf only (--format gguf: --type)");
  CASTOR_CHECK(
      !c.format.empty(), "--format: missing (",
      [] {
        std::string names;
        for (const ExportFormat& f : export_formats()) names += detail::cat(names.empty() ? "" : ", ", f.name);
        return names;
      }(),
      "; --llmc, --nanogpt, --llama2c, --safetensors and --peft DIR are its old spellings)");
  CASTOR_CHECK(!c.out.empty(), "--out: empty or missing (the file to write)");
  return c;
}

std::string export_help() {
  ExportConfig c;
  return export_app(c)->help();
}

namespace {

// A number as torch.save holds it here: a 0-d float64 tensor (PyTorch 1.13's weights_only unpickler has no floats).
PyValue number(double v) { return PyValue::tensor(scalar_tensor(v, DType::Float64)); }

// A recorded setting, or `fallback` when the run did not record it.
double setting(const Json& config, const char* key, double fallback) {
  const Json* v = config.is_object() ? config.find(key) : nullptr;
  return v && v->is_number() ? v->as_double() : fallback;
}
std::string setting(const Json& config, const char* key, const std::string& fallback) {
  const Json* v = config.is_object() ? config.find(key) : nullptr;
  return v && v->is_string() ? v->as_string() : fallback;
}

// nanoGPT's train.py config dict from a run's settings (its names; numbers as 0-d tensors, as above).
PyValue nanogpt_config(const Json& rc, const models::GPTConfig& m, const std::string& out_dir) {
  const std::string amp = setting(rc, "amp", "O0"), dtype = setting(rc, "dtype", "bf16");
  const std::string data_dir = setting(rc, "data_dir", "");
  const int64_t steps = static_cast<int64_t>(setting(rc, "steps", 0));
  const auto integer = [&](const char* key, double fallback) {
    return PyValue::integer(static_cast<int64_t>(setting(rc, key, fallback)));
  };
  return PyValue::dict(std::vector<std::pair<std::string, PyValue>>{
      {"out_dir", PyValue::string(out_dir)},
      {"eval_interval", integer("eval_every", 0)},
      {"log_interval", integer("log_every", 50)},
      {"eval_iters", integer("eval_iters", 0)},
      {"eval_only", PyValue::boolean(false)},
      {"always_save_checkpoint", PyValue::boolean(true)},
      {"init_from", PyValue::string("scratch")},
      {"wandb_log", PyValue::boolean(false)},
      {"dataset", PyValue::string(data_dir.empty() ? setting(rc, "data", "") : fs::path(data_dir).filename().string())},
      {"gradient_accumulation_steps", integer("grad_accum", 1)},
      {"batch_size", integer("batch_size", 12)},
      {"block_size", PyValue::integer(m.block_size)},
      {"n_layer", PyValue::integer(m.n_layer)},
      {"n_head", PyValue::integer(m.n_head)},
      {"n_embd", PyValue::integer(m.n_embd)},
      {"dropout", number(m.dropout)},
      {"bias", PyValue::boolean(m.bias)},
      {"learning_rate", number(setting(rc, "lr", 1e-3))},
      {"max_iters", PyValue::integer(steps)},
      {"weight_decay", number(setting(rc, "weight_decay", 0.0))},
      {"beta1", number(0.9)},
      {"beta2", number(setting(rc, "beta2", 0.999))},
      {"grad_clip", number(setting(rc, "clip_grad_norm", 0.0))},
      {"decay_lr", PyValue::boolean(setting(rc, "schedule", "none") == "warmup-cosine")},
      {"warmup_iters", integer("warmup_steps", 0)},
      {"lr_decay_iters", integer("schedule_steps", static_cast<double>(steps))},
      {"min_lr", number(setting(rc, "min_lr", 0.0))},
      {"backend", PyValue::string("gloo")},
      {"device", PyValue::string("cpu")},
      {"dtype", PyValue::string(amp == "O0"       ? "float32"
                                : dtype == "fp16" ? "float16"
                                                  : "bfloat16")},
      {"compile", PyValue::boolean(false)}});
}

// The run's AdamW state as torch.optim.AdamW.state_dict() of nanoGPT's configure_optimizers groups (decay: the
// tensors of 2 or more dims, in named_parameters order; then the rest), which Castor's groups are; None when the
// checkpoint holds no AdamW state.
PyValue nanogpt_optimizer(const LoadedGpt& g) {
  const StateDict& st = g.train_state;
  const std::string prefix = "amp.optimizer.0.";
  if (setting(g.config, "optimizer", "") != "adamw" || !st.count(prefix + "group.0.lr")) return PyValue();
  auto model = models::gpt(g.weights.config);
  std::vector<std::vector<Tensor>> groups(2);
  for (const Tensor& p : model->parameters()) groups[p.dim() >= 2 ? 0 : 1].push_back(p);
  std::vector<std::pair<PyValue, PyValue>> state;
  std::vector<PyValue> param_groups;
  int64_t index = 0;
  for (size_t gi = 0; gi < groups.size() && st.count(detail::cat(prefix, "group.", gi, ".lr")); ++gi) {
    std::vector<PyValue> params;
    for (size_t i = 0; i < groups[gi].size(); ++i, ++index) {
      const std::string key = detail::cat(prefix, "state.", gi, ".", i, ".");
      params.push_back(PyValue::integer(index));
      if (!st.count(key + "step")) continue;  // not stepped yet
      std::vector<std::pair<std::string, PyValue>> s;
      for (const char* name : {"step", "exp_avg", "exp_avg_sq"}) {
        auto it = st.find(key + name);
        CASTOR_CHECK(it != st.end(), g.what, ": the optimizer state has no ", key, name);
        s.emplace_back(name, PyValue::tensor(it->second));
      }
      state.emplace_back(PyValue::integer(index), PyValue::dict(std::move(s)));
    }
    const double lr = st.at(detail::cat(prefix, "group.", gi, ".lr")).item();
    const double wd = st.at(detail::cat(prefix, "group.", gi, ".weight_decay")).item();
    param_groups.push_back(PyValue::dict(std::vector<std::pair<std::string, PyValue>>{
        {"lr", number(lr)},
        {"betas", PyValue::tuple({number(0.9), number(setting(g.config, "beta2", 0.999))})},
        {"eps", number(1e-8)},
        {"weight_decay", number(wd)},
        {"amsgrad", PyValue::boolean(false)},
        {"foreach", PyValue()},
        {"maximize", PyValue::boolean(false)},
        {"capturable", PyValue::boolean(false)},
        {"params", PyValue::list(std::move(params))}}));
  }
  return PyValue::dict(std::vector<std::pair<std::string, PyValue>>{
      {"state", PyValue::dict(std::move(state))}, {"param_groups", PyValue::list(std::move(param_groups))}});
}

// The lowest validation loss the run's metrics record up to `step` (nanoGPT's best_val_loss; 1e9, its initial
// value, when none).
double best_val_loss(const std::string& run_dir, int64_t step) {
  double best = 1e9;
  if (run_dir.empty()) return best;
  for (const Json& r : read_metrics(run_dir)) {
    const Json* s = r.find("step");
    for (const char* key : {"val_loss", "test_loss"})
      if (const Json* v = r.find(key); v && v->is_number() && s && s->is_int() && s->as_int() <= step)
        best = std::min(best, v->as_double());
  }
  return best;
}

// nanoGPT's checkpoint dict: model (its state_dict: nanoGPT's names, lm_head.weight tied to wte, and the causal-mask
// buffers transformer.h.N.attn.bias its attention registers under PyTorch < 2), model_args, iter_num,
// best_val_loss, config and `optimizer` (nanogpt_optimizer's) unless it is None.
PyValue nanogpt_checkpoint(const LoadedGpt& g, const std::string& out_dir, PyValue optimizer) {
  const models::GPTConfig& m = g.weights.config;
  std::vector<std::pair<std::string, PyValue>> model;
  auto model_gpt = models::gpt(m);
  std::vector<double> lower(m.block_size * m.block_size);
  for (int64_t i = 0; i < m.block_size; ++i)
    for (int64_t j = 0; j <= i; ++j) lower[i * m.block_size + j] = 1;
  const Tensor mask = tensor(lower, Shape{1, 1, m.block_size, m.block_size}, DType::Float32);  // one, shared
  for (const auto& [name, p] : model_gpt->named_parameters()) {
    model.emplace_back(name, PyValue::tensor(g.weights.state.at(name)));
    if (name.size() > 18 && name.compare(name.size() - 18, 18, "attn.c_attn.weight") == 0)
      model.emplace_back(name.substr(0, name.size() - 13) + "bias", PyValue::tensor(mask));
  }
  model.emplace_back("lm_head.weight", PyValue::tensor(g.weights.state.at("transformer.wte.weight")));
  auto it = g.train_state.find("progress.step");
  const int64_t step = it == g.train_state.end() ? 0 : static_cast<int64_t>(it->second.item());
  std::vector<std::pair<std::string, PyValue>> ckpt = {
      {"model", PyValue::dict(std::move(model))},
      {"model_args",
       PyValue::dict(std::vector<std::pair<std::string, PyValue>>{{"n_layer", PyValue::integer(m.n_layer)},
                                                                  {"n_head", PyValue::integer(m.n_head)},
                                                                  {"n_embd", PyValue::integer(m.n_embd)},
                                                                  {"block_size", PyValue::integer(m.block_size)},
                                                                  {"bias", PyValue::boolean(m.bias)},
                                                                  {"vocab_size", PyValue::integer(m.vocab_size)},
                                                                  {"dropout", number(m.dropout)}})},
      {"iter_num", PyValue::integer(step)},
      {"best_val_loss", PyValue::tensor(scalar_tensor(best_val_loss(g.run_dir, step), DType::Float32))},
      {"config", nanogpt_config(g.config, m, out_dir)}};
  if (optimizer.kind() != PyValue::Kind::None) ckpt.emplace_back("optimizer", std::move(optimizer));
  return PyValue::dict(std::move(ckpt));
}

// tokenizer.bin beside the model file `out`.
std::string tokenizer_bin_beside(const std::string& out) {
  return (fs::path(out).parent_path() / "tokenizer.bin").string();
}

// The vocabulary of a run's bpe tokenizer, as run.c reads it from tokenizer.bin (none for a run of another
// tokenizer, or without a recorded data directory); castor::Error when its size is not the model's.
std::optional<data::BpeVocabulary> run_vocabulary(const LoadedGpt& g, int64_t vocab_size) {
  const std::string dir = model_tokenizer_dir(g.what, g.config);
  if (dir.empty() || !data::Tokenizer::is_loadable(dir)) return std::nullopt;
  const data::Tokenizer tok = data::Tokenizer::load(dir);
  if (!tok.bpe()) return std::nullopt;
  CASTOR_CHECK(tok.vocab_size() == vocab_size, dir, ": the tokenizer has ", tok.vocab_size(), " tokens, ", g.what,
               " was made for ", vocab_size);
  return tok.bpe()->vocabulary();
}

// What an export reads, which its --out must not be (check_export_out): --checkpoint, --lora-base, and once loaded the
// model file, its run directory and the --init (a LoRA run's base) the run records.
std::vector<std::string> export_inputs(const ExportConfig& c, const LoadedGpt* g = nullptr) {
  std::vector<std::string> inputs = {c.checkpoint, c.lora_base};
  if (!g) return inputs;
  inputs.insert(inputs.end(), {g->what, g->run_dir});
  if (const Json* init = g->config.is_object() ? g->config.find("init") : nullptr; init && init->is_string())
    inputs.push_back(init->as_string());
  return inputs;
}

// The model castor export writes: --checkpoint loaded after the files `outputs` it will replace are checked (a
// device, FIFO, directory or link there is refused at once; `dir_files`: --out is a directory of those files, `what`
// its writer), and checked again against the inputs it records; a LoRA run only with --merge-lora.
LoadedGpt load_for_export(const ExportConfig& c, const std::vector<std::string>& outputs,
                          const OwnsEntry& dir_files = {}, const std::string& what = "") {
  for (const std::string& out : outputs) check_export_out("--out", out, dir_files, what, export_inputs(c));
  LoadedGpt g = load_gpt(c.checkpoint, c.n_head, c.lora_base);
  CASTOR_CHECK(!c.merge_lora || g.lora, "--merge-lora: ", c.checkpoint,
               " is not a LoRA run's checkpoint (castor train --lora-rank): it has no adapters to merge");
  CASTOR_CHECK(!g.lora || c.merge_lora, "--merge-lora: missing; ", c.checkpoint,
               " is a LoRA run (adapters on a frozen base): --merge-lora writes the base with its adapters merged, "
               "--peft DIR the adapters alone");
  for (const std::string& out : outputs) check_export_out("--out", out, dir_files, what, export_inputs(c, &g));
  return g;
}

// castor export --llama2c: the Llama as llama2.c's model.bin of --version, then its run's vocabulary as tokenizer.bin
// beside it (everything checked before either is written; each written whole or not at all).
Json export_llama2c(const ExportConfig& c) {
  CASTOR_CHECK(fs::path(c.out).filename() != "tokenizer.bin", "--out ", c.out,
               ": --format llama2c writes tokenizer.bin beside the model file; give the model file another name");
  const LoadedGpt g = load_for_export(c, {c.out, tokenizer_bin_beside(c.out)});
  CASTOR_CHECK(g.llama, "--checkpoint ", c.checkpoint,
               ": a GPT; --format llama2c writes Llamas (llmc and nanogpt "
               "write GPTs)");
  const auto& llama = dynamic_cast<const models::Llama&>(*g.llama);
  const models::LlamaConfig& m = llama.config();
  const formats::Llama2cWeights w{formats::llama2c_config(m, printable(g.what)), llama.state_dict()};
  const std::optional<data::BpeVocabulary> vocab = run_vocabulary(g, m.vocab_size);
  formats::write_llama2c(c.out, w, c.version);
  const std::string tokenizer_bin = tokenizer_bin_beside(c.out);
  if (vocab) data::write_tokenizer_bin(tokenizer_bin, *vocab);
  const uint64_t bytes = file_bytes(c.out);
  return Json::Object{{"from", printable(g.what)},
                      {"format", "llama2c"},
                      {"version", c.version},
                      {"dim", w.config.dim},
                      {"hidden_dim", w.config.hidden_dim},
                      {"n_layers", w.config.n_layers},
                      {"n_heads", w.config.n_heads},
                      {"n_kv_heads", w.config.n_kv_heads},
                      {"vocab_size", m.vocab_size},
                      {"max_seq_len", m.max_seq_len},
                      {"shared_classifier", formats::shares_classifier(w)},
                      {"out", printable(c.out)},
                      {"bytes", bytes},
                      {"tokenizer", vocab ? Json(printable(tokenizer_bin)) : Json()}};
}

// castor export --safetensors: the model's tensors (a GPT's with nanoGPT's names, a Llama's with llama2.c's) and the
// model file's metadata, which name the model and its settings.
Json export_safetensors(const ExportConfig& c) {
  const LoadedGpt g = load_for_export(c, {c.out});
  const StateDict tensors = g.llama ? g.llama->state_dict() : g.weights.state;
  Metadata meta = g.meta;  // (an llm.c or llama2.c file's records the settings, not castor.model)
  const Json config = castor_config(meta, g.what);
  if (const Json* model = config.is_object() ? config.find("model") : nullptr; model && model->is_string())
    meta.emplace("castor.model", model->as_string());
  save_safetensors(c.out, tensors, meta);
  const uint64_t bytes = file_bytes(c.out);
  return Json::Object{{"from", printable(g.what)},
                      {"format", "safetensors"},
                      {"model", g.llama ? "llama" : "gpt"},
                      {"tensors", static_cast<int64_t>(tensors.size())},
                      {"out", printable(c.out)},
                      {"bytes", bytes}};
}

// castor export --format gguf: the model with its run's tokenizer, every check before the file is written.
Json export_gguf(const ExportConfig& c) {
  const LoadedGpt g = load_for_export(c, {c.out});
  // The tokenizer: the run's token directory, or a Hugging Face directory's own tokenizer.json (model_tokenizer_dir).
  const bool hf_dir = formats::is_source(c.checkpoint, formats::SourceFormat::HfDir);
  const std::string dir = model_tokenizer_dir(g.what, g.config);
  CASTOR_CHECK(!dir.empty() && data::Tokenizer::is_loadable(dir), "--format gguf: ", g.what,
               hf_dir ? " holds no tokenizer.json" : " records no token directory",
               "; a GGUF file carries the model's tokenizer");
  const data::Tokenizer tok = data::Tokenizer::load(dir);
  const int64_t model_vocab = g.llama ? g.llama->vocab_size() : 0;
  const formats::GgufVocabulary vocab = formats::gguf_vocabulary(tok, dir, tok.hf() ? model_vocab : 0);
  const formats::GgufFileType* type = formats::find_gguf_file_type(c.type);
  CASTOR_CHECK(type, "--type ", c.type, ": not a GGUF file type");
  const fs::path from = g.run_dir.empty() ? fs::path(g.what) : fs::path(g.run_dir);
  const std::string name = from.filename().empty() ? "castor" : from.filename().string();
  formats::GgufSummary written;
  if (g.llama) {
    const auto* llama = dynamic_cast<const models::Llama*>(g.llama.get());
    CASTOR_CHECK(llama, "--format gguf: ", g.what, " is a ", g.llama->type_name(),
                 ", which no GGUF architecture written here expresses (llama, gpt2)");
    const Json arch = described(g, "architecture");  // a Hugging Face model's (and a run of one)
    const bool qwen2 = arch.is_string() && arch.as_string() == "Qwen2ForCausalLM";
    // (the model's context, not a fine-tuning run's block size, which llama.cpp would take as its default context)
    const Json context = described(g, "max_position_embeddings");
    written = formats::write_gguf_llama(c.out, *llama, vocab, *type, name,
                                        qwen2 ? formats::GgufArch::Qwen2 : formats::GgufArch::Llama,
                                        context.is_int() ? context.as_int() : 0);
  } else {
    written = formats::write_gguf_gpt(c.out, g.weights, vocab, *type, name);
  }
  Json::Object types;
  for (const auto& [t, n] : written.tensor_types) types.emplace(t, n);
  Json::Object out{{"from", printable(g.what)},  {"format", "gguf"},           {"arch", written.arch},
                   {"type", type->name},         {"tensor_types", types},      {"tokenizer", vocab.model},
                   {"vocab_size", vocab.size()}, {"tensors", written.tensors}, {"out", printable(c.out)},
                   {"bytes", written.bytes}};
  if (written.max_error > 0) out["max_error"] = written.max_error;
  return out;
}

}  // namespace

namespace {

// castor export --format gguf-lora: a LoRA checkpoint's adapters as llama.cpp's LoRA adapter file, for the base the run
// trained on written as GGUF (the GGUF file itself, or --format gguf of the base).
Json export_gguf_lora(const ExportConfig& c) {
  CASTOR_CHECK(!c.merge_lora,
               "--merge-lora: --format gguf-lora writes the adapters alone (--format gguf "
               "--merge-lora writes the merged model)");
  check_export_out("--out", c.out, {}, "", export_inputs(c));
  std::string used;
  const Checkpoint ck = read_checkpoint(c.checkpoint, &used);
  const std::string what = (fs::path(used) / "model.safetensors").string();
  CASTOR_CHECK(is_lora_checkpoint(ck.model_meta), "--format gguf-lora: ", c.checkpoint,
               " is not a LoRA run's checkpoint (castor train --lora-rank); --format gguf writes a whole model");
  const std::string base = ck.model_meta.at("castor.lora_base");
  check_export_out("--out", c.out, {}, "", {c.checkpoint, c.lora_base, used, base});
  const formats::GgufFileType* type = formats::find_gguf_file_type(c.type);
  CASTOR_CHECK(type, "--type ", c.type, ": not a GGUF file type");
  const auto model = adapted_model(ck, what, c.lora_base);
  const auto* llama = dynamic_cast<const models::Llama*>(model.get());  // (else a GPT: arch gpt2)
  const Json d = model_description(castor_config(ck.model_meta, what), what);
  const Json* arch = d.is_object() ? d.find("architecture") : nullptr;
  const bool qwen2 = arch && arch->is_string() && arch->as_string() == "Qwen2ForCausalLM";
  const nn::LoraConfig lora = run_lora_config(ck, what);
  const StateDict adapters = nn::lora_state_dict(*model);
  const formats::GgufSummary written = formats::write_gguf_lora(
      c.out, llama ? llama->config() : models::LlamaConfig{},
      !llama  ? formats::GgufArch::Gpt2
      : qwen2 ? formats::GgufArch::Qwen2
              : formats::GgufArch::Llama,
      adapters, lora.scaling() * static_cast<double>(lora.r), *type, fs::path(used).parent_path().filename().string());
  return Json::Object{{"from", printable(what)},    {"format", "gguf-lora"},   {"arch", written.arch},
                      {"type", type->name},         {"rank", lora.r},          {"alpha", lora.scaling() * lora.r},
                      {"tensors", written.tensors}, {"out", printable(c.out)}, {"bytes", written.bytes}};
}

// castor export --format peft: a LoRA checkpoint's adapters as PEFT's files.
Json export_peft(const ExportConfig& c) {
  const std::string flag = c.out_flag;
  check_export_out(flag, c.out, is_peft_file, "a PEFT export", export_inputs(c));
  std::string used;
  const Checkpoint ck = read_checkpoint(c.checkpoint, &used);
  const std::string what = (fs::path(used) / "model.safetensors").string();
  const auto base = ck.model_meta.find("castor.lora_base");
  check_export_out(flag, c.out, is_peft_file, "a PEFT export",
                   {c.checkpoint, c.lora_base, used, base == ck.model_meta.end() ? "" : base->second});
  write_peft(flag, c.out, ck, what, c.lora_base);
  return Json::Object{{"from", printable(what)},
                      {"format", "peft"},
                      {"out", printable(c.out)},
                      {"tensors", static_cast<int64_t>(ck.model.size())}};
}

}  // namespace

namespace {

// castor export --format hf: a Llama as a Hugging Face directory (castor/hf.h), with the tokenizer files of the
// Hugging Face directory it came from (--checkpoint itself, or the run's --init).
Json export_hf(const ExportConfig& c) {
  const LoadedGpt g = load_for_export(c, {c.out}, formats::is_hf_export_file, "a Hugging Face export");
  CASTOR_CHECK(g.llama, "--checkpoint ", c.checkpoint,
               ": a GPT; --format hf writes Llamas (llmc and nanogpt write "
               "GPTs)");
  const auto& llama = dynamic_cast<const models::Llama&>(*g.llama);
  formats::HfWriteOptions o;
  o.max_shard_bytes = c.max_shard_size;
  if (const Json a = described(g, "architecture"); a.is_string()) o.architecture = a.as_string();
  if (const Json b = described(g, "bos_token_id"); !b.is_null()) o.bos = b;
  if (const Json e = described(g, "eos_token_id"); !e.is_null()) o.eos = e;
  if (const Json m = described(g, "max_position_embeddings"); m.is_int()) o.max_position_embeddings = m.as_int();
  // The tokenizer files of the Hugging Face directory or GGUF file the model came from (--checkpoint, or the run's
  // --init).
  const Json* init = g.config.is_object() ? g.config.find("init") : nullptr;
  std::string hf_source;  // (the Hugging Face directory it came from, whose torch_dtype the export keeps)
  for (const std::string& from : {c.checkpoint, init && init->is_string() ? init->as_string() : std::string()}) {
    if (from.empty() || !o.tokenizer_dir.empty()) continue;
    if (formats::is_source(from, formats::SourceFormat::HfDir)) o.tokenizer_dir = hf_source = from;
    if (formats::is_source(from, formats::SourceFormat::Gguf)) o.tokenizer_dir = formats::gguf_tokenizer_dir(from);
  }
  // The tensors' dtype: --dtype, else the source directory's (a LoRA run's base where it is now), as transformers'
  // save_pretrained keeps a model's: a merged run of a bf16 base is written in bf16, not in its float32 arithmetic.
  if (g.lora && !c.lora_base.empty() && formats::is_source(c.lora_base, formats::SourceFormat::HfDir))
    hf_source = c.lora_base;
  const std::optional<DType> dtype = c.dtype              ? c.dtype
                                     : !hf_source.empty() ? std::optional(formats::read_hf_config(hf_source).dtype)
                                                          : std::nullopt;
  StateDict state = llama.state_dict();
  if (dtype)
    for (auto& [name, t] : state) t = t.to(*dtype);
  formats::write_hf(c.out, llama.config(), state, o);
  uint64_t bytes = 0;
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(c.out))
    if (e.path().extension() == ".safetensors") bytes += file_bytes(e.path().string()), ++files;
  return Json::Object{{"from", printable(g.what)},
                      {"format", "hf"},
                      {"architecture", o.architecture},
                      {"dtype", dtype_name(state.begin()->second.dtype())},
                      {"shards", files},
                      {"out", printable(c.out)},
                      {"bytes", bytes},
                      {"tokenizer", o.tokenizer_dir.empty() ? Json() : Json(printable(o.tokenizer_dir))}};
}

// castor export --format llmc | nanogpt: a GPT as llm.c's checkpoint or nanoGPT's OUT/ckpt.pt.
Json export_gpt(const ExportConfig& c) {
  const bool nanogpt = c.format == "nanogpt";
  const OwnsEntry ckpt = [](const std::string& name) { return name == "ckpt.pt"; };
  LoadedGpt g = load_for_export(c, {c.out}, nanogpt ? ckpt : OwnsEntry(), "a nanoGPT export");
  CASTOR_CHECK(!g.llama, "--checkpoint ", c.checkpoint, ": a Llama; --format ", c.format,
               " writes GPTs (llama2c and hf write Llamas)");
  models::GPTConfig& config = g.weights.config;
  Json::Object out{{"from", printable(g.what)},
                   {"n_layer", config.n_layer},
                   {"n_head", config.n_head},
                   {"n_embd", config.n_embd},
                   {"block_size", config.block_size}};
  std::string file = c.out;
  if (nanogpt) {
    file = (fs::path(c.out) / "ckpt.pt").string();
    PyValue optimizer = nanogpt_optimizer(g);
    out["optimizer"] = optimizer.kind() != PyValue::Kind::None;
    const PyValue ckpt_pt = nanogpt_checkpoint(g, c.out, std::move(optimizer));
    write_output_dir("--out", c.out, ckpt, "a nanoGPT export", {},
                     [&](const std::string& dir) { torch_save(dir + "/ckpt.pt", ckpt_pt); });
    out["format"] = "nanogpt";
    out["vocab_size"] = config.vocab_size;
  } else {
    // llm.c's V: the tokenizer's vocabulary when the run records its data directory, else the padded size.
    if (config.real_vocab_size == 0) {
      const std::string dir = recorded_data_dir(g.config);
      if (!dir.empty() && !data::token_record_path(dir).empty()) {
        const int64_t v = data::Tokenizer::load(dir).vocab_size();
        CASTOR_CHECK(v <= config.vocab_size, dir, ": the tokenizer has ", v, " tokens, more than the model's ",
                     config.vocab_size);
        config.real_vocab_size = v;
      }
    }
    formats::write_llmc_checkpoint(c.out, g.weights);
    out["format"] = "llmc";
    out["vocab_size"] = config.real_vocab_size > 0 ? config.real_vocab_size : config.vocab_size;
    out["padded_vocab_size"] = config.vocab_size;
  }
  const uint64_t bytes = file_bytes(file);
  out["out"] = printable(file);  // a report line: any path, non-UTF-8 bytes as \xNN
  out["bytes"] = bytes;
  return out;
}

}  // namespace

const std::vector<ExportFormat>& export_formats() {
  static const std::vector<ExportFormat> table = {
      {"llmc", "--llmc", "a GPT as llm.c's gpt2_124M.bin (float32)", export_gpt},
      {"nanogpt", "--nanogpt",
       "a GPT as nanoGPT's OUT/ckpt.pt (torch.save: model, model_args, iter_num, best_val_loss, config and the AdamW "
       "state, which sample.py and train.py's init_from='resume' read)",
       export_gpt},
      {"llama2c", "--llama2c",
       "a Llama as llama2.c's model.bin (--version 0 or 1; run.c reads 0) with the run's vocabulary as tokenizer.bin "
       "beside it",
       export_llama2c},
      {"safetensors", "--safetensors",
       "the model as one safetensors file with the run's settings in its metadata (castor eval, sample --init and "
       "info read it)",
       export_safetensors},
      {"gguf", nullptr,
       "a GGUF file (version 3) that llama.cpp and ollama run, with the run's tokenizer (a Hugging Face directory's "
       "own): a Llama as arch llama (a Qwen2 as qwen2), a GPT as arch gpt2 (--type: llama-quantize's file types, f16, q8_0, q4_k_m, ...)",
       export_gguf},
      {"gguf-lora", nullptr,
       "a LoRA run's adapters as llama.cpp's GGUF LoRA adapter (general.type adapter; llama-cli --lora and an ollama "
       "Modelfile's ADAPTER load it onto the base the run trained on, as GGUF; --type f32, f16, bf16 or q8_0)",
       export_gguf_lora},
      {"hf", nullptr,
       "a Llama as a Hugging Face directory --out (config.json, generation_config.json, model.safetensors or shards "
       "past --max-shard-size with model.safetensors.index.json, the tokenizer files of the Hugging Face directory "
       "it came from), which transformers' from_pretrained and castor train --init read",
       export_hf},
      {"peft", "--peft", "a LoRA run's adapters as Hugging Face PEFT's directory (castor train --init-lora reads it)",
       export_peft},
  };
  return table;
}

std::vector<std::string> export_format_names() {
  std::vector<std::string> names;
  for (const ExportFormat& f : export_formats()) names.push_back(f.name);
  return names;
}

Json run_export(const ExportConfig& c) {
  for (const ExportFormat& f : export_formats())
    if (c.format == f.name) return f.write(c);
  throw Error(detail::cat("--format ", c.format, ": not a format castor export writes"));
}

}  // namespace castor::train
