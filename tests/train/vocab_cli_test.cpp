// A model's vocabulary through the CLI: castor tokenize --vocab encodes new text in a run's (or a token folder's, or
// llama2.c's tokenizer.bin's) vocabulary, and every place ids meet a model (train --init, --resume, LoRA without
// --data, eval, sample, a llama2.c model.bin, exported safetensors) refuses a token folder of another vocabulary of
// the same size, naming both sides.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "castor/fs.h"
#include "castor/json.h"
#include "castor/random.h"
#include "castor/safetensors.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;
using test::CastorProcess;

// Two texts of other words (so two 300-piece vocabularies learned from them differ), the first tokenized into `a`, the
// second into `b`, and a one-layer Llama trained 2 steps on `a` (run `base`); made once for the suite.
class VocabCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new test::ScratchDir("vocab_cli");
    test::write_grammar_text(at("a.txt"), 1500, 6, 3, /*capitalized=*/false);
    std::ofstream b(at("b.txt"));
    for (int i = 0; i < 1200; ++i) b << "Quick zebras vex " << (i % 7) << " lazy wolves, jumping over fog. ";
    b.close();
    for (const auto& [text, out] : {std::pair{"a.txt", "a"}, std::pair{"b.txt", "b"}})
      ASSERT_EQ(run({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", text, "--out", out}).exit_code,
                0);
    CastorProcess t = run(test::tiny_lm_args("llama", "base", 2, 4, {"--data-dir", "a", "--eval-iters", "1"}));
    ASSERT_EQ(t.exit_code, 0) << t.err;
  }
  static void TearDownTestSuite() { delete scratch_; }
  static std::string at(const std::string& name) { return scratch_->file(name); }
  static CastorProcess run(const std::vector<std::string>& args) {
    return test::run_castor(args, test::CastorRun{scratch_->path().string()});
  }
  static std::string record_sum(const std::string& dir) {
    return data::read_tokenizer_record(at(dir)).at("vocab_checksum").as_string();
  }
  // The one-line error refusing folder `dir` (of text b's vocabulary) for `model`, naming both and both checksums.
  static void expect_refused(const CastorProcess& p, const std::string& dir, const std::string& model) {
    test::expect_one_line_error(
        p, {dir + "/castor_tokens.json holds the vocabulary [bpe, 300 tokens, vocab_checksum " + record_sum("b") + "]",
            model + " was trained in [bpe, 300 tokens, vocab_checksum " + record_sum("a") + "]"});
  }
  static test::ScratchDir* scratch_;
};
test::ScratchDir* VocabCli::scratch_ = nullptr;

}  // namespace

