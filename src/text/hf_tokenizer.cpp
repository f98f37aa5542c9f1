// Hugging Face tokenizer.json: the BPE model with its normalizers, pre-tokenizers, post-processor and decoders, as
// the tokenizers library runs them (its src/tokenizer/added_vocabulary.rs, models/bpe, normalizers, pre_tokenizers
// and decoders were read for the semantics).
#include "castor/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "castor/bpe_tokenizer.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "text/unicode.h"

namespace castor::data {
namespace {

// The two regexes Split supports, as Llama 3 (digits in ones to threes) and Qwen2 (single digits) write them.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Added {
  std::string content;
  uint32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
};

enum class Norm { Prepend, Replace, Nfc };
struct NormStep {
  Norm kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

enum class Pre { Split, ByteLevel, Metaspace };
enum class Prepend { Always, First, Never };
struct PreStep {
  Pre kind;
  int max_digits = 0;                                // Split
  bool add_prefix_space = false, use_regex = false;  // ByteLevel
  std::string replacement;                           // Metaspace
  Prepend prepend = Prepend::Always;
  bool split = true;
};

enum class Dec { Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace };
struct DecStep {
  Dec kind;
  std::string a, b;  // Replace: a -> b; Strip: a the content; Metaspace: a the replacement
  int64_t start = 0, stop = 0;
  Prepend prepend = Prepend::Always;
};

// One stretch of text between added tokens, or an added token (id >= 0); `offset` is where it starts in the text it
// was cut from.
struct Segment {
  std::string_view text;
  int64_t id;
  size_t offset;
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(s, pos, hit - pos).append(to);
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// The byte of a byte-fallback token "<0xHH>", or -1.
int byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

bool is_word_char(char32_t c) { return unicode::is_letter(c) || unicode::is_number(c) || c == '_'; }

}  // namespace

std::string_view hf_split_regex(int digits) { return digits == 1 ? kQwen2Regex : kLlama3Regex; }

struct HfTokenizer::Impl {
  std::string what;
  std::unordered_map<std::string, uint32_t> vocab;  // the model's token -> id
  std::vector<std::string> tokens;                  // id -> token (the model's or an added one's content)
  std::vector<uint8_t> kind;                        // id -> 0 none, 1 model, 2 added, 3 added and special
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // (left << 32 | right) -> (rank, merged)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  // id -> score: a GGUF SentencePiece vocabulary's (model.gguf_scores, Castor's key), merged as llama.cpp merges it
  // (spm_piece) instead of by the merges' ranks; empty otherwise.
  std::vector<float> scores;
  std::optional<uint32_t> unk;
  std::array<int64_t, 256> byte_ids{};  // "<0xHH>" -> id, or -1
  std::vector<Added> added;
  // The added tokens matched in the raw text [0] and in the normalized text [1]: their patterns (the content, or
  // the normalized content), which added token each is, and the patterns by first byte.
  struct Matcher {
    std::vector<std::string> patterns;
    std::vector<size_t> added;
    std::array<std::vector<uint32_t>, 256> by_first;
  };
  std::array<Matcher, 2> matchers;
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre;
  std::vector<DecStep> decoders;
  std::vector<uint32_t> prefix, suffix;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache;
  // No token holds "▁" after another character than "▁" (SentencePiece vocabularies): a word merges as its pieces cut
  // before each such "▁", each on its own and cached, with the same result (no merge can cross the cut).
  bool cut_at_metaspace = false;
  // The ids a file may use: the tokens it defines (model.vocab and added_tokens) plus kMaxUnusedIds, so that an id
  // cannot make `tokens` grow past what the file's size accounts for.
  uint64_t id_limit = 0;
  static constexpr uint64_t kMaxUnusedIds = 65536;

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw Error(detail::cat(what, ": ", key, ": ", msg));
  }

