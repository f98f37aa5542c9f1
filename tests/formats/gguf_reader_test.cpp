// Reading GGUF files (castor/gguf.h, castor/model_source.h): files written by tests/oracle/gguf_writer.py (not Castor's
// exporter; its quantized blocks ggml's own) from hf_llama_oracle.py's random models give the oracle's logits on the
// values the file holds (llama with its permuted q/k rows, qwen2 without; f32, f16, bf16, q8_0, q4_0, every K-quant and
// the Q4_K_M mix), dequantized or kept in their blocks, and LoRA over the blocks gives the oracle's adapter gradients
// (tests/oracle/lora_oracle.py); llama.cpp's greedy tokens on an f16 file are castor sample's, with the tokenizer and
// family taken from the file alone, and llama.cpp's per-token probabilities give castor eval --text's perplexity; broken files are one-line errors naming the file and the field.
#include <cstring>
#include <filesystem>
#include <set>

#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/allocator.h"
#include "castor/functional.h"
#include "castor/hf.h"
#include "castor/json.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "castor/model_source.h"
#include "castor/models.h"
#include "castor/safetensors.h"
#include "castor/tokenizer.h"
#include "nn/lm_twin.h"
#include "formats/hf_lora_twin.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor {
namespace {

const std::string kLlamaCpp = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-llama-cpp/node_modules";
const std::string kOracle = std::string(CASTOR_SOURCE_DIR) + "/tests/oracle/";

// A model 32 wide (FF 72), or `wide`: 256 (FF 512, 4 heads of 64), every matrix's rows whole K-quant blocks; `extra`:
// more keys of config.json.
std::string hf_config(const std::string& arch, int64_t kv_heads, bool tied, int seed, int64_t vocab, bool wide = false,
                      const std::string& extra = "") {
  return detail::cat("{\"architectures\": [\"", arch, "\"], \"hidden_size\": ", wide ? 256 : 32,
                     ", \"intermediate_size\": ", wide ? 512 : 72, ", ",
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": ", kv_heads,
                     ", \"vocab_size\": ", vocab, ", \"rms_norm_eps\": 1e-6, \"rope_theta\": 5000.0, ",
                     "\"max_position_embeddings\": 64, \"tie_word_embeddings\": ", tied ? "true" : "false",
                     ", \"torch_dtype\": \"float32\", \"hidden_act\": \"silu\", \"bos_token_id\": 1, ",
                     "\"eos_token_id\": 2, \"shards\": 1, \"seed\": ", seed, extra.empty() ? "" : ", ", extra, "}");
}

// A random model as a Hugging Face directory DIR/hf and a GGUF file DIR/NAME.gguf of `type`; DIR/hf then holds the
// values the file does (as float32).
bool write_gguf_case(const std::string& dir, const std::string& name, const std::string& arch, int64_t kv_heads,
                     bool tied, const std::string& type, int seed, int64_t vocab = 53, bool wide = false) {
  return test::run_oracle("hf_llama_oracle.py",
                          {"write", dir + "/hf", hf_config(arch, kv_heads, tied, seed, vocab, wide)}) &&
         test::run_oracle("gguf_writer.py", {"write", dir + "/hf", dir + "/" + name + ".gguf", type});
}

// The Llama a GGUF file describes, loaded as castor train --init and castor sample load it.
std::shared_ptr<models::LanguageModel> load_gguf(const std::string& path) {
  const models::LlamaConfig l = formats::llama_config(formats::source_description(path), path);
  auto model = models::llama(l, /*seed=*/0);
  formats::load_weights_into(*model, path);
  return model;
}

// The same with each Linear weight the file stores quantized kept in its blocks (castor train --lora-rank's and castor
// sample's loading): the Llama made with placeholder weights, never dense.
std::shared_ptr<models::Llama> load_gguf_blocks(const std::string& path) {
  const models::LlamaConfig l = formats::llama_config(formats::source_description(path), path);
  std::shared_ptr<models::Llama> model;
  {
    nn::LoadInitGuard empty(DType::Float32, /*placeholders=*/true);
    model = models::llama(l, /*seed=*/0);
  }
  formats::load_weights_into(*model, path, nullptr, /*keep_blocks=*/true);
  return model;
}

TEST(GgufRead, LogitsMatchTheOracleOnTheFilesValues) {
  struct Case {
    std::string name, arch, type;
    int64_t kv_heads;
    bool tied;
  };
  const Case cases[] = {{"llama_f32_mha_untied", "LlamaForCausalLM", "f32", 4, false},
                        {"llama_f16_gqa_tied", "LlamaForCausalLM", "f16", 2, true},
                        {"llama_bf16_gqa", "LlamaForCausalLM", "bf16", 1, false},
                        {"llama_q8_0_gqa", "LlamaForCausalLM", "q8_0", 2, false},
                        {"qwen2_q8_0_tied", "Qwen2ForCausalLM", "q8_0", 2, true},
                        {"llama_q4_1_gqa", "LlamaForCausalLM", "q4_1", 2, false},
                        {"llama_q5_0", "LlamaForCausalLM", "q5_0", 4, false},
                        {"qwen2_q5_1", "Qwen2ForCausalLM", "q5_1", 2, false},
                        {"qwen2_f32", "Qwen2ForCausalLM", "f32", 4, false}};
  int seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const test::ScratchDir dir("gguf_read_" + c.name);
    ASSERT_TRUE(write_gguf_case(dir, c.name, c.arch, c.kv_heads, c.tied, c.type, seed++));
    const std::string file = dir + "/" + c.name + ".gguf";
    EXPECT_EQ(formats::source_format(file), formats::SourceFormat::Gguf);
    const Json d = formats::source_description(file);
    EXPECT_EQ(d.at("architecture").as_string(), c.arch);
    EXPECT_EQ(d.at("n_kv_heads").as_int(), c.kv_heads);
    EXPECT_EQ(d.at("tied").as_bool(), c.tied);
    auto model = load_gguf(file);
    const Tensor x = test::random_token_batch(2, 11, 53, 7);
    save_safetensors(dir + "/batch.safetensors", {{"x", x}});
    ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py",
                                 {"logits", dir + "/hf", dir + "/batch.safetensors", dir + "/out.safetensors"}));
    const Tensor want = load_safetensors(dir + "/out.safetensors").tensors.at("logits");
    EXPECT_TRUE(test::close((*model)(x), want, 0, 1e-5));
  }
}

