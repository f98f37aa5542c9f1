// Hugging Face Llama-family directories: written at random by tests/oracle/hf_llama_oracle.py (bf16, sharded, GQA,
// tied and untied, v5 spellings), read by Castor to the oracle's logits (rotate_half semantics) and its 10 AdamW steps;
// Castor's export read back bit for bit and by the oracle; bad directories as one-line errors naming file and key.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "castor/allocator.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llmc.h"
#include "castor/llama.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "nn/lm_twin.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using formats::HfConfig;

// A random model's config.json keys (and the oracle's seed, shards and spelling).
std::string hf_config(const std::string& dtype, int shards, int64_t kv_heads, bool tied, bool v5 = false,
                      const std::string& arch = "LlamaForCausalLM") {
  return detail::cat("{\"architectures\": [\"", arch, "\"], \"hidden_size\": 32, \"intermediate_size\": 72, ",
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": ", kv_heads,
                     ", \"vocab_size\": 53, \"rms_norm_eps\": 1e-6, \"rope_theta\": 5000.0, ",
                     "\"max_position_embeddings\": 64, \"tie_word_embeddings\": ", tied ? "true" : "false",
                     ", \"torch_dtype\": \"", dtype, "\", \"hidden_act\": \"silu\", \"bos_token_id\": 1, ",
                     "\"eos_token_id\": 2, \"shards\": ", shards, ", \"seed\": ", shards * 10 + kv_heads,
                     v5 ? ", \"v5\": true" : "", "}");
}

struct HfCase {
  std::string name, dtype;
  int shards;
  int64_t kv_heads;
  bool tied, v5;
};
const HfCase kCases[] = {{"f32_mha_untied", "float32", 1, 4, false, false},
                         {"bf16_gqa_sharded", "bfloat16", 3, 2, false, false},
                         {"f16_gqa_tied_v5", "float16", 2, 1, true, true}};

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
    ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py",
                                 {"write", model_dir, hf_config(c.dtype, c.shards, c.kv_heads, c.tied, c.v5)}));
    const HfConfig h = formats::read_hf_config(model_dir);
    EXPECT_EQ(h.llama.kv_heads(), c.kv_heads);
    EXPECT_EQ(h.llama.tied, c.tied);
    EXPECT_EQ(h.llama.norm_eps, 1e-6);
    EXPECT_EQ(h.llama.rope_theta, 5000.0);
    auto model = load_hf(model_dir);
    const Tensor x = test::random_token_batch(2, 11, 53, 7);
    const Tensor want = oracle_logits(model_dir, x, dir);
    ASSERT_TRUE(want.defined());
    EXPECT_TRUE(test::close((*model)(x), want, 0, 1e-5));
    // Castor's export: the same tensors read back bit for bit, and the oracle's logits of it are its logits of the
    // original (float32 holds every 16-bit value exactly).
    formats::HfWriteOptions o;
    o.max_shard_bytes = 20000;  // several shards
    formats::write_hf(dir + "/export", model->config(), model->state_dict(), o);
    EXPECT_TRUE(fs::exists(dir + "/export/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(dir + "/export/generation_config.json"));
    const StateDict back = formats::read_hf_weights(dir + "/export", formats::read_hf_config(dir + "/export"));
    for (const auto& [name, t] : model->state_dict()) EXPECT_TRUE(test::bit_equal(back.at(name), t)) << name;
    EXPECT_TRUE(test::bit_equal(oracle_logits(dir + "/export", x, dir), want));
  }
}

TEST(HfFormat, TenAdamWStepsMatchTheOracle) {
  const test::ScratchDir dir("hf_train");
  const std::string model_dir = dir + "/model";
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", model_dir, hf_config("bfloat16", 2, 2, false)}));
  auto model = load_hf(model_dir);
  StateDict batch;
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 3; ++i) {
    const Tensor s = test::learnable_token_batch(3, 13, 53, 40 + i);
    batches.emplace_back(s.narrow(1, 0, 12).contiguous(), s.narrow(1, 1, 12).contiguous());
    batch["x." + std::to_string(i)] = batches.back().first;
    batch["y." + std::to_string(i)] = batches.back().second;
  }
  save_safetensors(dir + "/batch.safetensors", batch);
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"train", model_dir, dir + "/batch.safetensors", dir + "/out"}));
  const std::vector<double> want = load_safetensors(dir + "/out").tensors.at("loss").to_vector<double>();
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
  models::load_weights_into(*model, model_dir);
  const int64_t streamed = memory_stats().peak_bytes - before;
  EXPECT_LE(streamed, 3 * largest) << "model " << model_bytes << " bytes";
  reset_peak_memory_stats();
  { const StateDict all = formats::read_hf_weights(model_dir, h); }
  EXPECT_GE(memory_stats().peak_bytes - before, model_bytes);  // (what a whole-dictionary read costs)
  const Tensor x = test::random_token_batch(1, 7, 53, 5);
  EXPECT_TRUE(test::bit_equal((*model)(x), (*load_hf(model_dir))(x)));
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
                            run, 120);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  p = test::run_castor({"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--out", "merged"}, run);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::string merged = dir + "/merged";
  EXPECT_TRUE(fs::exists(merged + "/config.json"));
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
                       run, 120);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  fs::copy(dir + "/base", dir + "/qwen", fs::copy_options::recursive);
  set_key(dir + "/qwen", "architectures", "[\"Qwen2ForCausalLM\"]");
  test::expect_one_line_error(test::run_castor({"train", "--model", "llama", "--data", "tokens", "--data-dir", "tok",
                                                "--init", "qwen", "--out", "never"},
                                               run),
                              {"--init qwen", "config.json", "Qwen2ForCausalLM"});
  EXPECT_FALSE(fs::exists(dir + "/never"));
  test::expect_one_line_error(
      test::run_castor({"export", "--format", "hf", "--checkpoint", "lora", "--merge-lora", "--out", "tok"}, run),
      {"tok", "not a Hugging Face directory"});
}

}  // namespace
}  // namespace castor
