// sentencepiece's BPE training with byte fallback (llama2.c's train_vocab settings), over distinct words with counts.
#include "castor/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "castor/check.h"
#include "castor/tokenizer.h"
#include "text/unicode.h"

namespace castor::data {
namespace {

constexpr char32_t kSpace = U'\u2581';  // sentencepiece's whitespace
constexpr int32_t kMaxPieceChars = 16;  // max_sentencepiece_length

// Unicode scripts, coarsely (sentencepiece splits pieces by script): letters of the common alphabets by block, and
// everything else (punctuation, symbols, marks) as one Common script. Kana join Han, as in sentencepiece.
struct ScriptRange {
  char32_t lo, hi;
  int8_t script;
};
constexpr ScriptRange kScripts[] = {
    {0x41, 0x5A, 1},       {0x61, 0x7A, 1},      {0xAA, 0xAA, 1},      {0xBA, 0xBA, 1},      {0xC0, 0xD6, 1},
    {0xD8, 0xF6, 1},       {0xF8, 0x24F, 1},     {0x370, 0x3FF, 2},    {0x400, 0x52F, 3},    {0x530, 0x58F, 4},
    {0x590, 0x5FF, 5},     {0x600, 0x6FF, 6},    {0x750, 0x77F, 6},    {0x900, 0x97F, 7},    {0x980, 0x9FF, 8},
    {0xE00, 0xE7F, 9},     {0x10A0, 0x10FF, 10}, {0x1100, 0x11FF, 11}, {0x1E00, 0x1EFF, 1},  {0x1F00, 0x1FFF, 2},
    {0x2C60, 0x2C7F, 1},   {0x2DE0, 0x2DFF, 3},  {0x2E80, 0x2FDF, 12}, {0x3040, 0x30FF, 12}, {0x3130, 0x318F, 11},
    {0x3400, 0x4DBF, 12},  {0x4E00, 0x9FFF, 12}, {0xA640, 0xA69F, 3},  {0xA720, 0xA7FF, 1},  {0xAC00, 0xD7AF, 11},
    {0xF900, 0xFAFF, 12},  {0xFB50, 0xFDFF, 6},  {0xFE70, 0xFEFF, 6},  {0xFF21, 0xFF3A, 1},  {0xFF41, 0xFF5A, 1},
    {0x20000, 0x3FFFF, 12}};

int8_t script_of(char32_t c) {
  for (const ScriptRange& r : kScripts)
    if (c >= r.lo && c <= r.hi) return r.script;
  return 0;
}

bool is_digit(char32_t c) { return (c >= '0' && c <= '9') || (c >= 0xFF10 && c <= 0xFF19); }

// A symbol: a character or a merged piece, with what decides whether it may join another.
struct Symbol {
  std::string utf8;  // sentencepiece's form (U+2581 for whitespace)
  int32_t chars = 1;
  bool all_space = false, has_space = false, has_digit = false;
  bool frozen = false;  // a character left to byte fallback: joins nothing
  int8_t script = -1;   // of its characters other than U+2581; -1: none
};

// sentencepiece's IsValidSentencePiece for the piece a + b (split_by_whitespace, allow_whitespace_only_pieces,
// split_digits, split_by_unicode_script).
bool may_join(const Symbol& a, const Symbol& b) {
  if (a.frozen || b.frozen || a.chars + b.chars > kMaxPieceChars) return false;
  if (a.all_space && b.all_space) return true;
  if (b.has_space || (a.all_space && a.chars > 1) || a.has_digit || b.has_digit) return false;
  return a.script < 0 || b.script < 0 || a.script == b.script;
}

Symbol join(const Symbol& a, const Symbol& b) {
  Symbol s;
  s.utf8 = a.utf8 + b.utf8;
  s.chars = a.chars + b.chars;
  s.all_space = a.all_space && b.all_space;
  s.has_space = a.has_space || b.has_space;
  s.script = a.script >= 0 ? a.script : b.script;
  return s;
}

// The distinct words of the texts with their counts. Each line is a sentence, normalized as sentencepiece's default
// remove_extra_whitespaces does (no ' ' at either end, runs of ' ' as one; a line left empty is skipped), then "▁" +
// line with ' ' as '▁' (both kept as ' ' here, a literal U+2581 too), cut before each '▁' that follows another
// character.
std::unordered_map<std::string, int64_t> count_words(std::span<const std::string_view> texts) {
  std::unordered_map<std::string, int64_t> words;
  std::string line, word;
  for (std::string_view text : texts) {
    for (size_t pos = 0; pos < text.size();) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      line.clear();
      for (char c : text.substr(pos, nl - pos))
        if (c != ' ' || (!line.empty() && line.back() != ' ')) line += c;
      if (!line.empty() && line.back() == ' ') line.pop_back();
      pos = nl + 1;
      if (line.empty()) continue;
      for (size_t k; (k = line.find("\u2581")) != std::string::npos;) line.replace(k, 3, " ");
      word = " ";
      for (char c : line) {
        if (c == ' ' && word.back() != ' ') {
          ++words[word];
          word.clear();
        }
        word += c;
      }
      ++words[word];
    }
  }
  return words;
}

// The trainer's state: the words as symbol ids, and the count of every adjacent pair that may join.
class Trainer {
 public:
  explicit Trainer(std::span<const std::string_view> texts, int64_t vocab_size);
  BpeVocabulary run();