// The block types of the quantized Linear weights and embedding of `model`, and of the file's quantized matrices but
// a tied embedding (read as values: the output layer shares it), as ggml names them.
std::multiset<std::string> quantized_layers(models::Llama& model) {
  std::multiset<std::string> out;
  const StateDict own = model.state_dict();
  for (const auto& [path, layer] : nn::linear_layers(model)) {
    if (!layer->quantized) continue;
    out.insert(formats::ggml_type_name(static_cast<uint32_t>(layer->quantized->type)));
    EXPECT_FALSE(own.count(path + ".weight")) << path << " holds a dense weight too";
  }
  if (const auto& e = model.tok_embeddings->quantized) {
    out.insert(formats::ggml_type_name(static_cast<uint32_t>(e->type)));
    EXPECT_FALSE(own.count("tok_embeddings.weight"));
  }
  return out;
}
std::multiset<std::string> quantized_matrices(const std::string& file, bool tied) {
  std::multiset<std::string> out;
  for (const formats::GgufTensorInfo& t : formats::read_gguf_header(file).tensors)
    if (t.type != 0 && t.type != 1 && t.type != 30 && !(tied && t.name == "token_embd.weight"))
      out.insert(formats::ggml_type_name(t.type));
  return out;
}

// A quantized file's Linear weights and embedding stay in the file's blocks (each its own type: Q4_K_M's Q4_K and
// Q6_K, the output's Q6_K; a tied embedding is read as values), and the model over them - logits, loss and LoRA's adapter
// gradients on every Linear - equals the oracle (transformers' Llama / Qwen2 in PyTorch on ggml's dequantized values,
// lora_oracle.py's PEFT-style LoRA) within 1e-5 at float32.
TEST(GgufRead, QuantizedBaseStaysInItsBlocksAndMatchesTheOracle) {
  struct Case {
    std::string name, arch, type;
    int64_t kv_heads;
    bool tied, wide;
  };
  const Case cases[] = {{"llama_q4_0", "LlamaForCausalLM", "q4_0", 2, false, false},
                        {"llama_q4_k_m", "LlamaForCausalLM", "q4_k_m", 2, false, true},
                        {"qwen2_q4_k_m_tied", "Qwen2ForCausalLM", "q4_k_m", 2, true, true},
                        {"llama_q8_0_tied", "LlamaForCausalLM", "q8_0", 4, true, false},
                        {"llama_q2_k", "LlamaForCausalLM", "q2_k", 2, false, true},
                        {"llama_q3_k", "LlamaForCausalLM", "q3_k", 4, false, true},
                        {"qwen2_q5_k", "Qwen2ForCausalLM", "q5_k", 2, false, true},
                        {"llama_q6_k", "LlamaForCausalLM", "q6_k", 2, false, true}};
  int seed = 31;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const test::ScratchDir dir("gguf_blocks_" + c.name);
    ASSERT_TRUE(write_gguf_case(dir, c.name, c.arch, c.kv_heads, c.tied, c.type, seed++, 53, c.wide));
    const std::string file = dir + "/" + c.name + ".gguf";
    auto model = load_gguf_blocks(file);
    const std::multiset<std::string> types = quantized_layers(*model);
    EXPECT_EQ(types, quantized_matrices(file, c.tied));
    if (c.type == "q4_k_m") {
      EXPECT_TRUE(types.count("q6_K") && types.count("q4_K"));
    }
    const nn::LoraConfig cfg{.r = 4, .alpha = 8, .target_modules = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}};
    EXPECT_EQ(nn::apply_lora(*model, cfg).size(), 14u);
    test::randomize_lora_b(*model, 7);
    const Tensor x = test::random_token_batch(2, 11, 53, 1), y = test::random_token_batch(2, 11, 53, 2);
    test::expect_hf_lora_matches_oracle(*model, dir + "/hf", "gguf_blocks_" + c.name + "_oracle", cfg.scaling(), x, y);
  }
}

