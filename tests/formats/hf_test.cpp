// Hugging Face Llama-family directories: written at random by tests/oracle/hf_llama_oracle.py (bf16, sharded, GQA,
// tied and untied, v5 spellings), read by Castor to the oracle's logits (rotate_half semantics) and its 10 AdamW steps;
// Castor's export read back bit for bit and by the oracle; bad directories as one-line errors naming file and key.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "castor/allocator.h"
#include "castor/functional.h"
#include "castor/random.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llmc.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/model_source.h"
#include "castor/token_file.h"
#include "nn/lm_twin.h"
#include "formats/hf_lora_twin.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using formats::HfConfig;

// A random model's config.json keys (and the oracle's seed, shards and spelling), `extra` keys (JSON members) last.
std::string hf_config(const std::string& dtype, int shards, int64_t kv_heads, bool tied, bool v5 = false,
                      const std::string& arch = "LlamaForCausalLM", const std::string& extra = "") {
  return detail::cat("{\"architectures\": [\"", arch, "\"], \"hidden_size\": 32, \"intermediate_size\": 72, ",
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": ", kv_heads,
                     ", \"vocab_size\": 53, \"rms_norm_eps\": 1e-6, \"rope_theta\": 5000.0, ",
                     "\"max_position_embeddings\": 64, \"tie_word_embeddings\": ", tied ? "true" : "false",
                     ", \"torch_dtype\": \"", dtype, "\", \"hidden_act\": \"silu\", \"bos_token_id\": 1, ",
                     "\"eos_token_id\": 2, \"shards\": ", shards, ", \"seed\": ", shards * 10 + kv_heads,
                     v5 ? ", \"v5\": true" : "", extra.empty() ? "" : ", ", extra, "}");
}

// Llama 3's rope scaling over 64 original positions: at head size 12 and theta 5000, pair 0 keeps its frequency, pair 1
// is in the smoothed band and pairs 2-5 are divided by the factor.
const char* kLlama3Rope =
    "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}";

struct HfCase {
  std::string name, dtype;
  int shards;
  int64_t kv_heads;
  bool tied, v5;
  std::string arch = "LlamaForCausalLM", extra;
};
const HfCase kCases[] = {
    {"f32_mha_untied", "float32", 1, 4, false, false},
    {"bf16_gqa_sharded", "bfloat16", 3, 2, false, false},
    {"f16_gqa_tied_v5", "float16", 2, 1, true, true},
    // Qwen2: q/k/v biases, tied, bf16 in shards; then a window on its second layer (use_sliding_window,
    // max_window_layers 1) with v5's rope_parameters and linear scaling.
    {"qwen2_bf16_gqa_tied", "bfloat16", 2, 2, true, false, "Qwen2ForCausalLM",
     "\"use_sliding_window\": false, \"sliding_window\": 4096, \"max_window_layers\": 28"},
    {"qwen2_window_linear_v5", "float32", 1, 2, false, true, "Qwen2ForCausalLM",
     "\"use_sliding_window\": true, \"sliding_window\": 4, \"max_window_layers\": 1, "
     "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.5}"},
    // Llama 3 rope scaling, a head size 12 (not 32 / 4), attention and MLP biases.
    {"llama3_head12_biases", "bfloat16", 2, 2, false, false, "LlamaForCausalLM",
     detail::cat(kLlama3Rope, ", \"head_dim\": 12, \"attention_bias\": true, \"mlp_bias\": true")},
    // Mistral: a window of 4 on every layer (the 11-token batch runs past it).
    {"mistral_window", "float16", 1, 1, false, false, "MistralForCausalLM", "\"sliding_window\": 4"},
};

// Writes case c's random directory at DIR with the oracle (false, the test failed, when it fails).
bool write_case(const HfCase& c, const std::string& dir) {
  return test::run_oracle("hf_llama_oracle.py",
                          {"write", dir, hf_config(c.dtype, c.shards, c.kv_heads, c.tied, c.v5, c.arch, c.extra)});
}

// The Llama a directory holds, loaded as `castor train --init` loads it (float32).
std::shared_ptr<models::Llama> load_hf(const std::string& dir) {
  const HfConfig h = formats::read_hf_config(dir);
  auto model = models::llama(h.llama, /*seed=*/0);
  model->load_state_dict(formats::read_hf_weights(dir, h));
  return model;
}

Tensor oracle_logits(const std::string& dir, const Tensor& x, const std::string& scratch) {
  save_safetensors(scratch + "/batch.safetensors", {{"x", x}});
  if (!test::run_oracle("hf_llama_oracle.py", {"logits", dir, scratch + "/batch.safetensors", scratch + "/out.st"}))
    return Tensor();
  return load_safetensors(scratch + "/out.st").tensors.at("logits");
}

