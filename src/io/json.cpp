// The strict JSON parser and serializer behind castor::Json.
#include "castor/json.h"

#include <charconv>
#include <cmath>

namespace castor {
namespace {

const char* const kTypeNames[] = {"null", "bool", "number", "string", "array", "object"};

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 when it is malformed.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  unsigned c = byte(0);
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (byte(1) < lo || byte(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  return n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void dump_string(std::string& out, const std::string& s) {
  CASTOR_CHECK(is_valid_utf8(s), "Json::dump: string is not valid UTF-8");
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump_number(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string_view text(buf, res.ptr - buf);
  out += text;
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";  // keep it a float when read back
}

void dump_value(std::string& out, const Json& v, int indent, int depth) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * d, ' ');
  };
  switch (v.type()) {
    case Json::Type::Null: out += "null"; break;
    case Json::Type::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Json::Type::Number:
      if (v.is_int())
        out += std::to_string(v.as_int());
      else
        dump_number(out, v.as_double());
      break;
    case Json::Type::String: dump_string(out, v.as_string()); break;
    case Json::Type::Array: {
      out += '[';
      bool first = true;
      for (const Json& e : v.as_array()) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        dump_value(out, e, indent, depth + 1);
      }
      if (!first) newline(depth);
      out += ']';
      break;
    }
    case Json::Type::Object: {
      out += '{';
      bool first = true;
      for (const auto& [key, e] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        dump_string(out, key);
        out += indent < 0 ? ":" : ": ";
        dump_value(out, e, indent, depth + 1);
      }
      if (!first) newline(depth);
      out += '}';
      break;
    }
  }
}

}  // namespace

class JsonParser {
 public:
  // `ordered`: objects as arrays of [key, value] pairs in the order written (Json::parse_ordered).
  JsonParser(std::string_view s, bool ordered) : s_(s), ordered_(ordered) {}

  Json document() {
    skip_whitespace();
    Json v = value(0);
    skip_whitespace();
    if (pos_ != s_.size()) fail("unexpected characters after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(detail::cat("invalid JSON at offset ", pos_, ": ", what));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void expect(char c) {
    if (peek() != c) fail(detail::cat("expected '", c, "'"));
    ++pos_;
  }
  void skip_whitespace() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  // `depth` counts the arrays and objects enclosing the value.
  Json value(int depth) {
    switch (peek()) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return Json(string());
      case 't': literal("true"); return Json(true);
      case 'f': literal("false"); return Json(false);
      case 'n': literal("null"); return Json();
      default: return number();
    }
  }

  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  void check_depth(int depth) const {
    if (depth > Json::kMaxDepth) fail(detail::cat("nesting deeper than ", Json::kMaxDepth));
  }

  Json object(int depth) {
    check_depth(depth);
    Json out(Json::Object{});
    Json pairs(Json::Array{});  // (ordered_)
    expect('{');
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return ordered_ ? pairs : out;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = string();
      skip_whitespace();
      expect(':');
      skip_whitespace();
      Json v = value(depth);
      if (ordered_) pairs.array_.push_back(Json::Array{key, v});
      if (!out.object_.try_emplace(key, std::move(v)).second) {
        pos_ = key_pos;
        fail("duplicate key " + Json(key).dump());
      }
      skip_whitespace();
      if (peek() == '}') {
        ++pos_;
        return ordered_ ? pairs : out;
      }
      expect(',');
    }
  }

  Json array(int depth) {
    check_depth(depth);
    Json out(Json::Array{});
    expect('[');
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return out;
    }
    while (true) {
      skip_whitespace();
      out.array_.push_back(value(depth));
      skip_whitespace();
      if (peek() == ']') {
        ++pos_;
        return out;
      }
      expect(',');
    }
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      char c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) fail("invalid \\u escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  std::string string() {
    std::string out;
    expect('"');
    while (true) {
      if (at_end()) fail("unterminated string");
      auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c >= 0x80) {
        size_t n = utf8_sequence_length(s_, pos_);
        if (n == 0) fail("invalid UTF-8 in string");
        out.append(s_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail("high surrogate not followed by a low surrogate");
            pos_ += 2;
            uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("invalid escape");
      }
    }
  }

  Json number() {
    size_t start = pos_;
    auto digits = [&] {
      size_t from = pos_;
      while (peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - from;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digits() == 0) {
      pos_ = start;
      fail("invalid value");
    }
    bool integral = true;
    if (peek() == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      integral = false;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected digits in the exponent");
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      int64_t i;
      if (std::from_chars(first, last, i).ec == std::errc()) return Json(i);
    }
    double d;
    if (std::from_chars(first, last, d).ec != std::errc()) {
      pos_ = start;
      fail("number out of range");
    }
    return Json(d);
  }

  std::string_view s_;
  size_t pos_ = 0;
  bool ordered_ = false;
};

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

Json Json::parse(std::string_view text) { return JsonParser(text, false).document(); }
Json Json::parse_ordered(std::string_view text) { return JsonParser(text, true).document(); }

std::string Json::dump(int indent) const {
  std::string out;
  dump_value(out, *this, indent, 0);
  return out;
}

const char* Json::type_name() const { return kTypeNames[static_cast<int>(type_)]; }

void Json::expect(Type t) const {
  CASTOR_CHECK(type_ == t, "Json: expected ", kTypeNames[static_cast<int>(t)], ", got ", type_name());
}

bool Json::as_bool() const { return expect(Type::Bool), bool_; }
double Json::as_double() const { return expect(Type::Number), number_; }
int64_t Json::as_int() const {
  CASTOR_CHECK(is_int(), "Json: expected an integer, got ", is_number() ? "a non-integer number" : type_name());
  return int_;
}
const std::string& Json::as_string() const { return expect(Type::String), string_; }
const Json::Array& Json::as_array() const { return expect(Type::Array), array_; }
Json::Array& Json::as_array() { return expect(Type::Array), array_; }
const Json::Object& Json::as_object() const { return expect(Type::Object), object_; }
Json::Object& Json::as_object() { return expect(Type::Object), object_; }

const Json* Json::find(const std::string& key) const {
  const Object& o = as_object();
  auto it = o.find(key);
  return it == o.end() ? nullptr : &it->second;
}

const Json& Json::at(const std::string& key) const {
  const Json* v = find(key);
  CASTOR_CHECK(v, "Json: missing key ", Json(key).dump());
  return *v;
}

Json& Json::operator[](const std::string& key) {
  if (is_null()) *this = Json(Object{});
  return as_object()[key];
}

}  // namespace castor