  std::string normalize(std::string_view s) const;
  std::vector<Segment> split_added(std::string_view s, bool normalized) const;
  std::vector<std::string> pre_tokenize(std::string_view s, bool at_start) const;
  void bpe(const std::string& word, std::vector<uint32_t>& out) const;
  void bpe_piece(const std::string& word, std::vector<uint32_t>& out) const;
  std::vector<uint32_t> spm_piece(const std::string& word) const;
  // A token id read at `path`, its slot in `tokens` and `kind` made.
  uint32_t take_id(const Json& id, const std::string& path);
  // A piece the vocabulary has not as its bytes' tokens (byte fallback); false when that is not done.
  bool byte_tokens(std::string_view piece, std::vector<uint32_t>& ids) const;
  // The decoders over `toks` (the first the text's first when `at_start`), but for what only the whole text's end
  // decides (finish_text): ByteLevel's bytes not yet made valid UTF-8, and a Strip after Fuse or ByteLevel not yet
  // applied to the end. A run of byte-fallback tokens is its bytes, or with `replace_runs` (the run is whole) each
  // byte U+FFFD when they are not valid UTF-8.
  std::string run_decoders(std::vector<std::string> toks, bool at_start, bool replace_runs) const;
  // The text's end: invalid UTF-8 replaced as String::from_utf8_lossy does, then a fused Strip's stop.
  std::string finish_text(std::string_view text) const;
  // How many bytes at the end of `text` (run_decoders' output so far) a later token could still change: a UTF-8
  // sequence cut short, or the copies of a fused Strip's content that it strips if the text ends there.
  size_t held_back(std::string_view text) const;
  bool byte_fallback_decoder() const;
};

namespace {

const Json& member(const HfTokenizer::Impl& t, const Json& obj, const std::string& key, const std::string& path) {
  const Json* v = obj.is_object() ? obj.find(key) : nullptr;
  if (!v) t.fail(path + "." + key, "missing");
  return *v;
}
std::string str_member(const HfTokenizer::Impl& t, const Json& obj, const std::string& key, const std::string& path) {
  const Json& v = member(t, obj, key, path);
  if (!v.is_string()) t.fail(path + "." + key, "expected a string, got " + v.dump().substr(0, 80));
  return v.as_string();
}
bool bool_member(const HfTokenizer::Impl& t, const Json& obj, const std::string& key, const std::string& path,
                 bool fallback) {
  const Json* v = obj.find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_bool()) t.fail(path + "." + key, "expected true or false, got " + v->dump().substr(0, 80));
  return v->as_bool();
}
// A component's list: itself, or the members of its Sequence (under `list_key`), each with its key path.
std::vector<std::pair<const Json*, std::string>> steps(const HfTokenizer::Impl& t, const Json& c,
                                                       const std::string& path, const char* list_key) {
  std::vector<std::pair<const Json*, std::string>> out;
  if (c.is_null()) return out;
  if (!c.is_object()) t.fail(path, "expected an object or null");
  if (str_member(t, c, "type", path) != "Sequence") return {{&c, path}};
  const Json& list = member(t, c, list_key, path);
  if (!list.is_array()) t.fail(path + "." + list_key, "expected an array");
  for (size_t i = 0; i < list.as_array().size(); ++i)
    for (auto& s : steps(t, list.as_array()[i], detail::cat(path, ".", list_key, "[", i, "]"), list_key))
      out.push_back(s);
  return out;
}
// A Replace's pattern: only {"String": s} (a Regex pattern is not supported).
std::string string_pattern(const HfTokenizer::Impl& t, const Json& step, const std::string& path) {
  const Json& p = member(t, step, "pattern", path);
  const Json* s = p.is_object() ? p.find("String") : nullptr;
  if (!s || !s->is_string())
    t.fail(path + ".pattern", "unsupported pattern " + p.dump().substr(0, 80) + " (only String)");
  return s->as_string();
}
Prepend prepend_scheme(const HfTokenizer::Impl& t, const Json& step, const std::string& path) {
  const Json* v = step.find("prepend_scheme");
  if (!v) return bool_member(t, step, "add_prefix_space", path, true) ? Prepend::Always : Prepend::Never;
  const std::string s = v->is_string() ? v->as_string() : "";
  if (s == "always") return Prepend::Always;
  if (s == "first") return Prepend::First;
  if (s == "never") return Prepend::Never;
  t.fail(path + ".prepend_scheme", "unsupported value " + v->dump());
}
// The replacement character of a Metaspace, as UTF-8.
std::string replacement(const HfTokenizer::Impl& t, const Json& step, const std::string& path) {
  std::string r = str_member(t, step, "replacement", path);
  size_t len = 0;
  if (r.empty() || (unicode::cp_at(r, 0, len), len != r.size()))
    t.fail(path + ".replacement", "expected one character");
  return r;
}

}  // namespace

uint32_t HfTokenizer::Impl::take_id(const Json& id, const std::string& path) {
  if (!id.is_int() || id.as_int() < 0 || static_cast<uint64_t>(id.as_int()) >= id_limit)
    fail(path, detail::cat("not an integer in [0, ", id_limit, ") (the tokens the file defines, plus at most ",
                           kMaxUnusedIds, " unused ids)"));
  const auto i = static_cast<uint32_t>(id.as_int());
  if (i >= tokens.size()) tokens.resize(i + 1), kind.resize(i + 1);
  return i;
}