TEST(HfFormat, LogitsMatchTheOracleAndExportRoundTripsBitForBit) {
  for (const HfCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const test::ScratchDir dir("hf_" + c.name);
    const std::string model_dir = dir + "/model";
    ASSERT_TRUE(write_case(c, model_dir));
    const HfConfig h = formats::read_hf_config(model_dir);
    EXPECT_EQ(h.llama.kv_heads(), c.kv_heads);
    EXPECT_EQ(h.llama.tied, c.tied);
    EXPECT_EQ(h.llama.norm_eps, 1e-6);
    EXPECT_EQ(h.llama.rope_theta, 5000.0);
    EXPECT_EQ(h.architecture, c.arch);
    EXPECT_EQ(h.llama.qkv_bias, c.arch == "Qwen2ForCausalLM");
    auto model = load_hf(model_dir);
    const Tensor x = test::random_token_batch(2, 11, 53, 7);
    const Tensor want = oracle_logits(model_dir, x, dir);
    ASSERT_TRUE(want.defined());
    EXPECT_TRUE(test::close((*model)(x), want, 0, 1e-5));
    // Castor's export: the same tensors read back bit for bit, and the oracle's logits of it are its logits of the
    // original (float32 holds every 16-bit value exactly).
    formats::HfWriteOptions o;
    o.max_shard_bytes = 20000;  // several shards
    o.architecture = h.architecture;
    formats::write_hf(dir + "/export", model->config(), model->state_dict(), o);
    EXPECT_TRUE(fs::exists(dir + "/export/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(dir + "/export/generation_config.json"));
    const HfConfig exported = formats::read_hf_config(dir + "/export");
    EXPECT_EQ(formats::hf_description(exported).dump(), formats::hf_description(h).dump());
    const StateDict back = formats::read_hf_weights(dir + "/export", exported);
    EXPECT_EQ(back.size(), model->state_dict().size());
    for (const auto& [name, t] : model->state_dict()) EXPECT_TRUE(test::bit_equal(back.at(name), t)) << name;
    EXPECT_TRUE(test::bit_equal(oracle_logits(dir + "/export", x, dir), want));
  }
}

TEST(HfFormat, TenAdamWStepsMatchTheOracle) {
  const test::ScratchDir dir("hf_train");
  StateDict batch;
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 3; ++i) {
    const Tensor s = test::learnable_token_batch(3, 13, 53, 40 + i);
    batches.emplace_back(s.narrow(1, 0, 12).contiguous(), s.narrow(1, 1, 12).contiguous());
    batch["x." + std::to_string(i)] = batches.back().first;
    batch["y." + std::to_string(i)] = batches.back().second;
  }
  save_safetensors(dir + "/batch.safetensors", batch);
  // A plain Llama, Qwen2's biases (tied), a window with linear scaling, llama3 scaling with head size 12 and biases.
  for (const HfCase& c : kCases) {
    if (c.name != "bf16_gqa_sharded" && c.name.rfind("qwen2", 0) != 0 && c.name != "llama3_head12_biases") continue;
    SCOPED_TRACE(c.name);
    const std::string model_dir = dir + "/" + c.name;
    ASSERT_TRUE(write_case(c, model_dir));
    auto model = load_hf(model_dir);
    ASSERT_TRUE(
        test::run_oracle("hf_llama_oracle.py", {"train", model_dir, dir + "/batch.safetensors", model_dir + ".out"}));
    const std::vector<double> want = load_safetensors(model_dir + ".out").tensors.at("loss").to_vector<double>();
    auto opt = test::lm_adamw(*model, 1e-3, 0.1);
    for (int step = 0; step < 10; ++step) {
      const auto& [x, y] = batches[step % batches.size()];
      Tensor loss = test::lm_loss(*model, x, y);
      opt->zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt->step();
      EXPECT_NEAR(loss.item(), want[step], 1e-4) << "step " << step;
    }
  }
}

// LoRA on an imported directory, as tests/nn/lora_test.cpp's Lora.*MatchPyTorchFloat32 on Castor's own Llama: the
// loss, logits and adapter gradients against lora_oracle.py's PEFT-style LoRA on the oracle's Hugging Face model
// (rotate_half, RMSNorm's cast order, Qwen2's q/k/v biases; llama3 scaling, head size 12, attention and MLP biases).
// The adapters cross under Hugging Face's names, q_proj's and k_proj's B rows (and their gradients) in its rotary
// order; within 1e-5, the tolerance of Lora.LlamaWithBiasesMatchesPyTorchFloat32 (biases make q's gradients
// ill-conditioned).
TEST(HfFormat, LoraGradientsMatchTheOracle) {
  for (const HfCase& c : {kCases[3], kCases[5]}) {
    SCOPED_TRACE(c.name);
    const test::ScratchDir dir("hf_lora_" + c.name);
    const std::string model_dir = dir + "/model";
    ASSERT_TRUE(write_case(c, model_dir));
    auto model = load_hf(model_dir);
    const nn::LoraConfig cfg{.r = 4, .alpha = 8, .target_modules = {"wq", "wk", "wv", "wo", "w2"}};
    EXPECT_EQ(nn::apply_lora(*model, cfg).size(), 10u);
    test::randomize_lora_b(*model, 7);
    const Tensor x = test::random_token_batch(3, 11, 53, 1), y = test::random_token_batch(3, 11, 53, 2);
    test::expect_hf_lora_matches_oracle(*model, model_dir, "hf_lora_" + c.name + "_oracle", cfg.scaling(), x, y);
  }
}

// Loading into a model holds one tensor besides the model at a time (its read, its permuted rows and its float32
// copy), not a second copy of the weights: the allocator's peak over the load, above the model, against a
// whole-dictionary read.
TEST(HfFormat, LoadsTensorByTensorWithoutASecondCopy) {
  const test::ScratchDir dir("hf_memory");
  const std::string model_dir = dir + "/model";
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", model_dir, hf_config("bfloat16", 1, 2, false)}));
  const HfConfig h = formats::read_hf_config(model_dir);
  auto model = models::llama(h.llama, 0);
  int64_t model_bytes = 0, largest = 0;
  for (const auto& [name, t] : model->state_dict()) {
    model_bytes += static_cast<int64_t>(t.nbytes());
    largest = std::max(largest, static_cast<int64_t>(t.nbytes()));
  }
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory_stats();
  formats::load_weights_into(*model, model_dir);
  const int64_t streamed = memory_stats().peak_bytes - before;
  EXPECT_LE(streamed, 3 * largest) << "model " << model_bytes << " bytes";
  reset_peak_memory_stats();
  { const StateDict all = formats::read_hf_weights(model_dir, h); }
  EXPECT_GE(memory_stats().peak_bytes - before, model_bytes);  // (what a whole-dictionary read costs)
  const Tensor x = test::random_token_batch(1, 7, 53, 5);
  EXPECT_TRUE(test::bit_equal((*model)(x), (*load_hf(model_dir))(x)));
}

// RMSNorm at 16 bits, Hugging Face's LlamaRMSNorm order: float32 statistics, the normalised row rounded to the input's
// dtype, then weight * it (rounded once; with a float32 weight PyTorch's product is float32, which the next op's
// autocast rounds: compared rounded). Bit for bit against the oracle in bf16 and fp16, 16-bit and float32 weights.
TEST(HfFormat, RmsNormCastOrderIsHuggingFacesBitForBit) {
  const test::ScratchDir dir("hf_rmsnorm");
  Generator gen(3);
  for (DType d : {DType::BFloat16, DType::Float16})
    for (DType wd : {d, DType::Float32}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " x, " + dtype_name(wd) + " weight");
      const Tensor x = (randn({5, 3, 48}, DType::Float32, &gen) * 3.0).to(d);
      const Tensor w = (randn({48}, DType::Float32, &gen) * 0.3 + 1.0).to(wd);
      save_safetensors(dir + "/batch.safetensors", {{"x", x}, {"w", w}});
      ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"rmsnorm", dir + "/batch.safetensors", dir + "/out.st"}));
      const Tensor want = load_safetensors(dir + "/out.st").tensors.at("y").to(d);
      const Tensor got = F::rms_norm(x, {48}, w, 1e-6);
      EXPECT_EQ(got.dtype(), d);
      EXPECT_TRUE(test::bit_equal(got, want));
    }
}