// LoRA over a q4_0 file's blocks (a 4-layer Llama 512 wide, FF 2048: 61 MB of float32 Linear weights): the
// allocator's peak while the model loads and runs a forward and backward stays under a third of what those weights
// take as float32 (the blocks hold 4.5 bits a value; a dequantized tile of at most 4 MB at a time), whatever the
// machine's load.
TEST(GgufRead, LoraOverQ4_0BlocksPeaksWellUnderTheDenseWeights) {
  const test::ScratchDir dir("gguf_blocks_memory");
  const std::string config =
      "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 512, \"intermediate_size\": 2048, "
      "\"num_hidden_layers\": 4, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"vocab_size\": 53, "
      "\"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 64, \"tie_word_embeddings\": false, "
      "\"torch_dtype\": \"float32\", \"bos_token_id\": 1, \"eos_token_id\": 2, \"seed\": 41}";
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py", {"write", dir + "/hf", config}));
  ASSERT_TRUE(test::run_oracle("gguf_writer.py", {"write", dir + "/hf", dir + "/m.gguf", "q4_0"}));
  empty_cache();
  reset_peak_memory_stats();
  const int64_t before = memory_stats().current_bytes;
  auto model = load_gguf_blocks(dir + "/m.gguf");
  int64_t dense = 0;
  for (const auto& [path, layer] : nn::linear_layers(*model)) dense += layer->in_features() * layer->out_features() * 4;
  nn::apply_lora(*model, nn::LoraConfig{.r = 4, .alpha = 8});
  const Tensor x = test::random_token_batch(1, 16, 53, 1), y = test::random_token_batch(1, 16, 53, 2);
  F::cross_entropy((*model)(x).reshape({-1, 53}), y.reshape({-1})).backward();
  const int64_t peak = memory_stats().peak_bytes - before;
  EXPECT_GT(dense, 60'000'000);
  EXPECT_LT(peak, dense / 3) << "peak " << peak << " bytes, dense float32 Linear weights " << dense;
}

