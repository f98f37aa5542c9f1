// Tests for the strict JSON parser and serializer.
#include "castor/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "io/file_test_util.h"

namespace castor {
namespace {

using test::error_of;

TEST(Json, ParsesEveryKind) {
  Json v = Json::parse(R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "x"}, "d": 0, "e": -0.0} )");
  const Json::Array& a = v.at("a").as_array();
  ASSERT_EQ(a.size(), 5u);
  EXPECT_TRUE(a[0].is_int());
  EXPECT_EQ(a[0].as_int(), 1);
  EXPECT_FALSE(a[1].is_int());
  EXPECT_EQ(a[1].as_double(), -2500.0);
  EXPECT_TRUE(a[2].as_bool());
  EXPECT_FALSE(a[3].as_bool());
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(v.at("b").at("c").as_string(), "x");
  EXPECT_EQ(v.at("d").as_int(), 0);
  EXPECT_TRUE(std::signbit(v.at("e").as_double()));
  EXPECT_EQ(v.find("zz"), nullptr);
}

// parse_ordered: each object as [key, value] pairs in the order written, nested ones too; duplicates still refused.
TEST(Json, ParseOrderedKeepsTheKeysOrder) {
  const Json v = Json::parse_ordered(R"({"z": 1, "a": {"y": [2, {"c": 3, "b": 4}], "x": {}}})");
  const Json want = Json::Array{
      Json::Array{"z", 1},
      Json::Array{"a",
                  Json::Array{Json::Array{"y", Json::Array{2, Json::Array{Json::Array{"c", 3}, Json::Array{"b", 4}}}},
                              Json::Array{"x", Json::Array{}}}}};
  EXPECT_EQ(v, want) << v.dump();
  EXPECT_THROW(Json::parse_ordered(R"({"a": 1, "a": 2})"), Error);
}

TEST(Json, IntegersKeepFullInt64Precision) {
  EXPECT_EQ(Json::parse("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Json::parse("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  Json big = Json::parse("9223372036854775808");  // one past int64: a double
  EXPECT_FALSE(big.is_int());
  EXPECT_EQ(big.as_double(), 9223372036854775808.0);
  EXPECT_FALSE(Json::parse("1.0").is_int());
  EXPECT_FALSE(Json::parse("1e2").is_int());
}

TEST(Json, StringEscapes) {
  EXPECT_EQ(Json::parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(Json::parse(R"("\u0041\u00e9\u20AC")").as_string(), "A\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(Json::parse(R"("\ud83e\uddab")").as_string(), "\xf0\x9f\xa6\xab");     // U+1F9AB beaver, surrogate pair
  EXPECT_EQ(Json::parse("\"\xf0\x9f\xa6\xab\"").as_string(), "\xf0\x9f\xa6\xab");  // raw UTF-8
  EXPECT_EQ(Json::parse(R"("\u0000")").as_string(), std::string(1, '\0'));
}

TEST(Json, RejectsMalformedInput) {
  // clang-format off
  const char* bad[] = {
      "",          " ",          "{",          "}",          "[1,]",      "[1 2]",       "{\"a\":1,}",
      "{\"a\" 1}", "{a:1}",      "{1:1}",      "'a'",        "01",        "-",           "1.",
      ".5",        "1e",         "+1",         "0x10",       "tru",       "nul",         "True",
      "NaN",       "Infinity",   "1e400",      "[1] [2]",    "\"abc",     "\"\\x\"",     "\"\\u12\"",
      "\"\\ud83e\"", "\"\\udcab\"", "\"\\ud83e\\u0041\"", "\"a\nb\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
      "\"\xf4\x90\x80\x80\"",     "\"\xe2\x82\"",      "/*c*/1",   "{\"a\":1,\"a\":2}"};
  // clang-format on
  for (const char* text : bad) {
    std::string msg = error_of([&] { Json::parse(text); });
    EXPECT_NE(msg.find("invalid JSON at offset"), std::string::npos) << text << " -> " << msg;
  }
  EXPECT_NE(error_of([] { Json::parse("{\"k\":1,\"k\":2}"); }).find("duplicate key \"k\""), std::string::npos);
}

TEST(Json, DepthIsLimited) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_NO_THROW(Json::parse(nested(Json::kMaxDepth)));
  EXPECT_NE(error_of([&] { Json::parse(nested(Json::kMaxDepth + 1)); }).find("nesting deeper"), std::string::npos);
  EXPECT_NE(error_of([&] { Json::parse(nested(1000000)); }).find("nesting deeper"), std::string::npos);
}

TEST(Json, DumpsCompactAndPretty) {
  Json v;
  v["b"] = Json::Array{1, 2.5, "x", nullptr, true};
  v["a"] = Json::Object{};
  v["c"] = "q\"\n\x01\xc3\xa9";
  EXPECT_EQ(v.dump(), R"({"a":{},"b":[1,2.5,"x",null,true],"c":"q\"\n\u0001)"
                      "\xc3\xa9\"}");
  EXPECT_EQ(Json(Json::Array{1, Json::Object{{"k", false}}}).dump(2), "[\n  1,\n  {\n    \"k\": false\n  }\n]");
  EXPECT_EQ(Json(1.0).dump(), "1.0");
  EXPECT_EQ(Json(0.1).dump(), "0.1");
  EXPECT_EQ(Json(std::numeric_limits<double>::infinity()).dump(), "null");
  EXPECT_EQ(Json(std::nan("")).dump(), "null");
  EXPECT_THROW(Json("\xff").dump(), Error);
}

TEST(Json, RoundTrips) {
  const char* text = R"({"a":[1,-2,0.5,1e+300,-9223372036854775808],"b":{"c":"\u00e9\ud83e\udd9b"},"d":null})";
  Json v = Json::parse(text);
  EXPECT_EQ(Json::parse(v.dump()), v);
  EXPECT_EQ(Json::parse(v.dump(4)), v);
  for (double d : {0.1, 1.0 / 3, 1e-300, 5e-324, -123456.789, 1e22})
    EXPECT_EQ(Json::parse(Json(d).dump()).as_double(), d);
}

TEST(Json, TypeErrorsAreCastorErrors) {
  Json v = Json::parse(R"({"a": "s", "n": 1.5})");
  EXPECT_NE(error_of([&] { v.at("a").as_int(); }).find("expected an integer, got string"), std::string::npos);
  EXPECT_NE(error_of([&] { v.at("n").as_int(); }).find("non-integer"), std::string::npos);
  EXPECT_NE(error_of([&] { v.at("missing"); }).find("missing key \"missing\""), std::string::npos);
  EXPECT_THROW(v.as_array(), Error);
  EXPECT_THROW(Json(uint64_t{1} << 63), Error);
}

TEST(Json, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\xa6\xab"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
  EXPECT_FALSE(is_valid_utf8("\xc1\xbf"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xe0\x80\xaf"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xed\xbf\xbf"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xf0\x9f\xa6"));      // truncated
}

}  // namespace
}  // namespace castor