// A bf16 directory run in bf16 throughout (from_pretrained's torch_dtype=torch.bfloat16; Castor's model cast to
// bfloat16): Qwen2 biases and llama3 scaling included. The attention and rotary roundings differ (Hugging Face
// rounds cos/sin and each product to bf16, Castor rotates in float32 and rounds once; its attention keeps float32
// scores), so the logits agree to bf16's precision, not bit for bit.
TEST(HfFormat, BFloat16ModelMatchesTheOracleInBFloat16) {
  for (const HfCase& c : {kCases[3], kCases[5]}) {
    SCOPED_TRACE(c.name);
    const test::ScratchDir dir("hf_bf16_" + c.name);
    const std::string model_dir = dir + "/model";
    ASSERT_TRUE(write_case(c, model_dir));
    auto model = load_hf(model_dir);
    model->to(DType::BFloat16);
    const Tensor x = test::random_token_batch(2, 11, 53, 7);
    save_safetensors(dir + "/batch.safetensors", {{"x", x}});
    ASSERT_TRUE(
        test::run_oracle("hf_llama_oracle.py", {"logits16", model_dir, dir + "/batch.safetensors", dir + "/out.st"}));
    const Tensor want = load_safetensors(dir + "/out.st").tensors.at("logits");
    const Tensor got = (*model)(x);
    EXPECT_EQ(got.dtype(), DType::BFloat16);
    EXPECT_LE(test::rel_l2(got.to(DType::Float32), want), 2e-2);
  }
}

// Rewrites config.json's `key` with `value` (JSON text; "" removes it).
void set_key(const std::string& dir, const std::string& key, const std::string& value) {
  const std::vector<uint8_t> bytes = read_file(dir + "/config.json");
  Json j = Json::parse(std::string(bytes.begin(), bytes.end()));
  if (value.empty())
    j.as_object().erase(key);
  else
    j[key] = Json::parse(value);
  atomic_write_file(dir + "/config.json", j.dump(2));
}

// Every way a directory can be wrong: a one-line castor::Error naming the file and the key or tensor.
TEST(HfFormat, BadDirectoriesAreOneLineErrorsNamingFileAndKey) {
  const test::ScratchDir dir("hf_bad");
  const std::string good = dir + "/good";
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", good, hf_config("bfloat16", 2, 2, false)}));
  int n = 0;
  const auto expect_error = [&](const std::function<void(const std::string&)>& damage,
                                const std::vector<std::string>& parts) {
    const std::string d = dir + "/case" + std::to_string(n++);
    fs::copy(good, d);
    damage(d);
    try {
      load_hf(d);
      ADD_FAILURE() << "no error for case " << n - 1;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in " << msg;
    }
  };
  const std::string shard1 = "model-00001-of-00002.safetensors", shard2 = "model-00002-of-00002.safetensors";
  expect_error([&](const std::string& d) { fs::remove(d + "/" + shard2); }, {shard2, "missing"});
  expect_error([&](const std::string& d) { set_key(d, "intermediate_size", "80"); },
               {"mlp", "has shape", "config.json"});
  expect_error([&](const std::string& d) { set_key(d, "vocab_size", "60"); },
               {shard1, "model.embed_tokens.weight", "vocab_size"});
  // Sizes are checked against the tensors before anything is made from them (1e9 layers once planned 1e10 tensors).
  expect_error([&](const std::string& d) { set_key(d, "num_hidden_layers", "1000000000"); },
               {"config.json", "\"num_hidden_layers\" 1000000000", "the tensors hold 2 layers"});
  expect_error([&](const std::string& d) { set_key(d, "hidden_size", "1000000000"); },
               {"model.embed_tokens.weight", "config.json gives", "(vocab_size x hidden_size)"});
  expect_error(
      [&](const std::string& d) {
        const std::vector<uint8_t> b = read_file(d + "/" + shard1);
        atomic_write_file(d + "/" + shard1, std::span<const uint8_t>(b.data(), 40));
      },
      {shard1});
  expect_error([&](const std::string& d) { set_key(d, "architectures", "[\"GPTNeoXForCausalLM\"]"); },
               {"config.json", "GPTNeoXForCausalLM"});
  expect_error([&](const std::string& d) { set_key(d, "hidden_size", ""); }, {"config.json", "hidden_size"});
  expect_error([&](const std::string& d) { set_key(d, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}"); },
               {"config.json", "rope_scaling", "yarn"});
  expect_error([&](const std::string& d) { set_key(d, "hidden_act", "\"gelu\""); }, {"config.json", "hidden_act"});
  expect_error(
      [&](const std::string& d) {
        for (const char* f : {shard1.c_str(), shard2.c_str(), "model.safetensors.index.json"}) fs::remove(d + "/" + f);
        std::ofstream(d + "/pytorch_model.bin") << "pickle";
      },
      {"pytorch_model.bin", "save_pretrained", "safe_serialization=True"});
}

// Each architecture's keys as its configuration and modelling files read them (written here: no weights needed).
TEST(HfFormat, ReadsEachArchitecturesKeys) {
  const test::ScratchDir dir("hf_keys");
  int n = 0;
  const auto config = [&](const std::string& arch, const std::string& extra) {
    const std::string d = dir + "/c" + std::to_string(n++);
    fs::create_directories(d);
    atomic_write_file(d + "/config.json", hf_config("float32", 1, 2, false, false, arch, extra));
    return formats::parse_hf_config(d);
  };
  using Type = F::RopeScaling::Type;
  // Qwen2: q/k/v biases always (attention_bias and mlp_bias are Llama's keys); its window only with
  // use_sliding_window, from layer max_window_layers (28 when absent) or as v5's layer_types say.
  HfConfig h = config("Qwen2ForCausalLM", "\"attention_bias\": true, \"mlp_bias\": true");
  EXPECT_TRUE(h.llama.qkv_bias);
  EXPECT_FALSE(h.llama.attention_bias || h.llama.mlp_bias);
  EXPECT_EQ(h.llama.sliding_window, 0);
  EXPECT_EQ(config("Qwen2ForCausalLM", "\"use_sliding_window\": true, \"sliding_window\": 8").llama.sliding_window, 0);
  h = config("Qwen2ForCausalLM", "\"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 1");
  EXPECT_EQ(h.llama.sliding_window, 8);
  EXPECT_EQ(h.llama.sliding_window_from, 1);
  h = config("Qwen2ForCausalLM",
             "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
             "\"sliding_attention\"]");
  EXPECT_EQ(h.llama.sliding_window, 8);
  EXPECT_EQ(h.llama.sliding_window_from, 0);
  // Mistral: its window on every layer, 4096 when absent, none when null; no bias keys. Llama: no window.
  EXPECT_EQ(config("MistralForCausalLM", "").llama.sliding_window, 4096);
  h = config("MistralForCausalLM", "\"sliding_window\": null, \"attention_bias\": true");
  EXPECT_EQ(h.llama.sliding_window, 0);
  EXPECT_FALSE(h.llama.attention_bias);
  EXPECT_EQ(config("LlamaForCausalLM", "\"sliding_window\": 4").llama.sliding_window, 0);
  // Llama: its bias keys, head_dim, rope scaling in v4's spellings ("type" too) and v5's rope_parameters.
  h = config("LlamaForCausalLM", detail::cat("\"attention_bias\": true, \"head_dim\": 12, ", kLlama3Rope));
  EXPECT_TRUE(h.llama.attention_bias);
  EXPECT_FALSE(h.llama.mlp_bias || h.llama.qkv_bias);
  EXPECT_EQ(h.llama.head_size(), 12);
  EXPECT_EQ(h.llama.rope_scaling.type, Type::Llama3);
  EXPECT_EQ(h.llama.rope_scaling.factor, 8.0);
  EXPECT_EQ(h.llama.rope_scaling.original_max_position_embeddings, 64);
  h = config("LlamaForCausalLM", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}");
  EXPECT_EQ(h.llama.rope_scaling.type, Type::Linear);
  EXPECT_EQ(h.llama.rope_scaling.factor, 2.0);
  h = config("LlamaForCausalLM",
             "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
             "\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
             "\"original_max_position_embeddings\": 8192}");
  EXPECT_EQ(h.llama.rope_theta, 500000.0);
  EXPECT_EQ(h.llama.rope_scaling.factor, 32.0);
  EXPECT_EQ(h.llama.head_size(), 8);
  // What still changes the math: one line naming the file and the key.
  const auto expect_error = [&](const std::string& arch, const std::string& extra,
                                const std::vector<std::string>& parts) {
    try {
      config(arch, extra);
      ADD_FAILURE() << "no error for " << extra;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in " << msg;
    }
  };
  expect_error("LlamaForCausalLM", "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}",
               {"config.json", "rope_scaling", "dynamic"});
  expect_error("LlamaForCausalLM", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 2.0}",
               {"config.json", "rope_parameters", "yarn"});
  expect_error("LlamaForCausalLM", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
               {"config.json", "rope_scaling", "low_freq_factor"});
  expect_error("LlamaForCausalLM", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": -1}",
               {"config.json", "factor"});
  expect_error("Qwen2ForCausalLM",
               "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
               "\"full_attention\"]",
               {"config.json", "layer_types"});
  expect_error("LlamaForCausalLM", "\"head_dim\": 7", {"config.json", "head_dim", "odd"});
  expect_error("LlamaForCausalLM", "\"partial_rotary_factor\": 0.5", {"config.json", "partial_rotary_factor"});
}

