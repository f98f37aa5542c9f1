// The chat-template subset of Jinja (castor/jinja.h): a lexer with transformers' whitespace rules, a recursive-descent
// parser to a small tree, and a tree-walking evaluator over Python-like values.
#include "castor/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>

#include "castor/check.h"
#include "text/unicode.h"

namespace castor::data {

namespace {

constexpr size_t kBytesPerStep = 256;  // a string's bytes copied that count as one step of the budget

// ---------------------------------------------------------------------------------------------------------------
// Values

struct Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  Value* find(const std::string& key);
};
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Fn = std::function<Value(Args&, Kwargs&)>;

struct Value {
  enum class K { Undefined, None, Bool, Int, Float, Str, List, Dict, Ns, Fn } k = K::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; Undefined: what was undefined (for errors)
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;  // Dict and Ns
  std::shared_ptr<Fn> fn;
  int depth = 0;          // List, Dict, Ns: how many lists and dicts nest here (at construction)
  bool holds_ns = false;  // a namespace, or a list or dict holding one (a namespace may not hold one: no cycles)

  static Value undefined(std::string what) {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value none() {
    Value v;
    v.k = K::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = K::Bool, v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = K::Int, v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.k = K::Float, v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.k = K::Str, v.s = std::move(x);
    return v;
  }
  static Value list(List x = {}) {
    Value v;
    v.k = K::List, v.depth = 1;
    for (const Value& e : x) v.contain(e);
    v.l = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value dict(Dict x = {}, K kind = K::Dict) {
    Value v;
    v.k = kind, v.depth = 1, v.holds_ns = kind == K::Ns;
    for (const auto& [_, e] : x.items) v.contain(e);
    v.d = std::make_shared<Dict>(std::move(x));
    return v;
  }
  void contain(const Value& e) {
    depth = std::max(depth, e.depth + 1);
    holds_ns |= e.holds_ns;
  }
  static Value function(Fn f) {
    Value v;
    v.k = K::Fn, v.fn = std::make_shared<Fn>(std::move(f));
    return v;
  }
  bool is_number() const { return k == K::Int || k == K::Float || k == K::Bool; }
  double number() const { return k == K::Float ? f : k == K::Bool ? (b ? 1 : 0) : static_cast<double>(i); }
};

Value* Dict::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

const char* kind_name(const Value& v) {
  switch (v.k) {
    case Value::K::Undefined: return "undefined";
    case Value::K::None: return "none";
    case Value::K::Bool: return "boolean";
    case Value::K::Int: return "integer";
    case Value::K::Float: return "float";
    case Value::K::Str: return "string";
    case Value::K::List: return "list";
    case Value::K::Dict: return "dict";
    case Value::K::Ns: return "namespace";
    case Value::K::Fn: return "function";
  }
  return "?";
}

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::Type::Null: return Value::none();
    case Json::Type::Bool: return Value::boolean(j.as_bool());
    case Json::Type::Number: return j.is_int() ? Value::integer(j.as_int()) : Value::real(j.as_double());
    case Json::Type::String: return Value::str(j.as_string());
    case Json::Type::Array: {
      List l;
      for (const Json& e : j.as_array()) l.push_back(from_json(e));
      return Value::list(std::move(l));
    }
    case Json::Type::Object: {
      Dict d;
      for (const auto& [k, v] : j.as_object()) d.items.emplace_back(k, from_json(v));
      return Value::dict(std::move(d));
    }
  }
  return Value::none();
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::Undefined:
    case Value::K::None: return false;
    case Value::K::Bool: return v.b;
    case Value::K::Int: return v.i != 0;
    case Value::K::Float: return v.f != 0;
    case Value::K::Str: return !v.s.empty();
    case Value::K::List: return !v.l->empty();
    case Value::K::Dict: return !v.d->items.empty();
    default: return true;
  }
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Python's json.dumps(ensure_ascii=False) of a string.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string repr(const Value& v);

std::string to_str(const Value& v) {
  switch (v.k) {
    case Value::K::Undefined: return "";
    case Value::K::None: return "None";
    case Value::K::Bool: return v.b ? "True" : "False";
    case Value::K::Int: return std::to_string(v.i);
    case Value::K::Float: return float_repr(v.f);
    case Value::K::Str: return v.s;
    case Value::K::Fn: return "<function>";
    default: return repr(v);
  }
}

// Python's repr of a list or dict (strings quoted with ').
std::string repr(const Value& v) {
  if (v.k == Value::K::Str) {
    std::string out = "'";
    for (char c : v.s) {
      if (c == '\'' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out + "'";
  }
  if (v.k == Value::K::List) {
    std::string out = "[";
    for (size_t i = 0; i < v.l->size(); ++i) out += (i ? ", " : "") + repr((*v.l)[i]);
    return out + "]";
  }
  if (v.k == Value::K::Dict || v.k == Value::K::Ns) {
    std::string out = v.k == Value::K::Ns ? "<Namespace {" : "{";
    for (size_t i = 0; i < v.d->items.size(); ++i)
      out += (i ? ", " : "") + repr(Value::str(v.d->items[i].first)) + ": " + repr(v.d->items[i].second);
    return out + (v.k == Value::K::Ns ? "}>" : "}");
  }
  return to_str(v);
}

[[noreturn]] void text_too_long() {
  throw Error(detail::cat("text longer than ", kMaxTemplateText, " bytes (the template interpreter's limit)"));
}

// Python's json.dumps(x, ensure_ascii=False, indent=indent) (transformers' tojson filter).
void tojson(const Value& v, int64_t indent, int depth, std::string& out) {
  if (out.size() > kMaxTemplateText || indent > static_cast<int64_t>(kMaxTemplateText) / (depth + 1)) text_too_long();
  const std::string pad = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string sep = indent > 0 ? "," : ", ";
  switch (v.k) {
    case Value::K::Undefined:
    case Value::K::None: out += "null"; return;
    case Value::K::Bool: out += v.b ? "true" : "false"; return;
    case Value::K::Int: out += std::to_string(v.i); return;
    case Value::K::Float: {
      const std::string r = float_repr(v.f);
      out += r == "nan" ? "NaN" : r == "inf" ? "Infinity" : r == "-inf" ? "-Infinity" : r;
      return;
    }
    case Value::K::Str: out += json_string(v.s); return;
    case Value::K::List:
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.l->size(); ++i) {
        out += (i ? sep : "") + pad;
        tojson((*v.l)[i], indent, depth + 1, out);
      }
      out += close + "]";
      return;
    case Value::K::Dict:
    case Value::K::Ns:
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t i = 0; i < v.d->items.size(); ++i) {
        out += (i ? sep : "") + pad + json_string(v.d->items[i].first) + ": ";
        tojson(v.d->items[i].second, indent, depth + 1, out);
      }
      out += close + "}";
      return;
    case Value::K::Fn: throw Error("tojson: a function is not JSON");
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.k == Value::K::Float || b.k == Value::K::Float) return a.number() == b.number();
    return (a.k == Value::K::Bool ? a.b : a.i) == (b.k == Value::K::Bool ? b.b : b.i);
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::K::Undefined:
    case Value::K::None: return true;
    case Value::K::Str: return a.s == b.s;
    case Value::K::List:
      if (a.l->size() != b.l->size()) return false;
      for (size_t i = 0; i < a.l->size(); ++i)
        if (!equal((*a.l)[i], (*b.l)[i])) return false;
      return true;
    case Value::K::Dict:
    case Value::K::Ns:
      if (a.d->items.size() != b.d->items.size()) return false;
      for (auto& [k, v] : a.d->items) {
        const Value* w = b.d->find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    default: return a.fn == b.fn;
  }
}

std::u32string code_points(const std::string& s) { return unicode::decode_utf8(s, "a template string"); }
std::string utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) unicode::append_utf8(c, out);
  return out;
}

// A boolean or integer as Python's int.
int64_t as_int(const Value& v) { return v.k == Value::K::Bool ? v.b : v.i; }

