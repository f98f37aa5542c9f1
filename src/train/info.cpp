// `castor info`: a checkpoint's model, step, precision, parameters, the run's last metrics and its checkpoints; with
// --tensors every tensor's dtype and shape.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llmc.h"
#include "castor/safetensors.h"
#include "castor/trainer.h"
#include "castor/model_source.h"
#include "train/family.h"
#include "train/metrics.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// A language model's sizes as a user compares them with a model card: layers, width, heads, key/value heads, head
// size, feed-forward width, vocabulary, context (a Hugging Face model's max_position_embeddings, and a fine-tuning
// run's block when shorter) and its rope; "" for a description of no family.
std::string model_sizes(const Json& d, const std::string& what) {
  const Json* family = d.is_object() ? d.find("family") : nullptr;
  if (!family || !family->is_string()) return "";
  if (family->as_string() == "gpt") {
    const models::GPTConfig g = gpt_config(d, what);
    return detail::cat("layers ", g.n_layer, ", width ", g.n_embd, ", heads ", g.n_head, ", vocabulary ", g.vocab_size,
                       ", context ", g.block_size);
  }
  if (family->as_string() != "llama") return "";
  const models::LlamaConfig l = llama_config(d, what);
  const Json* positions = d.find("max_position_embeddings");
  const int64_t context = positions && positions->is_int() ? positions->as_int() : l.max_seq_len;
  std::string rope;
  using Type = F::RopeScaling::Type;
  char theta[32];
  std::snprintf(theta, sizeof(theta), "%g", l.rope_theta);
  if (l.rope_scaling.type == Type::Linear) rope = detail::cat(" (linear scaling, factor ", l.rope_scaling.factor, ")");
  if (l.rope_scaling.type == Type::Llama3)
    rope = detail::cat(" (llama3 scaling, factor ", l.rope_scaling.factor, ", original context ",
                       l.rope_scaling.original_max_position_embeddings, ")");
  return detail::cat(
      "layers ", l.n_layers, ", width ", l.dim, ", heads ", l.n_heads, ", kv heads ", l.kv_heads(), ", head size ",
      l.head_size(), ", feed-forward ", l.ffn_hidden_dim(), ", vocabulary ", l.vocab_size, ", context ", context,
      context != l.max_seq_len ? detail::cat(" (this run's block ", l.max_seq_len, ")") : "",
      l.sliding_window > 0 ? detail::cat(", sliding window ", l.sliding_window) : "", ", rope theta ", theta, rope);
}

// A line of the summary: the key, padded, and its value.
std::string info_line(const char* key, const std::string& value) {
  return detail::cat(key, std::string(12 - std::strlen(key), ' '), value, "\n");
}

// A run directory's last evaluation, its checkpoints and its best.
std::string run_dir_lines(const fs::path& run) {
  std::string out;
  auto line = [&](const char* key, const std::string& value) { out += info_line(key, value); };
  std::error_code ec;
  const std::vector<Json> records = read_metrics(run.string());
  for (auto r = records.rbegin(); r != records.rend(); ++r) {
    char text[128];
    const long long step = r->find("step") && r->at("step").is_int() ? r->at("step").as_int() : -1;
    if (const Json* acc = r->find("test_accuracy"); acc && acc->is_number()) {
      std::snprintf(text, sizeof(text), "test accuracy %.2f%%, test loss %.4f at step %lld", 100 * acc->as_double(),
                    r->at("test_loss").as_double(), step);
    } else if (const Json* val = r->find("val_loss"); val && val->is_number()) {
      std::snprintf(text, sizeof(text), "val loss %.4f, perplexity %.2f at step %lld", val->as_double(),
                    std::exp(val->as_double()), step);
    } else {
      continue;
    }
    line("metrics", text);
    break;
  }
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(run / "checkpoints", ec))
    if (is_checkpoint_dir(e.path().string())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  line("checkpoints", list.empty() ? "none" : list);
  if (const Json best = read_best(run.string()); best.is_object() && best.find("metric") && best.find("value"))
    line("best", detail::cat(best.at("metric").dump(), " ", best.at("value").dump(), " at step ",
                             best.find("step") ? best.at("step").dump() : "?", " (", (run / "best").string(), ")"));
  return out;
}