// The same text in the vocabulary it learned: token for token the folder that learned it (the oracle), whether
// --vocab names the folder or the run trained on it; new text in it: the run's vocabulary (the same tokenizer.bin,
// vocab_checksum) without --vocab-size. Characters: hand-worked ids.
TEST_F(VocabCli, TokenizeVocabEncodesInAnExistingVocabulary) {
  for (const std::string vocab : {"a", "base"}) {
    const std::string out = "again_" + vocab;
    CastorProcess p = run({"tokenize", "--vocab", vocab, "--input", "a.txt", "--out", out});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    for (const char* f : {"train.bin", "val.bin", "tokenizer.bin"})
      EXPECT_EQ(read_file(at(out + "/" + f)), read_file(at(std::string("a/") + f))) << vocab << " " << f;
    EXPECT_EQ(record_sum(out), record_sum("a"));
  }
  CastorProcess p = run({"tokenize", "--vocab", "base", "--input", "b.txt", "--out", "b_in_a"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(read_file(at("b_in_a/tokenizer.bin")), read_file(at("a/tokenizer.bin")));
  EXPECT_EQ(record_sum("b_in_a"), record_sum("a"));
  EXPECT_NE(record_sum("b"), record_sum("a"));

  // Characters: "abc" gives a, b, c ids 0, 1, 2; "cab" in that vocabulary is 2 0 1 (val.bin: the last third).
  atomic_write_file(at("abc.txt"), std::string("abcabcabc"));
  atomic_write_file(at("cab.txt"), std::string("cabcab"));
  ASSERT_EQ(run({"tokenize", "--tokenizer", "char", "--input", "abc.txt", "--out", "abc", "--val-fraction", "0.34"})
                .exit_code,
            0);
  p = run({"tokenize", "--vocab", "abc", "--input", "cab.txt", "--out", "cab", "--val-fraction", "0.34"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const data::TokenFile train(at("cab/train.bin")), val(at("cab/val.bin"));
  ASSERT_EQ(train.size(), 4);
  ASSERT_EQ(val.size(), 2);
  const int64_t want[] = {2, 0, 1, 2, 0, 1};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(i < 4 ? train[i] : val[i - 4], want[i]) << i;

  // Flags that disagree with the vocabulary, a character outside it, a path that holds none: one line each.
  test::expect_one_line_error(
      run({"tokenize", "--vocab", "base", "--vocab-size", "512", "--input", "b.txt", "--out", "x"}),
      {"--vocab-size 512: --vocab ", " has 300 tokens"});
  test::expect_one_line_error(
      run({"tokenize", "--vocab", "a", "--tokenizer", "char", "--input", "b.txt", "--out", "x"}),
      {"--tokenizer char: --vocab a is a bpe vocabulary"});
  test::expect_one_line_error(run({"tokenize", "--vocab", "abc", "--input", "b.txt", "--out", "x"}),
                              {"--vocab abc (char, 3 tokens", "is not in the vocabulary"});
  test::expect_one_line_error(run({"tokenize", "--vocab", "nowhere", "--input", "b.txt", "--out", "x"}),
                              {"--vocab nowhere: no such file or directory"});
  EXPECT_FALSE(fs::exists(at("x")));
  // GPT-2's: the same files as --tokenizer gpt2 writes.
  ASSERT_EQ(run({"tokenize", "--input", "cab.txt", "--out", "g", "--val-fraction", "0.5"}).exit_code, 0);
  p = run({"tokenize", "--vocab", "g", "--input", "cab.txt", "--out", "g2", "--val-fraction", "0.5"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  for (const char* f : {"train.bin", "val.bin", "encoder.json", "vocab.bpe"})
    EXPECT_EQ(read_file(at(std::string("g2/") + f)), read_file(at(std::string("g/") + f))) << f;
}

// A Hugging Face tokenizer.json as --vocab (a model directory): the same files as --tokenizer writes; its
// vocab_checksum is of the content, so the file spelled otherwise (keys reordered, indented) is the same vocabulary.
TEST_F(VocabCli, HuggingFaceTokenizerJsonVocabulary) {
  const std::string mistral = std::string(CASTOR_SOURCE_DIR) +
                              "/third_party/npm-hf/node_modules/@lenml/"
                              "tokenizer-llama2/models";
  ASSERT_TRUE(file_exists(mistral + "/tokenizer.json")) << "run scripts/setup_tests.sh";
  ASSERT_EQ(run({"tokenize", "--tokenizer", mistral, "--input", "b.txt", "--out", "h0"}).exit_code, 0);
  CastorProcess p = run({"tokenize", "--vocab", mistral, "--input", "b.txt", "--out", "h1"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  for (const char* f : {"train.bin", "val.bin", "tokenizer.json"})
    EXPECT_EQ(read_file(at(std::string("h1/") + f)), read_file(at(std::string("h0/") + f))) << f;
  const std::vector<uint8_t> bytes = read_file(mistral + "/tokenizer.json");
  fs::create_directories(at("respelled"));
  atomic_write_file(at("respelled/tokenizer.json"), Json::parse(std::string(bytes.begin(), bytes.end())).dump(2));
  EXPECT_NE(read_file(at("respelled/tokenizer.json")), bytes);
  ASSERT_EQ(run({"tokenize", "--tokenizer", "respelled", "--input", "b.txt", "--out", "h2"}).exit_code, 0);
  EXPECT_EQ(record_sum("h2"), record_sum("h0"));
  EXPECT_EQ(read_file(at("h2/train.bin")), read_file(at("h0/train.bin")));
}

// train --init RUN on a folder of another 300-piece vocabulary: refused before a step (it trained on garbage
// before); the same text tokenized with --vocab RUN trains. The run records the vocabulary (config.json).
TEST_F(VocabCli, TrainInitRefusesAFolderOfAnotherVocabulary) {
  expect_refused(run({"train", "--model", "llama", "--init", "base", "--data", "tokens", "--data-dir", "b", "--steps",
                      "1", "--out", "r"}),
                 "b", "base/checkpoints/step-0000000002/model.safetensors");
  EXPECT_FALSE(fs::exists(at("r")));
  ASSERT_EQ(run({"tokenize", "--vocab", "base", "--input", "b.txt", "--out", "b_a"}).exit_code, 0);
  CastorProcess p = run({"train", "--model", "llama", "--init", "base", "--data", "tokens", "--data-dir", "b_a",
                         "--steps", "1", "--batch-size", "2", "--eval-iters", "1", "--out", "r"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<uint8_t> bytes = read_file(at("r/config.json"));
  const Json config = Json::parse(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(config.at("vocab_checksum").as_string(), record_sum("a"));
  EXPECT_EQ(config.at("tokenizer").as_string(), "bpe");
}

// A LoRA run of a base trained in another 512-piece vocabulary, without --data: the Llama's default folder (setup's
// brown-bpe, 512 pieces too) is refused, naming it (it trained on it silently before); with the base's folder it runs.
TEST_F(VocabCli, LoraWithoutDataRefusesTheDefaultFolder) {
  {  // words of random syllables: enough pairs for 512 pieces
    std::ofstream text(at("syllables.txt"));
    const char* syllables[] = {"ka",  "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pi",
                               "qua", "xe", "bo", "di", "fa", "gu", "he", "jo", "wy", "cy"};
    Generator gen(7);
    for (int i = 0; i < 6000; ++i) {
      for (uint64_t k = 0, n = 2 + gen.next_u64() % 3; k < n; ++k) text << syllables[gen.next_u64() % 20];
      text << ' ';
    }
  }
  ASSERT_EQ(run({"tokenize", "--tokenizer", "bpe", "--vocab-size", "512", "--input", "syllables.txt", "--out", "s"})
                .exit_code,
            0);
  ASSERT_EQ(run(test::tiny_lm_args("llama", "base512", 1, 2, {"--data-dir", "s", "--eval-iters", "1"})).exit_code, 0);
  CastorProcess p = run(
      {"train", "--model", "llama", "--init", "base512", "--lora-rank", "4", "--steps", "1", "--out", "lora"});
  test::expect_one_line_error(
      p, {"--data brown-bpe ", "brown-bpe/castor_tokens.json holds the vocabulary [bpe, 512 tokens, vocab_checksum ",
          "base512/checkpoints/step-0000000001/model.safetensors was trained in [bpe, 512 tokens, vocab_checksum " +
              record_sum("s") + "]"});
  EXPECT_FALSE(fs::exists(at("lora")));
  p = run({"train", "--model", "llama", "--init", "base512", "--lora-rank", "4", "--data", "tokens", "--data-dir", "s",
           "--steps", "1", "--batch-size", "2", "--eval-iters", "1", "--out", "lora"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
}

// train --resume after the folder was tokenized again with another vocabulary of the same size.
TEST_F(VocabCli, ResumeRefusesAFolderTokenizedAgain) {
  ASSERT_EQ(run({"tokenize", "--vocab", "a", "--input", "a.txt", "--out", "a2"}).exit_code, 0);
  ASSERT_EQ(run(test::tiny_lm_args("llama", "res", 1, 2, {"--data-dir", "a2", "--eval-iters", "1"})).exit_code, 0);
  ASSERT_EQ(run({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "b.txt", "--out", "a2"}).exit_code,
            0);
  CastorProcess p = run({"train", "--resume", "res", "--steps", "2"});
  test::expect_one_line_error(
      p, {"a2/castor_tokens.json holds the vocabulary [bpe, 300 tokens, vocab_checksum " + record_sum("b") + "]",
          "res/checkpoints/step-0000000001 was trained in [bpe, 300 tokens, vocab_checksum " + record_sum("a") + "]"});
}

// castor eval --data-dir and castor sample --tokenizer-dir of another vocabulary; the run's own folder tokenized again
// (sample's default) too. An exported safetensors file records the vocabulary and is checked the same way.
TEST_F(VocabCli, EvalAndSampleRefuseAnotherVocabulary) {
  expect_refused(run({"eval", "base", "--data-dir", "b"}), "b", "base");
  CastorProcess p = run({"sample", "--checkpoint", "base", "--tokenizer-dir", "b", "--tokens", "2"});
  test::expect_one_line_error(
      p, {"--tokenizer-dir b holds the vocabulary [bpe, 300 tokens, vocab_checksum " + record_sum("b") + "]",
          "was trained in [bpe, 300 tokens, vocab_checksum " + record_sum("a") + "]"});
  EXPECT_EQ(run({"sample", "--checkpoint", "base", "--tokenizer-dir", "a", "--tokens", "2"}).exit_code, 0);
  ASSERT_EQ(run({"export", "--format", "safetensors", "--checkpoint", "base", "--out", "base.safetensors"}).exit_code,
            0);
  const Json config = Json::parse(read_safetensors_header(at("base.safetensors")).metadata.at("castor.config"));
  EXPECT_EQ(config.at("vocab_checksum").as_string(), record_sum("a"));
  expect_refused(run({"eval", "base.safetensors", "--data-dir", "b"}), "b", "base.safetensors");
  EXPECT_EQ(run({"eval", "base.safetensors", "--data-dir", "a"}).exit_code, 0);
}

// llama2.c: tokenizer.bin alone beside model.bin is the model's vocabulary: sample --init finds it (as run.c does),
// eval and train --init compare a folder with it, and tokenize --vocab encodes with it.
TEST_F(VocabCli, Llama2cTokenizerBinBesideTheModelIsItsVocabulary) {
  fs::create_directories(at("l2c"));
  ASSERT_EQ(run({"export", "--format", "llama2c", "--checkpoint", "base", "--out", "l2c/model.bin"}).exit_code, 0);
  ASSERT_TRUE(fs::exists(at("l2c/tokenizer.bin")));
  CastorProcess p = run({"sample", "--init", "l2c/model.bin", "--prompt", "the jury", "--tokens", "3"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out.rfind("the jury", 0), 0u) << p.out;
  expect_refused(run({"eval", "l2c/model.bin", "--data-dir", "b"}), "b", "l2c/model.bin");
  expect_refused(run({"train", "--model", "llama", "--init", "l2c/model.bin", "--data", "tokens", "--data-dir", "b",
                      "--steps", "1", "--out", "r2"}),
                 "b", "l2c/model.bin");
  p = run({"tokenize", "--vocab", "l2c/model.bin", "--input", "a.txt", "--out", "a_l2c"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(read_file(at("a_l2c/train.bin")), read_file(at("a/train.bin")));
  // Without tokenizer.bin beside it and without --tokenizer-dir: one line saying so.
  fs::rename(at("l2c/tokenizer.bin"), at("l2c/elsewhere.bin"));
  test::expect_one_line_error(run({"sample", "--init", "l2c/model.bin", "--tokens", "2"}),
                              {"--tokenizer-dir: missing", "no tokenizer.bin is beside it"});
}

// Folders of older builds record no vocab_checksum: theirs is computed from their files (another vocabulary is still
// refused, the model's passes).
TEST_F(VocabCli, FoldersWithoutAChecksumAreComparedByTheirFiles) {
  for (const char* dir : {"a", "b"}) {
    const std::string old = std::string("old_") + dir;
    fs::copy(at(dir), at(old), fs::copy_options::recursive);
    Json rec = data::read_tokenizer_record(at(old));
    rec.as_object().erase("vocab_checksum");
    atomic_write_file(at(old + "/castor_tokens.json"), rec.dump(2) + "\n");
  }
  expect_refused(run({"eval", "base", "--data-dir", "old_b"}), "old_b", "base");
  EXPECT_EQ(run({"eval", "base", "--data-dir", "old_a"}).exit_code, 0);
}

}  // namespace castor::train