 private:
  struct Pair {
    int64_t count = 0;
    bool valid = false, dead = false;
    std::vector<int32_t> words;  // words that held the pair (some no longer do)
  };
  struct Entry {
    int64_t count;
    int32_t chars;
    std::string piece;
    uint64_t key;
    bool operator<(const Entry& o) const {  // the top is the most frequent, then the shortest, then the smallest
      if (count != o.count) return count < o.count;
      if (chars != o.chars) return chars > o.chars;
      return piece > o.piece;
    }
  };
  static uint64_t key_of(int32_t a, int32_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }
  Pair& pair(int32_t a, int32_t b);
  void count_pairs(int32_t w, int64_t sign);
  void queue_touched();
  void merge(uint64_t key, int32_t id);

  int64_t vocab_size_;
  std::vector<Symbol> symbols_;
  std::vector<std::pair<char32_t, int64_t>> chars_;  // kept characters, most frequent first
  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> freq_;
  std::unordered_map<uint64_t, Pair> pairs_;
  std::vector<uint64_t> touched_;
  std::priority_queue<Entry> queue_;
  std::vector<int64_t> seen_;  // per word: the last merge that rewrote it
};

Trainer::Trainer(std::span<const std::string_view> texts, int64_t vocab_size) : vocab_size_(vocab_size) {
  check_bpe_vocab_size(vocab_size);
  std::vector<std::pair<std::u32string, int64_t>> words;
  std::unordered_map<char32_t, int64_t> char_count;
  for (const auto& [w, n] : count_words(texts)) {
    std::u32string cps = unicode::decode_utf8(w, "the text");
    for (char32_t& c : cps) {
      if (c == ' ') c = kSpace;
      char_count[c] += n;
    }
    words.emplace_back(std::move(cps), n);
  }
  // NUL and tab are never pieces (sentencepiece drops them from its characters): byte fallback, joining nothing.
  for (const auto& [c, n] : char_count) chars_.emplace_back(c, c == 0 || c == '\t' ? -1 : n);
  std::sort(chars_.begin(), chars_.end(), [](const auto& x, const auto& y) {
    return x.second > y.second || (x.second == y.second && x.first < y.first);
  });
  const size_t pieces = static_cast<size_t>(
      std::count_if(chars_.begin(), chars_.end(), [](const auto& c) { return c.second > 0; }));
  const size_t keep = std::min<size_t>(pieces, static_cast<size_t>(vocab_size - 259));
  std::unordered_map<char32_t, int32_t> ids;
  for (size_t i = 0; i < chars_.size(); ++i) {
    Symbol s;
    const char32_t c = chars_[i].first;
    unicode::append_utf8(c, s.utf8);
    s.all_space = s.has_space = c == kSpace;
    s.has_digit = is_digit(c);
    s.script = c == kSpace ? -1 : script_of(c);
    s.frozen = i >= keep;
    ids.emplace(c, static_cast<int32_t>(symbols_.size()));
    symbols_.push_back(std::move(s));
  }
  chars_.resize(keep);
  for (const auto& [cps, n] : words) {
    std::vector<int32_t> w;
    for (char32_t c : cps) w.push_back(ids.at(c));
    words_.push_back(std::move(w));
    freq_.push_back(n);
  }
  seen_.assign(words_.size(), -1);
  for (size_t w = 0; w < words_.size(); ++w) count_pairs(static_cast<int32_t>(w), +1);
  queue_touched();
}

Trainer::Pair& Trainer::pair(int32_t a, int32_t b) {
  const auto [it, fresh] = pairs_.try_emplace(key_of(a, b));
  if (fresh) it->second.valid = may_join(symbols_[a], symbols_[b]);
  return it->second;
}

// Adds (sign +1) or takes away (-1) the pairs of word w.
void Trainer::count_pairs(int32_t w, int64_t sign) {
  const std::vector<int32_t>& s = words_[w];
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    Pair& p = pair(s[i], s[i + 1]);
    if (!p.valid) continue;
    p.count += sign * freq_[w];
    if (sign > 0) p.words.push_back(w);
    touched_.push_back(key_of(s[i], s[i + 1]));
  }
}

