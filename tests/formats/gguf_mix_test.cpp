// The per-tensor types of castor/gguf.h's file types against tables worked by hand from llama.cpp's
// src/llama-quant.cpp (llama_tensor_get_type_impl, tensor_type_fallback; use_more_bits(i, n): i < n/8, i >= 7n/8, or
// (i - n/8) % 3 == 2) for a 32-layer Llama-2-7B shape, a 32-layer Llama-3-8B shape (4 query heads per key-value
// head), a 24-layer Qwen2-0.5B shape (rows of 896, not whole 256-value blocks) and a 2-layer toy. GgufCli's
// QuantizedExportIsLlamaQuantizesFile checks whole files against llama.cpp's own quantizer.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "castor/gguf.h"

namespace castor::formats {
namespace {

using quant::BlockType;

const GgufFileType& type(const char* name) {
  const GgufFileType* t = find_gguf_file_type(name);
  EXPECT_NE(t, nullptr) << name;
  return *t;
}

std::string blk(int i, const char* what) { return "blk." + std::to_string(i) + "." + what + ".weight"; }

// The layers of 32 that use_more_bits picks: 0-3, 28-31, and 4 + 3k + 2.
const std::set<int> kMoreBits32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};

TEST(GgufMix, Llama2SevenBQ4KMAndQ5KM) {
  const GgufModelShape s{32, 32, 32, false, false};
  for (const char* name : {"q4_k_m", "q4_k", "q5_k_m"}) {
    SCOPED_TRACE(name);
    const GgufFileType& t = type(name);
    const BlockType base = std::string(name).starts_with("q4") ? BlockType::Q4_K : BlockType::Q5_K;
    for (int i = 0; i < 32; ++i) {
      const BlockType more = kMoreBits32.count(i) ? BlockType::Q6_K : base;
      EXPECT_EQ(gguf_tensor_type(t, blk(i, "attn_v"), {4096, 4096}, s), more) << i;
      EXPECT_EQ(gguf_tensor_type(t, blk(i, "ffn_down"), {11008, 4096}, s), more) << i;
      for (const char* other : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
        EXPECT_EQ(gguf_tensor_type(t, blk(i, other), {4096, 4096}, s), base) << i << other;
      EXPECT_EQ(gguf_tensor_type(t, blk(i, "attn_norm"), {4096}, s), BlockType::F32);
    }
    EXPECT_EQ(gguf_tensor_type(t, "output.weight", {4096, 32000}, s), BlockType::Q6_K);
    EXPECT_EQ(gguf_tensor_type(t, "token_embd.weight", {4096, 32000}, s), base);  // not tied: the base type
    EXPECT_EQ(gguf_tensor_type(t, "output_norm.weight", {4096}, s), BlockType::F32);
  }
}

TEST(GgufMix, Llama3EightBOtherMixes) {
  const GgufModelShape s{32, 32, 8, false, false};
  const auto v = [&](const char* name, int i) {
    return gguf_tensor_type(type(name), blk(i, "attn_v"), {4096, 1024}, s);
  };
  const auto down = [&](const char* name, int i) {
    return gguf_tensor_type(type(name), blk(i, "ffn_down"), {14336, 4096}, s);
  };
  const auto out = [&](const char* name, int i) {
    return gguf_tensor_type(type(name), blk(i, "attn_output"), {4096, 4096}, s);
  };
  for (int i = 0; i < 32; ++i) {
    SCOPED_TRACE(i);
    // Q2_K: attn_v Q4_K with 4 query heads per kv head, ffn_down and attn_output Q3_K, the rest Q2_K.
    EXPECT_EQ(v("q2_k", i), BlockType::Q4_K);
    EXPECT_EQ(down("q2_k", i), BlockType::Q3_K);
    EXPECT_EQ(out("q2_k", i), BlockType::Q3_K);
    EXPECT_EQ(gguf_tensor_type(type("q2_k"), blk(i, "ffn_up"), {4096, 14336}, s), BlockType::Q2_K);
    // Q3_K_M: attn_v Q5_K in the first 2 layers else Q4_K, ffn_down Q5_K in the first 32/16 = 2 else Q4_K,
    // attn_output Q4_K.
    EXPECT_EQ(v("q3_k_m", i), i < 2 ? BlockType::Q5_K : BlockType::Q4_K);
    EXPECT_EQ(down("q3_k_m", i), i < 2 ? BlockType::Q5_K : BlockType::Q4_K);
    EXPECT_EQ(out("q3_k_m", i), BlockType::Q4_K);
    EXPECT_EQ(v("q3_k", i), v("q3_k_m", i));
    // Q3_K_L: all three Q5_K; Q3_K_S: none changed.
    EXPECT_EQ(v("q3_k_l", i), BlockType::Q5_K);
    EXPECT_EQ(down("q3_k_l", i), BlockType::Q5_K);
    EXPECT_EQ(out("q3_k_l", i), BlockType::Q5_K);
    EXPECT_EQ(v("q3_k_s", i), BlockType::Q3_K);
    EXPECT_EQ(down("q3_k_s", i), BlockType::Q3_K);
    // Q4_K_S: attn_v Q5_K in the first 4 layers, ffn_down in the first 32/8 = 4.
    EXPECT_EQ(v("q4_k_s", i), i < 4 ? BlockType::Q5_K : BlockType::Q4_K);
    EXPECT_EQ(down("q4_k_s", i), i < 4 ? BlockType::Q5_K : BlockType::Q4_K);
    EXPECT_EQ(out("q4_k_s", i), BlockType::Q4_K);
    // Q5_K_S, Q6_K and the 32-value types: every matrix the base type.
    EXPECT_EQ(v("q5_k_s", i), BlockType::Q5_K);
    EXPECT_EQ(down("q6_k", i), BlockType::Q6_K);
    EXPECT_EQ(down("q4_0", i), BlockType::Q4_0);
    EXPECT_EQ(v("q5_1", i), BlockType::Q5_1);
    EXPECT_EQ(v("q8_0", i), BlockType::Q8_0);
  }
  // The output head: Q6_K for every quantized type but Q8_0 (Q4_0 included); the float types keep theirs.
  for (const char* name : {"q2_k", "q3_k_s", "q4_0", "q4_1", "q5_0", "q5_k_s", "q6_k"})
    EXPECT_EQ(gguf_tensor_type(type(name), "output.weight", {4096, 128256}, s), BlockType::Q6_K) << name;
  EXPECT_EQ(gguf_tensor_type(type("q8_0"), "output.weight", {4096, 128256}, s), BlockType::Q8_0);
  EXPECT_EQ(gguf_tensor_type(type("f16"), "output.weight", {4096, 128256}, s), BlockType::F16);
  EXPECT_EQ(gguf_tensor_type(type("bf16"), blk(3, "attn_v"), {4096, 1024}, s), BlockType::BF16);
  EXPECT_EQ(gguf_tensor_type(type("f16"), blk(3, "attn_norm"), {4096}, s), BlockType::F32);
  // A 70B (80 layers, grouped kv heads): attn_v Q3_K / Q4_K become Q5_K.
  const GgufModelShape big{80, 64, 8, false, true};
  EXPECT_EQ(gguf_tensor_type(type("q3_k_s"), blk(40, "attn_v"), {8192, 1024}, big), BlockType::Q5_K);
  EXPECT_EQ(gguf_tensor_type(type("q4_k_m"), blk(40, "attn_v"), {8192, 1024}, big), BlockType::Q5_K);  // 40: not more
  EXPECT_EQ(gguf_tensor_type(type("q4_k_m"), blk(0, "attn_v"), {8192, 1024}, big), BlockType::Q6_K);
}

// Qwen2-0.5B (24 layers, 14 heads over 2, rows of 896 = 3.5 blocks of 256, FF 4864 = 19 blocks, tied embedding):
// the fallbacks.
TEST(GgufMix, Qwen2HalfBRowsNotWholeBlocksFallBack) {
  const GgufModelShape s{24, 14, 2, true, false};
  const GgufFileType& t = type("q4_k_m");
  // use_more_bits of 24: i < 3, i >= 21, (i - 3) % 3 == 2: 5, 8, 11, 14, 17, 20.
  const std::set<int> more = {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23};
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(gguf_tensor_type(t, blk(i, "attn_q"), {896, 896}, s), BlockType::Q5_0);  // Q4_K falls back to Q5_0
    EXPECT_EQ(gguf_tensor_type(t, blk(i, "attn_v"), {896, 128}, s), more.count(i) ? BlockType::Q8_0 : BlockType::Q5_0);
    EXPECT_EQ(gguf_tensor_type(t, blk(i, "ffn_down"), {4864, 896}, s),
              more.count(i) ? BlockType::Q6_K : BlockType::Q4_K);
    EXPECT_EQ(gguf_tensor_type(t, blk(i, "ffn_up"), {896, 4864}, s), BlockType::Q5_0);
  }
  // Tied: token_embd is the output head; 896 is no whole number of Q4_K blocks: Q8_0.
  EXPECT_EQ(gguf_tensor_type(t, "token_embd.weight", {896, 151936}, s), BlockType::Q8_0);
  EXPECT_EQ(gguf_tensor_type(type("q5_k_s"), blk(0, "attn_q"), {896, 896}, s), BlockType::Q5_1);
  EXPECT_EQ(gguf_tensor_type(type("q3_k_m"), blk(9, "attn_k"), {896, 128}, s), BlockType::Q4_0);
  EXPECT_EQ(gguf_tensor_type(type("q2_k"), blk(9, "ffn_gate"), {896, 4864}, s), BlockType::Q4_0);
  EXPECT_EQ(gguf_tensor_type(type("q6_k"), blk(9, "ffn_gate"), {896, 4864}, s), BlockType::Q8_0);
  // Rows that are not whole 32-value blocks either: F16.
  EXPECT_EQ(gguf_tensor_type(type("q4_k_m"), blk(0, "attn_q"), {48, 48}, s), BlockType::F16);
  EXPECT_EQ(gguf_tensor_type(type("q8_0"), blk(0, "attn_q"), {48, 48}, s), BlockType::F16);
}

// A 2-layer toy of rows of 64 (the GgufCli runs' size): every K-quant falls back; layer 1 is use_more_bits' (1 >=
// 7 * 2 / 8), layer 0 is not. A GPT's attn_qkv counts as attn_v, its position embedding stays float32.
TEST(GgufMix, TwoLayerToyAndGpt) {
  const GgufModelShape s{2, 4, 2, true, false};
  const GgufFileType& t = type("q4_k_m");
  EXPECT_EQ(gguf_tensor_type(t, blk(0, "attn_v"), {64, 32}, s), BlockType::Q5_0);
  EXPECT_EQ(gguf_tensor_type(t, blk(1, "attn_v"), {64, 32}, s), BlockType::Q8_0);
  EXPECT_EQ(gguf_tensor_type(t, blk(0, "ffn_down"), {192, 64}, s), BlockType::Q5_0);
  EXPECT_EQ(gguf_tensor_type(t, blk(1, "ffn_down"), {192, 64}, s), BlockType::Q8_0);
  EXPECT_EQ(gguf_tensor_type(t, "token_embd.weight", {64, 300}, s), BlockType::Q8_0);
  EXPECT_EQ(gguf_tensor_type(t, "rope_freqs.weight", {8}, s), BlockType::F32);
  const GgufModelShape gpt{2, 4, 4, true, false};
  EXPECT_EQ(gguf_tensor_type(t, blk(1, "attn_qkv"), {256, 768}, gpt), BlockType::Q6_K);
  EXPECT_EQ(gguf_tensor_type(t, blk(0, "attn_qkv"), {256, 768}, gpt), BlockType::Q4_K);
  EXPECT_EQ(gguf_tensor_type(t, "position_embd.weight", {256, 1024}, gpt), BlockType::F32);
  EXPECT_EQ(gguf_tensor_type(t, blk(0, "attn_qkv") + "x", {256, 768}, gpt), BlockType::F32);  // not a weight
  EXPECT_EQ(find_gguf_file_type("q4_k_x"), nullptr);
}

}  // namespace
}  // namespace castor::formats