// Python's +, -, *, // (floor), % (floored) and ** (a non-negative power) of integers; nullopt where the result is
// beyond 64 bits. `y` is not 0 for // and %.
std::optional<int64_t> int_arith(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op == "+") return __builtin_add_overflow(x, y, &r) ? std::nullopt : std::optional(r);
  if (op == "-") return __builtin_sub_overflow(x, y, &r) ? std::nullopt : std::optional(r);
  if (op == "*") return __builtin_mul_overflow(x, y, &r) ? std::nullopt : std::optional(r);
  if (op == "//" || op == "%") {
    if (y == -1) return op == "%" ? std::optional<int64_t>(0) : x == INT64_MIN ? std::nullopt : std::optional(-x);
    int64_t q = x / y, m = x % y;
    if (m != 0 && (m < 0) != (y < 0)) --q, m += y;
    return op == "//" ? q : m;
  }
  // ** by squaring: while bits of y remain above the current one, the result holds base^2 at least, so base^2
  // overflowing means the result does.
  r = 1;
  for (int64_t base = x, e = y; e > 0; e >>= 1) {
    if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return std::nullopt;
    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return std::nullopt;
  }
  return r;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars && chars->k == Value::K::Str ? chars->s.find(c) != std::string::npos : is_space(c);
  };
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && drop(s[a])) ++a;
  if (right)
    while (b > a && drop(s[b - 1])) --b;
  return s.substr(a, b - a);
}

// ---------------------------------------------------------------------------------------------------------------
// Lexer: text, and the tokens of each tag

struct Token {
  enum class T { Name, Str, Int, Float, Op, End } t = T::End;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

struct Segment {
  enum class T { Text, Expr, Stmt } t = T::Text;
  std::string text;
  std::vector<Token> tokens;
  int line = 1;
};

[[noreturn]] void fail(const std::string& what, int line, const std::string& msg) {
  throw Error(detail::cat(what, ": line ", line, ": ", msg));
}

[[noreturn]] void too_deep(const std::string& what, int line) {
  fail(what, line, detail::cat("nested deeper than ", kMaxTemplateDepth, " levels (the template interpreter's limit)"));
}

// An integer or float literal from src[pos] (digits with '_' separators, as Python's); returns the position after it.
size_t lex_number(const std::string& src, size_t pos, Token& t, const std::string& what, int line) {
  size_t e = pos;
  while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
  bool is_float = false;
  if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
    is_float = true;
    ++e;
    while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
  }
  std::string digits = src.substr(pos, e - pos);
  std::erase(digits, '_');
  const char* end = digits.data() + digits.size();
  const std::from_chars_result r = is_float ? std::from_chars(digits.data(), end, t.f)
                                            : std::from_chars(digits.data(), end, t.i);
  if (r.ec != std::errc() || r.ptr != end)
    fail(what, line, "the number " + digits + " is beyond 64 bits (the template interpreter's limit)");
  t.t = is_float ? Token::T::Float : Token::T::Int;
  return e;
}

// A quoted string literal from src[pos] with Python's escapes; returns the position after its closing quote.
size_t lex_string(const std::string& src, size_t pos, Token& t, const std::string& what, int line) {
  const char c = src[pos];
  std::string s;
  size_t e = pos + 1;
  for (;; ++e) {
    if (e >= src.size()) fail(what, line, "a string literal is not closed");
    if (src[e] == c) break;
    if (src[e] != '\\') {
      s += src[e];
      continue;
    }
    if (++e >= src.size()) fail(what, line, "a string literal is not closed");
    switch (src[e]) {
      case 'n': s += '\n'; break;
      case 't': s += '\t'; break;
      case 'r': s += '\r'; break;
      case 'b': s += '\b'; break;
      case 'f': s += '\f'; break;
      case 'v': s += '\v'; break;
      case '0': s += '\0'; break;
      case '\\':
      case '\'':
      case '"': s += src[e]; break;
      case 'x':
      case 'u': {
        const size_t n = src[e] == 'x' ? 2 : 4;
        if (e + n >= src.size()) fail(what, line, "a bad \\" + std::string(1, src[e]) + " escape");
        const std::string hex = src.substr(e + 1, n);
        if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          fail(what, line, "a bad \\" + std::string(1, src[e]) + " escape");
        const auto cp = static_cast<char32_t>(std::stoul(hex, nullptr, 16));
        if (cp >= 0xD800 && cp <= 0xDFFF) fail(what, line, "\\u" + hex + " is a surrogate, not a character");
        unicode::append_utf8(cp, s);
        e += n;
        break;
      }
      default: s += '\\', s += src[e];  // Python keeps an unknown escape as written
    }
  }
  t.t = Token::T::Str, t.s = std::move(s);
  return e + 1;
}

