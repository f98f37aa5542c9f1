// llama2.c's tokenizer.bin and run.c's encode/decode (byte fallback, best-scoring merges first).
#include "castor/bpe_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "castor/check.h"
#include "castor/fs.h"

namespace castor::data {
namespace {

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); }

int hex_value(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

// The byte a piece "<0xHH>" stands for, or -1 (run.c: sscanf(piece, "<0x%02hhX>")).
int piece_byte(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || !is_hex(p[3]) || !is_hex(p[4]) || p[5] != '>') return -1;
  return hex_value(p[3]) * 16 + hex_value(p[4]);
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// A pair of adjacent tokens that joins to a piece, in run.c's order of choice: the higher score, then the leftmost.
struct Candidate {
  float score;
  int32_t left;  // the left token's position (positions keep their order through merges)
  bool operator<(const Candidate& o) const { return score < o.score || (score == o.score && left > o.left); }
};

}  // namespace

std::string byte_piece(uint8_t b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

std::vector<uint8_t> tokenizer_bin_bytes(const BpeVocabulary& vocab) {
  CASTOR_CHECK(vocab.scores.size() == vocab.pieces.size(), "tokenizer.bin: ", vocab.pieces.size(), " pieces but ",
               vocab.scores.size(), " scores");
  size_t longest = 0, total = 4;
  for (const std::string& p : vocab.pieces) {
    longest = std::max(longest, p.size());
    total += 8 + p.size();
  }
  std::vector<uint8_t> out;
  out.reserve(total);
  put(out, static_cast<int32_t>(longest));
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    put(out, vocab.scores[i]);
    put(out, static_cast<int32_t>(vocab.pieces[i].size()));
    out.insert(out.end(), vocab.pieces[i].begin(), vocab.pieces[i].end());
  }
  return out;
}

void write_tokenizer_bin(const std::string& path, const BpeVocabulary& vocab) {
  atomic_write_file(path, tokenizer_bin_bytes(vocab));
}

BpeVocabulary parse_tokenizer_bin(std::span<const uint8_t> bytes, const std::string& what) {
  auto get = [&](size_t at, auto& v) { std::memcpy(&v, bytes.data() + at, sizeof(v)); };
  CASTOR_CHECK(bytes.size() >= 4, what, ": truncated: ", bytes.size(),
               " bytes, no max_token_length (a tokenizer.bin "
               "starts with it)");
  int32_t max_len = 0;
  get(0, max_len);
  BpeVocabulary v;
  std::unordered_map<std::string_view, size_t> seen;
  size_t longest = 0;
  for (size_t at = 4; at < bytes.size();) {
    const size_t k = v.pieces.size();
    CASTOR_CHECK(at + 8 <= bytes.size(), what, ": truncated in piece ", k, "'s score and length (byte ", at, ")");
    float score = 0;
    int32_t len = 0;
    get(at, score);
    get(at + 4, len);
    at += 8;
    CASTOR_CHECK(len >= 0 && static_cast<size_t>(len) <= bytes.size() - at, what, ": piece ", k, " of ", len,
                 " bytes runs past the end of the file (", bytes.size() - at,
                 " left): truncated or not a tokenizer.bin");
    std::string piece(reinterpret_cast<const char*>(bytes.data() + at), static_cast<size_t>(len));
    at += static_cast<size_t>(len);
    CASTOR_CHECK(piece.find('\0') == std::string::npos, what, ": piece ", k, " holds a NUL byte");
    longest = std::max(longest, piece.size());
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
  }
  CASTOR_CHECK(max_len >= 0 && static_cast<size_t>(max_len) >= longest, what, ": max_token_length ", max_len,
               " but a piece has ", longest, " bytes");
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    const auto [it, fresh] = seen.emplace(v.pieces[i], i);
    CASTOR_CHECK(fresh, what, ": pieces ", it->second, " and ", i, " are the same ('", printable(v.pieces[i]), "')");
  }
  return v;
}

BpeVocabulary read_tokenizer_bin(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/1 << 30);
  return parse_tokenizer_bin(bytes, path);
}

BpeTokenizer::BpeTokenizer(BpeVocabulary vocab) : vocab_(std::move(vocab)) {
  CASTOR_CHECK(vocab_.scores.size() == vocab_.pieces.size(), "bpe tokenizer: ", vocab_.pieces.size(), " pieces but ",
               vocab_.scores.size(), " scores");
  CASTOR_CHECK(vocab_.size() >= 259 && vocab_.size() <= 65536, "bpe tokenizer: ", vocab_.size(),
               " pieces; byte fallback needs at least 259 (<unk>, <s>, </s> and 256 bytes) and 16-bit ids at most "
               "65,536");
  for (size_t i = 0; i < vocab_.pieces.size(); ++i) ids_.emplace(vocab_.pieces[i], static_cast<int32_t>(i));
  for (size_t c = 0; c < ascii_ids_.size(); ++c) ascii_ids_[c] = lookup(std::string(1, static_cast<char>(c)));
  // (<s> must not end in a space either, or <s> + " word" could join.)
  const std::string& bos = vocab_.pieces[BpeVocabulary::kBos];
  word_wise_ = !bos.empty() && bos.back() != ' ' &&
               std::none_of(vocab_.pieces.begin(), vocab_.pieces.end(), [](const std::string& p) {
                 for (size_t i = 1; i < p.size(); ++i)
                   if (p[i] == ' ' && p[i - 1] != ' ') return true;
                 return false;
               });
}