// Llama 3.1's rope scaling as convert_hf_to_gguf.py writes it, a table of per-pair factors (rope_freqs.weight, no
// scaling key): the file describes the llama3 scaling and gives the oracle's logits (transformers'
// _compute_llama3_parameters over 64 original positions: at head size 8 and theta 5000, pair 0 kept, pair 1 smoothed,
// pairs 2-3 divided by the factor); a table no llama3 scaling gives is a one-line error naming the tensor.
TEST(GgufRead, Llama3RopeFactorsGiveTheOraclesLogits) {
  const test::ScratchDir dir("gguf_read_llama3");
  const std::string rope =
      "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}";
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py",
                               {"write", dir + "/hf", hf_config("LlamaForCausalLM", 2, false, 51, 53, false, rope)}));
  ASSERT_TRUE(test::run_oracle("gguf_writer.py", {"write", dir + "/hf", dir + "/m.gguf", "f32"}));
  const std::string file = dir + "/m.gguf";
  const Json scaling = formats::source_description(file).at("rope_scaling");
  EXPECT_EQ(scaling.at("type").as_string(), "llama3");
  EXPECT_EQ(scaling.at("factor").as_double(), 8.0);
  EXPECT_EQ(scaling.at("original_max_position_embeddings").as_int(), 64);
  auto model = load_gguf(file);
  const Tensor x = test::random_token_batch(2, 40, 53, 7);
  save_safetensors(dir + "/batch.safetensors", {{"x", x}});
  ASSERT_TRUE(test::run_oracle("hf_llama_oracle.py",
                               {"logits", dir + "/hf", dir + "/batch.safetensors", dir + "/out.safetensors"}));
  EXPECT_TRUE(test::close((*model)(x), load_safetensors(dir + "/out.safetensors").tensors.at("logits"), 0, 1e-5));
  // Factors no llama3 scaling gives (pair 1 above the factor's band's value, pair 3 below pair 2's).
  for (const formats::GgufTensorInfo& t : formats::read_gguf_header(file).tensors) {
    if (t.name != "rope_freqs.weight") continue;
    std::vector<uint8_t> bytes = read_file(file);
    const float bad[4] = {1.0f, 3.0f, 8.0f, 2.0f};
    std::memcpy(bytes.data() + t.begin, bad, sizeof bad);
    atomic_write_file(dir + "/bad.gguf", std::span<const uint8_t>(bytes));
  }
  test::expect_error([&] { formats::source_description(dir + "/bad.gguf"); },
                     {dir + "/bad.gguf: tensor rope_freqs.weight: per-pair rope factors that no llama3"});
}

// llama.cpp's greedy continuation on an f16 file equals Castor's, and castor sample --init FILE.gguf (no --model, no
// tokenizer directory) prints it.
TEST(GgufRead, SampleFromTheFileAloneGivesLlamaCppsGreedyTokens) {
  ASSERT_TRUE(file_exists(kLlamaCpp + "/node-llama-cpp/package.json"))
      << kLlamaCpp << " lacks node-llama-cpp: run scripts/setup_tests.sh";
  const test::ScratchDir dir("gguf_read_sample");
  ASSERT_TRUE(write_gguf_case(dir, "m", "LlamaForCausalLM", 2, false, "f16", 21, 300));  // (with byte tokens)
  const std::string file = dir + "/m.gguf";
  data::Tokenizer tok = data::Tokenizer::load(formats::gguf_tokenizer_dir(file));
  const std::string prompt = "a b c";
  const std::vector<uint32_t> ids = tok.encode(prompt);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1u);  // add_bos_token
  auto model = load_gguf(file);
  model->eval();
  const std::vector<int64_t> prompt_ids(ids.begin(), ids.end());
  std::vector<int64_t> greedy = models::generate(*model, prompt_ids, 8, 0.0);
  greedy.erase(greedy.begin(), greedy.begin() + static_cast<int64_t>(prompt_ids.size()));
  const Json request = Json::Array{Json::Object{
      {"model", file}, {"context", 64}, {"prompt", Json::Array(prompt_ids.begin(), prompt_ids.end())}, {"steps", 8}}};
  atomic_write_file(dir + "/request.json", request.dump());
  const std::string cmd = "node " + kOracle + "gguf_llama_cpp.mjs " + kLlamaCpp + " " + dir + "/request.json > " + dir +
                          "/llama_cpp.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<uint8_t> out = read_file(dir + "/llama_cpp.json");
  const Json got = Json::parse(std::string(out.begin(), out.end())).as_array().at(0).at("greedy");
  std::vector<int64_t> theirs;
  for (const Json& t : got.as_array()) theirs.push_back(t.as_int());
  ASSERT_FALSE(theirs.empty());
  EXPECT_EQ(std::vector<int64_t>(greedy.begin(), greedy.begin() + static_cast<int64_t>(theirs.size())), theirs);
  const test::CastorProcess s = test::run_castor(
      {"sample", "--init", file, "--prompt", prompt, "--temperature", "0", "--tokens", std::to_string(theirs.size())},
      test::CastorRun{dir});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  // castor sample writes the prompt, then the continuation as the tokenizer streams it.
  std::string want = tok.decode(ids);
  data::Tokenizer::Stream stream(tok, ids.back());
  for (int64_t t : theirs) want += stream.next(static_cast<uint32_t>(t));
  EXPECT_EQ(s.out, want + stream.finish() + "\n");
}

