// GGUF v3 files (ggml docs/gguf.md) of Castor's Llamas and GPTs with their tokenizers, and ggml's Q8_0 blocks.
#include "castor/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "castor/chat_data.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "castor/functional.h"
#include "castor/hf.h"
#include "castor/json.h"
#include "castor/quant.h"

namespace castor::formats {

using models::GPTConfig;
using models::Llama;
using models::LlamaConfig;

namespace {

constexpr uint32_t kAlignment = 32;

// GGUF's value types (gguf.md, gguf_type) that these files use.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };
// llama.cpp's token types (llama_token_type).
enum : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

using quant::BlockType;

bool is_quantized(BlockType t) { return t != BlockType::F32 && t != BlockType::F16 && t != BlockType::BF16; }

// llama-quantize's file types without an importance matrix (llama_ftype; src/llama-quant.cpp's mixes, in its
// branch order: a row's attn_v, ffn_down and attn_output rules).
constexpr GgufPick kNever = GgufPick::Never, kAlways = GgufPick::Always, kMoreBits = GgufPick::MoreBits;
const GgufFileType kFileTypes[] = {
    {"f32", 0, BlockType::F32, {}, {}, {}},
    {"f16", 1, BlockType::F16, {}, {}, {}},
    {"bf16", 32, BlockType::BF16, {}, {}, {}},
    {"q8_0", 7, BlockType::Q8_0, {}, {}, {}},
    {"q4_0", 2, BlockType::Q4_0, {}, {}, {}},
    {"q4_1", 3, BlockType::Q4_1, {}, {}, {}},
    {"q5_0", 8, BlockType::Q5_0, {}, {}, {}},
    {"q5_1", 9, BlockType::Q5_1, {}, {}, {}},
    {"q2_k",
     10,
     BlockType::Q2_K,
     {GgufPick::Gqa4, BlockType::Q4_K, BlockType::Q3_K},
     {kAlways, BlockType::Q3_K},
     {kAlways, BlockType::Q3_K}},
    {"q3_k_s", 11, BlockType::Q3_K, {}, {}, {}},
    {"q3_k_m",
     12,
     BlockType::Q3_K,
     {GgufPick::FirstTwo, BlockType::Q5_K, BlockType::Q4_K},
     {GgufPick::FirstSixteenth, BlockType::Q5_K, BlockType::Q4_K},
     {kAlways, BlockType::Q4_K}},
    {"q3_k_l", 13, BlockType::Q3_K, {kAlways, BlockType::Q5_K}, {kAlways, BlockType::Q5_K}, {kAlways, BlockType::Q5_K}},
    {"q4_k_s",
     14,
     BlockType::Q4_K,
     {GgufPick::FirstFour, BlockType::Q5_K},
     {GgufPick::FirstEighth, BlockType::Q5_K},
     {}},
    {"q4_k_m", 15, BlockType::Q4_K, {kMoreBits, BlockType::Q6_K}, {kMoreBits, BlockType::Q6_K}, {}},
    {"q5_k_s", 16, BlockType::Q5_K, {}, {}, {}},
    {"q5_k_m", 17, BlockType::Q5_K, {kMoreBits, BlockType::Q6_K}, {kMoreBits, BlockType::Q6_K}, {}},
    {"q6_k", 18, BlockType::Q6_K, {}, {}, {}},
};
// llama-quantize's other names of rows.
const std::pair<const char*, const char*> kFileTypeAliases[] = {
    {"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"}};

// Whether `rule` picks layer i of n (a model with `gqa` query heads per key-value head), and the type it gives.
BlockType mixed(const GgufMixRule& rule, BlockType base, int64_t i, int64_t n, int64_t gqa) {
  bool yes = false;
  switch (rule.pick) {
    case GgufPick::Never: return base;
    case GgufPick::Always: yes = true; break;
    case GgufPick::MoreBits: yes = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; break;  // use_more_bits
    case GgufPick::FirstTwo: yes = i < 2; break;
    case GgufPick::FirstFour: yes = i < 4; break;
    case GgufPick::FirstEighth: yes = i < n / 8; break;
    case GgufPick::FirstSixteenth: yes = i < n / 16; break;
    case GgufPick::Gqa4: yes = gqa >= 4; break;
  }
  return yes ? rule.yes : rule.no == BlockType::F32 ? base : rule.no;
}

// tensor_type_fallback: a type whose block does not divide the row width `cols`.
BlockType fallback(BlockType t, int64_t cols) {
  if (cols % quant::block_type(t).block == 0) return t;
  const BlockType f = t == BlockType::Q2_K || t == BlockType::Q3_K ? BlockType::Q4_0
                      : t == BlockType::Q4_K                       ? BlockType::Q5_0
                      : t == BlockType::Q5_K                       ? BlockType::Q5_1
                      : t == BlockType::Q6_K                       ? BlockType::Q8_0
                                                                   : t;
  return cols % quant::block_type(f).block == 0 ? f : BlockType::F16;
}

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) {  // little-endian, as on every machine Castor builds for
  put_bytes(out, &v, sizeof v);
}
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

// A GGUF file being assembled: key-value pairs in order, then tensors (their data padded to the alignment).
class GgufFile {
 public:
  // `type_of`: a tensor's block type from its name and ggml dims.
  using TypeOf = std::function<BlockType(const std::string& name, const std::vector<int64_t>& ne)>;
  explicit GgufFile(TypeOf type_of) : type_of_(std::move(type_of)) {}
  void u32(const std::string& key, uint32_t v) { head(key, kU32), put(kv_, v); }
  void f32(const std::string& key, float v) { head(key, kF32), put(kv_, v); }
  void boolean(const std::string& key, bool v) { head(key, kBool), put<uint8_t>(kv_, v ? 1 : 0); }
  void string(const std::string& key, std::string_view v) { head(key, kString), put_string(kv_, v); }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    array_head(key, kString, v.size());
    for (const std::string& s : v) put_string(kv_, s);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    array_head(key, kF32, v.size());
    for (float x : v) put(kv_, x);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    array_head(key, kI32, v.size());
    for (int32_t x : v) put(kv_, x);
  }

