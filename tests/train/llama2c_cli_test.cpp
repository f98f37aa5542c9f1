// llama2.c files through the real binary: `castor export --llama2c` writes model.bin (v0 or v1) and tokenizer.bin from
// a Llama run, and `--init model.bin` (train, sample), `castor eval` and `castor info` read them back; damaged files,
// conflicting flags and vocabularies give one-line errors naming the file or flag, and nothing good is overwritten.
#include <gtest/gtest.h>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llama2c.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

// A 300-piece vocabulary learned from generated sentences, and a tiny Llama (grouped-query attention) trained on it
// for 3 steps.
class Llama2cCli : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_grammar_text(path("text.txt"), 1500, 6, 5, /*capitalized=*/true);
    CastorProcess t = castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "text.txt", "--out",
                              "tok", "--val-fraction", "0.1"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    CastorProcess run = castor({"train", "--model",   "llama", "--data",       "tokens", "--data-dir",
                                "tok",   "--n-layer", "2",     "--n-head",     "4",      "--n-kv-head",
                                "2",     "--n-embd",  "32",    "--block-size", "24",     "--batch-size",
                                "4",     "--steps",   "3",     "--eval-iters", "1",      "--threads",
                                "1",     "--out",     "run"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  std::string path(const std::string& name) const { return scratch.file(name); }
  CastorProcess castor(const std::vector<std::string>& args) { return test::run_castor(args, in_dir); }
  std::string greedy(const std::vector<std::string>& from) {
    std::vector<std::string> args{"sample", "--temperature", "0", "--tokens", "12", "--prompt", "The jury"};
    args.insert(args.end(), from.begin(), from.end());
    CastorProcess s = castor(args);
    EXPECT_EQ(s.exit_code, 0) << s.err;
    return s.out;
  }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

}  // namespace

// Both versions: model.bin holds the run's tensors bit for bit, tokenizer.bin is the vocabulary's, sampling from
// --init model.bin gives the run's greedy text, eval gives the run's float32 loss, info names a Llama, and a new run
// takes its sizes from the file.
TEST_F(Llama2cCli, ExportAndReadBack) {
  const std::string from_run = greedy({"--checkpoint", "run"});
  const StateDict trained = read_checkpoint(path("run")).model;
  CastorProcess run_eval = castor({"eval", "run", "--dtype", "float32"});
  ASSERT_EQ(run_eval.exit_code, 0) << run_eval.err;
  for (const char* version : {"0", "1"}) {
    SCOPED_TRACE(detail::cat("v", version));
    const std::string dir = detail::cat("v", version), bin = dir + "/model.bin";
    std::filesystem::create_directories(path(dir));
    CastorProcess e = castor({"export", "--llama2c", "--checkpoint", "run", "--out", bin, "--version", version});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const Json summary = Json::parse(e.out);
    EXPECT_EQ(summary.at("tokenizer").as_string(), dir + "/tokenizer.bin");
    EXPECT_EQ(summary.at("hidden_dim").as_int(), 96);  // 2/3 of 4 x 32, rounded up to llama's multiple of 32
    EXPECT_EQ(read_file(path(dir + "/tokenizer.bin")), read_file(path("tok/tokenizer.bin")));
    const formats::Llama2cWeights w = formats::read_llama2c(path(bin));
    EXPECT_EQ(w.config.n_kv_heads, 2);
    for (const auto& [name, t] : w.state) EXPECT_TRUE(test::bit_equal(t, trained.at(name))) << name;
    EXPECT_EQ(greedy({"--init", bin, "--tokenizer-dir", "tok"}), from_run);
    CastorProcess ev = castor({"eval", bin, "--data-dir", "tok"});
    ASSERT_EQ(ev.exit_code, 0) << ev.err;
    EXPECT_EQ(Json::parse(ev.out).at("val_loss").as_double(), Json::parse(run_eval.out).at("val_loss").as_double());
    CastorProcess info = castor({"info", bin});
    ASSERT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("model       llama, "), std::string::npos) << info.out;
    CastorProcess init = castor({"train", "--model", "llama", "--init", bin, "--data", "tokens", "--data-dir", "tok",
                                 "--steps", "1", "--eval-iters", "1", "--threads", "1", "--out", dir + "/again"});
    ASSERT_EQ(init.exit_code, 0) << init.err;
    const std::vector<uint8_t> recorded = read_file(path(dir + "/again/config.json"));
    const Json config = Json::parse(std::string(recorded.begin(), recorded.end()));
    EXPECT_EQ(config.at("n_embd").as_int(), 32);
    EXPECT_EQ(config.at("n_kv_head").as_int(), 2);
    EXPECT_EQ(config.at("block_size").as_int(), 24);
  }
}