namespace {

void parse_model(HfTokenizer::Impl& t, const Json& m) {
  const std::string type = str_member(t, m, "type", "model");
  if (type != "BPE") t.fail("model.type", "unsupported model type '" + type + "' (only BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = m.find(key);
    if (v && !v->is_null() && !(v->is_string() && v->as_string().empty()))
      t.fail(std::string("model.") + key, "unsupported");
  }
  if (const Json* d = m.find("dropout"); d && !d->is_null()) t.fail("model.dropout", "unsupported (only null)");
  t.byte_fallback = bool_member(t, m, "byte_fallback", "model", false);
  t.fuse_unk = bool_member(t, m, "fuse_unk", "model", false);
  t.ignore_merges = bool_member(t, m, "ignore_merges", "model", false);
  const Json& vocab = member(t, m, "vocab", "model");
  if (!vocab.is_object()) t.fail("model.vocab", "expected an object of token -> id");
  t.vocab.reserve(vocab.as_object().size());
  for (const auto& [token, id] : vocab.as_object()) {
    const uint32_t i = t.take_id(id, "model.vocab: the id of '" + printable(token) + "'");
    t.vocab.emplace(token, i);
    if (t.kind[i]) t.fail("model.vocab", detail::cat("id ", i, " is given twice"));
    t.tokens[i] = token;
    t.kind[i] = 1;
  }
  if (const Json* u = m.find("unk_token"); u && !u->is_null()) {
    const auto it = u->is_string() ? t.vocab.find(u->as_string()) : t.vocab.end();
    if (it == t.vocab.end()) t.fail("model.unk_token", u->dump() + " is not in the vocabulary");
    t.unk = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = t.vocab.find(byte_piece(static_cast<uint8_t>(b)));
    t.byte_ids[b] = it == t.vocab.end() ? int64_t{-1} : int64_t{it->second};
  }
  const Json& merges = member(t, m, "merges", "model");
  if (!merges.is_array()) t.fail("model.merges", "expected an array");
  const auto id_of = [&](const std::string& s, size_t rank) {
    const auto it = t.vocab.find(s);
    if (it == t.vocab.end())
      t.fail(detail::cat("model.merges[", rank, "]"), "'" + printable(s) + "' is not in the vocabulary");
    return it->second;
  };
  t.merges.reserve(merges.as_array().size());
  for (size_t r = 0; r < merges.as_array().size(); ++r) {
    const Json& e = merges.as_array()[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.as_string();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        t.fail(detail::cat("model.merges[", r, "]"), "expected \"a b\", got " + e.dump().substr(0, 80));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.as_array().size() == 2 && e.as_array()[0].is_string() && e.as_array()[1].is_string()) {
      a = e.as_array()[0].as_string(), b = e.as_array()[1].as_string();
    } else {
      t.fail(detail::cat("model.merges[", r, "]"), "expected \"a b\" or [a, b], got " + e.dump().substr(0, 80));
    }
    const uint64_t key = uint64_t{id_of(a, r)} << 32 | id_of(b, r);
    t.merges[key] = {static_cast<uint32_t>(r), id_of(a + b, r)};
  }
  if (const Json* scores = m.find("gguf_scores")) {
    if (!scores->is_array() || scores->as_array().size() != t.tokens.size())
      t.fail("model.gguf_scores", detail::cat("expected an array of ", t.tokens.size(), " scores (one per token)"));
    for (const Json& v : scores->as_array()) {
      if (!v.is_number()) t.fail("model.gguf_scores", "holds " + v.dump().substr(0, 40) + ", not a number");
      t.scores.push_back(static_cast<float>(v.as_double()));
    }
  }
}

void parse_added(HfTokenizer::Impl& t, const Json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) t.fail("added_tokens", "expected an array");
  for (size_t i = 0; i < list.as_array().size(); ++i) {
    const Json& a = list.as_array()[i];
    const std::string path = detail::cat("added_tokens[", i, "]");
    Added x{str_member(t, a, "content", path),
            t.take_id(member(t, a, "id", path), path + ".id"),
            bool_member(t, a, "single_word", path, false),
            bool_member(t, a, "lstrip", path, false),
            bool_member(t, a, "rstrip", path, false),
            bool_member(t, a, "normalized", path, false),
            bool_member(t, a, "special", path, false)};
    if (x.content.empty()) t.fail(path + ".content", "empty");
    if (t.kind[x.id] == 1 && t.tokens[x.id] != x.content)
      t.fail(path, detail::cat("id ", x.id, " is the model's '", printable(t.tokens[x.id]), "'"));
    t.tokens[x.id] = x.content;
    t.kind[x.id] = x.special ? 3 : 2;
    t.added.push_back(std::move(x));
  }
}

void parse_normalizer(HfTokenizer::Impl& t, const Json& n) {
  for (const auto& [s, path] : steps(t, n, "normalizer", "normalizers")) {
    const std::string type = str_member(t, *s, "type", path);
    if (type == "Prepend")
      t.normalizers.push_back({Norm::Prepend, str_member(t, *s, "prepend", path), ""});
    else if (type == "Replace")
      t.normalizers.push_back({Norm::Replace, string_pattern(t, *s, path), str_member(t, *s, "content", path)});
    else if (type == "NFC")
      t.normalizers.push_back({Norm::Nfc, "", ""});
    else
      t.fail(path + ".type", "unsupported normalizer '" + type + "' (Prepend, Replace, NFC)");
  }
}

void parse_pre_tokenizer(HfTokenizer::Impl& t, const Json& p) {
  for (const auto& [s, path] : steps(t, p, "pre_tokenizer", "pretokenizers")) {
    const std::string type = str_member(t, *s, "type", path);
    PreStep step{};
    if (type == "Split") {
      step.kind = Pre::Split;
      const Json& pat = member(t, *s, "pattern", path);
      const Json* re = pat.is_object() ? pat.find("Regex") : nullptr;
      const std::string r = re && re->is_string() ? re->as_string() : "";
      if (r == kLlama3Regex)
        step.max_digits = 3;
      else if (r == kQwen2Regex)
        step.max_digits = 1;
      else
        t.fail(path + ".pattern",
               "unsupported split pattern " + pat.dump().substr(0, 120) + " (only Llama 3's and Qwen2's regexes)");
      if (str_member(t, *s, "behavior", path) != "Isolated") t.fail(path + ".behavior", "unsupported (only Isolated)");
      if (bool_member(t, *s, "invert", path, false)) t.fail(path + ".invert", "unsupported (only false)");
    } else if (type == "ByteLevel") {
      step.kind = Pre::ByteLevel;
      step.add_prefix_space = bool_member(t, *s, "add_prefix_space", path, true);
      step.use_regex = bool_member(t, *s, "use_regex", path, true);
    } else if (type == "Metaspace") {
      step.kind = Pre::Metaspace;
      step.replacement = replacement(t, *s, path);
      step.prepend = prepend_scheme(t, *s, path);
      step.split = bool_member(t, *s, "split", path, true);
    } else {
      t.fail(path + ".type", "unsupported pre_tokenizer '" + type + "' (Split, ByteLevel, Metaspace)");
    }
    t.pre.push_back(step);
  }
}