  // `t` (1-D, or 2-D [rows, columns] as PyTorch holds a Linear's weight) in blocks of its type along its rows (the
  // block-type table's quantizer: ggml's reference quantizers, Castor's round-to-nearest-even float conversions).
  void tensor(const std::string& name, const Tensor& t) {
    CASTOR_ASSERT(t.dim() == 1 || t.dim() == 2, name, ": a ", t.dim(), "-d tensor");
    const Tensor f = t.detach().to(DType::Float32).contiguous();
    std::vector<int64_t> ne;
    for (int64_t d = f.dim() - 1; d >= 0; --d) ne.push_back(f.size(d));  // innermost first
    const BlockType type = type_of_(name, ne);
    Info info{name, std::vector<uint64_t>(ne.begin(), ne.end()), static_cast<uint32_t>(type), {}};
    const quant::BlockTypeInfo& q = quant::block_type(type);
    const int64_t cols = f.size(-1), rows = f.numel() / cols;
    const int64_t row_bytes = quant::row_bytes(type, cols);
    const std::vector<float> x = f.to_vector<float>();
    info.data.resize(static_cast<size_t>(row_bytes * rows));
    std::vector<float> back(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      q.quantize(x.data() + r * cols, info.data.data() + r * row_bytes, cols);
      if (type == quant::BlockType::F32 || type == quant::BlockType::F16 || type == quant::BlockType::BF16) continue;
      q.dequantize(info.data.data() + r * row_bytes, back.data(), cols);
      for (int64_t j = 0; j < cols; ++j)
        max_error_ = std::max(max_error_, static_cast<double>(std::fabs(x[r * cols + j] - back[j])));
    }
    ++tensor_types_[ggml_type_name(info.type)];
    tensors_.push_back(std::move(info));
  }

  // The whole file: header, key-value pairs, tensor infos, padding, data.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    put_bytes(out, "GGUF", 4);
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kv_count_);
    put_bytes(out, kv_.data(), kv_.size());
    uint64_t offset = 0;
    for (const Info& t : tensors_) {
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t n : t.ne) put(out, n);
      put(out, t.type);
      put(out, offset);
      offset += padded(t.data.size());
    }
    out.resize(padded(out.size()), 0);
    for (const Info& t : tensors_) {
      put_bytes(out, t.data.data(), t.data.size());
      out.resize(padded(out.size()), 0);
    }
    return out;
  }
  int64_t tensor_count() const { return static_cast<int64_t>(tensors_.size()); }
  double max_error() const { return max_error_; }
  const std::map<std::string, int64_t>& tensor_types() const { return tensor_types_; }

 private:
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  static uint64_t padded(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
  void head(const std::string& key, uint32_t type) {
    put_string(kv_, key);
    put(kv_, type);
    ++kv_count_;
  }
  void array_head(const std::string& key, uint32_t elem, size_t n) {
    head(key, kArray);
    put(kv_, elem);
    put<uint64_t>(kv_, n);
  }
  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  std::vector<Info> tensors_;
  TypeOf type_of_;
  double max_error_ = 0;
  std::map<std::string, int64_t> tensor_types_;
};