// A damaged model.bin is one line naming it for every command; flags and vocabularies that conflict with the file
// name both; a failed export leaves the good files at --out as they were.
TEST_F(Llama2cCli, BadFilesAndConflictsAreOneLineErrors) {
  ASSERT_EQ(castor({"export", "--llama2c", "--checkpoint", "run", "--out", "model.bin"}).exit_code, 0);
  const std::vector<uint8_t> good = read_file(path("model.bin"));
  atomic_write_file(path("short.bin"), std::span<const uint8_t>(good.data(), good.size() - 8));
  const std::string needs = "needs " + std::to_string(good.size());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info", "short.bin"},
        {"eval", "short.bin", "--data-dir", "tok"},
        {"sample", "--init", "short.bin", "--tokenizer-dir", "tok"},
        {"train", "--model", "llama", "--init", "short.bin", "--data", "tokens", "--data-dir", "tok", "--out", "r"}})
    test::expect_one_line_error(castor(args), {"short.bin", "as a llama2.c v0 file", needs});
  test::expect_one_line_error(castor({"train", "--model", "llama", "--init", "model.bin", "--data", "tokens",
                                      "--data-dir", "tok", "--n-kv-head", "4", "--out", "r"}),
                              {"--n-kv-head 4: --init model.bin holds 2"});
  test::expect_one_line_error(
      castor({"train", "--model", "llama", "--init", "model.bin", "--data", "brown-char", "--out", "r"}),
      {"brown-char/castor_tokens.json holds the vocabulary [char, ", "model.bin was trained in [bpe, 300 tokens"});
  // A GPT run has no llama2.c export; the model.bin and tokenizer.bin already at --out stay as they were.
  ASSERT_EQ(castor({"train", "--model",  "gpt", "--data",       "tokens", "--data-dir",   "tok", "--n-layer",
                    "1",     "--n-head", "2",   "--n-embd",     "16",     "--block-size", "16",  "--batch-size",
                    "2",     "--steps",  "1",   "--eval-iters", "1",      "--threads",    "1",   "--out",
                    "gpt"})
                .exit_code,
            0);
  const std::vector<uint8_t> tokenizer = read_file(path("tokenizer.bin"));
  test::expect_one_line_error(castor({"export", "--llama2c", "--checkpoint", "gpt", "--out", "model.bin"}),
                              {"--checkpoint gpt: a GPT; --format llama2c writes Llamas"});
  EXPECT_EQ(read_file(path("model.bin")), good);
  EXPECT_EQ(read_file(path("tokenizer.bin")), tokenizer);
  test::expect_one_line_error(castor({"export", "--llama2c", "--checkpoint", "run", "--out", "tokenizer.bin"}),
                              {"--out tokenizer.bin: --format llama2c writes tokenizer.bin beside the model file"});
  test::expect_one_line_error(castor({"export", "--llmc", "--checkpoint", "run", "--out", "x.bin", "--version", "1"}),
                              {"--version: applies to --format llama2c only"});
  test::expect_one_line_error(
      castor({"export", "--llama2c", "--checkpoint", "run", "--out", "x.bin", "--version", "2"}), {"--version"});
}

}  // namespace castor::train