// What an architecture cannot compute is not written as it: one line naming DIR, nothing written.
TEST(HfFormat, ExportRefusesAnArchitectureThatDoesNotComputeTheModel) {
  const test::ScratchDir dir("hf_refuse");
  models::LlamaConfig c;
  c.dim = 16, c.n_layers = 2, c.n_heads = 2, c.vocab_size = 11, c.max_seq_len = 8;
  const auto expect_error = [&](const models::LlamaConfig& c, const std::string& arch, const std::string& part) {
    formats::HfWriteOptions o;
    o.architecture = arch;
    try {
      formats::write_hf(dir + "/out", c, models::llama(c)->state_dict(), o);
      ADD_FAILURE() << "no error for " << arch;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir + "/out"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir + "/out"));
  };
  expect_error(c, "Qwen2ForCausalLM", "q/k/v biases");
  expect_error(c, "GPTNeoXForCausalLM", "GPTNeoXForCausalLM");
  models::LlamaConfig q = c;
  q.qkv_bias = true;
  expect_error(q, "LlamaForCausalLM", "q/k/v biases");
  expect_error(q, "MistralForCausalLM", "q/k/v biases");
  models::LlamaConfig m = c;
  m.mlp_bias = true;
  expect_error(m, "MistralForCausalLM", "mlp_bias");
  models::LlamaConfig w = c;
  w.sliding_window = 4;
  expect_error(w, "LlamaForCausalLM", "sliding_window");
  w.sliding_window_from = 1;
  expect_error(w, "MistralForCausalLM", "sliding_window");
}

TEST(HfFormat, LayoutNamesEveryLlamaTensor) {
  // Each Castor name of a tied and an untied Llama has exactly one Hugging Face name.
  models::LlamaConfig c;
  c.dim = 16, c.n_layers = 2, c.n_heads = 2, c.vocab_size = 11, c.max_seq_len = 8;
  for (bool tied : {true, false}) {
    c.tied = tied;
    for (const auto& [name, t] : models::llama(c)->state_dict()) {
      const std::string hf = formats::file_name(formats::hf_layout(), name);
      EXPECT_FALSE(hf.empty()) << name;
    }
  }
  EXPECT_EQ(formats::file_name(formats::hf_layout(), "layers.1.attention.wq.weight"),
            "model.layers.1.self_attn.q_proj.weight");
}