// llama-quantize's choice of each tensor's type in a file of `type` of a model of `shape`.
GgufFile::TypeOf mix_of(const GgufFileType& type, const GgufModelShape& shape) {
  return [&type, shape](const std::string& name, const std::vector<int64_t>& ne) {
    return gguf_tensor_type(type, name, ne, shape);
  };
}

// general.* and tokenizer.ggml.* keys.
void put_general(GgufFile& f, const std::string& arch, const std::string& name, const GgufFileType& type) {
  f.string("general.architecture", arch);
  f.string("general.name", name);
  f.u32("general.alignment", kAlignment);
  f.u32("general.file_type", type.ftype);
  if (is_quantized(type.base)) f.u32("general.quantization_version", 2);  // ggml's GGML_QNT_VERSION
}
void put_vocabulary(GgufFile& f, const GgufVocabulary& v) {
  f.string("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) f.string("tokenizer.ggml.pre", v.pre);
  f.strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) f.f32s("tokenizer.ggml.scores", v.scores);
  f.i32s("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) f.strings("tokenizer.ggml.merges", v.merges);
  if (v.bos >= 0) f.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  if (v.eos >= 0) f.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  if (v.unk >= 0) f.u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(v.unk));
  if (v.pad >= 0) f.u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(v.pad));
  if (v.eot >= 0) f.u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(v.eot));
  f.boolean("tokenizer.ggml.add_bos_token", v.add_bos);
  f.boolean("tokenizer.ggml.add_eos_token", false);
  if (v.model == "llama") f.boolean("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (!v.chat_template.empty()) f.string("tokenizer.chat_template", v.chat_template);
}

GgufSummary write(const std::string& path, const GgufFile& f, const std::string& arch) {
  const std::vector<uint8_t> bytes = f.bytes();
  atomic_write_file(path, std::span<const uint8_t>(bytes));
  return {arch, f.tensor_count(), bytes.size(), f.max_error(), f.tensor_types()};
}

std::string text_of(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

// llama2.c's vocabulary as SentencePiece's: ' ' back to U+2581, <s> and </s> without tokenizer.py's newlines.
GgufVocabulary spm_vocabulary(const data::BpeVocabulary& bpe, const std::string& what) {
  GgufVocabulary v;
  v.model = "llama";
  v.scores = bpe.scores;
  std::set<std::string> seen;
  for (int64_t id = 0; id < bpe.size(); ++id) {
    std::string piece;
    int32_t type = kNormal;
    if (id == data::BpeVocabulary::kUnk) {
      piece = "<unk>", type = kUnknown;
    } else if (id == data::BpeVocabulary::kBos || id == data::BpeVocabulary::kEos) {
      piece = id == data::BpeVocabulary::kBos ? "<s>" : "</s>", type = kControl;
    } else {
      for (char ch : bpe.pieces[id]) piece += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
      if (id >= data::BpeVocabulary::kFirstByte && id < data::BpeVocabulary::kFirstByte + 256 &&
          bpe.pieces[id] == data::byte_piece(static_cast<uint8_t>(id - data::BpeVocabulary::kFirstByte)))
        type = kByte;
    }
    CASTOR_CHECK(seen.insert(piece).second, what, ": piece ", id, " '", printable(piece),
                 "' is another piece once spaces are written as U+2581; GGUF's tokenizer would confuse them");
    v.tokens.push_back(std::move(piece));
    v.types.push_back(type);
  }
  v.bos = data::BpeVocabulary::kBos, v.eos = data::BpeVocabulary::kEos, v.unk = data::BpeVocabulary::kUnk;
  v.add_bos = true;  // run.c's encode and castor sample put <s> first
  v.add_space_prefix = std::find(bpe.pieces.begin(), bpe.pieces.end(), " ") != bpe.pieces.end();
  return v;
}

// GPT-2's encoder.json (token -> id, byte-level characters) and vocab.bpe (a version line, then "a b" merges).
GgufVocabulary gpt2_vocabulary(const std::string& dir, int64_t size) {
  GgufVocabulary v;
  v.model = "gpt2", v.pre = "gpt-2";
  const std::string enc_path = dir + "/encoder.json", merges_path = dir + "/vocab.bpe";
  const Json enc = Json::parse(text_of(read_file(enc_path)));
  CASTOR_CHECK(enc.is_object() && static_cast<int64_t>(enc.as_object().size()) == size, enc_path,
               ": expected the tokenizer's ", size, " tokens");
  v.tokens.resize(size);
  for (const auto& [token, id] : enc.as_object()) {
    CASTOR_CHECK(id.is_int() && id.as_int() >= 0 && id.as_int() < size && v.tokens[id.as_int()].empty(), enc_path,
                 ": the id of '", printable(token), "' is not a new id below ", size);
    v.tokens[id.as_int()] = token;
  }
  v.types.assign(size, kNormal);
  v.types[data::Gpt2Tokenizer::kEot] = kControl;
  const std::string merges = text_of(read_file(merges_path));
  size_t pos = merges.find('\n');
  while (pos != std::string::npos && pos + 1 < merges.size()) {
    const size_t end = merges.find('\n', pos + 1);
    std::string line = merges.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) v.merges.push_back(std::move(line));
    pos = end;
  }
  v.bos = v.eos = data::Gpt2Tokenizer::kEot;
  return v;
}