// llama.cpp's requests of gguf_llama_cpp.mjs: one a chunk of `ids` (BOS first), its first half the prompt and the
// rest teacher-forced, as llama-perplexity scores the chunk; the first request also tokenizes `text`.
Json perplexity_requests(const std::string& file, const std::vector<uint32_t>& ids, int64_t ctx, int64_t bos,
                         const std::string& text) {
  Json::Array requests;
  const int64_t first = ctx / 2;
  for (int64_t c = 0; c < static_cast<int64_t>(ids.size()) / ctx; ++c) {
    Json::Array prompt, forced;
    for (int64_t i = 0; i < ctx; ++i) {
      const int64_t id = i == 0 ? bos : static_cast<int64_t>(ids[c * ctx + i]);
      (i <= first ? prompt : forced).push_back(id);
    }
    Json::Object r{{"model", file}, {"context", 64}, {"prompt", prompt}, {"forced", forced}};
    if (c == 0) r["texts"] = Json::Array{text};
    requests.push_back(r);
  }
  return requests;
}

// castor eval FILE.gguf --text F --ctx N gives llama-perplexity's figure: llama.cpp's own per-token probabilities on
// the same chunks (BOS first, the second half of each scored) give the same perplexity within 1e-3, and llama.cpp
// tokenizes the text as Castor does.
TEST(GgufRead, PerplexityOfCastorEvalIsLlamaCpps) {
  ASSERT_TRUE(file_exists(kLlamaCpp + "/node-llama-cpp/package.json"))
      << kLlamaCpp << " lacks node-llama-cpp: run scripts/setup_tests.sh";
  const test::ScratchDir dir("gguf_read_perplexity");
  ASSERT_TRUE(write_gguf_case(dir, "m", "LlamaForCausalLM", 2, false, "f16", 23, 300));  // (with byte tokens)
  const std::string file = dir + "/m.gguf";
  // Characters of byte tokens: the file's pieces ("\u2581a", ...) have halves that are not tokens, which llama.cpp's
  // SentencePiece merges and a tokenizer.json's merges (Hugging Face's conversion, Castor's) cannot.
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += std::string(1 + i % 2, static_cast<char>('A' + (i * 7) % 26)) + (i % 9 == 8 ? ".\n" : " ");
  atomic_write_file(dir + "/text.txt", text);
  data::Tokenizer tok = data::Tokenizer::load(formats::gguf_tokenizer_dir(file));
  const std::vector<uint32_t> ids = tok.encode(text, true);
  const int64_t ctx = 16;
  ASSERT_GE(static_cast<int64_t>(ids.size()), 3 * ctx);
  atomic_write_file(dir + "/request.json", perplexity_requests(file, ids, ctx, ids[0], text).dump());
  const std::string cmd = "node " + kOracle + "gguf_llama_cpp.mjs " + kLlamaCpp + " " + dir + "/request.json > " + dir +
                          "/llama_cpp.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const Json got = Json::parse(test::read_text(dir + "/llama_cpp.json"));
  std::vector<uint32_t> theirs;
  for (const Json& t : got.as_array().at(0).at("tokens").as_array().at(0).as_array())
    theirs.push_back(static_cast<uint32_t>(t.as_int()));
  EXPECT_EQ(theirs, std::vector<uint32_t>(ids.begin() + 1, ids.end()));
  double nll = 0;
  int64_t scored = 0;
  for (const Json& r : got.as_array())
    for (const Json& f : r.at("forced").as_array()) nll -= std::log(f.at("p").as_double()), ++scored;
  EXPECT_EQ(scored, static_cast<int64_t>(ids.size()) / ctx * (ctx - 1 - ctx / 2));
  const test::CastorProcess s = test::run_castor({"eval", file, "--text", "text.txt", "--ctx", std::to_string(ctx)},
                                                 test::CastorRun{dir});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const Json out = Json::parse(s.out);
  EXPECT_EQ(out.at("tokens").as_int(), scored);
  const double want = std::exp(nll / static_cast<double>(scored));
  EXPECT_NEAR(out.at("perplexity").as_double() / want, 1.0, 1e-3) << want;
}

