// The llama2.c vocabulary through the CLI: `castor tokenize --tokenizer bpe` writes a token folder with tokenizer.bin,
// a GPT trains on it and `castor sample` encodes the prompt as run.c does (<s> first) and decodes with run.c's rules;
// bad sizes, a damaged tokenizer.bin and setup's missing data/brown-bpe give one-line errors naming the flag or file.
#include <gtest/gtest.h>

#include "castor/bpe_tokenizer.h"
#include "castor/fs.h"
#include "castor/tokenizer.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

class BpeCli : public ::testing::Test {
 protected:
  void SetUp() override { test::write_grammar_text(path("text.txt"), 1500, 6, 11, /*capitalized=*/true); }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return test::run_castor(args, in_dir); }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

}  // namespace

TEST_F(BpeCli, TokenizeTrainAndSampleWithRunCsEncoding) {
  CastorProcess t = castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "text.txt", "--out",
                            "tok", "--val-fraction", "0.1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const data::BpeVocabulary v = data::read_tokenizer_bin(path("tok/tokenizer.bin"));
  EXPECT_EQ(v.size(), 300);
  EXPECT_EQ(data::Tokenizer::load(path("tok")).kind(), "bpe");
  CastorProcess run = castor(
      {"train", "--model",   "gpt", "--data",       "tokens", "--data-dir",   "tok", "--n-layer", "1", "--n-head",
       "2",     "--n-embd",  "32",  "--block-size", "16",     "--batch-size", "4",   "--steps",   "3", "--eval-iters",
       "1",     "--threads", "1",   "--out",        "run"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // run.c's decode drops the dummy prefix's space after <s>: the prompt comes back as given.
  CastorProcess s = castor({"sample", "--checkpoint", "run", "--prompt", "The jury", "--tokens", "6"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out.rfind("The jury", 0), 0u) << s.out;
  CastorProcess empty = castor({"sample", "--checkpoint", "run", "--prompt", "", "--tokens", "4"});
  EXPECT_EQ(empty.exit_code, 0) << empty.err;
  // tokenizer.bin changed after the tokenize: sampling names it.
  std::vector<uint8_t> bin = read_file(path("tok/tokenizer.bin"));
  bin[bin.size() / 2] ^= 0x40;
  atomic_write_file(path("tok/tokenizer.bin"), bin);
  test::expect_one_line_error(castor({"sample", "--checkpoint", "run", "--prompt", "The"}), {"tok/tokenizer.bin"});
}

TEST_F(BpeCli, BadSizesAndMissingSetupDataAreOneLineErrors) {
  for (const char* n : {"258", "65537", "-1"})
    test::expect_one_line_error(
        castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", n, "--input", "text.txt", "--out", "tok"}),
        {"--vocab-size"});
  test::expect_one_line_error(castor({"tokenize", "--tokenizer", "bpe", "--input", "text.txt", "--out", "tok"}),
                              {"--vocab-size: missing"});
  test::expect_one_line_error(
      castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "60000", "--input", "text.txt", "--out", "tok"}),
      {"--vocab-size 60000", "pieces"});
  EXPECT_FALSE(file_exists(path("tok")));
  const test::CastorRun elsewhere{scratch.path().string(), {"CASTOR_SETUP_DIR=/nonexistent"}};
  test::expect_one_line_error(
      test::run_castor({"train", "--model", "gpt", "--data", "brown-bpe", "--out", "r"}, elsewhere),
      {"/nonexistent/data/brown-bpe/train.bin is missing"});
}

}  // namespace castor::train