void parse_post_processor(HfTokenizer::Impl& t, const Json& p) {
  for (const auto& [s, path] : steps(t, p, "post_processor", "processors")) {
    const std::string type = str_member(t, *s, "type", path);
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing")
      t.fail(path + ".type", "unsupported post_processor '" + type + "' (TemplateProcessing, ByteLevel)");
    const Json& single = member(t, *s, "single", path);
    const Json& specials = member(t, *s, "special_tokens", path);
    if (!single.is_array()) t.fail(path + ".single", "expected an array");
    bool seen_a = false;
    for (size_t i = 0; i < single.as_array().size(); ++i) {
      const Json& item = single.as_array()[i];
      const std::string ipath = detail::cat(path, ".single[", i, "]");
      if (const Json* sp = item.is_object() ? item.find("SpecialToken") : nullptr) {
        const std::string name = str_member(t, *sp, "id", ipath + ".SpecialToken");
        const Json& ids = member(t, member(t, specials, name, path + ".special_tokens"), "ids",
                                 path + ".special_tokens." + name);
        if (!ids.is_array()) t.fail(path + ".special_tokens." + name + ".ids", "expected an array");
        for (const Json& id : ids.as_array()) {
          if (!id.is_int() || id.as_int() < 0 || id.as_int() >= static_cast<int64_t>(t.tokens.size()))
            t.fail(path + ".special_tokens." + name + ".ids", "an id outside the vocabulary: " + id.dump());
          (seen_a ? t.suffix : t.prefix).push_back(static_cast<uint32_t>(id.as_int()));
        }
      } else if (const Json* sq = item.is_object() ? item.find("Sequence") : nullptr) {
        if (str_member(t, *sq, "id", ipath + ".Sequence") != "A") t.fail(ipath, "expected sequence A");
        seen_a = true;
      } else {
        t.fail(ipath, "expected SpecialToken or Sequence");
      }
    }
  }
}

void parse_decoder(HfTokenizer::Impl& t, const Json& d) {
  for (const auto& [s, path] : steps(t, d, "decoder", "decoders")) {
    const std::string type = str_member(t, *s, "type", path);
    DecStep step{};
    if (type == "Replace") {
      step = {Dec::Replace, string_pattern(t, *s, path), str_member(t, *s, "content", path)};
    } else if (type == "ByteFallback") {
      step.kind = Dec::ByteFallback;
    } else if (type == "Fuse") {
      step.kind = Dec::Fuse;
    } else if (type == "Strip") {
      step.kind = Dec::Strip;
      step.a = str_member(t, *s, "content", path);
      size_t len = 0;
      if (step.a.empty() || (unicode::cp_at(step.a, 0, len), len != step.a.size()))
        t.fail(path + ".content", "expected one character");
      const Json &start = member(t, *s, "start", path), &stop = member(t, *s, "stop", path);
      if (!start.is_int() || start.as_int() < 0 || !stop.is_int() || stop.as_int() < 0)
        t.fail(path, "start and stop must be counts");
      step.start = start.as_int(), step.stop = stop.as_int();
    } else if (type == "ByteLevel") {
      step.kind = Dec::ByteLevel;
    } else if (type == "Metaspace") {
      step.kind = Dec::Metaspace;
      step.a = replacement(t, *s, path);
      step.prepend = prepend_scheme(t, *s, path);
    } else {
      t.fail(path + ".type",
             "unsupported decoder '" + type + "' (Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace)");
    }
    t.decoders.push_back(step);
  }
}

}  // namespace

std::string HfTokenizer::Impl::normalize(std::string_view s) const {
  std::string out(s);
  for (const NormStep& n : normalizers) {
    if (n.kind == Norm::Prepend && !out.empty()) out.insert(0, n.a);
    if (n.kind == Norm::Replace) replace_all(out, n.a, n.b);
    if (n.kind == Norm::Nfc) out = unicode::nfc(out);
  }
  return out;
}