// A small GGUF file assembled field by field, to break one field at a time.
struct Tiny {
  uint32_t version = 3;
  uint64_t tensor_count = 1, kv_count = 1;
  std::string key = "general.architecture";
  uint64_t key_length = 20;
  uint32_t value_type = 8;  // string
  std::vector<uint8_t> value = {5, 0, 0, 0, 0, 0, 0, 0, 'l', 'l', 'a', 'm', 'a'};
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    uint64_t offset;
  };
  std::vector<Info> infos = {{"token_embd.weight", {8, 4}, 0, 0}};
  uint64_t data = 128;
  uint64_t cut = 0;  // bytes cut off the end

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b;
    const auto put = [&](const void* p, size_t n) {
      b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    put("GGUF", 4), put(&version, 4), put(&tensor_count, 8), put(&kv_count, 8);
    put(&key_length, 8), put(key.data(), key.size()), put(&value_type, 4), put(value.data(), value.size());
    for (const Info& t : infos) {
      const uint64_t n = t.name.size();
      const auto dims = static_cast<uint32_t>(t.ne.size());
      put(&n, 8), put(t.name.data(), n), put(&dims, 4);
      for (uint64_t d : t.ne) put(&d, 8);
      put(&t.type, 4), put(&t.offset, 8);
    }
    b.resize((b.size() + 31) / 32 * 32 + data, 0);
    b.resize(b.size() - cut);
    return b;
  }
};

TEST(GgufRead, BrokenFilesAreOneLineErrorsNamingTheField) {
  const test::ScratchDir dir("gguf_read_bad");
  struct Bad {
    std::string name;
    void (*change)(Tiny&);
    std::vector<std::string> parts;
  };
  const Bad bad[] = {
      {"truncated", [](Tiny& t) { t.cut = t.data + 28; }, {"truncated at tensor token_embd.weight's dims"}},
      {"data_past_end", [](Tiny& t) { t.data = 64; }, {"tensor token_embd.weight", "past the end of the file"}},
      {"unknown_type", [](Tiny& t) { t.infos[0].type = 99; }, {"tensor token_embd.weight", "unknown tensor type 99"}},
      {"unaligned", [](Tiny& t) { t.infos[0].offset = 4; }, {"offset 4 is not a multiple of the alignment 32"}},
      {"duplicate",
       [](Tiny& t) {
         t.infos.push_back(t.infos[0]);
         t.infos[1].offset = 128;
         t.tensor_count = 2;
       },
       {"tensor token_embd.weight appears twice"}},
      {"five_dims",
       [](Tiny& t) {
         t.infos[0].ne = {8, 1, 1, 1, 4};
       },
       {"tensor token_embd.weight has 5 dims"}},
      {"overflowing_dims",
       [](Tiny& t) {
         t.infos[0].ne = {uint64_t(1) << 40, uint64_t(1) << 40};
       },
       {"tensor token_embd.weight's dims overflow"}},
      {"huge_array",
       [](Tiny& t) {
         t.value_type = 9;
         t.value = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};  // u8 elements, 2^40 of them
       },
       {"general.architecture: an array of 1099511627776 elements"}},
      {"bad_string_length",
       [](Tiny& t) { t.value = {0, 0, 0, 0, 0, 0, 1, 0}; },
       {"general.architecture: a string of 281474976710656 bytes, past the end"}},
      {"bad_key_length", [](Tiny& t) { t.key_length = uint64_t(1) << 50; }, {"key 0: a string of", "past the end"}},
      {"unknown_arch",
       [](Tiny& t) { t.value = {5, 0, 0, 0, 0, 0, 0, 0, 'g', 'e', 'm', 'm', 'a'}; },
       {"general.architecture gemma is not read"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    Tiny t;
    b.change(t);
    const std::string path = dir + "/" + b.name + ".gguf";
    const std::vector<uint8_t> bytes = t.bytes();
    atomic_write_file(path, std::span<const uint8_t>(bytes));
    std::vector<std::string> parts = b.parts;
    parts.insert(parts.begin(), path + ": ");
    test::expect_error([&] { formats::source_description(path); }, parts);
  }
  // The same through the command line: one line, exit 1.
  const test::CastorProcess p = test::run_castor({"info", dir + "/unknown_type.gguf"}, test::CastorRun{dir});
  test::expect_one_line_error(p, {dir + "/unknown_type.gguf", "unknown tensor type 99"});
}

}  // namespace
}  // namespace castor