// A Hugging Face tokenizer.json as convert_hf_to_gguf.py writes one: byte-level BPE as "gpt2" with its tokens (the
// byte-level strings), types and merges, the pre-tokenizer named by its split regex (llama.cpp's converter recognises
// it by hashing the encodings of a probe text; each name stands for one regex: "llama-bpe" Llama 3's, "qwen2"
// Qwen2's); SentencePiece-style BPE (byte fallback, U+2581) as "llama" with scores that make llama.cpp's
// highest-score-first merging Hugging Face's lowest-rank-first: a token's score is minus the rank of the first merge
// that makes it (the converter's LlamaHfVocab writes -1000 for every token, which does not), or the scores a GGUF
// file's tokenizer came with (gguf_tokenizer's model.gguf_scores). Added tokens are
// control (special) or user-defined; ids past the tokenizer up to `size` (a model's padded vocabulary) are
// "[PADn]", unused.
GgufVocabulary hf_vocabulary(const data::Tokenizer& tok, int64_t size) {
  const data::HfTokenizer::Layout l = tok.hf()->layout();
  const std::string& what = tok.hf_path();
  GgufVocabulary v;
  const auto n = static_cast<int64_t>(l.tokens.size());
  CASTOR_CHECK(size == 0 || size >= n, what, ": ", n, " tokens, more than the model's vocabulary of ", size);
  if (l.byte_level) {
    CASTOR_CHECK(l.split_digits == 3 || l.split_digits == 1, what,
                 ": a byte-level tokenizer without Llama 3's or Qwen2's split regex; no tokenizer.ggml.pre of "
                 "llama.cpp is known to match it");
    v.model = "gpt2", v.pre = l.split_digits == 3 ? "llama-bpe" : "qwen2";
    for (const auto& m : l.merges) v.merges.push_back(l.tokens[m[0]] + " " + l.tokens[m[1]]);
  } else {
    v.model = "llama";
    v.scores.assign(static_cast<size_t>(std::max(size, n)), 0.0f);
    std::vector<bool> made(l.tokens.size(), false);
    if (!l.scores.empty())  // (a GGUF file's own: written back as they were)
      std::copy(l.scores.begin(), l.scores.end(), v.scores.begin());
    else
      for (size_t r = 0; r < l.merges.size(); ++r)
        if (!made[l.merges[r][2]]) made[l.merges[r][2]] = true, v.scores[l.merges[r][2]] = -static_cast<float>(r);
    v.add_space_prefix = l.prepends_space;
  }
  for (int64_t id = 0; id < std::max(size, n); ++id) {
    const uint8_t kind = id < n ? l.kind[id] : 0;
    if (kind == 0) {
      v.tokens.push_back(detail::cat("[PAD", id, "]"));
      v.types.push_back(kUnused);
      continue;
    }
    const std::string& t = l.tokens[id];
    v.tokens.push_back(t);
    const bool byte = !l.byte_level && t.size() == 6 && t.starts_with("<0x") && t.back() == '>';
    v.types.push_back(kind == 3               ? kControl
                      : kind == 2             ? kUserDefined
                      : l.unk && *l.unk == id ? kUnknown
                      : byte                  ? kByte
                                              : kNormal);
  }
  if (l.unk) v.unk = *l.unk;
  // The special ids and the template: tokenizer_config.json's (castor/chat_data.h reads them for chat data too).
  const data::ChatTokenizer ct = data::chat_tokenizer(tok, /*need_template=*/false);
  const std::vector<uint32_t>& prefix = tok.hf()->prefix_ids();
  v.add_bos = !prefix.empty();
  if (!ct.bos_token.empty())
    if (const auto id = tok.hf()->token_id(ct.bos_token)) v.bos = *id;
  if (v.bos < 0 && v.add_bos) v.bos = prefix.front();
  v.eos = ct.eos_id, v.eot = ct.eot_id, v.pad = ct.pad_id;
  v.chat_template = ct.chat_template;
  return v;
}