// The tokens of one tag from src[pos] up to its closer ("}}" or "%}", with an optional '-' before it); returns the
// position after the closer and whether it had '-'.
std::pair<size_t, bool> lex_tag(const std::string& src, size_t pos, const std::string& closer, std::vector<Token>& out,
                                const std::string& what, int line) {
  static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                              ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "="};
  while (true) {
    while (pos < src.size() && is_space(src[pos])) {
      ++pos;
    }
    if (pos >= src.size()) fail(what, line, "a tag is not closed with '" + closer + "'");
    if (src.compare(pos, 1 + closer.size(), "-" + closer) == 0) return {pos + 1 + closer.size(), true};
    if (src.compare(pos, closer.size(), closer) == 0) return {pos + closer.size(), false};
    if (src.compare(pos, 1 + closer.size(), "+" + closer) == 0) return {pos + 1 + closer.size(), false};
    const char c = src[pos];
    Token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos;
      while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      t.t = Token::T::Name, t.s = src.substr(pos, e - pos);
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      pos = lex_number(src, pos, t, what, line);
    } else if (c == '\'' || c == '"') {
      pos = lex_string(src, pos, t, what, line);
    } else {
      bool found = false;
      for (const char* op : ops)
        if (src.compare(pos, std::strlen(op), op) == 0) {
          t.t = Token::T::Op, t.s = op;
          pos += std::strlen(op);
          found = true;
          break;
        }
      if (!found) fail(what, line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
}

std::vector<Segment> lex(std::string src, const std::string& what) {
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline=False
  std::vector<Segment> segs;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_next = false;
  auto count_lines = [&](size_t from, size_t to) {
    line += static_cast<int>(
        std::count(src.begin() + static_cast<ptrdiff_t>(from), src.begin() + static_cast<ptrdiff_t>(to), '\n'));
  };
  while (pos <= src.size()) {
    size_t open = pos;
    while ((open = src.find('{', open)) != std::string::npos &&
           (open + 1 >= src.size() || (src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')))
      ++open;
    const size_t text_end = open == std::string::npos ? src.size() : open;
    std::string text = src.substr(pos, text_end - pos);
    if (trim_next && text.starts_with("\r\n"))
      text.erase(0, 2);
    else if (trim_next && text.starts_with("\n"))
      text.erase(0, 1);
    if (strip_next) text = strip(text, nullptr, true, false);
    strip_next = trim_next = false;
    count_lines(pos, text_end);
    if (open == std::string::npos) {
      if (!text.empty()) segs.push_back({Segment::T::Text, text, {}, line});
      break;
    }
    const char kind = src[open + 1];
    const char mod = open + 2 < src.size() ? src[open + 2] : ' ';
    if (mod == '-') {
      text = strip(text, nullptr, false, true);
    } else if (kind != '{' && mod != '+') {  // lstrip_blocks
      size_t k = open;
      while (k > 0 && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || src[k - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - k));
    }
    if (!text.empty()) segs.push_back({Segment::T::Text, text, {}, line});
    size_t body = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
    if (kind == '#') {
      const size_t close = src.find("#}", body);
      if (close == std::string::npos) fail(what, line, "a comment is not closed with '#}'");
      strip_next = close > body && src[close - 1] == '-';
      trim_next = !strip_next;
      count_lines(open, close + 2);
      pos = close + 2;
      continue;
    }
    Segment seg;
    seg.t = kind == '{' ? Segment::T::Expr : Segment::T::Stmt;
    seg.line = line;
    const auto [next, dash] = lex_tag(src, body, kind == '{' ? "}}" : "%}", seg.tokens, what, line);
    count_lines(open, next);
    strip_next = dash;
    trim_next = !dash && kind == '%';
    segs.push_back(std::move(seg));
    pos = next;
  }
  return segs;
}

// ---------------------------------------------------------------------------------------------------------------
// The tree

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class T {
    Literal,
    Name,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Neg,
    Pos,
    Not,
    Binary,
    And,
    Or,
    Cond,
    ListLit,
    DictLit
  } t;
  Value literal;
  std::string name;           // Name, Attr, Filter, Test; Binary: the operator
  bool negate = false;        // Test: `is not`
  std::vector<ExprPtr> args;  // operands; Slice: object, start, stop, step (null when absent); Call: callee first
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int line = 0;
  int depth = 1;  // the tree's height here (Parser::done)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum class T { Text, Output, Set, For, If } t;
  std::string text;
  ExprPtr expr;                    // Output, Set's value, For's iterable
  std::vector<std::string> names;  // Set: target (one name, or namespace and attribute); For: loop variables
  bool attr_target = false;
  ExprPtr filter;                                  // For's `if`
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: conditions and bodies (a null condition: else)
  Body body, else_body;                            // For
  int line = 0;
};

const std::set<std::string> kFilters = {"trim",    "tojson",     "length", "count", "lower",      "upper",
                                        "title",   "capitalize", "first",  "last",  "join",       "default",
                                        "d",       "string",     "int",    "float", "list",       "items",
                                        "replace", "safe",       "abs",    "map",   "selectattr", "rejectattr"};
const std::set<std::string> kTests = {"defined", "undefined",   "none",     "string",  "number", "integer", "float",
                                      "mapping", "iterable",    "sequence", "boolean", "true",   "false",   "odd",
                                      "even",    "divisibleby", "eq",       "equalto", "ne",     "lt",      "gt",
                                      "le",      "ge",          "in",       "sameas"};
const std::set<std::string> kMethods = {"strip", "lstrip", "rstrip",  "split",  "startswith", "endswith",
                                        "upper", "lower",  "replace", "title",  "capitalize", "find",
                                        "count", "items",  "keys",    "values", "get"};

class Parser {
 public:
  Parser(const std::string& what, std::vector<Segment> segs) : what_(what), segs_(std::move(segs)) {}

  Body parse() {
    Body b = body({});
    if (seg_ < segs_.size()) fail(what_, segs_[seg_].line, "unexpected '" + tag_name(segs_[seg_]) + "'");
    return b;
  }

 private:
  static std::string tag_name(const Segment& s) { return s.tokens.empty() ? "" : s.tokens[0].s; }

  // Counts the parser's recursion (nested statements, parentheses, `not`s, signs) against the depth limit.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxTemplateDepth) too_deep(p_.what_, p_.line_);
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // Statements up to (not including) a tag named in `ends`.
  Body body(const std::set<std::string>& ends) {
    const Nest nest(*this);
    Body out;
    while (seg_ < segs_.size()) {
      const Segment& s = segs_[seg_];
      if (s.t == Segment::T::Text) {
        auto st = std::make_unique<Stmt>();
        st->t = Stmt::T::Text, st->text = s.text, st->line = s.line;
        out.push_back(std::move(st));
        ++seg_;
        continue;
      }
      start(s);
      if (s.t == Segment::T::Expr) {
        auto st = std::make_unique<Stmt>();
        st->t = Stmt::T::Output, st->line = s.line;
        st->expr = expr();
        finish();
        out.push_back(std::move(st));
        continue;
      }
      if (tok_.empty()) fail(what_, s.line, "an empty tag");
      const std::string tag = tok_[0].s;
      if (ends.count(tag)) return out;
      if (tag == "generation" || tag == "endgeneration") {  // transformers' assistant markers: no output
        ++seg_;
        continue;
      }
      if (tag == "set")
        out.push_back(set_stmt());
      else if (tag == "for")
        out.push_back(for_stmt());
      else if (tag == "if")
        out.push_back(if_stmt());
      else if (tag.starts_with("end") || tag == "else" || tag == "elif")
        fail(what_, s.line, "unexpected '" + tag + "'");
      else
        fail(what_, s.line, "unsupported tag '" + tag + "'");
    }
    if (!ends.empty()) fail(what_, segs_.empty() ? 1 : segs_.back().line, "missing '" + *ends.rbegin() + "'");
    return out;
  }

  void start(const Segment& s) {
    tok_ = s.tokens;
    tok_.push_back(Token{});
    pos_ = 0;
    line_ = s.line;
  }
  void finish() {
    if (peek().t != Token::T::End) fail(what_, line_, "unexpected '" + peek().s + "' in a tag");
    ++seg_;
  }
  // The next tag (which must be one of `names`), started.
  std::string expect_tag(const std::set<std::string>& names) {
    if (seg_ >= segs_.size()) fail(what_, line_, "missing '" + *names.begin() + "'");
    start(segs_[seg_]);
    const std::string tag = tok_[0].s;
    if (!names.count(tag)) fail(what_, line_, "unexpected '" + tag + "'");
    pos_ = 1;
    return tag;
  }

  const Token& peek(size_t ahead = 0) const { return tok_[std::min(pos_ + ahead, tok_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).t == Token::T::Op && peek(ahead).s == op; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).t == Token::T::Name && peek(ahead).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(what_, line_, std::string("expected '") + op + "', got '" + peek().s + "'");
    ++pos_;
  }
  std::string expect_name() {
    if (peek().t != Token::T::Name) fail(what_, line_, "expected a name, got '" + peek().s + "'");
    return tok_[pos_++].s;
  }

  std::unique_ptr<Stmt> set_stmt() {
    auto st = std::make_unique<Stmt>();
    st->t = Stmt::T::Set, st->line = line_;
    pos_ = 1;
    st->names.push_back(expect_name());
    if (is_op(".")) {
      ++pos_;
      st->names.push_back(expect_name());
      st->attr_target = true;
    }
    if (is_op(",")) fail(what_, line_, "unsupported construct: set with several targets");
    if (!is_op("=")) fail(what_, line_, "unsupported construct: block set ({% set x %}...{% endset %})");
    ++pos_;
    st->expr = expr();
    finish();
    return st;
  }

  std::unique_ptr<Stmt> for_stmt() {
    auto st = std::make_unique<Stmt>();
    st->t = Stmt::T::For, st->line = line_;
    pos_ = 1;
    st->names.push_back(expect_name());
    while (is_op(",")) {
      ++pos_;
      st->names.push_back(expect_name());
    }
    if (!is_name("in")) fail(what_, line_, "expected 'in' in a for tag");
    ++pos_;
    st->expr = expr(/*allow_cond=*/false);
    if (is_name("if")) {
      ++pos_;
      st->filter = expr();
    }
    if (is_name("recursive")) fail(what_, line_, "unsupported construct: recursive for");
    finish();
    st->body = body({"endfor", "else"});
    if (expect_tag({"endfor", "else"}) == "else") {
      finish();
      st->else_body = body({"endfor"});
      expect_tag({"endfor"});
    }
    finish();
    return st;
  }

  std::unique_ptr<Stmt> if_stmt() {
    auto st = std::make_unique<Stmt>();
    st->t = Stmt::T::If, st->line = line_;
    pos_ = 1;
    ExprPtr cond = expr();
    finish();
    while (true) {
      Body b = body({"elif", "else", "endif"});
      st->branches.emplace_back(std::move(cond), std::move(b));
      const std::string tag = expect_tag({"elif", "else", "endif"});
      if (tag == "endif") break;
      if (tag == "elif") {
        cond = expr();
        finish();
        continue;
      }
      finish();
      st->branches.emplace_back(nullptr, body({"endif"}));
      expect_tag({"endif"});
      break;
    }
    finish();
    return st;
  }

  ExprPtr node(Expr::T t) {
    auto e = std::make_unique<Expr>();
    e->t = t, e->line = line_;
    return e;
  }
  // A node with its operands in place: its height, with the statements and parentheses around it (the renderer's
  // recursion), checked against the depth limit (a chain such as 1+1+...+1 or x.a.a...a grows the tree without
  // recursing in the parser).
  ExprPtr done(ExprPtr e) {
    for (const ExprPtr& a : e->args)
      if (a) e->depth = std::max(e->depth, a->depth + 1);
    for (const auto& [_, v] : e->kwargs) e->depth = std::max(e->depth, v->depth + 1);
    if (e->depth + depth_ > kMaxTemplateDepth) too_deep(what_, line_);
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, Expr::T t = Expr::T::Binary) {
    ExprPtr e = node(t);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return done(std::move(e));
  }

  // expr: or ['if' or ['else' expr]]
  ExprPtr expr(bool allow_cond = true) {
    const Nest nest(*this);
    ExprPtr a = or_expr();
    if (!allow_cond || !is_name("if")) return a;
    ++pos_;
    ExprPtr e = node(Expr::T::Cond);
    ExprPtr cond = or_expr();
    ExprPtr other;
    if (is_name("else")) {
      ++pos_;
      other = expr();
    } else {
      other = node(Expr::T::Literal);
      other->literal = Value::undefined("the else of a conditional expression");
    }
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(other));
    return done(std::move(e));
  }
  ExprPtr or_expr() {
    ExprPtr a = and_expr();
    while (is_name("or")) {
      ++pos_;
      a = binary("or", std::move(a), and_expr(), Expr::T::Or);
    }
    return a;
  }
  ExprPtr and_expr() {
    ExprPtr a = not_expr();
    while (is_name("and")) {
      ++pos_;
      a = binary("and", std::move(a), not_expr(), Expr::T::And);
    }
    return a;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      const Nest nest(*this);
      ++pos_;
      ExprPtr e = node(Expr::T::Not);
      e->args.push_back(not_expr());
      return done(std::move(e));
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr a = concat();
    while (true) {
      std::string op;
      if (peek().t == Token::T::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" ||
                                       peek().s == ">" || peek().s == ">=")) {
        op = peek().s;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else {
        return a;
      }
      a = binary(op, std::move(a), concat());
    }
  }
  ExprPtr concat() {
    ExprPtr a = sum();
    while (is_op("~")) {
      ++pos_;
      a = binary("~", std::move(a), sum());
    }
    return a;
  }
  ExprPtr sum() {
    ExprPtr a = product();
    while (is_op("+") || is_op("-")) {
      const std::string op = tok_[pos_++].s;
      a = binary(op, std::move(a), product());
    }
    return a;
  }
  ExprPtr product() {
    ExprPtr a = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = tok_[pos_++].s;
      a = binary(op, std::move(a), power());
    }
    return a;
  }
  ExprPtr power() {
    ExprPtr a = unary();
    while (is_op("**")) {
      ++pos_;
      a = binary("**", std::move(a), unary());
    }
    return a;
  }
  ExprPtr unary() {
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this);
      ExprPtr e = node(is_op("-") ? Expr::T::Neg : Expr::T::Pos);
      ++pos_;
      e->args.push_back(unary());
      return done(std::move(e));
    }
    ExprPtr a = postfix(primary());
    // Filters and tests bind to the unary expression before them.
    while (true) {
      if (is_op("|")) {
        ++pos_;
        ExprPtr f = node(Expr::T::Filter);
        f->name = expect_name();
        if (!kFilters.count(f->name)) fail(what_, line_, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(a));
        if (is_op("(")) call_args(*f);
        a = done(std::move(f));
      } else if (is_name("is")) {
        ++pos_;
        ExprPtr t = node(Expr::T::Test);
        if (is_name("not")) {
          ++pos_;
          t->negate = true;
        }
        t->name = peek().t == Token::T::Op && (peek().s == "==" || peek().s == "!=") ? tok_[pos_++].s : expect_name();
        if (t->name == "==") t->name = "eq";
        if (t->name == "!=") t->name = "ne";
        if (!kTests.count(t->name)) fail(what_, line_, "unsupported test '" + t->name + "'");
        t->args.push_back(std::move(a));
        if (is_op("(")) {
          call_args(*t);
        } else if (peek().t == Token::T::Str || peek().t == Token::T::Int || peek().t == Token::T::Float ||
                   (peek().t == Token::T::Name && !is_name("and") && !is_name("or") && !is_name("if") &&
                    !is_name("else") && !is_name("is") && !is_name("not") && !is_name("in"))) {
          t->args.push_back(postfix(primary()));  // `x is divisibleby 3`, `x is sameas none`
        }
        a = done(std::move(t));
      } else {
        return a;
      }
    }
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().t == Token::T::Name && is_op("=", 1)) {
        std::string k = tok_[pos_].s;
        pos_ += 2;
        e.kwargs.emplace_back(std::move(k), expr());
      } else {
        e.args.push_back(expr());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr a) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        ExprPtr e = node(Expr::T::Attr);
        e->name = peek().t == Token::T::Int ? std::to_string(tok_[pos_++].i) : expect_name();
        if (is_op("(") && !kMethods.count(e->name)) fail(what_, line_, "unsupported method '" + e->name + "'");
        e->args.push_back(std::move(a));
        a = done(std::move(e));
      } else if (is_op("[")) {
        ++pos_;
        ExprPtr parts[3];
        int colons = 0;
        while (true) {
          if (!is_op(":") && !is_op("]")) parts[colons] = expr();
          if (is_op(":") && colons < 2) {
            ++pos_;
            ++colons;
            continue;
          }
          break;
        }
        expect_op("]");
        ExprPtr e = node(colons ? Expr::T::Slice : Expr::T::Item);
        e->args.push_back(std::move(a));
        if (!colons && !parts[0]) fail(what_, line_, "an empty subscript");
        for (int k = 0; k < (colons ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
        a = done(std::move(e));
      } else if (is_op("(")) {
        ExprPtr e = node(Expr::T::Call);
        e->args.push_back(std::move(a));
        call_args(*e);
        a = done(std::move(e));
      } else {
        return a;
      }
    }
  }
  ExprPtr primary() {
    const Token t = peek();
    ++pos_;
    ExprPtr e = node(Expr::T::Literal);
    switch (t.t) {
      case Token::T::Str: {
        std::string s = t.s;
        while (peek().t == Token::T::Str) s += tok_[pos_++].s;  // adjacent literals join
        e->literal = Value::str(std::move(s));
        return e;
      }
      case Token::T::Int: e->literal = Value::integer(t.i); return e;
      case Token::T::Float: e->literal = Value::real(t.f); return e;
      case Token::T::Name:
        if (t.s == "true" || t.s == "True")
          e->literal = Value::boolean(true);
        else if (t.s == "false" || t.s == "False")
          e->literal = Value::boolean(false);
        else if (t.s == "none" || t.s == "None")
          e->literal = Value::none();
        else {
          e->t = Expr::T::Name;
          e->name = t.s;
        }
        return e;
      case Token::T::Op:
        if (t.s == "(") {
          ExprPtr inner = expr();
          if (is_op(",")) fail(what_, line_, "unsupported construct: tuple");
          expect_op(")");
          return inner;
        }
        if (t.s == "[") {
          e->t = Expr::T::ListLit;
          while (!is_op("]")) {
            e->args.push_back(expr());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return done(std::move(e));
        }
        if (t.s == "{") {
          e->t = Expr::T::DictLit;
          while (!is_op("}")) {
            e->args.push_back(expr());
            expect_op(":");
            e->args.push_back(expr());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return done(std::move(e));
        }
        break;
      case Token::T::End: fail(what_, line_, "unexpected end of a tag");
    }
    fail(what_, line_, "unexpected '" + t.s + "'");
  }

  const std::string& what_;
  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token> tok_;
  size_t pos_ = 0;
  int line_ = 1;
  int depth_ = 0;  // Nest
};

}  // namespace

