// Loading weights without a float32 copy (formats::load_weights_into, nn::LoadInitGuard): a LoRA base made in 16 bits
// and filled tensor by tensor holds the bits a float32 load and then the cast would give, at the allocator's peak of
// one 16-bit model plus one tensor; a base quantized as it is filled (--quantize-base) never holds its dense Linears
// whole; a placeholder takes the tensor read as its memory; sample --init of a bfloat16 Hugging Face directory holds
// its weights once.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "castor/allocator.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llama.h"
#include "castor/llmc.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/nn.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "castor/sample.h"
#include "castor/serialize.h"
#include "castor/tokenizer.h"
#include "castor/model_source.h"
#include "test_util.h"

namespace castor {
namespace {

// The bytes a model's tensors hold (a tied tensor once).
int64_t model_bytes(const nn::Module& m) {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& [name, t] : m.state_dict())
    if (seen.insert(t.data_ptr()).second) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// The largest tensor `path` holds, in its file's dtype.
int64_t largest_tensor(const std::string& path) {
  int64_t n = 0;
  for (const SafetensorsEntry& e : formats::read_weights_header(path).entries)
    n = std::max(n, static_cast<int64_t>(e.end - e.begin));
  return n;
}

// Every tensor of `b` is `a`'s, the same dtype and bits.
void expect_same_state(const nn::Module& a, const nn::Module& b, const std::string& what) {
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (const auto& [name, t] : sa) {
    ASSERT_TRUE(sb.count(name)) << what << ": " << name;
    EXPECT_EQ(t.dtype(), sb.at(name).dtype()) << what << ": " << name;
    EXPECT_TRUE(test::bit_equal(t, sb.at(name))) << what << ": " << name;
  }
}

// The old path and the new one for a LoRA base at O1 bf16: (1) float32 model drawn, the whole file read and loaded,
// then cast as amp::initialize casts a frozen base (norms kept in float32); (2) made under LoadInitGuard(bf16) and
// loaded tensor by tensor. Same bits, the same default generator afterwards (LoRA adapters drawn next match), and
// the new path's peak within one 16-bit model plus two tensors of the file while the old one's is above it.
template <class Make>
void check_loads_in_16_bits(const Make& make, const std::string& path) {
  manual_seed(5);
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory_stats();
  std::shared_ptr<nn::Module> old_model = make();
  old_model->load_state_dict(formats::load_weights_file(path, "").tensors, /*strict=*/true);
  old_model->to(DType::BFloat16, /*keep_norms_fp32=*/true);
  const int64_t old_peak = memory_stats().peak_bytes - before;
  const Tensor old_next = uniform({4}, 0.0, 1.0);

  manual_seed(5);
  const int64_t held = memory_stats().current_bytes;
  reset_peak_memory_stats();
  std::shared_ptr<nn::Module> model;
  {
    nn::LoadInitGuard empty(DType::BFloat16);
    model = make();
  }
  formats::load_weights_into(*model, path);
  const int64_t peak = memory_stats().peak_bytes - held;
  const Tensor next = uniform({4}, 0.0, 1.0);

  expect_same_state(*old_model, *model, path);
  EXPECT_TRUE(test::bit_equal(old_next, next)) << path << ": the default generator moved differently";
  const int64_t bound = model_bytes(*model) + 2 * largest_tensor(path);
  EXPECT_LE(peak, bound) << path << ": 16-bit model " << model_bytes(*model) << " bytes";
  EXPECT_GT(old_peak, bound) << path << ": (the float32 path this replaces)";
}

models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 300, c.max_seq_len = 32;
  c.tied = false;
  return c;
}

TEST(WeightsLoad, LlamaBaseLoadsStraightInto16BitsBitForBit) {
  const test::ScratchDir dir("load16_llama");
  const models::LlamaConfig c = small_llama();
  auto source = models::llama(c, 3);
  // A Castor safetensors file (float32) and a Hugging Face directory (bfloat16, two shards, q/k rows permuted).
  save_safetensors(dir + "/model.safetensors", source->state_dict());
  StateDict bf16;
  for (const auto& [name, t] : source->state_dict()) bf16.emplace(name, t.to(DType::BFloat16));
  formats::HfWriteOptions o;
  o.max_shard_bytes = 200'000;
  formats::write_hf(dir + "/hf", c, bf16, o);
  const auto make = [&] { return std::static_pointer_cast<nn::Module>(models::llama(c, 7)); };
  check_loads_in_16_bits(make, dir + "/model.safetensors");
  check_loads_in_16_bits(make, dir + "/hf");
}

// A random Llama of shape c written to `dir` as a bfloat16 Hugging Face directory; returns what it wrote (its float32
// source freed).
StateDict write_bf16_llama(const std::string& dir, const models::LlamaConfig& c) {
  StateDict bf16;
  for (const auto& [name, t] : models::llama(c, 3)->state_dict()) bf16.emplace(name, t.to(DType::BFloat16));
  formats::write_hf(dir, c, bf16, {});
  return bf16;
}

// A bfloat16 Llama of shape c whose weights are placeholders that a load fills (a LoRA base's load at O1).
std::shared_ptr<models::Llama> placeholder_llama(const models::LlamaConfig& c) {
  nn::LoadInitGuard empty(DType::BFloat16, /*placeholders=*/true);
  return models::llama(c, 7);
}

// --quantize-base nf4's load (train::load_base): a bf16 Hugging Face directory filled into placeholders, each Linear
// quantized as soon as its weight is filled and its dense weight dropped. The allocator's peak stays within what the
// loaded model holds (NF4 blocks, the dense embedding, output and norms) plus four of the file's largest tensor (the
// tensor read, the weight filled, and its float32 copy for the quantizer): the loader keeps no filled placeholder (it
// kept every one, the whole bf16 base, until the load ended).
TEST(WeightsLoad, BaseQuantizedAsItIsFilledNeverHoldsItsDenseLinears) {
  const test::ScratchDir dir("load_nf4");
  models::LlamaConfig c = small_llama();
  c.dim = 256, c.n_layers = 4, c.vocab_size = 64;
  write_bf16_llama(dir + "/hf", c);
  empty_cache();
  const int64_t held = memory_stats().current_bytes;
  reset_peak_memory_stats();
  const std::shared_ptr<models::Llama> model = placeholder_llama(c);
  std::map<std::string, std::shared_ptr<nn::Linear>> pending;
  int64_t dense = 0;  // the Linears' bf16 bytes
  for (const auto& [name, layer] : nn::all_linear_layers(*model)) {
    pending.emplace(name + ".weight", layer);
    dense += layer->in_features() * layer->out_features() * 2;
  }
  formats::load_weights_into(*model, dir + "/hf", [&](const std::string& name) {
    if (const auto it = pending.find(name); it != pending.end()) {
      it->second->quantize_weight(quant::BlockType::NF4, /*double_quant=*/true);
      pending.erase(it);
      empty_cache();
    }
  });
  const int64_t peak = memory_stats().peak_bytes - held;
  EXPECT_TRUE(pending.empty());
  int64_t loaded = model_bytes(*model);
  for (const auto& [name, layer] : nn::all_linear_layers(*model)) loaded += layer->quantized->bytes();
  EXPECT_GT(dense, 5'000'000);
  EXPECT_LE(peak, loaded + 4 * largest_tensor(dir + "/hf"))
      << "peak " << peak << " bytes, loaded model " << loaded << ", dense bf16 Linears " << dense;
}

// A bf16 Hugging Face directory filled into bf16 placeholders (a LoRA base's load at O1): each placeholder takes the
// tensor read from the file as its memory, so no weight is ever held twice (before, the tensor read, the filled weight
// and copy_'s temporary: up to two of the largest tensor above the model, the 8B base's RSS high-water mark). The
// peak stays within the loaded model plus one tensor (a q/k matrix while its rows are permuted), the bits the file's.
TEST(WeightsLoad, PlaceholdersTakeTheTensorReadAsTheirMemory) {
  const test::ScratchDir dir("load_take");
  const models::LlamaConfig c = small_llama();
  const StateDict bf16 = write_bf16_llama(dir + "/hf", c);
  empty_cache();
  const int64_t held = memory_stats().current_bytes;
  reset_peak_memory_stats();
  const std::shared_ptr<models::Llama> model = placeholder_llama(c);
  formats::load_weights_into(*model, dir + "/hf");
  const int64_t peak = memory_stats().peak_bytes - held;
  EXPECT_LE(peak, model_bytes(*model) + largest_tensor(dir + "/hf")) << "16-bit model " << model_bytes(*model);
  const StateDict own = model->state_dict();
  for (const auto& [name, t] : bf16) {
    if (own.at(name).dtype() != DType::BFloat16) continue;  // (the norms, kept in float32)
    EXPECT_TRUE(test::bit_equal(own.at(name), t)) << name;
  }
}

TEST(WeightsLoad, GptBaseLoadsStraightInto16BitsFromLlmcBitForBit) {
  const test::ScratchDir dir("load16_gpt");
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 16, c.vocab_size = 128, c.bias = true;
  const auto source = models::gpt(c, 3);
  formats::write_llmc_checkpoint(dir + "/model.bin", *source);
  // (the old path read it through load_gpt_init, whose tensors load_weights_file's are)
  const auto make = [&] { return std::static_pointer_cast<nn::Module>(models::gpt(c, 7)); };
  check_loads_in_16_bits(make, dir + "/model.bin");
}

// A float32 model made under LoadInitGuard(float32) and loaded equals the drawn model loaded; a file the model does
// not match is a one-line error naming it and the tensor.
TEST(WeightsLoad, Float32LoadEqualsTheDrawnModelsAndBadFilesNameTheTensor) {
  const test::ScratchDir dir("load32");
  const models::LlamaConfig c = small_llama();
  save_safetensors(dir + "/model.safetensors", models::llama(c, 3)->state_dict());
  auto drawn = models::llama(c, 7);
  drawn->load_state_dict(load_safetensors(dir + "/model.safetensors").tensors);
  std::shared_ptr<models::Llama> empty_model;
  {
    nn::LoadInitGuard empty(DType::Float32);
    empty_model = models::llama(c, 7);
  }
  formats::load_weights_into(*empty_model, dir + "/model.safetensors");
  expect_same_state(*drawn, *empty_model, "float32");
  models::LlamaConfig other = c;
  other.n_layers = 3;
  auto bigger = models::llama(other, 7);
  test::expect_error([&] { formats::load_weights_into(*bigger, dir + "/model.safetensors"); },
                     {dir + "/model.safetensors", "gives no layers.2."});
  other = c, other.dim = 32, other.n_heads = 2, other.n_kv_heads = 1;
  auto narrower = models::llama(other, 7);
  test::expect_error([&] { formats::load_weights_into(*narrower, dir + "/model.safetensors"); },
                     {dir + "/model.safetensors", "has shape"});
}

// sample --init of a bfloat16 Hugging Face directory: the model is held once in bfloat16 (norms in float32) and runs
// there; the allocator's peak over the whole sample, load included, at most 1.1x the 16-bit weights plus the KV cache.
TEST(WeightsLoad, SampleOfABfloat16HfDirectoryHoldsItsWeightsOnce) {
  const std::string tokens = std::string(CASTOR_SOURCE_DIR) + "/data/brown-char";
  ASSERT_TRUE(file_exists(tokens + "/train.bin")) << "run scripts/setup.sh";
  const test::ScratchDir dir("load16_sample");
  models::LlamaConfig c;
  c.dim = 256, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 2, c.max_seq_len = 64, c.tied = false;
  c.vocab_size = data::Tokenizer::load(tokens).vocab_size();
  auto source = models::llama(c, 3);
  StateDict bf16;
  int64_t weights = 0;
  for (const auto& [name, t] : source->state_dict()) {
    bf16.emplace(name, t.to(DType::BFloat16));
    weights += 2 * t.numel();
  }
  formats::write_hf(dir + "/hf", c, bf16, {});
  const int64_t cache = 2 * c.n_layers * c.max_seq_len * c.kv_heads() * c.head_size() * 2;  // keys, values in bf16
  train::SampleConfig s;
  s.init = dir + "/hf", s.tokenizer_dir = tokens, s.prompt = "The ", s.tokens = 20, s.cached_window = true;
  std::string text;
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory_stats();
  train::run_sample(s, [&](std::string_view piece) { text += piece; });
  const int64_t peak = memory_stats().peak_bytes - before;
  EXPECT_LE(static_cast<double>(peak), 1.1 * static_cast<double>(weights) + static_cast<double>(cache))
      << "weights " << weights << " bytes, cache " << cache;
  EXPECT_GT(text.size(), 4u);
}

}  // namespace
}  // namespace castor
