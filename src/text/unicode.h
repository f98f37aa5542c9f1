// Unicode helpers the tokenizers and chat templates share (private to src/text and the layers above): UTF-8
// decoding, encoding and stepping, the character classes their pre-tokenizer regexes use, GPT-2's byte-to-character
// map, NFC and lossy UTF-8 repair.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace castor::data::unicode {

// UTF-8 to code points; castor::Error naming `what` and the byte offset on invalid UTF-8.
std::u32string decode_utf8(std::string_view text, const std::string& what);
void append_utf8(char32_t cp, std::string& out);

// The code point at s[pos] of valid UTF-8, and its length in bytes.
char32_t cp_at(std::string_view s, size_t pos, size_t& len);

bool is_letter(char32_t cp);       // \p{L}
bool is_number(char32_t cp);       // \p{N}
bool is_js_space(char32_t cp);     // JavaScript's \s (u flag): White_Space without U+0085, with U+FEFF
bool is_white_space(char32_t cp);  // Unicode's White_Space, \s of Oniguruma (Hugging Face tokenizers' regexes)

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 onwards in byte order.
const std::array<char32_t, 256>& byte_to_unicode();
// The byte that a character of GPT-2's byte alphabet stands for, or -1.
int unicode_to_byte(char32_t cp);

// Unicode Normalization Form C of valid UTF-8 (canonical decomposition, canonical ordering, canonical composition;
// tables generated from Python's unicodedata by scripts/gen_nfc_tables.py).
std::string nfc(std::string_view s);

// Bytes as UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Rust's String::from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);
// How many bytes at the end of `bytes` are the start of a UTF-8 sequence cut short (more bytes could complete it;
// utf8_lossy gives U+FFFD for them as they are): 0 to 3. utf8_lossy of the bytes before them is final: no byte
// appended can change it.
size_t utf8_cut_tail(std::string_view bytes);

// The pieces (tiling `s`, valid UTF-8) of GPT-2's pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s as `is_space` has it (is_js_space: gpt-3-encoder's; is_white_space: Hugging Face's ByteLevel).
std::vector<std::string_view> split_gpt2(std::string_view s, bool (*is_space)(char32_t));
// The pieces of Llama 3's regex (max_digits 3) or Qwen2's (max_digits 1), Oniguruma's leftmost-first semantics:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::vector<std::string_view> split_llama3(std::string_view s, int max_digits);

}  // namespace castor::data::unicode