struct ChatTemplate::Program {
  std::string what;
  Body body;
};

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The evaluator

class Renderer {
 public:
  Renderer(const std::string& what, const Json& context) : what_(what) {
    CASTOR_CHECK(context.is_object(), what, ": the context must be a JSON object");
    scopes_.emplace_back();
    for (const auto& [k, v] : context.as_object()) scopes_.back()[k] = from_json(v);
  }

  void run(const Body& body) {
    for (const auto& s : body) exec(*s);
  }
  std::string out;

 private:
  [[noreturn]] void error(int line, const std::string& msg) const { fail(what_, line, msg); }

  // Counts `n` steps against the budget.
  void tick(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > kTemplateStepBudget)
      error(line, detail::cat("more than ", kTemplateStepBudget,
                              " steps (the template interpreter's limit: a loop that does not end?)"));
  }
  // Text of `bytes` bytes is within the limit.
  void fits(size_t bytes, int line) const {
    if (bytes <= kMaxTemplateText) return;
    try {
      text_too_long();
    } catch (const Error& err) {
      error(line, err.what());
    }
  }
  [[noreturn]] void overflow(const std::string& op, int line) const {
    error(line, "integer overflow in '" + op + "' (integers are 64-bit in the template interpreter)");
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  void exec(const Stmt& s) {
    tick(s.line);
    switch (s.t) {
      case Stmt::T::Text:
        out += s.text;
        fits(out.size(), s.line);
        return;
      case Stmt::T::Output: {
        const Value v = eval(*s.expr);
        const size_t before = out.size();
        out += to_str(v);
        fits(out.size(), s.line);
        tick(s.line, static_cast<int64_t>((out.size() - before) / kBytesPerStep));
        return;
      }
      case Stmt::T::Set: {
        Value v = eval(*s.expr);
        if (!s.attr_target) {
          scopes_.back()[s.names[0]] = std::move(v);
          return;
        }
        Value* ns = lookup(s.names[0]);
        if (!ns) error(s.line, "unknown variable '" + s.names[0] + "'");
        if (ns->k != Value::K::Ns) error(s.line, "set " + s.names[0] + "." + s.names[1] + ": not a namespace");
        if (v.holds_ns)
          error(s.line, "set " + s.names[0] + "." + s.names[1] +
                            ": a namespace cannot hold a namespace here (it could come to hold itself)");
        if (Value* slot = ns->d->find(s.names[1]))
          *slot = std::move(v);
        else
          ns->d->items.emplace_back(s.names[1], std::move(v));
        return;
      }
      case Stmt::T::If:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) {
            run(body);
            return;
          }
        return;
      case Stmt::T::For: exec_for(s); return;
    }
  }

  void exec_for(const Stmt& s) {
    const List items = iterate(eval(*s.expr), s.line);
    std::vector<std::pair<Value, std::vector<Value>>> kept;  // each item and its unpacked variables
    for (const Value& item : items) {
      tick(s.line);
      std::vector<Value> vars;
      if (s.names.size() == 1) {
        vars.push_back(item);
      } else {
        if (item.k != Value::K::List || item.l->size() != s.names.size())
          error(s.line, detail::cat("for: cannot unpack a ", kind_name(item), " into ", s.names.size(), " names"));
        vars = *item.l;
      }
      if (s.filter) {
        scopes_.emplace_back();
        for (size_t k = 0; k < vars.size(); ++k) scopes_.back()[s.names[k]] = vars[k];
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (!keep) continue;
      }
      kept.emplace_back(item, std::move(vars));
    }
    if (kept.empty()) {
      run(s.else_body);
      return;
    }
    const int64_t n = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < n; ++i) {
      tick(s.line, 10);  // (`loop`'s entries)
      scopes_.emplace_back();
      for (size_t k = 0; k < s.names.size(); ++k) scopes_.back()[s.names[k]] = kept[static_cast<size_t>(i)].second[k];
      Dict loop;
      loop.items = {
          {"index", Value::integer(i + 1)},
          {"index0", Value::integer(i)},
          {"revindex", Value::integer(n - i)},
          {"revindex0", Value::integer(n - i - 1)},
          {"first", Value::boolean(i == 0)},
          {"last", Value::boolean(i == n - 1)},
          {"length", Value::integer(n)},
          {"previtem", i > 0 ? kept[static_cast<size_t>(i - 1)].first : Value::undefined("loop.previtem")},
          {"nextitem", i + 1 < n ? kept[static_cast<size_t>(i + 1)].first : Value::undefined("loop.nextitem")}};
      scopes_.back()["loop"] = Value::dict(std::move(loop));
      run(s.body);
      scopes_.pop_back();
    }
  }

  List iterate(const Value& v, int line) {
    if (v.k == Value::K::List || v.k == Value::K::Dict || v.k == Value::K::Str) tick(line, length(v, line));
    switch (v.k) {
      case Value::K::List: return *v.l;
      case Value::K::Dict: {
        List keys;
        for (auto& [k, _] : v.d->items) keys.push_back(Value::str(k));
        return keys;
      }
      case Value::K::Str: {
        List chars;
        for (char32_t c : code_points(v.s)) chars.push_back(Value::str(utf8(std::u32string(1, c))));
        return chars;
      }
      case Value::K::Undefined: return {};
      default: error(line, detail::cat("a ", kind_name(v), " is not iterable"));
    }
  }

  // An expression's value, its steps counted (a string's copy by its size) and its size and nesting checked.
  Value eval(const Expr& e) {
    tick(e.line);
    Value v = eval_node(e);
    if (v.k == Value::K::Str) {
      fits(v.s.size(), e.line);
      tick(e.line, static_cast<int64_t>(v.s.size() / kBytesPerStep));
    }
    if (v.depth > kMaxTemplateDepth)
      error(e.line, detail::cat("a list or dict nested deeper than ", kMaxTemplateDepth,
                                " levels (the template interpreter's limit)"));
    return v;
  }

  Value eval_node(const Expr& e) {
    switch (e.t) {
      case Expr::T::Literal: return e.literal;
      case Expr::T::Name: {
        if (Value* v = lookup(e.name)) return *v;
        if (e.name == "namespace" || e.name == "raise_exception" || e.name == "range") {
          Value f = Value::function(nullptr);
          f.s = e.name;  // a global, called by name (Call)
          return f;
        }
        error(e.line, "unknown variable '" + e.name + "'");
      }
      case Expr::T::Attr: return attr(eval(*e.args[0]), e.name, e.line);
      case Expr::T::Item: return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::T::Slice: return slice(e);
      case Expr::T::Call: return call(e);
      case Expr::T::Filter: return filter(e);
      case Expr::T::Test: return Value::boolean(test(e) != e.negate);
      case Expr::T::Neg:
      case Expr::T::Pos: {
        const Value v = eval(*e.args[0]);
        if (!v.is_number())
          error(e.line, detail::cat("unary ", e.t == Expr::T::Neg ? "-" : "+", " of a ", kind_name(v)));
        if (e.t == Expr::T::Pos) return v;
        if (v.k == Value::K::Float) return Value::real(-v.f);
        const int64_t i = as_int(v);
        if (i == INT64_MIN) overflow("-", e.line);
        return Value::integer(-i);
      }
      case Expr::T::Not: return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::T::And: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::T::Or: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::T::Cond: return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::T::ListLit: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return Value::list(std::move(l));
      }
      case Expr::T::DictLit: {
        Dict d;
        for (size_t k = 0; k < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (key.k != Value::K::Str) error(e.line, "a dict key that is not a string");
          if (Value* slot = d.find(key.s))
            *slot = eval(*e.args[k + 1]);
          else
            d.items.emplace_back(key.s, eval(*e.args[k + 1]));
        }
        return Value::dict(std::move(d));
      }
      case Expr::T::Binary: return binary(e);
    }
    return {};
  }

  Value attr(const Value& obj, const std::string& name, int line) {
    if (obj.k == Value::K::Str || obj.k == Value::K::Dict) {
      static const std::set<std::string> str_methods = {"strip",      "lstrip", "rstrip", "split",   "startswith",
                                                        "endswith",   "upper",  "lower",  "replace", "title",
                                                        "capitalize", "find",   "count"};
      static const std::set<std::string> dict_methods = {"items", "keys", "values", "get"};
      const auto& methods = obj.k == Value::K::Str ? str_methods : dict_methods;
      if (methods.count(name)) {
        Value self = obj;
        return Value::function(
            [this, self, name, line](Args& a, Kwargs& kw) { return method(self, name, a, kw, line); });
      }
    }
    if (obj.k == Value::K::Dict || obj.k == Value::K::Ns) {
      if (Value* v = obj.d->find(name)) return *v;
      return Value::undefined("'" + name + "'");
    }
    if (obj.k == Value::K::Undefined) error(line, "." + name + " of an undefined value " + obj.s);
    return Value::undefined("'" + name + "' of a " + kind_name(obj));
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.k == Value::K::Dict || obj.k == Value::K::Ns) {
      if (key.k != Value::K::Str) return Value::undefined("a non-string key");
      if (Value* v = obj.d->find(key.s)) return *v;
      return Value::undefined("'" + key.s + "'");
    }
    if (obj.k == Value::K::List || obj.k == Value::K::Str) {
      if (key.k != Value::K::Int)
        error(line, detail::cat("a ", kind_name(obj), " index must be an integer, got a ", kind_name(key)));
      if (obj.k == Value::K::List) {
        const int64_t n = static_cast<int64_t>(obj.l->size());
        const int64_t i = key.i < 0 ? key.i + n : key.i;
        if (i < 0 || i >= n) return Value::undefined(detail::cat("index ", key.i));
        return (*obj.l)[static_cast<size_t>(i)];
      }
      const std::u32string cps = code_points(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      const int64_t i = key.i < 0 ? key.i + n : key.i;
      if (i < 0 || i >= n) return Value::undefined(detail::cat("index ", key.i));
      return Value::str(utf8(std::u32string(1, cps[static_cast<size_t>(i)])));
    }
    if (obj.k == Value::K::Undefined) error(line, "a subscript of an undefined value " + obj.s);
    return Value::undefined(detail::cat("a subscript of a ", kind_name(obj)));
  }

  // Python's slice semantics.
  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      const Value v = eval(*e.args[k]);
      if (v.k == Value::K::None) return std::nullopt;
      if (v.k != Value::K::Int) error(e.line, "slice bounds must be integers");
      return v.i;
    };
    const auto a = bound(1), b = bound(2), c = bound(3);
    const int64_t step = c.value_or(1);
    if (step == 0) error(e.line, "slice step cannot be zero");
    std::vector<int64_t> idx;
    auto pick = [&](int64_t n) {
      auto norm = [&](std::optional<int64_t> x, int64_t dflt, int64_t lo, int64_t hi) {
        if (!x) return dflt;
        int64_t v = *x < 0 ? *x + n : *x;
        return std::clamp(v, lo, hi);
      };
      // (i moves by step while it stays short of t, without passing int64's range)
      if (step > 0) {
        const int64_t s = norm(a, 0, 0, n), t = norm(b, n, 0, n);
        for (int64_t i = s; i<t; i = t - i> step ? i + step : t) idx.push_back(i);
      } else {
        const int64_t s = norm(a, n - 1, -1, n - 1), t = norm(b, -1, -1, n - 1);
        for (int64_t i = s; i > t; i = i - t - 1 > -(step + 1) ? i + step : t) idx.push_back(i);
      }
    };
    if (obj.k == Value::K::List) {
      pick(static_cast<int64_t>(obj.l->size()));
      tick(e.line, static_cast<int64_t>(idx.size()));
      List out;
      for (int64_t i : idx) out.push_back((*obj.l)[static_cast<size_t>(i)]);
      return Value::list(std::move(out));
    }
    if (obj.k == Value::K::Str) {
      const std::u32string cps = code_points(obj.s);
      pick(static_cast<int64_t>(cps.size()));
      std::u32string out;
      for (int64_t i : idx) out += cps[static_cast<size_t>(i)];
      return Value::str(utf8(out));
    }
    error(e.line, detail::cat("a slice of a ", kind_name(obj)));
  }

  Value call(const Expr& e) {
    const Value f = eval(*e.args[0]);
    Args args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    Kwargs kw;
    for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v));
    if (f.k != Value::K::Fn) error(e.line, detail::cat("a ", kind_name(f), " is not callable"));
    if (f.fn && *f.fn) return (*f.fn)(args, kw);
    if (f.s == "raise_exception")
      throw Error(detail::cat(what_, ": the template raised: ", args.empty() ? "" : to_str(args[0])));
    if (f.s == "namespace") {
      Dict d;
      if (!args.empty()) error(e.line, "namespace() takes keyword arguments only here");
      for (auto& [k, v] : kw) d.items.emplace_back(k, v);
      return Value::dict(std::move(d), Value::K::Ns);
    }
    // range
    int64_t lo = 0, hi = 0, step = 1;
    for (const Value& a : args)
      if (a.k != Value::K::Int) error(e.line, "range() takes integers");
    if (args.size() == 1)
      hi = args[0].i;
    else if (args.size() >= 2)
      lo = args[0].i, hi = args[1].i;
    if (args.size() == 3) step = args[2].i;
    if (args.empty() || args.size() > 3 || step == 0) error(e.line, "range() takes 1 to 3 integers, step not 0");
    // The count in unsigned arithmetic (hi - lo may pass int64's range), counted as steps before the list is made.
    const bool up = step > 0;
    const uint64_t span = up ? (hi > lo ? static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) : 0)
                             : (lo > hi ? static_cast<uint64_t>(lo) - static_cast<uint64_t>(hi) : 0);
    const uint64_t stride = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    const uint64_t count = span / stride + (span % stride != 0);
    tick(e.line, static_cast<int64_t>(std::min<uint64_t>(count, kTemplateStepBudget + 1)));
    List l;
    l.reserve(count);
    for (uint64_t k = 0; k < count; ++k)
      l.push_back(Value::integer(static_cast<int64_t>(static_cast<uint64_t>(lo) + k * static_cast<uint64_t>(step))));
    return Value::list(std::move(l));
  }

  Value method(const Value& self, const std::string& name, Args& a, Kwargs& kw, int line) {
    auto arg_str = [&](size_t k) -> const std::string& {
      if (a.size() <= k || a[k].k != Value::K::Str) error(line, name + "() expects a string argument");
      return a[k].s;
    };
    if (self.k == Value::K::Dict) return dict_method(self, name, a, line);
    const std::string& s = self.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = a.empty() || a[0].k == Value::K::None ? nullptr : &a[0];
      return Value::str(strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith") return Value::boolean(s.starts_with(arg_str(0)));
    if (name == "endswith") return Value::boolean(s.ends_with(arg_str(0)));
    if (name == "upper" || name == "lower") {
      std::string out = s;
      for (char& c : out)
        c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                              : std::tolower(static_cast<unsigned char>(c)));
      return Value::str(out);
    }
    if (name == "title" || name == "capitalize") return Value::str(case_words(s, name == "title"));
    if (name == "replace") return Value::str(replace(s, arg_str(0), arg_str(1), a.size() > 2 ? a[2].i : -1, line));
    if (name == "find") {
      const size_t p = s.find(arg_str(0));
      return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(code_points(s.substr(0, p)).size()));
    }
    if (name == "count") {
      const std::string& sub = arg_str(0);
      int64_t n = 0;
      if (sub.empty()) return Value::integer(static_cast<int64_t>(code_points(s).size()) + 1);
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    return split(s, a, kw, line);
  }

  // get, keys, values and items of a dict
  Value dict_method(const Value& self, const std::string& name, const Args& a, int line) {
    if (name == "get") {
      if (a.empty()) error(line, "get() expects a key");
      const Value v = item(self, a[0], line);
      return v.k == Value::K::Undefined ? (a.size() > 1 ? a[1] : Value::none()) : v;
    }
    tick(line, static_cast<int64_t>(self.d->items.size()));
    List l;
    for (auto& [k, v] : self.d->items) {
      if (name == "keys")
        l.push_back(Value::str(k));
      else if (name == "values")
        l.push_back(v);
      else
        l.push_back(Value::list({Value::str(k), v}));
    }
    return Value::list(std::move(l));
  }

  // str.split(sep=None, maxsplit=-1) as Python's: runs of whitespace without a separator
  Value split(const std::string& s, const Args& a, const Kwargs& kw, int line) {
    int64_t maxsplit = -1;
    const Value* sep = a.empty() || a[0].k == Value::K::None ? nullptr : &a[0];
    if (a.size() > 1) maxsplit = a[1].i;
    for (auto& [k, v] : kw) {
      if (k == "sep")
        sep = v.k == Value::K::None ? nullptr : &v;
      else if (k == "maxsplit")
        maxsplit = v.i;
    }
    List parts;
    if (sep) {
      if (sep->k != Value::K::Str || sep->s.empty()) error(line, "split() needs a non-empty string separator");
      size_t p = 0, q;
      while ((maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) &&
             (q = s.find(sep->s, p)) != std::string::npos) {
        tick(line);
        parts.push_back(Value::str(s.substr(p, q - p)));
        p = q + sep->s.size();
      }
      parts.push_back(Value::str(s.substr(p)));
    } else {
      size_t p = 0;
      while (true) {
        while (p < s.size() && is_space(s[p])) ++p;
        if (p >= s.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(Value::str(strip(s.substr(p), nullptr, false, true)));
          break;
        }
        size_t q = p;
        while (q < s.size() && !is_space(s[q])) ++q;
        tick(line);
        parts.push_back(Value::str(s.substr(p, q - p)));
        p = q;
      }
    }
    return Value::list(std::move(parts));
  }

  std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count, int line) {
    if (from.empty()) return s;
    std::string out;
    size_t p = 0, q;
    int64_t n = 0;
    while ((count < 0 || n < count) && (q = s.find(from, p)) != std::string::npos) {
      out.append(s, p, q - p).append(to);
      fits(out.size(), line);
      p = q + from.size();
      ++n;
    }
    return out.append(s, p);
  }
  static std::string case_words(const std::string& s, bool title) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      c = static_cast<char>(start && alpha ? std::toupper(static_cast<unsigned char>(c))
                                           : std::tolower(static_cast<unsigned char>(c)));
      if (title)
        start = !alpha;
      else if (alpha)
        start = false;
    }
    return out;
  }

  int64_t length(const Value& v, int line) {
    switch (v.k) {
      case Value::K::Str: return static_cast<int64_t>(code_points(v.s).size());
      case Value::K::List: return static_cast<int64_t>(v.l->size());
      case Value::K::Dict: return static_cast<int64_t>(v.d->items.size());
      case Value::K::Undefined: return 0;
      default: error(line, detail::cat("length of a ", kind_name(v)));
    }
  }

  Value filter(const Expr& e) {
    const std::string& f = e.name;
    Value x = f == "default" || f == "d" ? eval_or_undefined(*e.args[0]) : eval(*e.args[0]);
    Args a;
    for (size_t k = 1; k < e.args.size(); ++k) a.push_back(eval(*e.args[k]));
    Kwargs kw;
    for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v));
    auto kwarg = [&](const char* k) -> const Value* {
      for (auto& [n, v] : kw)
        if (n == k) return &v;
      return nullptr;
    };
    auto need_str = [&]() -> const std::string& {
      if (x.k != Value::K::Str) error(e.line, detail::cat("filter ", f, " of a ", kind_name(x)));
      return x.s;
    };
    if (f == "default" || f == "d") {
      const bool boolean = a.size() > 1 && truthy(a[1]);
      const bool use = x.k == Value::K::Undefined || (boolean && !truthy(x));
      return use ? (a.empty() ? Value::str("") : a[0]) : x;
    }
    if (x.k == Value::K::Undefined && f != "length" && f != "count" && f != "string" && f != "list")
      error(e.line, "filter " + f + " of an undefined value " + x.s);
    if (f == "trim") return Value::str(strip(need_str(), a.empty() ? nullptr : &a[0], true, true));
    if (f == "tojson") {
      const Value* indent = kwarg("indent");
      return tojson_filter(x, indent ? indent : a.empty() ? nullptr : &a[0], e.line);
    }
    if (f == "length" || f == "count") return Value::integer(length(x, e.line));
    if (f == "lower" || f == "upper" || f == "title" || f == "capitalize") {
      Args none;
      Kwargs nokw;
      Value s = Value::str(need_str());
      return method(s, f, none, nokw, e.line);
    }
    if (f == "first" || f == "last") {
      const List l = iterate(x, e.line);
      if (l.empty()) return Value::undefined("the " + f + " of an empty sequence");
      return f == "first" ? l.front() : l.back();
    }
    if (f == "join") return join(x, a, e.line);
    if (f == "string") return Value::str(to_str(x));
    if (f == "safe") return x;
    if (f == "int" || f == "float" || f == "abs") return number_filter(f, x, a, e.line);
    if (f == "list") return Value::list(iterate(x, e.line));
    if (f == "items") {
      if (x.k != Value::K::Dict) error(e.line, detail::cat("items of a ", kind_name(x)));
      Args none;
      Kwargs nokw;
      return method(x, "items", none, nokw, e.line);
    }
    if (f == "replace") {
      if (a.size() < 2) error(e.line, "replace needs two strings");
      return Value::str(replace(need_str(), to_str(a[0]), to_str(a[1]), a.size() > 2 ? a[2].i : -1, e.line));
    }
    if (f == "map") {
      const Value* at = kwarg("attribute");
      if (!at || at->k != Value::K::Str) error(e.line, "map is supported with attribute= only");
      List out;
      for (const Value& v : iterate(x, e.line)) out.push_back(attr(v, at->s, e.line));
      return Value::list(std::move(out));
    }
    return select_filter(f, x, a, e.line);
  }

  Value tojson_filter(const Value& x, const Value* indent, int line) {
    std::string out;
    try {
      tojson(x, indent && indent->k == Value::K::Int ? indent->i : 0, 0, out);
    } catch (const Error& err) {
      error(line, err.what());
    }
    return Value::str(out);
  }

  Value join(const Value& x, const Args& a, int line) {
    std::string out;
    const List l = iterate(x, line);
    const std::string sep = a.empty() ? "" : to_str(a[0]);
    for (size_t k = 0; k < l.size(); ++k) {
      out += (k ? sep : "") + to_str(l[k]);
      fits(out.size(), line);
      tick(line, static_cast<int64_t>(sep.size() / kBytesPerStep));
    }
    return Value::str(out);
  }

  // int, float and abs as Jinja's: a string that is not a number converts to the default (0)
  Value number_filter(const std::string& f, const Value& x, const Args& a, int line) {
    if (f == "int") {
      if (x.k == Value::K::Float) {
        // (int64's range is [-2^63, 2^63); Python's int() of a float has no bound)
        if (!(x.f >= -0x1p63 && x.f < 0x1p63)) error(line, "filter int of " + float_repr(x.f) + ": beyond 64 bits");
        return Value::integer(static_cast<int64_t>(x.f));
      }
      if (x.is_number()) return Value::integer(as_int(x));
      if (x.k == Value::K::Str) {
        try {
          return Value::integer(std::stoll(x.s));
        } catch (...) {
          return a.empty() ? Value::integer(0) : a[0];
        }
      }
      return Value::integer(0);
    }
    if (f == "float") {
      if (x.is_number()) return Value::real(x.number());
      try {
        return Value::real(std::stod(to_str(x)));
      } catch (...) {
        return Value::real(0);
      }
    }
    // abs
    if (!x.is_number()) error(line, detail::cat("abs of a ", kind_name(x)));
    if (x.k == Value::K::Float) return Value::real(std::fabs(x.f));
    if (as_int(x) == INT64_MIN) overflow("abs", line);
    return Value::integer(std::llabs(as_int(x)));
  }

  // selectattr / rejectattr: attribute, then an optional test and its argument
  Value select_filter(const std::string& f, const Value& x, const Args& a, int line) {
    if (a.empty() || a[0].k != Value::K::Str) error(line, f + " needs an attribute name");
    const std::string test_name = a.size() > 1 ? to_str(a[1]) : "";
    if (!test_name.empty() && !kTests.count(test_name)) error(line, "unsupported test '" + test_name + "'");
    List out;
    for (const Value& v : iterate(x, line)) {
      const Value field = attr(v, a[0].s, line);
      const bool pass = test_name.empty() ? truthy(field)
                                          : apply_test(test_name, field, a.size() > 2 ? &a[2] : nullptr, line);
      if (pass == (f == "selectattr")) out.push_back(v);
    }
    return Value::list(std::move(out));
  }

  // A name neither the template nor the context defines is undefined here (`x is defined`, `x | default(...)`),
  // an error anywhere else.
  Value eval_or_undefined(const Expr& e) {
    if (e.t == Expr::T::Name && !lookup(e.name) && e.name != "namespace" && e.name != "raise_exception" &&
        e.name != "range")
      return Value::undefined("'" + e.name + "'");
    return eval(e);
  }

  bool test(const Expr& e) {
    const Value x = eval_or_undefined(*e.args[0]);
    std::optional<Value> arg;
    if (e.args.size() > 1) arg = eval(*e.args[1]);
    return apply_test(e.name, x, arg ? &*arg : nullptr, e.line);
  }

  bool apply_test(const std::string& t, const Value& x, const Value* arg, int line) {
    auto need = [&]() -> const Value& {
      if (!arg) error(line, "test " + t + " needs an argument");
      return *arg;
    };
    if (t == "defined") return x.k != Value::K::Undefined;
    if (t == "undefined") return x.k == Value::K::Undefined;
    if (t == "none") return x.k == Value::K::None;
    if (t == "string") return x.k == Value::K::Str;
    if (t == "number") return x.k == Value::K::Int || x.k == Value::K::Float;
    if (t == "integer") return x.k == Value::K::Int;
    if (t == "float") return x.k == Value::K::Float;
    if (t == "boolean") return x.k == Value::K::Bool;
    if (t == "true") return x.k == Value::K::Bool && x.b;
    if (t == "false") return x.k == Value::K::Bool && !x.b;
    if (t == "mapping") return x.k == Value::K::Dict;
    if (t == "iterable") return x.k == Value::K::List || x.k == Value::K::Dict || x.k == Value::K::Str;
    if (t == "sequence") return x.k == Value::K::List || x.k == Value::K::Dict || x.k == Value::K::Str;
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (x.k != Value::K::Int) error(line, "test " + t + " of a " + kind_name(x));
      if (t == "divisibleby") {
        const Value& d = need();
        if (d.k != Value::K::Int || d.i == 0) error(line, "divisibleby needs a non-zero integer");
        return d.i == -1 || x.i % d.i == 0;
      }
      return (x.i % 2 != 0) == (t == "odd");
    }
    if (t == "eq" || t == "equalto") return equal(x, need());
    if (t == "ne") return !equal(x, need());
    if (t == "sameas") return equal(x, need()) && x.k == need().k;
    if (t == "in") return contains(need(), x, line);
    const Value& y = need();
    return compare(t == "lt" ? "<" : t == "gt" ? ">" : t == "le" ? "<=" : ">=", x, y, line);
  }

  bool contains(const Value& container, const Value& x, int line) {
    switch (container.k) {
      case Value::K::Str:
        if (x.k != Value::K::Str) error(line, detail::cat("'in <string>' needs a string, got a ", kind_name(x)));
        return container.s.find(x.s) != std::string::npos;
      case Value::K::List:
        tick(line, static_cast<int64_t>(container.l->size()));
        return std::any_of(container.l->begin(), container.l->end(), [&](const Value& v) { return equal(v, x); });
      case Value::K::Dict:
      case Value::K::Ns: return x.k == Value::K::Str && container.d->find(x.s) != nullptr;
      case Value::K::Undefined: return false;
      default: error(line, detail::cat("'in' a ", kind_name(container)));
    }
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) {
    int c;
    if (a.is_number() && b.is_number() && a.k != Value::K::Float && b.k != Value::K::Float) {
      c = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    } else if (a.is_number() && b.is_number()) {
      c = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    } else if (a.k == Value::K::Str && b.k == Value::K::Str) {
      c = a.s.compare(b.s);
    } else {
      error(line, detail::cat("'", op, "' between a ", kind_name(a), " and a ", kind_name(b)));
    }
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (a.k == Value::K::List && b.k == Value::K::List) tick(e.line, static_cast<int64_t>(a.l->size()));
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in") return Value::boolean(contains(b, a, e.line));
    if (op == "not in") return Value::boolean(!contains(b, a, e.line));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") return Value::boolean(compare(op, a, b, e.line));
    if (op == "~") return Value::str(to_str(a) + to_str(b));
    for (const Value* v : {&a, &b})
      if (v->k == Value::K::Undefined) error(e.line, "'" + op + "' of an undefined value " + v->s);
    if (op == "+") {
      if (a.k == Value::K::Str && b.k == Value::K::Str) return Value::str(a.s + b.s);
      if (a.k == Value::K::List && b.k == Value::K::List) {
        tick(e.line, static_cast<int64_t>(a.l->size() + b.l->size()));
        List l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return Value::list(std::move(l));
      }
    }
    if (op == "*" &&
        ((a.k == Value::K::Str && b.k == Value::K::Int) || (a.k == Value::K::Int && b.k == Value::K::Str))) {
      const std::string& s = a.k == Value::K::Str ? a.s : b.s;
      const int64_t n = a.k == Value::K::Int ? a.i : b.i;
      if (s.empty() || n <= 0) return Value::str("");
      fits(s.size() > kMaxTemplateText / static_cast<uint64_t>(n) ? kMaxTemplateText + 1 : s.size() * n, e.line);
      std::string out;
      out.reserve(s.size() * static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) out += s;
      return Value::str(std::move(out));
    }
    if (!a.is_number() || !b.is_number())
      error(e.line, detail::cat("'", op, "' between a ", kind_name(a), " and a ", kind_name(b)));
    const double x = a.number(), y = b.number();
    if ((op == "/" || op == "//" || op == "%") && y == 0) error(e.line, "division by zero");
    if (op == "/") return Value::real(x / y);
    if (a.k != Value::K::Float && b.k != Value::K::Float) {  // Python's integers (and booleans as integers)
      if (op == "**" && as_int(b) < 0) {
        if (x == 0) error(e.line, "division by zero");
        return Value::real(std::pow(x, y));
      }
      const std::optional<int64_t> r = int_arith(op, as_int(a), as_int(b));
      if (!r) overflow(op, e.line);
      return Value::integer(*r);
    }
    if (op == "//" || op == "%") {
      const double q = std::floor(x / y);
      return op == "//" ? Value::real(q) : Value::real(x - q * y);
    }
    if (op == "**") return Value::real(std::pow(x, y));
    return Value::real(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }

  const std::string& what_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int64_t steps_ = 0;  // tick
};

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string what) : program_(std::make_unique<Program>()) {
  program_->what = std::move(what);
  CASTOR_CHECK(is_valid_utf8(source), program_->what, ": not valid UTF-8");
  Parser p(program_->what, lex(std::string(source), program_->what));
  program_->body = p.parse();
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const Json& context) const {
  Renderer r(program_->what, context);
  r.run(program_->body);
  return std::move(r.out);
}

const std::string& ChatTemplate::what() const { return program_->what; }

}  // namespace castor::data
