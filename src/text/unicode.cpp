// Unicode helpers the tokenizers and chat templates share: UTF-8 decoding and encoding, character classes, GPT-2's byte map, NFC and lossy UTF-8 repair.
#include "text/unicode.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/json.h"

namespace castor::data::unicode {

std::u32string decode_utf8(std::string_view s, const std::string& what) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    CASTOR_CHECK(len != 0 && i + len <= s.size() && is_valid_utf8(s.substr(i, len)), what, ": not valid UTF-8 at byte ",
                 i);
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | cp >> 6));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | cp >> 12));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | cp >> 18));
    out.push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

struct CodeRange {
  char32_t lo, hi;
};
#include "unicode_classes.inc"

struct CombiningClass {
  char32_t cp, ccc;
};
struct Decomposition {
  char32_t cp, first, second;
};
struct Composition {
  char32_t first, second, composite;
};
#include "nfc_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  const CodeRange* r = std::upper_bound(table, table + N, cp, [](char32_t c, const CodeRange& x) { return c < x.lo; });
  return r != table && cp <= (r - 1)->hi;
}

// Hangul syllables (Unicode 3.12): S = SBase + (L * VCount + V) * TCount + T.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = kLCount * kVCount * kTCount;

uint32_t ccc_of(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = kCombiningClasses + std::size(kCombiningClasses);
  const auto* it = std::lower_bound(kCombiningClasses, end, cp,
                                    [](const CombiningClass& c, char32_t v) { return c.cp < v; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + s % (kVCount * kTCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = kDecompositions + std::size(kDecompositions);
  const auto* it = std::lower_bound(kDecompositions, end, cp,
                                    [](const Decomposition& d, char32_t v) { return d.cp < v; });
  if (cp < 0xC0 || it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = kCompositions + std::size(kCompositions);
  const auto* it = std::lower_bound(kCompositions, end, std::pair{a, b},
                                    [](const Composition& c, std::pair<char32_t, char32_t> v) {
                                      return c.first < v.first || (c.first == v.first && c.second < v.second);
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

char32_t cp_at(std::string_view s, size_t pos, size_t& len) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return len = 1, c;
  if (c < 0xE0) return len = 2, char32_t(c & 0x1F) << 6 | (b(1) & 0x3F);
  if (c < 0xF0) return len = 3, char32_t(c & 0x0F) << 12 | char32_t(b(1) & 0x3F) << 6 | (b(2) & 0x3F);
  return len = 4, char32_t(c & 0x07) << 18 | char32_t(b(1) & 0x3F) << 12 | char32_t(b(2) & 0x3F) << 6 | (b(3) & 0x3F);
}

bool is_letter(char32_t cp) {
  if (cp < 128) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetters, cp);
}
bool is_number(char32_t cp) {
  if (cp < 128) return cp >= '0' && cp <= '9';
  return in_ranges(kNumbers, cp);
}
bool is_js_space(char32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13);
  return in_ranges(kSpaces, cp);
}
bool is_white_space(char32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13);
  return in_ranges(kWhiteSpace, cp);
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> m = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return m;
}

int unicode_to_byte(char32_t cp) {
  static const std::array<int, 324> from = [] {
    std::array<int, 324> f{};
    f.fill(-1);
    for (int b = 0; b < 256; ++b) f[byte_to_unicode()[b]] = b;
    return f;
  }();
  return cp < from.size() ? from[cp] : -1;
}

std::string nfc(std::string_view s) {
  // Below U+0300 every character is its own NFC and none composes with a following one below U+0300.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return std::string(s);
  std::u32string d;
  for (size_t i = 0, len = 0; i < s.size(); i += len) decompose(cp_at(s, i, len), d);
  // Canonical ordering: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless blocked (a character between them with a
  // class of zero or at least its own).
  std::u32string out;
  size_t starter = std::u32string::npos;
  uint32_t last_ccc = 0;
  for (char32_t cp : d) {
    const uint32_t c = ccc_of(cp);
    if (starter != std::u32string::npos && (last_ccc < c || (last_ccc == 0 && starter + 1 == out.size()))) {
      if (const char32_t comp = compose(out[starter], cp)) {
        out[starter] = comp;
        continue;
      }
    }
    if (c == 0) starter = out.size();
    last_ccc = c;
    out.push_back(cp);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t cp : out) append_utf8(cp, r);
  return r;
}

namespace {

// The sequence at b[i] as String::from_utf8_lossy steps over it: its length (a whole character, or a maximal
// invalid subsequence), whether it is a whole character, and whether it is a valid start cut short by b's end.
struct Utf8Step {
  size_t len;
  bool whole, cut;
};
Utf8Step utf8_step(std::string_view b, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(b[k]); };
  const unsigned char c = at(i);
  const size_t need = c < 0x80                 ? 0
                      : c >= 0xC2 && c <= 0xDF ? 1
                      : c >= 0xE0 && c <= 0xEF ? 2
                      : c >= 0xF0 && c <= 0xF4 ? 3
                                               : 99;
  if (need == 0) return {1, true, false};
  if (need == 99) return {1, false, false};
  // The second byte's range depends on the first (no overlongs, surrogates or code points past U+10FFFF).
  const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  size_t k = 1;
  for (; k <= need && i + k < b.size(); ++k) {
    const unsigned char x = at(i + k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) break;
  }
  return {k, k == need + 1, k <= need && i + k == b.size()};
}

}  // namespace

std::string utf8_lossy(std::string_view b) {
  std::string out;
  out.reserve(b.size());
  for (size_t i = 0; i < b.size();) {
    const Utf8Step s = utf8_step(b, i);
    out.append(s.whole ? b.substr(i, s.len) : "\xEF\xBF\xBD");
    i += s.len;
  }
  return out;
}

size_t utf8_cut_tail(std::string_view b) {
  // (only the last 4 bytes can hold the start of a cut sequence; a lead byte ends any sequence before it)
  for (size_t i = b.size() > 4 ? b.size() - 4 : 0; i < b.size();) {
    const Utf8Step s = utf8_step(b, i);
    if (s.cut) return b.size() - i;
    i += s.len;
  }
  return 0;
}

std::vector<std::string_view> split_gpt2(std::string_view s, bool (*is_space)(char32_t)) {
  enum class Cls : uint8_t { Letter, Number, Space, Other };
  const auto classify = [&](char32_t cp) {
    return is_letter(cp) ? Cls::Letter : is_number(cp) ? Cls::Number : is_space(cp) ? Cls::Space : Cls::Other;
  };
  std::vector<std::string_view> pieces;
  const size_t n = s.size();
  size_t i = 0;
  // The end of the run of class `c` that starts at `pos`.
  auto run_end = [&](size_t pos, Cls c) {
    size_t len = 0;
    while (pos < n && classify(cp_at(s, pos, len)) == c) pos += len;
    return pos;
  };
  while (i < n) {
    size_t len = 0;
    const char32_t cp = cp_at(s, i, len);
    size_t end = i;
    if (cp == '\'' && i + 1 < n) {
      const std::string_view rest = s.substr(i + 1, 2);
      if (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd')
        end = i + 2;
      else if (rest == "re" || rest == "ve" || rest == "ll")
        end = i + 3;
    }
    if (end == i) {
      Cls c = classify(cp);
      size_t start = i;
      if (cp == ' ' && i + 1 < n) {
        size_t next_len = 0;
        const Cls next = classify(cp_at(s, i + 1, next_len));
        if (next != Cls::Space) c = next, start = i + 1;
      }
      if (c != Cls::Space) {
        end = run_end(start, c);
      } else {
        const size_t ws = run_end(i, Cls::Space);
        // \s+(?!\S): the whole run at the end of the text, else all but its last character (when that leaves
        // one); \s+: a single whitespace character before a non-space.
        end = ws;
        if (ws < n) {
          size_t last = i, l = 0;
          for (size_t p = i; p < ws; p += l) cp_at(s, p, l), last = p;
          if (last > i) end = last;
        }
      }
    }
    pieces.push_back(s.substr(i, end - i));
    i = end;
  }
  return pieces;
}

std::vector<std::string_view> split_llama3(std::string_view s, int max_digits) {
  std::vector<std::string_view> pieces;
  const size_t n = s.size();
  const auto cp = [&](size_t pos, size_t& len) { return cp_at(s, pos, len); };
  const auto other = [](char32_t c) { return !is_white_space(c) && !is_letter(c) && !is_number(c); };
  size_t i = 0;
  while (i < n) {
    size_t len = 0, len2 = 0;
    const char32_t c = cp(i, len);
    size_t end = i;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c == '\'' && i + 1 < n) {
      const auto lower = [&](size_t k) { return k < n ? static_cast<char>(s[k] | 0x20) : '\0'; };
      const char a = lower(i + 1), b = lower(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        end = i + 3;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (end == i) {
      size_t p = i;
      if (!is_letter(c) && c != '\r' && c != '\n' && !is_number(c) && i + len < n && is_letter(cp(i + len, len2)))
        p = i + len;
      if (is_letter(cp(p, len2))) {
        while (p < n && is_letter(cp(p, len2))) p += len2;
        end = p;
      }
    }
    // \p{N}{1,max_digits}
    if (end == i && is_number(c)) {
      size_t p = i;
      for (int k = 0; k < max_digits && p < n && is_number(cp(p, len2)); ++k) p += len2;
      end = p;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (end == i) {
      size_t p = c == ' ' && i + 1 < n ? i + 1 : i;
      if (other(cp(p, len2))) {
        while (p < n && other(cp(p, len2))) p += len2;
        while (p < n && (s[p] == '\r' || s[p] == '\n')) ++p;
        end = p;
      }
    }
    if (end == i) {
      // Whitespace from here: \s*[\r\n]+ up to its last line break, else \s+(?!\S) (all but the last character
      // before a non-space, or the whole run at the end), else \s+.
      size_t run = i, last_nl = std::string_view::npos, last = i;
      while (run < n && is_white_space(cp(run, len2))) {
        if (s[run] == '\r' || s[run] == '\n') last_nl = run;
        last = run;
        run += len2;
      }
      if (last_nl != std::string_view::npos)
        end = last_nl + 1;
      else if (run < n && last > i)
        end = last;
      else
        end = run;
    }
    pieces.push_back(s.substr(i, end - i));
    i = end;
  }
  return pieces;
}

}  // namespace castor::data::unicode