// llama3 rope scaling as llama.cpp runs it: pair k's angle divided by rope_freqs[k] (convert_hf_to_gguf.py's
// LlamaModel writes this table and no rope scaling key): 1 for short wavelengths, factor for long ones, between them
// 1 / ((1 - s) / factor + s), the same inverse frequency as modeling_rope_utils' smoothing.
Tensor llama3_rope_factors(const LlamaConfig& c) {
  const F::RopeScaling& r = c.rope_scaling;
  const int64_t d = c.head_size();
  const double orig = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = orig / r.low_freq_factor, high_wavelen = orig / r.high_freq_factor;
  std::vector<double> factors;
  for (int64_t k = 0; k < d / 2; ++k) {
    const double inv = std::pow(c.rope_theta, -2.0 * static_cast<double>(k) / static_cast<double>(d));
    const double wavelen = 2 * M_PI / inv;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0);
    } else if (wavelen > low_wavelen) {
      factors.push_back(r.factor);
    } else {
      const double smooth = (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      factors.push_back(1.0 / ((1 - smooth) / r.factor + smooth));
    }
  }
  return tensor(factors, {d / 2});
}

// The rows of a layout that name a layer's tensors.
std::vector<TensorName> layer_rows(const std::vector<TensorName>& layout) {
  std::vector<TensorName> rows;
  for (const TensorName& row : layout)
    if (std::string_view(row.castor).find("{i}") != std::string_view::npos) rows.push_back(row);
  return rows;
}
// `pattern`'s "{i}" as layer i.
std::string at_layer(const char* pattern, int64_t i) {
  std::string s = pattern;
  s.replace(s.find("{i}"), 3, std::to_string(i));
  return s;
}

}  // namespace

const std::vector<TensorName>& gguf_llama_layout() {
  static const std::vector<TensorName> layout = {
      {"tok_embeddings.weight", "token_embd.weight"},
      {"layers.{i}.attention_norm.weight", "blk.{i}.attn_norm.weight"},
      {"layers.{i}.attention.wq.weight", "blk.{i}.attn_q.weight"},
      {"layers.{i}.attention.wq.bias", "blk.{i}.attn_q.bias"},
      {"layers.{i}.attention.wk.weight", "blk.{i}.attn_k.weight"},
      {"layers.{i}.attention.wk.bias", "blk.{i}.attn_k.bias"},
      {"layers.{i}.attention.wv.weight", "blk.{i}.attn_v.weight"},
      {"layers.{i}.attention.wv.bias", "blk.{i}.attn_v.bias"},
      {"layers.{i}.attention.wo.weight", "blk.{i}.attn_output.weight"},
      {"layers.{i}.attention.wo.bias", "blk.{i}.attn_output.bias"},
      {"layers.{i}.ffn_norm.weight", "blk.{i}.ffn_norm.weight"},
      {"layers.{i}.feed_forward.w1.weight", "blk.{i}.ffn_gate.weight"},  // w1 the gate, w3 up, w2 down
      {"layers.{i}.feed_forward.w1.bias", "blk.{i}.ffn_gate.bias"},
      {"layers.{i}.feed_forward.w3.weight", "blk.{i}.ffn_up.weight"},
      {"layers.{i}.feed_forward.w3.bias", "blk.{i}.ffn_up.bias"},
      {"layers.{i}.feed_forward.w2.weight", "blk.{i}.ffn_down.weight"},
      {"layers.{i}.feed_forward.w2.bias", "blk.{i}.ffn_down.bias"},
      {"norm.weight", "output_norm.weight"},
      {"output.weight", "output.weight"}};
  return layout;
}

const std::vector<TensorName>& gguf_gpt_layout() {
  static const std::vector<TensorName> layout = {
      {"transformer.wte.weight", "token_embd.weight"},
      {"transformer.wpe.weight", "position_embd.weight"},
      {"transformer.h.{i}.ln_1.weight", "blk.{i}.attn_norm.weight"},
      {"transformer.h.{i}.ln_1.bias", "blk.{i}.attn_norm.bias"},
      {"transformer.h.{i}.attn.c_attn.weight", "blk.{i}.attn_qkv.weight"},
      {"transformer.h.{i}.attn.c_attn.bias", "blk.{i}.attn_qkv.bias"},
      {"transformer.h.{i}.attn.c_proj.weight", "blk.{i}.attn_output.weight"},
      {"transformer.h.{i}.attn.c_proj.bias", "blk.{i}.attn_output.bias"},
      {"transformer.h.{i}.ln_2.weight", "blk.{i}.ffn_norm.weight"},
      {"transformer.h.{i}.ln_2.bias", "blk.{i}.ffn_norm.bias"},
      {"transformer.h.{i}.mlp.c_fc.weight", "blk.{i}.ffn_up.weight"},
      {"transformer.h.{i}.mlp.c_fc.bias", "blk.{i}.ffn_up.bias"},
      {"transformer.h.{i}.mlp.c_proj.weight", "blk.{i}.ffn_down.weight"},
      {"transformer.h.{i}.mlp.c_proj.bias", "blk.{i}.ffn_down.bias"},
      {"transformer.ln_f.weight", "output_norm.weight"},
      {"transformer.ln_f.bias", "output_norm.bias"}};  // (lm_head: tied to wte, llama.cpp reuses token_embd)
  return layout;
}