// added_vocabulary.rs's find_matches: leftmost-longest matches of the added tokens of one kind (normalized or not),
// those that fail single_word dropped, lstrip/rstrip taking the whitespace beside them.
std::vector<Segment> HfTokenizer::Impl::split_added(std::string_view s, bool normalized) const {
  const Matcher& m = matchers[normalized];
  std::vector<Segment> out;
  size_t done = 0;  // the end of the last match
  // The start of the character before byte `p`.
  const auto back = [&](size_t p) {
    do --p;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80);
    return p;
  };
  for (size_t i = 0; i < s.size();) {
    int64_t best = -1;
    for (uint32_t k : m.by_first[static_cast<unsigned char>(s[i])])
      if (s.substr(i).starts_with(m.patterns[k]) && (best < 0 || m.patterns[k].size() > m.patterns[best].size()))
        best = k;
    if (best < 0) {
      ++i;
      continue;
    }
    const Added& a = added[m.added[best]];
    size_t start = i, stop = i + m.patterns[best].size(), len = 0;
    i = stop;
    if (a.single_word) {
      const bool word_before = start > 0 && is_word_char(unicode::cp_at(s, back(start), len));
      const bool word_after = stop < s.size() && is_word_char(unicode::cp_at(s, stop, len));
      if (word_before || word_after) continue;
    }
    if (a.lstrip) {  // the whitespace before it, back to the last match
      while (start > done && unicode::is_white_space(unicode::cp_at(s, back(start), len))) start = back(start);
    }
    if (a.rstrip) {
      while (stop < s.size() && unicode::is_white_space(unicode::cp_at(s, stop, len))) stop += len;
      i = stop;
    }
    if (done < start) out.push_back({s.substr(done, start - done), -1, done});
    out.push_back({s.substr(start, stop - start), a.id, start});
    done = stop;
  }
  if (done < s.size()) out.push_back({s.substr(done), -1, done});
  return out;
}

std::vector<std::string> HfTokenizer::Impl::pre_tokenize(std::string_view s, bool at_start) const {
  std::vector<std::string> pieces{std::string(s)};
  for (const PreStep& p : pre) {
    std::vector<std::string> next;
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string& piece = pieces[k];
      if (p.kind == Pre::Split) {
        for (std::string_view w : unicode::split_llama3(piece, p.max_digits)) next.emplace_back(w);
      } else if (p.kind == Pre::ByteLevel) {
        if (p.add_prefix_space && !piece.starts_with(' ')) piece.insert(0, " ");
        std::vector<std::string_view> words{piece};
        if (p.use_regex) words = unicode::split_gpt2(piece, unicode::is_white_space);
        for (std::string_view w : words) {
          std::string mapped;
          for (unsigned char c : w) {
            const char32_t m = unicode::byte_to_unicode()[c];
            if (m < 0x80) {
              mapped.push_back(static_cast<char>(m));
            } else {  // U+0080..U+0143: two bytes
              mapped.push_back(static_cast<char>(0xC0 | m >> 6));
              mapped.push_back(static_cast<char>(0x80 | (m & 0x3F)));
            }
          }
          next.push_back(std::move(mapped));
        }
      } else {  // Metaspace
        replace_all(piece, " ", p.replacement);
        const bool first = at_start && k == 0;
        if (!piece.starts_with(p.replacement) &&
            (p.prepend == Prepend::Always || (p.prepend == Prepend::First && first)))
          piece.insert(0, p.replacement);
        if (!p.split) {
          next.push_back(std::move(piece));
          continue;
        }
        // MergedWithNext: each replacement character starts a piece.
        size_t from = 0;
        for (size_t hit = piece.find(p.replacement, 1); hit != std::string::npos;
             hit = piece.find(p.replacement, hit + p.replacement.size())) {
          next.push_back(piece.substr(from, hit - from));
          from = hit;
        }
        next.push_back(piece.substr(from));
      }
    }
    std::erase_if(next, [](const std::string& w) { return w.empty(); });
    pieces = std::move(next);
  }
  return pieces;
}

namespace {

constexpr std::string_view kMetaspace = "\u2581";

// Whether `s` holds "▁" after a character other than "▁".
bool metaspace_inside(std::string_view s) {
  for (size_t at = s.find(kMetaspace, 1); at != std::string_view::npos; at = s.find(kMetaspace, at + 1))
    if (!s.substr(0, at).ends_with(kMetaspace)) return true;
  return false;
}

}  // namespace