// Queues the pairs whose counts changed (the queue's older entries for them are skipped as stale).
void Trainer::queue_touched() {
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  for (uint64_t key : touched_) {
    const Pair& p = pairs_.at(key);
    if (p.dead || p.count <= 0) continue;
    const Symbol &a = symbols_[key >> 32], &b = symbols_[key & 0xFFFFFFFFu];
    queue_.push({p.count, a.chars + b.chars, a.utf8 + b.utf8, key});
  }
  touched_.clear();
}

// Replaces the pair `key` by the new symbol `id` in every word holding it, left to right.
void Trainer::merge(uint64_t key, int32_t id) {
  const int32_t a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xFFFFFFFFu);
  const std::vector<int32_t> holders = std::move(pairs_.at(key).words);
  for (int32_t w : holders) {
    if (seen_[w] == id) continue;
    seen_[w] = id;
    std::vector<int32_t>& s = words_[w];
    count_pairs(w, -1);
    size_t o = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const bool hit = i + 1 < s.size() && s[i] == a && s[i + 1] == b;
      s[o++] = hit ? id : s[i];
      i += hit;
    }
    s.resize(o);
    count_pairs(w, +1);
  }
  queue_touched();
}

BpeVocabulary Trainer::run() {
  const size_t budget = static_cast<size_t>(vocab_size_) - 259 - chars_.size();
  std::vector<std::string> merged;
  std::unordered_set<std::string> pieces;
  while (merged.size() < budget) {
    CASTOR_CHECK(!queue_.empty(), "--vocab-size ", vocab_size_, ": the text gives only ",
                 259 + chars_.size() + merged.size(), " pieces (", chars_.size(), " characters, ", merged.size(),
                 " merges); give a smaller --vocab-size or more text");
    const Entry e = queue_.top();
    queue_.pop();
    Pair& p = pairs_.at(e.key);
    if (p.dead || p.count != e.count) continue;  // stale
    p.dead = true;                               // taken, or a piece already made from other halves: never joined
    if (!pieces.insert(e.piece).second) continue;
    merged.push_back(e.piece);
    symbols_.push_back(join(symbols_[e.key >> 32], symbols_[e.key & 0xFFFFFFFFu]));
    merge(e.key, static_cast<int32_t>(symbols_.size() - 1));
  }
  BpeVocabulary v;
  v.pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) v.pieces.push_back(byte_piece(static_cast<uint8_t>(b)));
  v.scores.assign(v.pieces.size(), 0.0f);
  auto add = [&](std::string piece) {  // tokenizer.py's export writes U+2581 as ' '
    for (size_t k; (k = piece.find("\u2581")) != std::string::npos;) piece.replace(k, 3, " ");
    v.scores.push_back(-static_cast<float>(v.pieces.size() - 259));
    v.pieces.push_back(std::move(piece));
  };
  for (std::string& m : merged) add(std::move(m));
  for (const auto& [c, n] : chars_) {
    std::string s;
    unicode::append_utf8(c, s);
    add(std::move(s));
  }
  return v;
}

}  // namespace

void check_bpe_vocab_size(int64_t n) {
  CASTOR_CHECK(n >= 259 && n <= 65536, "--vocab-size: ", n,
               " is outside 259..65536 (<unk>, <s>, </s> and the 256 "
               "byte pieces come first; token ids are 16-bit)");
}

BpeVocabulary train_bpe_vocabulary(std::span<const std::string_view> texts, int64_t vocab_size) {
  return Trainer(texts, vocab_size).run();
}

}  // namespace castor::data