std::span<const GgufFileType> gguf_file_types() { return kFileTypes; }

const GgufFileType* find_gguf_file_type(std::string_view name) {
  for (const auto& [alias, row] : kFileTypeAliases)
    if (name == alias) name = row;
  for (const GgufFileType& t : kFileTypes)
    if (name == t.name) return &t;
  return nullptr;
}

std::vector<std::string> gguf_file_type_names() {
  std::vector<std::string> names;
  for (const GgufFileType& t : kFileTypes) names.push_back(t.name);
  for (const auto& [alias, row] : kFileTypeAliases) names.push_back(alias);
  return names;
}

BlockType gguf_tensor_type(const GgufFileType& type, const std::string& name, const std::vector<int64_t>& ne,
                           const GgufModelShape& shape) {
  // tensor_allows_quantization: 2-D weights but norms and positional embeddings.
  const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
  if (ne.size() < 2) return BlockType::F32;
  if (!weight || name.find("_norm.weight") != std::string::npos || name == "position_embd.weight")
    return is_quantized(type.base) ? BlockType::F32 : type.base;
  if (!is_quantized(type.base)) return type.base;
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  int layer = -1;
  std::sscanf(name.c_str(), "blk.%d.", &layer);
  const int64_t gqa = shape.n_kv_heads > 0 ? shape.n_heads / shape.n_kv_heads : 0;
  BlockType t = type.base;
  if (name == "output.weight" || (shape.tied && name == "token_embd.weight")) {
    t = ne[0] % quant::block_type(t).block != 0 || t == BlockType::Q8_0 ? BlockType::Q8_0 : BlockType::Q6_K;
  } else if (has("attn_qkv.weight") || has("attn_v.weight")) {
    t = mixed(type.attn_v, t, layer, shape.n_layers, gqa);
    if (shape.is_70b && (t == BlockType::Q3_K || t == BlockType::Q4_K)) t = BlockType::Q5_K;
  } else if (has("attn_output.weight") || has("ffn_down")) {
    t = mixed(has("ffn_down") ? type.ffn_down : type.attn_output, t, layer, shape.n_layers, gqa);
  }
  return fallback(t, ne[0]);
}

GgufVocabulary gguf_vocabulary(const data::Tokenizer& tok, const std::string& dir, int64_t size) {
  CASTOR_CHECK(tok.bpe() || tok.hf() || tok.kind() == "gpt2", dir, ": a ", tok.kind(),
               " vocabulary; GGUF's tokenizers (SentencePiece, byte-level BPE) cannot express it (train on a bpe, "
               "gpt2 or Hugging Face token directory to export GGUF)");
  GgufVocabulary v = tok.hf()    ? hf_vocabulary(tok, size)
                     : tok.bpe() ? spm_vocabulary(tok.bpe()->vocabulary(), dir + "/tokenizer.bin")
                                 : gpt2_vocabulary(dir, tok.vocab_size());
  const std::string what = data::token_record_path(dir);
  if (what.empty()) return v;  // a Hugging Face model directory: no record
  const Json record = data::read_tokenizer_record(dir);
  if (const Json* t = record.find("chat_template")) {
    CASTOR_CHECK(t->is_string(), what, ": chat_template is not a string");
    v.chat_template = t->as_string();
  }
  for (auto [key, id] :
       {std::pair{"eos_token_id", &v.eos}, std::pair{"eot_token_id", &v.eot}, std::pair{"pad_token_id", &v.pad}})
    if (const Json* t = record.find(key)) {
      CASTOR_CHECK(t->is_int() && t->as_int() >= 0 && t->as_int() < v.size(), what, ": ", key,
                   " is not a token id below ", v.size());
      *id = t->as_int();
    }
  return v;
}