int32_t BpeTokenizer::lookup(std::string_view piece) const {
  const auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

int32_t BpeTokenizer::merged(uint16_t left, uint16_t right) const {
  const uint32_t key = static_cast<uint32_t>(left) << 16 | right;
  const auto it = merges_.find(key);
  if (it != merges_.end()) return it->second;
  const int32_t id = lookup(vocab_.pieces[left] + vocab_.pieces[right]);
  merges_.emplace(key, id);
  return id;
}

void BpeTokenizer::append_chars(std::string_view text, std::vector<uint16_t>& tok) const {
  for (size_t i = 0; i < text.size();) {
    // run.c's UTF-8 grouping: this byte and the continuation bytes after it, four bytes at most.
    size_t len = 1;
    while (i + len < text.size() && len < 4 && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) ++len;
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    const int32_t id = len == 1 && lead < 0x80 ? ascii_ids_[lead] : lookup(text.substr(i, len));
    if (id >= 0) {
      tok.push_back(static_cast<uint16_t>(id));
    } else {
      for (size_t k = 0; k < len; ++k)
        tok.push_back(static_cast<uint16_t>(static_cast<unsigned char>(text[i + k]) + BpeVocabulary::kFirstByte));
    }
    i += len;
  }
}

void BpeTokenizer::merge_pairs(std::vector<uint16_t>& tok) const {
  const int32_t n = static_cast<int32_t>(tok.size());
  std::vector<int32_t> prev(n), next(n);  // merged-away positions are skipped by next
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t left) {  // queues the pair at `left` if it joins to a piece run.c would take
    if (left < 0 || next[left] >= n) return;
    const int32_t id = merged(tok[left], tok[next[left]]);
    if (id >= 0 && vocab_.scores[id] > -1e10f) queue.push({vocab_.scores[id], left});
  };
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1;
  }
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  std::vector<bool> gone(n, false);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    // Stale entries (a token changed or was merged away since) no longer name the pair's piece and score.
    if (gone[c.left] || next[c.left] >= n) continue;
    const int32_t id = merged(tok[c.left], tok[next[c.left]]);
    if (id < 0 || vocab_.scores[id] != c.score) continue;
    const int32_t right = next[c.left];
    tok[c.left] = static_cast<uint16_t>(id);
    gone[right] = true;
    next[c.left] = next[right];
    if (next[right] < n) prev[next[right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  int32_t kept = 0;
  for (int32_t i = 0; i < n; i = next[i]) tok[kept++] = tok[i];
  tok.resize(kept);
}

void BpeTokenizer::encode(std::string_view text, bool bos, bool eos, std::vector<uint16_t>& out) const {
  const int32_t dummy = text.empty() ? -1 : lookup(" ");
  if (word_wise_ && dummy >= 0) {
    // No piece joins across a word start: run.c's merges never cross one, so each word (a cached one too) is
    // merged on its own, with the same result. The dummy prefix leads the first word (a token of its own: the text
    // after it is grouped into characters from its first byte on).
    if (bos) out.push_back(BpeVocabulary::kBos);
    const std::string spaced = " " + std::string(text);
    std::vector<uint16_t> tok;
    for (size_t start = 0, end; start < spaced.size(); start = end) {
      for (end = start + 1; end < spaced.size() && !(spaced[end] == ' ' && spaced[end - 1] != ' ');) ++end;
      const std::string word = spaced.substr(start, end - start);
      auto it = start == 0 ? words_.end() : words_.find(word);
      if (it == words_.end()) {
        tok.assign(start == 0 ? 1 : 0, static_cast<uint16_t>(dummy));
        append_chars(std::string_view(word).substr(start == 0 ? 1 : 0), tok);
        merge_pairs(tok);
        if (start == 0) {
          out.insert(out.end(), tok.begin(), tok.end());
          continue;
        }
        it = words_.emplace(word, tok).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  } else {
    std::vector<uint16_t> tok;
    tok.reserve(text.size() + 2);
    if (bos) tok.push_back(BpeVocabulary::kBos);  // run.c's merge loop passes over <s> too
    if (dummy >= 0) tok.push_back(static_cast<uint16_t>(dummy));
    append_chars(text, tok);
    merge_pairs(tok);
    out.insert(out.end(), tok.begin(), tok.end());
  }
  if (eos) out.push_back(BpeVocabulary::kEos);
}

std::vector<uint16_t> BpeTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<uint16_t> out;
  encode(text, bos, eos, out);
  return out;
}

std::string BpeTokenizer::decode_piece(int32_t prev, uint16_t token) const {
  CASTOR_CHECK(token < vocab_.size(), "bpe decode: token ", token, " is outside the vocabulary of ", vocab_.size());
  if (token == BpeVocabulary::kBos) return "";
  std::string_view p = vocab_.pieces[token];
  if (prev == BpeVocabulary::kBos && !p.empty() && p[0] == ' ') p.remove_prefix(1);
  const int byte = piece_byte(p);
  return byte >= 0 ? std::string(1, static_cast<char>(byte)) : std::string(p);
}

std::string BpeTokenizer::decode(std::span<const uint16_t> tokens) const {
  std::string text;
  int32_t prev = -1;
  for (uint16_t t : tokens) {
    text += decode_piece(prev, t);
    prev = t;
  }
  return text;
}

}  // namespace castor::data