// castor train --init DIR (LoRA), castor export --format hf of the merged run, --init of the export: the run's
// logits bit for bit; castor info and eval take the directory.
TEST(HfCli, FineTuneExportAndReadBack) {
  const test::ScratchDir dir("hf_cli");
  const test::CastorRun run{dir, {}};
  ASSERT_EQ(test::make_grammar_tokens(run).exit_code, 0);
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", dir + "/base", hf_config("bfloat16", 2, 2, false)}));
  auto p = test::run_castor({"train", "--model", "llama", "--data",       "tokens", "--data-dir",
                             "tok",   "--init",  "base",  "--block-size", "16",     "--batch-size",
                             "4",     "--steps", "3",     "--lora-rank",  "4",      "--amp",
                             "O0",    "--out",   "lora"},
                            run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor(
      {"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--dtype", "float32", "--out", "merged"},
      run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::string merged = dir + "/merged";
  EXPECT_TRUE(fs::exists(merged + "/config.json"));
  // By default the merged export keeps its bf16 base's dtype (torch_dtype and tensors), the float32 export's values
  // rounded to bfloat16.
  p = test::run_castor({"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--out", "merged16"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(Json::parse(p.out).at("dtype"), Json("bfloat16")) << p.out;
  {
    const HfConfig h16 = formats::read_hf_config(dir + "/merged16"), h32 = formats::read_hf_config(merged);
    EXPECT_EQ(h16.dtype, DType::BFloat16);
    EXPECT_EQ(h32.dtype, DType::Float32);
    const StateDict w32 = formats::read_hf_weights(merged, h32);
    formats::read_hf_weights_each(dir + "/merged16", h16, [&](const std::string& name, const Tensor& t) {
      EXPECT_EQ(t.dtype(), DType::BFloat16) << name;
      EXPECT_TRUE(test::bit_equal(t, w32.at(name).to(DType::BFloat16))) << name;
    });
  }
  const Tensor x = test::random_token_batch(1, 9, 53, 3);
  // The export's logits are the merged run's (its checkpoint exported as safetensors and loaded by llama2.c names).
  p = test::run_castor({"export", "--safetensors", "--checkpoint", "lora", "--merge-lora", "--out", "m.st"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  auto from_run = models::llama(formats::read_hf_config(merged).llama, 0);
  from_run->load_state_dict(load_safetensors(dir + "/m.st").tensors);
  EXPECT_TRUE(test::bit_equal((*load_hf(merged))(x), (*from_run)(x)));
  // The oracle reads the export, and the fine-tune changed the model.
  EXPECT_TRUE(test::close(oracle_logits(merged, x, dir), (*from_run)(x), 0, 1e-5));
  EXPECT_FALSE(test::bit_equal((*load_hf(dir + "/base"))(x), (*from_run)(x)));
  p = test::run_castor({"info", "base"}, run);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("llama, 21 tensors, 23520 values (bfloat16)"), std::string::npos) << p.out;
  p = test::run_castor({"info", "--tensors", "base"}, run);
  EXPECT_NE(p.out.find("layers.1.attention.wq.weight  bfloat16[32, 32]"), std::string::npos) << p.out;
  // Full fine-tuning of the export, and bad --init directories as one-line errors with nothing written.
  p = test::run_castor({"train", "--model", "llama", "--data", "tokens", "--data-dir", "tok", "--init", "merged",
                        "--block-size", "16", "--batch-size", "2", "--steps", "1", "--out", "full"},
                       run);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  fs::copy(dir + "/base", dir + "/qwen", fs::copy_options::recursive);
  set_key(dir + "/qwen", "architectures", "[\"Qwen2ForCausalLM\"]");  // (a Qwen2 has q/k/v biases: these have none)
  test::expect_one_line_error(test::run_castor({"train", "--model", "llama", "--data", "tokens", "--data-dir", "tok",
                                                "--init", "qwen", "--out", "never"},
                                               run),
                              {"qwen", "no tensor", "q_proj.bias"});
  EXPECT_FALSE(fs::exists(dir + "/never"));
  test::expect_one_line_error(
      test::run_castor({"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--out", "tok"}, run),
      {"--out: tok holds files a Hugging Face export does not (castor_tokens.json"});
}

// castor export --format hf replaces a directory only when it holds nothing but an earlier export's files: a project
// folder holding a config.json, a Hugging Face model directory with its README, a run directory, a symbolic link, and
// the export's own source and base are refused in one line, each left as it was.
TEST(HfCli, ExportReplacesOnlyAnEarlierExport) {
  const test::ScratchDir dir("hf_cli_out");
  const test::CastorRun run{dir, {}};
  ASSERT_EQ(test::make_grammar_tokens(run).exit_code, 0);
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", dir + "/base", hf_config("float32", 1, 2, false)}));
  auto p = test::run_castor({"train", "--model",      "llama", "--data",       "tokens", "--data-dir",
                             "tok",   "--init",       "base",  "--block-size", "16",     "--batch-size",
                             "2",     "--steps",      "1",     "--lora-rank",  "2",      "--amp",
                             "O0",    "--eval-iters", "0",     "--out",        "lora"},
                            run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<std::string> exp = {"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--out"};
  const auto to = [&](const std::string& out) {
    std::vector<std::string> a = exp;
    a.push_back(out);
    return test::run_castor(a, run);
  };
  for (int i = 0; i < 2; ++i) ASSERT_EQ(to("merged").exit_code, 0);  // (the second replaces the first)
  // A project folder with a config.json; a model directory with its README.
  fs::create_directories(dir + "/proj/src");
  atomic_write_file(dir + "/proj/config.json", std::string_view("{}"));
  atomic_write_file(dir + "/proj/src/main.py", std::string_view("print()"));
  fs::copy(dir + "/merged", dir + "/model");
  atomic_write_file(dir + "/model/README.md", std::string_view("license"));
  fs::create_directory_symlink("merged", dir + "/link");
  const auto listing = [&](const std::string& d) {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir + "/" + d))
      names.push_back(e.path().string() + " " + (e.is_regular_file() ? std::to_string(e.file_size()) : "dir"));
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto before = std::vector{listing("proj"), listing("model"), listing("lora"), listing("base"),
                                  listing("merged")};
  test::expect_one_line_error(to("proj"), {"--out: proj holds files a Hugging Face export does not (src)"});
  test::expect_one_line_error(to("model"), {"--out: model holds files a Hugging Face export does not (README.md)"});
  test::expect_one_line_error(to("lora"), {"--out: lora: a Castor run directory"});
  test::expect_one_line_error(to("link"), {"--out: link: is a symbolic link"});
  test::expect_one_line_error(to("base"), {"--out: base is", "which this export reads"});
  test::expect_one_line_error(
      test::run_castor({"export", "--format", "hf", "--checkpoint", "merged", "--out", "merged"}, run),
      {"--out: merged is merged", "which this export reads"});
  EXPECT_EQ((std::vector{listing("proj"), listing("model"), listing("lora"), listing("base"), listing("merged")}),
            before);
  EXPECT_EQ(test::run_castor({"eval", "lora"}, run).exit_code, 0);  // (its base intact)
}

// The mean next-token cross-entropy (float64) of the oracle's logits over every window of `T` tokens of the token
// file `tokens` (row k: tokens k T .. k T + T, predicting the next), as castor eval's sequential windows; NaN when the
// oracle fails.
double oracle_window_loss(const std::string& model_dir, const std::string& tokens, int64_t T, const std::string& dir) {
  const data::TokenFile file(tokens);
  const int64_t rows = (file.size() - 1) / T;
  std::vector<double> x, y;
  for (int64_t k = 0; k < rows; ++k)
    for (int64_t i = 0; i < T; ++i) x.push_back(file[k * T + i]), y.push_back(file[k * T + i + 1]);
  const Tensor logits = oracle_logits(model_dir, tensor(x, Shape{rows, T}, DType::Int64), dir);  // (rows, T, V)
  if (!logits.defined()) return NAN;
  const Tensor l = logits.to(DType::Float64).contiguous();
  const int64_t V = l.size(2);
  const double* p = l.data<double>();
  double sum = 0;
  for (size_t j = 0; j < y.size(); ++j) {
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, p[j * V + v]);
    for (int64_t v = 0; v < V; ++v) z += std::exp(p[j * V + v] - mx);
    sum += mx + std::log(z) - p[j * V + static_cast<int64_t>(y[j])];
  }
  return sum / static_cast<double>(y.size());
}

// castor eval of a Hugging Face directory of a Llama 3's context (max_position_embeddings 131,072, llama3 rope
// scaling), which is the model's and not a training block: the validation loss over windows of 2048 tokens (the
// default, lm-evaluation-harness's max_length) and of --block-size 16, each the oracle's over the same windows; a
// window past the context is one line naming it.
TEST(HfCli, EvaluatesALlama3ContextInWindows) {
  const test::ScratchDir dir("hf_eval");
  const test::CastorRun run{dir, {}};
  ASSERT_EQ(test::make_grammar_tokens(run).exit_code, 0);
  ASSERT_TRUE(test::run_oracle(
      "hf_llama_oracle.py",
      {"write", dir + "/base", hf_config("float32", 1, 2, false, false, "LlamaForCausalLM", kLlama3Rope)}));
  set_key(dir + "/base", "max_position_embeddings", "131072");
  for (const int64_t window : {int64_t{0}, int64_t{16}}) {
    SCOPED_TRACE(window);
    std::vector<std::string> args = {"eval", "base", "--data-dir", "tok"};
    if (window > 0) args.insert(args.end(), {"--block-size", std::to_string(window)});
    const auto p = test::run_castor(args, run);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    const double want = oracle_window_loss(dir + "/base", dir + "/tok/val.bin", window > 0 ? window : 2048, dir);
    EXPECT_NEAR(Json::parse(p.out).at("val_loss").as_double(), want, 1e-5 * want) << p.out;
  }
  test::expect_one_line_error(test::run_castor({"eval", "base", "--data-dir", "tok", "--block-size", "200000"}, run),
                              {"--block-size 200000", "base", "at most 131072 positions"});
}

// castor info of a Hugging Face directory and of a run from it: the sizes a model card lists (the run's block beside
// the model's context). A directory train refuses (a tensor of another shape than config.json's) is refused by info
// too; a tensor config.json does not name is one warning line naming it (transformers' "weights ... not used"), once a
// command; NaN in a weight: train --init and eval name the directory and the tensor (not a divergence, not an
// accuracy of 0), exit 1.
TEST(HfCli, InfoSizesUnnamedAndNonFiniteTensors) {
  const test::ScratchDir dir("hf_info");
  const test::CastorRun run{dir, {}};
  ASSERT_EQ(test::make_grammar_tokens(run).exit_code, 0);
  ASSERT_TRUE(test::run_oracle(
      "hf_llama_oracle.py",
      {"write", dir + "/base", hf_config("float32", 1, 2, false, false, "LlamaForCausalLM", kLlama3Rope)}));
  const std::string sizes =
      "layers 2, width 32, heads 4, kv heads 2, head size 8, feed-forward 72, vocabulary 53, context 64";
  const std::string rope = "rope theta 5000 (llama3 scaling, factor 8, original context 64)";
  auto p = test::run_castor({"info", "base"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("sizes       " + sizes + ", " + rope + "\n"), std::string::npos) << p.out;
  const std::vector<std::string> train = {"train",      "--model", "llama",        "--data", "tokens",
                                          "--data-dir", "tok",     "--block-size", "16",     "--steps",
                                          "1",          "--amp",   "O0",           "--init"};
  const auto train_from = [&](const std::string& init, const std::string& out) {
    std::vector<std::string> a = train;
    a.insert(a.end(), {init, "--out", out});
    return test::run_castor(a, run);
  };
  p = train_from("base", "run");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor({"info", "run"}, run);
  EXPECT_NE(p.out.find(sizes + " (this run's block 16), " + rope), std::string::npos) << p.out;

  fs::copy(dir + "/base", dir + "/shape");
  set_key(dir + "/shape", "intermediate_size", "80");
  test::expect_one_line_error(train_from("shape", "never"), {"shape", "has shape", "config.json"});
  test::expect_one_line_error(test::run_castor({"info", "shape"}, run), {"shape", "has shape", "config.json"});

  fs::copy(dir + "/base", dir + "/extra");
  LoadedTensors file = load_safetensors(dir + "/extra/model.safetensors");
  file.tensors.emplace("model.layers.0.self_attn.rotary_emb.inv_freq", ones({4}));
  save_safetensors(dir + "/extra/model.safetensors", file.tensors, file.metadata);
  const std::string warning =
      "castor: warning: extra: 1 tensor that config.json does not name, not used: "
      "model.layers.0.self_attn.rotary_emb.inv_freq\n";
  p = test::run_castor({"info", "extra"}, run);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.err, warning);
  p = train_from("extra", "from_extra");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.err.find(warning), p.err.rfind(warning)) << p.err;  // once
  EXPECT_NE(p.err.find(warning), std::string::npos) << p.err;

  fs::copy(dir + "/base", dir + "/nan");
  file = load_safetensors(dir + "/nan/model.safetensors");
  {
    Tensor w = file.tensors.at("model.layers.1.mlp.down_proj.weight");
    w.view({-1}).narrow(0, 5, 1).fill_(NAN);
  }
  save_safetensors(dir + "/nan/model.safetensors", file.tensors, file.metadata);
  const std::vector<std::string> named = {"nan", "tensor layers.1.feed_forward.w2.weight", "NaN or infinite"};
  test::expect_one_line_error(train_from("nan", "never"), named);
  EXPECT_FALSE(fs::exists(dir + "/never"));
  test::expect_one_line_error(test::run_castor({"eval", "nan", "--data-dir", "tok", "--block-size", "16"}, run), named);
}

// The grammar tokens and a two-layer float32 Hugging Face Llama in `dir`/base, for LoRA runs on it.
bool make_hf_lora_base(const std::string& dir, const test::CastorRun& run) {
  return test::make_grammar_tokens(run).exit_code == 0 &&
         test::run_oracle("hf_llama_oracle.py", {"write", dir + "/base", hf_config("float32", 1, 2, false)});
}

// castor train of a llama on make_hf_lora_base's base and tokens (O0, block 16, batch 4; `more`: the other flags).
test::CastorProcess train_on_hf_base(const test::CastorRun& run, const std::vector<std::string>& more) {
  std::vector<std::string> a = {"train", "--model", "llama", "--data",       "tokens", "--data-dir",
                                "tok",   "--init",  "base",  "--block-size", "16",     "--batch-size",
                                "4",     "--amp",   "O0",    "--eval-iters", "0"};
  a.insert(a.end(), more.begin(), more.end());
  return test::run_castor(a, run);
}

// castor export --format peft of a LoRA run on a Hugging Face directory: the files PEFT loads on the Hugging Face
// model (its names, target_modules, q_proj/k_proj lora_B rows in its rotary layout). The oracle merges them into the
// directory's model as PEFT does and gives the run's logits; --init-lora reads the same adapters back bit for bit.
TEST(HfCli, PeftExportLoadsOnTheHuggingFaceModel) {
  const test::ScratchDir dir("hf_peft");
  const test::CastorRun run{dir, {}};
  ASSERT_TRUE(make_hf_lora_base(dir, run));
  const auto train_run = [&](const std::vector<std::string>& more) { return train_on_hf_base(run, more); };
  auto p = train_run({"--steps", "3", "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets",
                      "wq,wk,wv,w2,output", "--out", "lora"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor({"export", "--format", "peft", "--checkpoint", "lora", "--out", "peft"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<uint8_t> bytes = read_file(dir + "/peft/adapter_config.json");
  EXPECT_EQ(Json::parse(std::string(bytes.begin(), bytes.end())).at("target_modules"),
            Json(Json::Array{"down_proj", "k_proj", "lm_head", "q_proj", "v_proj"}));
  const StateDict files = load_safetensors(dir + "/peft/adapter_model.safetensors").tensors;
  EXPECT_EQ(files.size(), 18u);  // 2 layers x 4 + lm_head, A and B each
  EXPECT_EQ(files.at("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight").shape(), (Shape{16, 4}));
  EXPECT_EQ(files.at("base_model.model.lm_head.lora_A.weight").shape(), (Shape{4, 32}));
  // The run's model: the base with its adapters, unmerged, in float32.
  const train::Checkpoint ck = train::read_checkpoint(dir + "/lora");
  auto model = load_hf(dir + "/base");
  nn::apply_lora(*model, {.r = 4, .alpha = 8, .target_modules = {"wq", "wk", "wv", "w2", "output"}});
  {
    NoGradGuard no_grad;
    for (const auto& [k, t] : nn::lora_state_dict(*model)) Tensor(t).copy_(ck.model.at(k));
  }
  const Tensor x = test::random_token_batch(2, 11, 53, 4);
  save_safetensors(dir + "/batch.safetensors", {{"x", x}});
  ASSERT_TRUE(test::run_oracle("lora_oracle.py",
                               {"peft", dir + "/base", dir + "/peft", dir + "/batch.safetensors", dir + "/out.st"}));
  const StateDict out = load_safetensors(dir + "/out.st").tensors;
  EXPECT_EQ(out.at("adapted").item(), 9);
  const Tensor logits = (*model)(x);
  EXPECT_TRUE(test::close(logits, out.at("logits"), 0, 1e-5));
  EXPECT_FALSE(test::close(logits, (*load_hf(dir + "/base"))(x), 0, 1e-3));  // (the adapters change the logits)
  // --init-lora on the Hugging Face base: the run's adapters bit for bit.
  p = train_run({"--steps", "1", "--lr", "1e-30", "--init-lora", "peft", "--out", "back"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const train::Checkpoint back = train::read_checkpoint(dir + "/back");
  ASSERT_EQ(back.model.size(), ck.model.size());
  for (const auto& [k, t] : ck.model) EXPECT_TRUE(test::bit_equal(back.model.at(k), t)) << k;
  // --lora-targets in PEFT's names (q_proj, ...: what Hugging Face users type): the same layers, the same run.
  p = train_run({"--steps", "3", "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets",
                 "q_proj,k_proj,v_proj,down_proj,lm_head", "--out", "peft_names"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const train::Checkpoint named = train::read_checkpoint(dir + "/peft_names");
  ASSERT_EQ(named.model.size(), ck.model.size());
  for (const auto& [k, t] : ck.model) EXPECT_TRUE(test::bit_equal(named.model.at(k), t)) << k;
  // The base and the adapter directory without a run (castor eval --init BASE --lora DIR): the LoRA run's validation
  // loss (castor sample's: GgufCli.Llama3FineTuneExportsTheModelsContextAndDtype).
  p = test::run_castor({"eval", "lora"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const double run_loss = Json::parse(p.out).at("val_loss").as_double();
  p = test::run_castor({"eval", "--init", "base", "--lora", "peft", "--data-dir", "tok", "--block-size", "16"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NEAR(Json::parse(p.out).at("val_loss").as_double(), run_loss, 1e-5 * run_loss) << p.out;
  test::expect_one_line_error(test::run_castor({"eval", "--init", "base", "--lora", "tok", "--data-dir", "tok"}, run),
                              {"--lora tok/adapter_config.json"});
}

// PEFT's rank_pattern and alpha_pattern: an adapter directory whose modules take other ranks and alphas, each the
// first key in the file's order whose regular expression ends the module's Hugging Face name ("q_proj" before
// "model.layers.0.self_attn.q_proj" gives layer 0's q_proj rank 3, where sorted keys would give 2). --init-lora takes
// the files as written; the run's merged export gives the logits of the oracle's merge (per-module r and alpha, as
// PEFT's LoraModel takes them, in PyTorch); castor eval --init BASE --lora DIR gives the run's loss; --format peft writes
// the patterns back in their order.
TEST(HfCli, PeftRankAndAlphaPatternsAreTakenAsPeftTakesThem) {
  const test::ScratchDir dir("hf_peft_patterns");
  const test::CastorRun run{dir, {}};
  ASSERT_TRUE(make_hf_lora_base(dir, run));
  const auto train_run = [&](const std::vector<std::string>& more) { return train_on_hf_base(run, more); };
  auto p = train_run({"--steps", "3", "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets",
                      "q_proj,k_proj,v_proj,down_proj,lm_head", "--out", "lora"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor({"export", "--format", "peft", "--checkpoint", "lora", "--out", "peft"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  // The run's adapters cut to the patterns' ranks: q_proj 3, down_proj 2, the others r (4).
  const auto rank = [](const std::string& key) {
    return key.find("q_proj.") != std::string::npos ? 3 : key.find("down_proj.") != std::string::npos ? 2 : 4;
  };
  StateDict cut;
  for (const auto& [k, t] : load_safetensors(dir + "/peft/adapter_model.safetensors").tensors)
    cut.emplace(k, t.narrow(k.find(".lora_A.") != std::string::npos ? 0 : 1, 0, rank(k)).contiguous());
  fs::create_directory(dir + "/patterned");
  save_safetensors(dir + "/patterned/adapter_model.safetensors", cut, {{"format", "pt"}});
  const std::vector<uint8_t> bytes = read_file(dir + "/peft/adapter_config.json");
  std::string text = Json::parse(std::string(bytes.begin(), bytes.end())).dump(2);
  const std::string rank_pattern = R"({"q_proj": 3, "model.layers.0.self_attn.q_proj": 2, "down_proj": 2})";
  const std::string alpha_pattern =
      R"({"model.layers.1.self_attn.k_proj": 5, "k_proj": 20, "layers\\.1\\.mlp\\..*": 12, "lm_head": 6})";
  text.insert(text.rfind('}') - 1,
              ",\n  \"rank_pattern\": " + rank_pattern + ",\n  \"alpha_pattern\": " + alpha_pattern);
  atomic_write_file(dir + "/patterned/adapter_config.json", text);
  fs::create_directory(dir + "/ranks_only");  // (the alphas as r's: what a reader ignoring alpha_pattern computes)
  fs::copy(dir + "/patterned/adapter_model.safetensors", dir + "/ranks_only/adapter_model.safetensors");
  const size_t alphas = text.find(",\n  \"alpha_pattern\"");
  atomic_write_file(dir + "/ranks_only/adapter_config.json", text.substr(0, alphas) + "\n}");

  p = train_run({"--steps", "1", "--lr", "1e-30", "--init-lora", "patterned", "--out", "back"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const train::Checkpoint back = train::read_checkpoint(dir + "/back");
  p = test::run_castor(
      {"export", "--format", "hf", "--checkpoint", "back", "--merge-lora", "--dtype", "float32", "--out", "merged"},
      run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const Tensor x = test::random_token_batch(2, 11, 53, 4);
  save_safetensors(dir + "/batch.safetensors", {{"x", x}});
  for (const char* adapters : {"patterned", "ranks_only"})
    ASSERT_TRUE(test::run_oracle("lora_oracle.py", {"peft", dir + "/base", dir + "/" + adapters,
                                                    dir + "/batch.safetensors", dir + "/" + adapters + ".st"}));
  const StateDict want = load_safetensors(dir + "/patterned.st").tensors;
  EXPECT_EQ(want.at("ranks").to_vector<int64_t>(), (std::vector<int64_t>{4, 2, 4, 3, 4, 2, 4, 3, 4}));  // (name order)
  const Tensor logits = (*load_hf(dir + "/merged"))(x);
  EXPECT_TRUE(test::close(logits, want.at("logits"), 0, 1e-5));
  EXPECT_FALSE(test::close(logits, load_safetensors(dir + "/ranks_only.st").tensors.at("logits"), 0, 1e-3));
  // The adapters as the files hold them, whatever their rank.
  ASSERT_EQ(back.model.size(), cut.size());
  for (const auto& [k, t] : formats::hf_adapters(load_hf(dir + "/base")->config(), back.model, /*to_castor=*/false))
    EXPECT_TRUE(test::bit_equal(t, cut.at("base_model.model." + k))) << k;

  p = test::run_castor({"eval", "back"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const double run_loss = Json::parse(p.out).at("val_loss").as_double();
  p = test::run_castor({"eval", "--init", "base", "--lora", "patterned", "--data-dir", "tok", "--block-size", "16"},
                       run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NEAR(Json::parse(p.out).at("val_loss").as_double(), run_loss, 1e-5 * run_loss) << p.out;

  p = test::run_castor({"export", "--format", "peft", "--checkpoint", "back", "--out", "again"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<uint8_t> again = read_file(dir + "/again/adapter_config.json");
  const Json ordered = Json::parse_ordered(std::string(again.begin(), again.end()));
  Json written;
  for (const Json& pair : ordered.as_array())
    if (pair.as_array()[0].as_string().ends_with("_pattern"))
      written[pair.as_array()[0].as_string()] = pair.as_array()[1];
  for (const auto& [key, given] :
       {std::pair{"rank_pattern", rank_pattern}, std::pair{"alpha_pattern", alpha_pattern}}) {
    const Json::Array &got = written.at(key).as_array(), want = Json::parse_ordered(given).as_array();
    ASSERT_EQ(got.size(), want.size()) << key;
    for (size_t i = 0; i < got.size(); ++i) {  // (the same keys in the same order; an alpha written as a float)
      EXPECT_EQ(got[i].as_array()[0], want[i].as_array()[0]) << key;
      EXPECT_EQ(got[i].as_array()[1].as_double(), want[i].as_array()[1].as_double()) << key;
    }
  }
}

}  // namespace
}  // namespace castor
