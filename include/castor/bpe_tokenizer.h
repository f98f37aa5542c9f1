// llama2.c's tokenizer: a byte-fallback BPE vocabulary (pieces and scores, as tokenizer.bin holds them), the
// tokenizer.bin file, and encoding and decoding exactly as llama2.c's run.c does.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace castor::data {

// A vocabulary as llama2.c's tokenizer.bin holds it: pieces with sentencepiece's U+2581 written as ' ', <s> as
// "\n<s>\n" and </s> as "\n</s>\n" (tokenizer.py's export), byte pieces as "<0x41>". run.c fixes ids 1 (<s>) and
// 2 (</s>) and takes id 3 + b for byte b.
struct BpeVocabulary {
  static constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kFirstByte = 3;
  std::vector<std::string> pieces;
  std::vector<float> scores;  // one per piece
  int64_t size() const { return static_cast<int64_t>(pieces.size()); }
};

// The byte piece of byte b: "<0xHH>" (upper-case hex, as sentencepiece names them).
std::string byte_piece(uint8_t b);

// tokenizer.bin as llama2.c's tokenizer.py export writes it: int32 max_token_length (the longest piece's byte count),
// then per piece float32 score, int32 byte length, the bytes (little-endian, as on every machine run.c runs on).
std::vector<uint8_t> tokenizer_bin_bytes(const BpeVocabulary& vocab);
void write_tokenizer_bin(const std::string& path, const BpeVocabulary& vocab);
// Reads tokenizer.bin: the file ends after its last piece (run.c reads as many pieces as the model's vocabulary;
// this file records none, so its pieces are counted). One-line castor::Error naming `what` when the file is
// truncated, a length is negative, max_token_length is shorter than a piece (run.c's buffers would overflow), a piece
// holds a NUL byte (run.c's C strings would cut it) or two pieces are the same (run.c's lookup would be ambiguous).
BpeVocabulary parse_tokenizer_bin(std::span<const uint8_t> bytes, const std::string& what);
BpeVocabulary read_tokenizer_bin(const std::string& path);

// run.c's encode and decode over a vocabulary of at most 65,536 pieces.
class BpeTokenizer {
 public:
  // castor::Error on fewer than 259 pieces (3 special and 256 bytes), more than 65,536, or mismatched scores.
  explicit BpeTokenizer(BpeVocabulary vocab);

  // run.c's encode(text, bos, eos): <s> when `bos`; then, for a non-empty text, the piece " " (sentencepiece's dummy
  // prefix; left out when the vocabulary has none, where run.c would write id -1); each UTF-8 character as its piece,
  // or its bytes as byte pieces; then, repeatedly, the adjacent pair whose joined string is the piece with the
  // highest score (above -1e10; the leftmost of equals) becomes that piece, until no pair joins to a piece; </s>
  // when `eos`. Any bytes encode (a NUL byte, which ends run.c's C string, becomes <0x00>). A priority queue makes it
  // O(n log n), and a vocabulary whose pieces never hold a space after another byte (any this trainer learns) merges
  // each word on its own, cached; the result is run.c's, token for token. Not thread-safe (the caches).
  void encode(std::string_view text, bool bos, bool eos, std::vector<uint16_t>& out) const;
  std::vector<uint16_t> encode(std::string_view text, bool bos, bool eos) const;
  // run.c's decode(prev_token, token): the piece, less its leading space after <s>; a byte piece "<0xHH>" as that
  // byte. <s> itself is empty (run.c prints a sequence from the token after it, and stops on a sampled one).
  std::string decode_piece(int32_t prev, uint16_t token) const;
  // The pieces of `tokens` one after another, each decoded after the one before it (the first after none):
  // decode(encode(text, true, false)) == text for any bytes, with a vocabulary that holds " ".
  std::string decode(std::span<const uint16_t> tokens) const;

  const BpeVocabulary& vocabulary() const { return vocab_; }
  int64_t vocab_size() const { return vocab_.size(); }
  // The id of `piece`, or -1 (run.c's str_lookup).
  int32_t lookup(std::string_view piece) const;

 private:
  int32_t merged(uint16_t left, uint16_t right) const;                         // the piece left + right joins to, or -1
  void append_chars(std::string_view text, std::vector<uint16_t>& tok) const;  // run.c's first tokens of text
  void merge_pairs(std::vector<uint16_t>& tok) const;  // run.c's merge loop, with a priority queue
  BpeVocabulary vocab_;
  std::unordered_map<std::string, int32_t> ids_;          // piece -> id
  std::array<int32_t, 128> ascii_ids_;                    // the id of each one-byte piece below 0x80, or -1
  mutable std::unordered_map<uint32_t, int32_t> merges_;  // (left << 16 | right) -> merged id or -1, filled lazily
  // No piece holds a space after another byte: a text's words (cut before each space that follows another byte)
  // merge on their own, and each word's tokens are cached.
  bool word_wise_ = false;
  mutable std::unordered_map<std::string, std::vector<uint16_t>> words_;
};

}  // namespace castor::data