GgufSummary write_gguf_llama(const std::string& path, const Llama& model, const GgufVocabulary& vocab,
                             const GgufFileType& type, const std::string& name, GgufArch arch, int64_t context_length) {
  const LlamaConfig& c = model.config();
  CASTOR_ASSERT(arch != GgufArch::Gpt2, path, ": a Llama written as gpt2");
  const bool qwen2 = arch == GgufArch::Qwen2;
  const std::string a = qwen2 ? "qwen2" : "llama";
  CASTOR_CHECK(vocab.size() == c.vocab_size, path, ": the tokenizer has ", vocab.size(), " tokens, the model ",
               c.vocab_size);
  // What llama.cpp's archs cannot run as Castor does: a sliding window shorter than the context (llama.cpp attends
  // to every earlier position); for qwen2, biases other than q/k/v's (it reads those three, and requires them) and
  // llama3 rope scaling.
  CASTOR_CHECK(c.sliding_window == 0 || c.sliding_window >= c.max_seq_len, path, ": the model attends through a ",
               "sliding window of ", c.sliding_window, " tokens, which llama.cpp's ", a,
               " arch does not; nothing written");
  CASTOR_CHECK(!qwen2 || (c.qkv_bias && !c.attention_bias && !c.mlp_bias), path,
               ": arch qwen2 holds q/k/v biases and no others, the model has ",
               c.attention_bias ? "q/k/v/o biases"
               : c.qkv_bias     ? "MLP biases"
                                : "no q/k/v biases",
               "; nothing written");
  CASTOR_CHECK(!qwen2 || c.rope_scaling.type != F::RopeScaling::Type::Llama3, path,
               ": arch qwen2 has no llama3 rope scaling; nothing written");
  const GgufModelShape shape{c.n_layers, c.n_heads, c.kv_heads(), c.tied,
                             c.n_layers == 80 && (qwen2 || c.n_heads != c.kv_heads())};  // llama.cpp's LLM_TYPE_70B
  GgufFile f(mix_of(type, shape));
  put_general(f, a, name, type);
  const auto key = [&](const char* k) { return a + "." + k; };
  f.u32(key("context_length"), static_cast<uint32_t>(context_length > 0 ? context_length : c.max_seq_len));
  f.u32(key("embedding_length"), static_cast<uint32_t>(c.dim));
  f.u32(key("block_count"), static_cast<uint32_t>(c.n_layers));
  f.u32(key("feed_forward_length"), static_cast<uint32_t>(c.ffn_hidden_dim()));
  f.u32(key("rope.dimension_count"), static_cast<uint32_t>(c.head_size()));
  if (c.head_size() * c.n_heads != c.dim) {  // a head size other than dim / heads (Hugging Face's head_dim)
    f.u32(key("attention.key_length"), static_cast<uint32_t>(c.head_size()));
    f.u32(key("attention.value_length"), static_cast<uint32_t>(c.head_size()));
  }
  if (c.rope_scaling.type == F::RopeScaling::Type::Linear) {
    f.string(key("rope.scaling.type"), "linear");
    f.f32(key("rope.scaling.factor"), static_cast<float>(c.rope_scaling.factor));
  }
  f.u32(key("attention.head_count"), static_cast<uint32_t>(c.n_heads));
  f.u32(key("attention.head_count_kv"), static_cast<uint32_t>(c.kv_heads()));
  f.f32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.norm_eps));
  f.f32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  f.u32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
  put_vocabulary(f, vocab);
  const StateDict s = model.state_dict();
  const std::vector<TensorName>& names = gguf_llama_layout();
  f.tensor(file_name(names, "tok_embeddings.weight"), s.at("tok_embeddings.weight"));
  // qwen2 rotates pairs (k, k + D/2) (llama.cpp's NEOX rope): wq's and wk's rows (and biases) back to that layout.
  const auto rows = [&](const std::string& castor_name, const Tensor& t) {
    const bool q = castor_name.find(".wq.") != std::string::npos, k = castor_name.find(".wk.") != std::string::npos;
    return qwen2 && (q || k) ? formats::permute_rows(t, q ? c.n_heads : c.kv_heads(), /*to_castor=*/false) : t;
  };
  for (int64_t i = 0; i < c.n_layers; ++i)
    for (const TensorName& row : layer_rows(names)) {  // a bias (attention_bias, qkv_bias, mlp_bias) where it is one
      const std::string name = at_layer(row.castor, i);
      if (auto t = s.find(name); t != s.end()) f.tensor(at_layer(row.file, i), rows(name, t->second));
    }
  f.tensor(file_name(names, "norm.weight"), s.at("norm.weight"));
  if (!c.tied) f.tensor(file_name(names, "output.weight"), s.at("output.weight"));  // tied: reuses token_embd
  if (c.rope_scaling.type == F::RopeScaling::Type::Llama3) f.tensor(kGgufRopeFreqs, llama3_rope_factors(c));
  return write(path, f, a);
}

