// A minimal strict JSON value type with a depth-limited parser and a serializer (headers, configs, metrics).
#pragma once
#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "castor/check.h"

namespace castor {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json>;  // keys sorted, so dump() is deterministic

  static constexpr int kMaxDepth = 256;  // most arrays/objects parse() accepts nested in one another

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::Bool), bool_(b) {}
  Json(double d) : type_(Type::Number), number_(d) {}
  template <std::integral T>
  requires(!std::same_as<T, bool>) Json(T i) : Json(checked_int(i)) {}
  Json(const char* s) : Json(std::string(s)) {}
  Json(std::string s) : type_(Type::String), string_(std::move(s)) {}
  Json(Array a) : type_(Type::Array), array_(std::move(a)) {}
  Json(Object o) : type_(Type::Object), object_(std::move(o)) {}

  // Parses exactly one JSON value (surrounding whitespace allowed). Strict RFC 8259: no comments, no trailing
  // commas, no leading zeros, no lone surrogates, no invalid UTF-8, no duplicate keys. Throws castor::Error.
  static Json parse(std::string_view text);
  // As parse(), but each object as an array of its [key, value] pairs in the order written (an Object sorts its
  // keys): for files whose key order means something, as Python's dicts keep it (PEFT's rank_pattern).
  static Json parse_ordered(std::string_view text);

  // Serializes compactly (indent < 0) or pretty-printed with `indent` spaces. Non-finite numbers become null.
  std::string dump(int indent = -1) const;

  Type type() const { return type_; }
  const char* type_name() const;
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_int() const { return type_ == Type::Number && is_int_; }  // an integer literal that fits int64
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  // Typed accessors; each throws castor::Error when the value has another type.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object access: find() returns nullptr when absent; at() throws; operator[] turns null into an object.
  const Json* find(const std::string& key) const;
  const Json& at(const std::string& key) const;
  Json& operator[](const std::string& key);

  bool operator==(const Json& other) const = default;

 private:
  struct Int {
    int64_t v;
  };
  explicit Json(Int i) : type_(Type::Number), is_int_(true), int_(i.v), number_(static_cast<double>(i.v)) {}
  template <class T>
  static Int checked_int(T i) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t))
      CASTOR_CHECK(i <= static_cast<uint64_t>(INT64_MAX), "Json: integer ", i, " does not fit in int64");
    return Int{static_cast<int64_t>(i)};
  }
  void expect(Type t) const;

  Type type_ = Type::Null;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double number_ = 0;
  std::string string_;
  Array array_;
  Object object_;

  friend class JsonParser;
};

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace castor
