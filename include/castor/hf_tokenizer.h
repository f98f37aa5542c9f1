// Hugging Face tokenizer.json: BPE models as Llama 2, Mistral and TinyLlama ship them (SentencePiece-style, byte
// fallback) and as Llama 3 and Qwen2 ship them (byte-level, regex split), encoding and decoding id for id as the
// tokenizers library (huggingface/tokenizers) does.
#pragma once
#include <cstdint>
#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace castor::data {

// The Split regex tokenizer.json files write for Llama 3 (`digits` 3: numbers in ones to threes) and Qwen2 (1).
std::string_view hf_split_regex(int digits);

// Supported components (anything else is a one-line castor::Error naming the file and the key):
//   model: BPE (vocab; merges as "a b" strings or [a, b] pairs; byte_fallback, fuse_unk, unk_token, ignore_merges)
//   normalizer: null, Sequence, Prepend, Replace (string pattern), NFC
//   pre_tokenizer: null, Sequence, Split (Llama 3's or Qwen2's regex, Isolated), ByteLevel, Metaspace
//   post_processor: null, Sequence, ByteLevel, TemplateProcessing (the single sequence's special tokens)
//   decoder: null, Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace
// added_tokens are matched in the raw text (normalized ones in each normalized stretch between them), leftmost-
// longest, with their lstrip, rstrip and single_word.
class HfTokenizer {
 public:
  struct Impl;

  // Reads PATH (a tokenizer.json); errors name it.
  static HfTokenizer from_file(const std::string& path);
  // From the file's contents; `what` names it in errors.
  HfTokenizer(std::string_view json, const std::string& what);

  // The ids of `text` (valid UTF-8, else castor::Error), as tokenizers' encode(text, add_special_tokens): with
  // `add_special`, the post-processor's tokens around them (Llama 2's and Llama 3.1's BOS). Not thread-safe: each
  // word's ids are cached.
  void encode(std::string_view text, bool add_special, std::vector<uint32_t>& out) const;
  std::vector<uint32_t> encode(std::string_view text, bool add_special) const;
  // tokenizers' decode(ids, skip_special_tokens=false): the decoder over the tokens' strings, invalid UTF-8 replaced
  // by U+FFFD as it does. castor::Error on an id with no token.
  std::string decode(std::span<const uint32_t> ids) const;
  // The bytes `id` adds to a text after `prev` (-1: at the start; after a special token, as at the start), so that
  // a sampler can print token by token: a byte token's byte itself (the concatenation is the text, UTF-8 sequences
  // split across tokens included), the decoder's leading Strip/Metaspace space only at the start, "" for a special
  // token.
  std::string decode_next(int64_t prev, uint32_t id) const;

  // Text as `castor sample` writes it, token by token: the pieces next() gives for ids and then finish() add up to
  // decode(ids) (tokenizers' decode, invalid UTF-8 replaced as it does), each piece given as soon as no later token
  // can change it. Held back: an open run of byte-fallback tokens (a later byte could make the run invalid, and then
  // each of its bytes is U+FFFD) until a token that is not a byte ends it, a byte-level UTF-8 sequence cut short
  // until the next bytes complete it or show it invalid, and the copies of a fused Strip's content at the end. A
  // special token gives what is held, finished, and nothing of its own; the text after it starts as at the start (as
  // decode of the ids after it: Strip's leading space dropped).
  class Stream {
   public:
    // `prev`: the token the text follows (-1: none; a special token: as none).
    explicit Stream(const HfTokenizer& tok, int64_t prev = -1);
    std::string next(uint32_t id);
    // What is held back, finished as the text's end; the stream then starts a new text.
    std::string finish();

   private:
    std::shared_ptr<const Impl> impl_;
    std::vector<std::string> pending_;  // tokens not yet through the decoders (an open run of byte tokens)
    std::string text_;                  // decoded bytes not yet given
    bool at_start_;
  };

  int64_t vocab_size() const;  // the highest id + 1
  std::optional<uint32_t> token_id(std::string_view token) const;
  bool is_special(uint32_t id) const;
  // The ids the post-processor puts before the text (Llama 2's BOS).
  const std::vector<uint32_t>& prefix_ids() const;

  // The vocabulary as a GGUF file's tokenizer keys hold it (castor/gguf.h): the tokens as tokenizer.json spells them
  // (the model's byte-level or U+2581 strings, an added token's content), the merges in rank order, and which
  // pre-tokenizer the text goes through.
  struct Layout {
    bool byte_level = false;          // a ByteLevel pre-tokenizer (Llama 3, Qwen2); else SentencePiece-style (Llama 2)
    int split_digits = 0;             // the Split regex: 3 Llama 3's, 1 Qwen2's, 0 none
    bool nfc = false;                 // an NFC normalizer (Qwen2)
    bool prepends_space = false;      // a Prepend normalizer or a prepending Metaspace: SentencePiece's dummy prefix
    std::vector<std::string> tokens;  // id -> token ("" for an id with none)
    std::vector<uint8_t> kind;        // id -> 0 none, 1 the model's, 2 added, 3 added and special
    std::vector<std::array<uint32_t, 3>> merges;  // in rank order: left, right, merged
    std::vector<float> scores;  // id -> score: a GGUF SentencePiece vocabulary's, merged by them (else empty)
    std::optional<uint32_t> unk;
  };
  Layout layout() const;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace castor::data
