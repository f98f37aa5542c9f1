// GPT-2 byte-level BPE, output identical to the npm package gpt-3-encoder's `encode` (its quirks included).
#include <algorithm>
#include <array>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/tokenizer.h"
#include "text/unicode.h"

namespace castor::data {
namespace {

using unicode::cp_at;

enum class Cls : uint8_t { Letter, Number, Space, Other };

// JavaScript's classes, as gpt-3-encoder's regular expression sees them.
Cls classify(char32_t cp) {
  if (unicode::is_letter(cp)) return Cls::Letter;
  if (unicode::is_number(cp)) return Cls::Number;
  if (unicode::is_js_space(cp)) return Cls::Space;
  return Cls::Other;
}

// A token or merge half as written in encoder.json / vocab.bpe (mapped characters) back to its bytes.
std::string unmap(std::string_view mapped, const std::string& what) {
  std::string bytes;
  for (char32_t cp : unicode::decode_utf8(mapped, what)) {
    const int b = unicode::unicode_to_byte(cp);
    CASTOR_CHECK(b >= 0, what, ": '", printable(mapped), "' holds a character outside GPT-2's byte alphabet");
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::from_dir(const std::string& dir) {
  const std::string enc = dir + "/encoder.json", merges = dir + "/vocab.bpe";
  const std::vector<uint8_t> e = read_file(enc), m = read_file(merges);
  return Gpt2Tokenizer({reinterpret_cast<const char*>(e.data()), e.size()},
                       {reinterpret_cast<const char*>(m.data()), m.size()}, enc, merges);
}

Gpt2Tokenizer::Gpt2Tokenizer(std::string_view encoder_json, std::string_view vocab_bpe, const std::string& encoder_what,
                             const std::string& vocab_what) {
  Json enc;
  try {
    enc = Json::parse(encoder_json);
  } catch (const Error& e) {
    throw Error(encoder_what + ": " + e.what());
  }
  CASTOR_CHECK(enc.is_object(), encoder_what, ": expected a JSON object of token -> id");
  decoder_.resize(enc.as_object().size());
  for (const auto& [token, id] : enc.as_object()) {
    CASTOR_CHECK(id.is_int() && id.as_int() >= 0 && id.as_int() < static_cast<int64_t>(decoder_.size()) &&
                     id.as_int() <= 0xFFFF,
                 encoder_what, ": the id of '", printable(token), "' is not an integer in [0, ", decoder_.size(), ")");
    std::string bytes = unmap(token, encoder_what);
    CASTOR_CHECK(decoder_[id.as_int()].empty(), encoder_what, ": id ", id.as_int(), " is given twice");
    decoder_[id.as_int()] = bytes;
    encoder_.emplace(std::move(bytes), static_cast<uint16_t>(id.as_int()));
  }
  CASTOR_CHECK(is_valid_utf8(vocab_bpe), vocab_what, ": not valid UTF-8");
  // As gpt-3-encoder: the lines between the first (a version comment) and the last (empty after the final
  // newline), each split at whitespace runs; the halves joined with ',' key the rank, and a later line wins.
  std::vector<std::string_view> lines;
  for (size_t pos = 0;;) {
    const size_t nl = vocab_bpe.find('\n', pos);
    lines.push_back(vocab_bpe.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos));
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    std::string key;
    bool first = true;
    for (size_t pos = 0; pos < lines[i].size();) {
      size_t len = 0;
      if (classify(cp_at(lines[i], pos, len)) == Cls::Space) {
        pos += len;
        continue;
      }
      size_t end = pos;
      while (end < lines[i].size() && classify(cp_at(lines[i], end, len)) != Cls::Space) end += len;
      key += (first ? "" : ",") + unmap(lines[i].substr(pos, end - pos), vocab_what);
      first = false;
      pos = end;
    }
    ranks_[key] = static_cast<int32_t>(i - 1);
  }
}

std::vector<std::string_view> Gpt2Tokenizer::split(std::string_view s) {
  CASTOR_CHECK(is_valid_utf8(s), "text is not valid UTF-8");
  return unicode::split_gpt2(s, unicode::is_js_space);
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<uint16_t>& out) {
  if (auto it = cache_.find(std::string(piece)); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<std::string> word;
  for (char c : piece) word.emplace_back(1, c);
  std::string key;
  while (word.size() > 1) {
    // gpt-3-encoder keeps, per rank, the last pair with it; pairs without a rank end the merging.
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      key.assign(word[k]).append(1, ',').append(word[k + 1]);
      const auto r = ranks_.find(key);
      if (r != ranks_.end() && r->second <= best) best = r->second, at = k;
    }
    if (best == INT32_MAX) break;
    const std::string first = word[at], second = word[at + 1];
    std::vector<std::string> merged;
    for (size_t k = 0; k < word.size();) {
      if (word[k] == first && k + 1 < word.size() && word[k + 1] == second) {
        merged.push_back(first + second);
        k += 2;
      } else {
        merged.push_back(std::move(word[k]));
        k += 1;
      }
    }
    word = std::move(merged);
  }
  std::vector<uint16_t> ids;
  for (const std::string& w : word) {
    const auto e = encoder_.find(w);
    CASTOR_CHECK(e != encoder_.end(), "GPT-2 BPE: the merged token '", printable(w), "' is not in encoder.json");
    ids.push_back(e->second);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.emplace(std::string(piece), std::move(ids));
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<uint16_t>& out) {
  for (std::string_view piece : split(text)) bpe(piece, out);
}

std::vector<uint16_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<uint16_t> out;
  encode(text, out);
  return out;
}

std::string Gpt2Tokenizer::content() const {
  std::string out;
  for (const std::string& token : decoder_) out += detail::cat(token.size(), ":", token);
  std::vector<std::pair<int32_t, std::string_view>> merges;
  for (const auto& [key, rank] : ranks_) merges.emplace_back(rank, key);
  std::sort(merges.begin(), merges.end());
  for (const auto& [rank, key] : merges) out += detail::cat("\n", rank, " ", key.size(), ":", key);
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const uint16_t> tokens) const {
  std::string text;
  for (uint16_t t : tokens) {
    CASTOR_CHECK(t < decoder_.size(), "GPT-2 decode: token ", t, " is outside the vocabulary of ", decoder_.size());
    text += decoder_[t];
  }
  return text;
}

}  // namespace castor::data