// `castor info`'s default: what a person asks of a checkpoint first.
std::string info_summary(const std::string& path, const std::string& used, const SafetensorsFile& model,
                         const StateDict* state) {
  std::string out;
  auto line = [&](const char* key, const std::string& value) { out += info_line(key, value); };
  int64_t values = 0;
  std::string dtypes;
  for (const SafetensorsEntry& e : model.entries) {
    values += e.numel();
    if (dtypes.find(dtype_name(e.dtype)) == std::string::npos)
      dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(e.dtype));
  }
  line("file", printable(used));
  // (of a checkpoint directory, its model file is the one named)
  Json config = castor_config(model.metadata, fs::is_directory(used) ? used + "/model.safetensors" : used);
  if (config.is_null()) config = Json::Object{};
  const std::string model_name = config.find("model") ? config.at("model").as_string() : "unknown (no castor metadata)";
  line("model", detail::cat(model_name, ", ", model.entries.size(), " tensors, ", values, " values (", dtypes, ")"));
  if (const Json* m = config.find("model"); m && m->is_string() && family_of_spelling(m->as_string()))
    if (const std::string sizes = model_sizes(model_description(config, used), used); !sizes.empty())
      line("sizes", sizes);
  if (const Json* t = config.find("trainable_params"), *a = config.find("all_params");
      t && a && t->is_int() && a->is_int())
    line("parameters", trainable_parameters_text(t->as_int(), a->as_int()));
  if (config.find("amp") && config.find("dtype")) {
    TrainConfig c;
    c.amp = amp::parse_opt_level(config.at("amp").as_string());
    c.dtype = parse_dtype(config.at("dtype").as_string());
    line("precision", detail::cat(precision_name(c), " (", amp::opt_level_name(c.amp), ", ",
                                  c.amp == amp::OptLevel::O0 ? "float32" : dtype_name(c.dtype), ")"));
  }
  if (config.find("data")) {
    std::string data = config.at("data").as_string();
    if (const Json* k = config.find("num_classes")) data += detail::cat(", ", k->dump(), " classes");
    if (const Json* shape = config.find("input_shape")) data += ", input (C, H, W) " + shape->dump();
    line("data", data);
  }
  if (state) {
    auto counter = [&](const char* key) {
      auto it = state->find(key);
      return it == state->end() ? int64_t{-1} : static_cast<int64_t>(it->second.to(DType::Float64).item());
    };
    const int64_t step = counter("progress.step"), epoch = counter("progress.epoch"), batch = counter("progress.batch");
    if (step >= 0)  // (epochs numbered from 1, as training shows them)
      line("step", batch == 0 && epoch > 0 ? detail::cat(step, " (the end of epoch ", epoch, ")")
                                           : detail::cat(step, " (in epoch ", epoch + 1, ")"));
  }
  // In a run directory: its last evaluation and its checkpoints.
  std::error_code ec;
  fs::path run = fs::is_directory(path + "/checkpoints", ec) ? fs::path(path)
                                                             : fs::path(used).parent_path().parent_path();
  if (fs::is_directory(run / "checkpoints", ec)) {
    out += run_dir_lines(run);
  }
  for (const auto& [k, v] : model.metadata)  // the recorded config is summarised above
    if (k != "castor.config" && k != "format") line("metadata", printable(k) + " = " + printable(v));
  out += "(castor info --tensors " + printable(path) + ": every tensor)\n";
  return out;
}

}  // namespace

std::string run_info(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  bool tensors = false;
  for (const std::string& a : args) {
    if (a == "--tensors")
      tensors = true;
    else
      paths.push_back(a);
  }
  CASTOR_CHECK(paths.size() == 1, "castor info: expected one FILE or DIR, got ", paths.size(), " arguments");
  const std::string& path = paths[0];
  // Names, dtypes and shapes only: of a file, its header is read, not its data (of any size).
  std::vector<std::pair<std::string, SafetensorsFile>> files;
  std::string used = path;
  std::optional<StateDict> state;
  if (formats::is_source(path, formats::SourceFormat::CastorDir)) {  // (a Hugging Face directory: its headers, below)
    // A checkpoint is read whole, to verify its checksums.
    const Checkpoint ck = read_checkpoint(path, &used);
    auto listing = [](const StateDict& tensors, const Metadata& metadata) {
      SafetensorsFile f;
      for (const auto& [k, t] : tensors) f.entries.push_back({k, t.dtype(), t.shape(), 0, t.nbytes()});
      f.metadata = metadata;
      return f;
    };
    files.push_back({"model.safetensors", listing(ck.model, ck.model_meta)});
    files.push_back({"train_state.safetensors", listing(ck.state, ck.state_meta)});
    state = ck.state;
  } else {
    files.push_back({path, formats::read_weights_header(path)});
  }
  if (!tensors) return info_summary(path, used, files[0].second, state ? &*state : nullptr);
  std::string out;
  for (auto& [name, f] : files) {
    int64_t bytes = 0, values = 0;
    std::sort(f.entries.begin(), f.entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    out += printable(name) + ": " + std::to_string(f.entries.size()) + " tensors\n";
    for (const SafetensorsEntry& e : f.entries) {
      out += "  " + printable(e.name) + "  " + dtype_name(e.dtype) + shape_str(e.shape) + "  " +
             std::to_string(e.numel()) + "\n";
      bytes += static_cast<int64_t>(e.end - e.begin);
      values += e.numel();
    }
    out += "  total " + std::to_string(values) + " values (parameters and buffers), " + std::to_string(bytes) +
           " bytes\n";
    for (const auto& [k, v] : f.metadata) out += "  metadata " + printable(k) + " = " + printable(v) + "\n";
  }
  return out;
}

}  // namespace castor::train