void HfTokenizer::Impl::bpe(const std::string& word, std::vector<uint32_t>& out) const {
  if (ignore_merges) {
    if (const auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (!cut_at_metaspace || word.size() < 256) return bpe_piece(word, out);
  size_t from = 0;
  for (size_t at = word.find(kMetaspace, 1); at != std::string::npos; at = word.find(kMetaspace, at + 1))
    if (!std::string_view(word).substr(0, at).ends_with(kMetaspace)) {
      bpe_piece(word.substr(from, at - from), out);
      from = at;
    }
  bpe_piece(word.substr(from), out);
}

// models/bpe/model.rs's merge_word and word.rs's merge_all: the word's characters as tokens (byte fallback, else
// the unknown token), then the lowest-ranked adjacent pair merged first, the leftmost of equal ranks.
void HfTokenizer::Impl::bpe_piece(const std::string& word, std::vector<uint32_t>& out) const {
  const bool cacheable = word.size() < 256;
  if (cacheable) {
    if (const auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  if (!scores.empty()) {
    std::vector<uint32_t> result = spm_piece(word);
    out.insert(out.end(), result.begin(), result.end());
    if (cacheable) cache.emplace(word, std::move(result));
    return;
  }
  std::vector<uint32_t> ids;
  std::optional<uint32_t> pending_unk;
  for (size_t i = 0, len = 0; i < word.size(); i += len) {
    unicode::cp_at(word, i, len);
    const auto it = vocab.find(word.substr(i, len));
    if (it != vocab.end()) {
      if (pending_unk) ids.push_back(*pending_unk), pending_unk.reset();
      ids.push_back(it->second);
      continue;
    }
    if (byte_tokens(std::string_view(word).substr(i, len), ids)) continue;
    if (unk) {
      if (pending_unk && !fuse_unk) ids.push_back(*pending_unk);
      pending_unk = unk;
    }
  }
  if (pending_unk) ids.push_back(*pending_unk);

  // A doubly linked list of symbols and a heap of candidate merges (rank, position, merged id).
  const int32_t n = static_cast<int32_t>(ids.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int32_t k = 0; k < n; ++k) prev[k] = k - 1, next[k] = k + 1 < n ? k + 1 : -1;
  using Cand = std::tuple<uint32_t, int32_t, uint32_t>;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  const auto push = [&](int32_t k) {
    if (k < 0 || next[k] < 0) return;
    const auto it = merges.find(uint64_t{ids[k]} << 32 | ids[next[k]]);
    if (it != merges.end()) heap.emplace(it->second.first, k, it->second.second);
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const auto [rank, k, merged] = heap.top();
    heap.pop();
    if (!alive[k] || next[k] < 0) continue;
    const int32_t r = next[k];
    const auto it = merges.find(uint64_t{ids[k]} << 32 | ids[r]);
    if (it == merges.end() || it->second.second != merged) continue;
    ids[k] = merged;
    alive[r] = false;
    next[k] = next[r];
    if (next[r] >= 0) prev[next[r]] = k;
    push(prev[k]);
    push(k);
  }
  std::vector<uint32_t> result;
  for (int32_t k = 0; k < n; ++k)
    if (alive[k]) result.push_back(ids[k]);
  out.insert(out.end(), result.begin(), result.end());
  if (cacheable) cache.emplace(word, std::move(result));
}

// llama.cpp's SentencePiece merging (llm_tokenizer_spm): the word's characters (tokens or not), then again and again
// the adjacent pair whose concatenation is a token of the highest score merged, the leftmost of equal scores; each
// piece left its token, else its bytes' tokens (byte fallback), else the unknown token.
std::vector<uint32_t> HfTokenizer::Impl::spm_piece(const std::string& word) const {
  struct Symbol {
    size_t begin, len;
    int32_t prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0, len = 0; i < word.size(); i += len) {
    unicode::cp_at(word, i, len);
    const auto k = static_cast<int32_t>(sym.size());
    sym.push_back({i, len, k - 1, i + len < word.size() ? k + 1 : -1});
  }
  // Candidates: (score, minus the left symbol, the right one, the merged length); the highest first.
  using Cand = std::tuple<float, int32_t, int32_t, size_t>;
  std::priority_queue<Cand> heap;
  const auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const auto it = vocab.find(word.substr(sym[l].begin, sym[l].len + sym[r].len));
    if (it != vocab.end()) heap.emplace(scores[it->second], -l, r, sym[l].len + sym[r].len);
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(sym.size()); ++k) push(k, k + 1);
  while (!heap.empty()) {
    const auto [score, minus_l, r, len] = heap.top();
    heap.pop();
    Symbol& left = sym[-minus_l];
    if (left.len == 0 || sym[r].len == 0 || left.len + sym[r].len != len) continue;  // (either merged since)
    left.len = len;
    sym[r].len = 0;
    left.next = sym[r].next;
    if (left.next >= 0) sym[left.next].prev = -minus_l;
    push(left.prev, -minus_l);
    push(-minus_l, left.next);
  }
  std::vector<uint32_t> ids;
  for (int32_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) {
    const std::string_view piece = std::string_view(word).substr(sym[k].begin, sym[k].len);
    if (const auto it = vocab.find(std::string(piece)); it != vocab.end())
      ids.push_back(it->second);
    else if (!byte_tokens(piece, ids) && unk)
      ids.push_back(*unk);
  }
  return ids;
}

bool HfTokenizer::Impl::byte_tokens(std::string_view piece, std::vector<uint32_t>& ids) const {
  if (!byte_fallback ||
      !std::all_of(piece.begin(), piece.end(), [&](char c) { return byte_ids[static_cast<unsigned char>(c)] >= 0; }))
    return false;
  for (char c : piece) ids.push_back(static_cast<uint32_t>(byte_ids[static_cast<unsigned char>(c)]));
  return true;
}

std::string HfTokenizer::Impl::run_decoders(std::vector<std::string> toks, bool at_start, bool replace_runs) const {
  bool fused = false;
  for (const DecStep& d : decoders) {
    switch (d.kind) {
      case Dec::Replace:
        for (std::string& t : toks) replace_all(t, d.a, d.b);
        break;
      case Dec::ByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        size_t count = 0;
        const auto flush = [&] {
          if (count == 0) return;
          if (!replace_runs || is_valid_utf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (size_t k = 0; k < count; ++k) out.emplace_back("\xEF\xBF\xBD");
          }
          bytes.clear(), count = 0;
        };
        for (std::string& t : toks) {
          const int b = byte_token(t);
          if (b >= 0) {
            bytes.push_back(static_cast<char>(b)), ++count;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        toks = std::move(out);
        break;
      }
      case Dec::Fuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks = {all};
        fused = true;
        break;
      }
      case Dec::Strip:
        for (size_t i = 0; i < toks.size(); ++i) {
          std::string& t = toks[i];
          // After Fuse the one token is the text so far: its start is the text's only at the start, its end is
          // finish_text's.
          if (!fused || at_start)
            for (int64_t k = 0; k < d.start && t.starts_with(d.a); ++k) t.erase(0, d.a.size());
          if (!fused)
            for (int64_t k = 0; k < d.stop && t.ends_with(d.a); ++k) t.erase(t.size() - d.a.size());
        }
        break;
      case Dec::ByteLevel: {
        std::string all;
        for (const std::string& t : toks) {
          std::string bytes;
          bool ok = is_valid_utf8(t);
          for (size_t i = 0, len = 0; ok && i < t.size(); i += len) {
            const int b = unicode::unicode_to_byte(unicode::cp_at(t, i, len));
            if (b < 0) ok = false;
            bytes.push_back(static_cast<char>(b));
          }
          all += ok ? bytes : t;
        }
        toks = {all};  // (made valid UTF-8 by finish_text and held_back)
        fused = true;
        break;
      }
      case Dec::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          const bool drop = i == 0 && at_start && d.prepend != Prepend::Never;
          replace_all(toks[i], d.a, drop ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

namespace {

// The Strip steps with a stop that come after Fuse or ByteLevel: they strip the end of the whole text.
std::vector<const DecStep*> fused_strips(const std::vector<DecStep>& decoders) {
  std::vector<const DecStep*> out;
  bool fused = false;
  for (const DecStep& d : decoders) {
    fused |= d.kind == Dec::Fuse || d.kind == Dec::ByteLevel;
    if (fused && d.kind == Dec::Strip && d.stop > 0) out.push_back(&d);
  }
  return out;
}

}  // namespace

std::string HfTokenizer::Impl::finish_text(std::string_view text) const {
  std::string out = unicode::utf8_lossy(text);
  for (const DecStep* d : fused_strips(decoders))
    for (int64_t k = 0; k < d->stop && out.ends_with(d->a); ++k) out.erase(out.size() - d->a.size());
  return out;
}

size_t HfTokenizer::Impl::held_back(std::string_view text) const {
  if (const size_t cut = unicode::utf8_cut_tail(text)) return cut;
  size_t held = 0;
  for (const DecStep* d : fused_strips(decoders)) {
    size_t n = 0;
    for (int64_t k = 0; k < d->stop && text.substr(0, text.size() - n).ends_with(d->a); ++k) n += d->a.size();
    held = std::max(held, n);
  }
  return held;
}

bool HfTokenizer::Impl::byte_fallback_decoder() const {
  return std::any_of(decoders.begin(), decoders.end(), [](const DecStep& d) { return d.kind == Dec::ByteFallback; });
}

HfTokenizer HfTokenizer::from_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/int64_t{1} << 30);
  return HfTokenizer({reinterpret_cast<const char*>(bytes.data()), bytes.size()}, path);
}

HfTokenizer::HfTokenizer(std::string_view json, const std::string& what) : impl_(std::make_shared<Impl>()) {
  Impl& t = *impl_;
  t.what = what;
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  if (!j.is_object()) t.fail("(top level)", "expected a JSON object");
  for (const char* key : {"truncation", "padding"})
    if (const Json* v = j.find(key); v && !v->is_null()) t.fail(key, "unsupported (only null)");
  const auto optional = [&](const char* key) -> const Json& {
    static const Json null;
    const Json* v = j.find(key);
    return v ? *v : null;
  };
  const Json& model = member(t, j, "model", "tokenizer");
  const Json* vocab = model.is_object() ? model.find("vocab") : nullptr;
  t.id_limit = Impl::kMaxUnusedIds + (vocab && vocab->is_object() ? vocab->as_object().size() : 0) +
               (optional("added_tokens").is_array() ? optional("added_tokens").as_array().size() : 0);
  parse_model(t, model);
  parse_added(t, optional("added_tokens"));
  parse_normalizer(t, optional("normalizer"));
  parse_pre_tokenizer(t, optional("pre_tokenizer"));
  parse_post_processor(t, optional("post_processor"));
  parse_decoder(t, optional("decoder"));
  t.cut_at_metaspace = std::none_of(t.vocab.begin(), t.vocab.end(),
                                    [](const auto& v) { return metaspace_inside(v.first); });
  for (size_t i = 0; i < t.added.size(); ++i) {
    Impl::Matcher& m = t.matchers[t.added[i].normalized];
    std::string pattern = t.added[i].normalized ? t.normalize(t.added[i].content) : t.added[i].content;
    if (pattern.empty()) continue;
    m.by_first[static_cast<unsigned char>(pattern[0])].push_back(static_cast<uint32_t>(m.patterns.size()));
    m.patterns.push_back(std::move(pattern));
    m.added.push_back(i);
  }
}

void HfTokenizer::encode(std::string_view text, bool add_special, std::vector<uint32_t>& out) const {
  const Impl& t = *impl_;
  CASTOR_CHECK(is_valid_utf8(text), "text is not valid UTF-8");
  if (add_special) out.insert(out.end(), t.prefix.begin(), t.prefix.end());
  for (const Segment& raw : t.split_added(text, /*normalized=*/false)) {
    if (raw.id >= 0) {
      out.push_back(static_cast<uint32_t>(raw.id));
      continue;
    }
    const std::string norm = t.normalize(raw.text);
    for (const Segment& seg : t.split_added(norm, /*normalized=*/true)) {
      if (seg.id >= 0) {
        out.push_back(static_cast<uint32_t>(seg.id));
        continue;
      }
      for (const std::string& word : t.pre_tokenize(seg.text, raw.offset == 0 && seg.offset == 0)) t.bpe(word, out);
    }
  }
  if (add_special) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<uint32_t> out;
  encode(text, add_special, out);
  return out;
}

std::string HfTokenizer::decode(std::span<const uint32_t> ids) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (uint32_t id : ids) {
    CASTOR_CHECK(id < t.kind.size() && t.kind[id], t.what, ": token ", id, " is not in the vocabulary");
    toks.push_back(t.tokens[id]);
  }
  return t.finish_text(t.run_decoders(std::move(toks), /*at_start=*/true, /*replace_runs=*/true));
}

std::string HfTokenizer::decode_next(int64_t prev, uint32_t id) const {
  const Impl& t = *impl_;
  CASTOR_CHECK(id < t.kind.size() && t.kind[id], t.what, ": token ", id, " is not in the vocabulary");
  if (t.kind[id] == 3) return "";
  const bool at_start = prev < 0 || (prev < static_cast<int64_t>(t.kind.size()) && t.kind[prev] == 3);
  return t.run_decoders({t.tokens[id]}, at_start, /*replace_runs=*/false);
}

HfTokenizer::Stream::Stream(const HfTokenizer& tok, int64_t prev)
    : impl_(tok.impl_), at_start_(prev < 0 || (prev <= UINT32_MAX && tok.is_special(static_cast<uint32_t>(prev)))) {}

std::string HfTokenizer::Stream::next(uint32_t id) {
  const Impl& t = *impl_;
  CASTOR_CHECK(id < t.kind.size() && t.kind[id], t.what, ": token ", id, " is not in the vocabulary");
  if (t.kind[id] == 3) return finish();
  pending_.push_back(t.tokens[id]);
  // An open run of byte tokens: a byte still to come could make it invalid, and then each of its bytes is U+FFFD.
  if (t.byte_fallback_decoder() && byte_token(pending_.back()) >= 0) return "";
  text_ += t.run_decoders(std::move(pending_), at_start_, /*replace_runs=*/true);
  pending_.clear();
  at_start_ = false;
  const size_t ready = text_.size() - t.held_back(text_);
  std::string out = unicode::utf8_lossy(std::string_view(text_).substr(0, ready));
  text_.erase(0, ready);
  return out;
}

std::string HfTokenizer::Stream::finish() {
  const Impl& t = *impl_;
  if (!pending_.empty()) text_ += t.run_decoders(std::move(pending_), at_start_, /*replace_runs=*/true);
  std::string out = t.finish_text(text_);
  pending_.clear(), text_.clear();
  at_start_ = true;
  return out;
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::optional<uint32_t> HfTokenizer::token_id(std::string_view token) const {
  for (const Added& a : impl_->added)
    if (a.content == token) return a.id;
  const auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? std::nullopt : std::optional<uint32_t>(it->second);
}

bool HfTokenizer::is_special(uint32_t id) const { return id < impl_->kind.size() && impl_->kind[id] == 3; }

const std::vector<uint32_t>& HfTokenizer::prefix_ids() const { return impl_->prefix; }

HfTokenizer::Layout HfTokenizer::layout() const {
  const Impl& t = *impl_;
  Layout l;
  for (const PreStep& p : t.pre) {
    if (p.kind == Pre::ByteLevel) l.byte_level = true;
    if (p.kind == Pre::Split) l.split_digits = p.max_digits;
    if (p.kind == Pre::Metaspace && p.prepend != Prepend::Never) l.prepends_space = true;
  }
  for (const NormStep& n : t.normalizers) {
    if (n.kind == Norm::Nfc) l.nfc = true;
    if (n.kind == Norm::Prepend) l.prepends_space = true;
  }
  l.tokens = t.tokens, l.kind = t.kind, l.unk = t.unk, l.scores = t.scores;
  std::vector<std::pair<uint32_t, std::array<uint32_t, 3>>> ranked;  // (a pair listed twice keeps its one rank)
  ranked.reserve(t.merges.size());
  for (const auto& [pair, rank_merged] : t.merges)
    ranked.push_back(
        {rank_merged.first,
         {static_cast<uint32_t>(pair >> 32), static_cast<uint32_t>(pair & 0xFFFFFFFFu), rank_merged.second}});
  std::sort(ranked.begin(), ranked.end());
  for (const auto& r : ranked) l.merges.push_back(r.second);
  return l;
}

}  // namespace castor::data