GgufSummary write_gguf_lora(const std::string& path, const LlamaConfig& c, GgufArch arch, const StateDict& adapters,
                            double alpha, const GgufFileType& type, const std::string& name) {
  CASTOR_CHECK(!is_quantized(type.base) || type.base == BlockType::Q8_0, path, ": --type ", type.name,
               ": an adapter is written f32, f16, bf16 or q8_0 (convert_lora_to_gguf.py's types)");
  const bool qwen2 = arch == GgufArch::Qwen2;
  const std::string a = qwen2 ? "qwen2" : arch == GgufArch::Gpt2 ? "gpt2" : "llama";
  const std::vector<TensorName>& names = arch == GgufArch::Gpt2 ? gguf_gpt_layout() : gguf_llama_layout();
  // Each matrix in the type, or float16 where its rows are not whole blocks (lora_b's rows of r values, as the
  // converter falls back).
  GgufFile f([&type](const std::string&, const std::vector<int64_t>& ne) { return fallback(type.base, ne[0]); });
  put_general(f, a, name, type);
  f.string("general.type", "adapter");
  f.string("adapter.type", "lora");
  f.f32("adapter.lora.alpha", static_cast<float>(alpha));
  for (const auto& [key, t] : adapters) {  // "<path>.lora_A.weight" (r, in), "<path>.lora_B.weight" (out, r)
    const size_t at = key.rfind(".lora_");
    const bool b = key.ends_with(".lora_B.weight");
    CASTOR_ASSERT(at != std::string::npos && (b || key.ends_with(".lora_A.weight")), key);
    const std::string weight = key.substr(0, at) + ".weight", gguf = file_name(names, weight);
    CASTOR_CHECK(!gguf.empty(), path, ": the adapter of ", weight, " has no tensor of llama.cpp's ", a, " arch");
    // qwen2's q/k output rows in Hugging Face's rotate-half order, as the base's (write_gguf_llama).
    const bool q = weight.find(".wq.") != std::string::npos, k = weight.find(".wk.") != std::string::npos;
    const Tensor rows = qwen2 && b && (q || k) ? permute_rows(t, q ? c.n_heads : c.kv_heads(), false) : t;
    f.tensor(gguf + (b ? ".lora_b" : ".lora_a"), rows);
  }
  return write(path, f, a);
}

GgufSummary write_gguf_gpt(const std::string& path, const GPTWeights& weights, const GgufVocabulary& vocab,
                           const GgufFileType& type, const std::string& name) {
  const GPTConfig& c = weights.config;
  CASTOR_CHECK(vocab.size() <= c.vocab_size && (c.real_vocab_size == 0 || c.real_vocab_size == vocab.size()), path,
               ": the tokenizer has ", vocab.size(), " tokens, the model ",
               c.real_vocab_size ? c.real_vocab_size : c.vocab_size);
  GgufFile f(mix_of(type, {c.n_layer, c.n_head, c.n_head, /*tied=*/true, /*is_70b=*/false}));
  put_general(f, "gpt2", name, type);
  f.u32("gpt2.context_length", static_cast<uint32_t>(c.block_size));
  f.u32("gpt2.embedding_length", static_cast<uint32_t>(c.n_embd));
  f.u32("gpt2.block_count", static_cast<uint32_t>(c.n_layer));
  f.u32("gpt2.feed_forward_length", static_cast<uint32_t>(4 * c.n_embd));
  f.u32("gpt2.attention.head_count", static_cast<uint32_t>(c.n_head));
  f.f32("gpt2.attention.layer_norm_epsilon", 1e-5f);
  f.u32("gpt2.vocab_size", static_cast<uint32_t>(vocab.size()));
  put_vocabulary(f, vocab);
  const StateDict& s = weights.state;
  // A bias-free model's biases as zeros (nanoGPT's bias=False drops the LayerNorms' too).
  auto bias = [&](const std::string& key, int64_t n) {
    auto it = s.find(key);
    return it != s.end() ? it->second : zeros({n});
  };
  const std::vector<TensorName>& names = gguf_gpt_layout();
  f.tensor(file_name(names, "transformer.wte.weight"), s.at("transformer.wte.weight").narrow(0, 0, vocab.size()));
  f.tensor(file_name(names, "transformer.wpe.weight"), s.at("transformer.wpe.weight"));
  for (int64_t i = 0; i < c.n_layer; ++i)
    for (const TensorName& row : layer_rows(names)) {
      const std::string name = at_layer(row.castor, i);
      f.tensor(at_layer(row.file, i), name.ends_with(".bias")
                                          ? bias(name, s.at(name.substr(0, name.size() - 4) + "weight").size(0))
                                          : s.at(name));
    }
  f.tensor(file_name(names, "transformer.ln_f.weight"), s.at("transformer.ln_f.weight"));
  f.tensor(file_name(names, "transformer.ln_f.bias"), bias("transformer.ln_f.bias", c.n_embd));
  return write(path, f, "gpt2");  // lm_head is tied to wte: llama.cpp reuses token_embd
}

}  // namespace castor::formats
