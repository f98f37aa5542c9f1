// Fine-tuning on chat rows through the real binary: `castor tokenize --format chat` writes rows and loss masks, and
// `castor train`'s step on them (grad accumulation, 2 ranks) is PyTorch's cross_entropy(ignore_index=-100) over the
// whole step (tests/oracle/gpt_oracle.py, whose loss is that); data without targets is refused before step 1.
#include <gtest/gtest.h>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/lm_batch.h"
#include "castor/models.h"
#include "castor/serialize.h"
#include "castor/token_file.h"
#include "io/file_test_util.h"
#include "nn/lm_twin.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

class ChatTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_grammar_text(in_dir.dir + "/text.txt", 400, 8, 3, false);
    CastorProcess p = castor({"tokenize", "--tokenizer", "bpe", "--vocab-size", "300", "--input", "text.txt", "--out",
                              "bpe", "--val-fraction", "0.1"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    // Conversations whose answers (the prompt's words reversed) differ in length, so rows hold different numbers of
    // targets: a mean of per-batch means would differ from the mean over the step's targets.
    const char* words[] = {"the", "jury", "said", "a", "clerk", "found", "no", "evidence"};
    std::string jsonl;
    for (int i = 0; i < 12; ++i) {
      std::string prompt, answer;
      for (int k = 0; k <= i % 4; ++k) {
        const std::string w = words[(i * 3 + k) % 8];
        prompt += (k ? " " : "") + w;
        answer = w + (k ? " " : "") + answer;
      }
      jsonl += Json(Json::Object{{"messages", Json::Array{Json::Object{{"role", "user"}, {"content", prompt}},
                                                          Json::Object{{"role", "assistant"}, {"content", answer}}}}})
                   .dump() +
               "\n";
    }
    atomic_write_file(in_dir.dir + "/chat.jsonl", jsonl);
    p = castor({"tokenize", "--format", "chat", "--tokenizer", "bpe", "--input", "chat.jsonl", "--block-size", "79",
                "--out", "chat", "--val-fraction", "0.25"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
  }
  CastorProcess castor(const std::vector<std::string>& args) { return test::run_castor(args, in_dir, 120); }
  std::string path(const std::string& name) const { return scratch.file(name); }

  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

}  // namespace

// One SGD step (lr 0.5, --grad-accum 2 of 2 rows; then 2 ranks of 1 row) from the same weights: the step's loss is
// PyTorch's mean cross-entropy with ignore_index=-100 over the 4 rows (float32, 1e-6) and the weights moved by lr
// times its gradients.
TEST_F(ChatTrain, MaskedStepIsPyTorchsIgnoreIndexLossWithAccumulationAndRanks) {
  models::GPTConfig g;
  g.n_layer = 1, g.n_head = 2, g.n_embd = 16, g.block_size = 79, g.vocab_size = 300;
  const auto model = models::gpt(g, 17);
  save_safetensors(path("init.safetensors"), model->state_dict());
  const std::vector<std::string> common = {"train",
                                           "--model",
                                           "gpt",
                                           "--data",
                                           "tokens",
                                           "--data-dir",
                                           "chat",
                                           "--init",
                                           "init.safetensors",
                                           "--n-head",
                                           "2",
                                           "--optimizer",
                                           "sgd",
                                           "--momentum",
                                           "0",
                                           "--weight-decay",
                                           "0",
                                           "--schedule",
                                           "none",
                                           "--lr",
                                           "0.5",
                                           "--steps",
                                           "1",
                                           "--data-order",
                                           "sequential",
                                           "--amp",
                                           "O0",
                                           "--log-every",
                                           "1",
                                           "--eval-every",
                                           "0",
                                           "--dropout",
                                           "0",
                                           "--clip-grad-norm",
                                           "0"};
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CastorProcess one = castor(args({"--batch-size", "2", "--grad-accum", "2", "--threads", "1", "--out", "one"}));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  CastorProcess two = castor(
      args({"--batch-size", "1", "--grad-accum", "2", "--nproc", "2", "--threads", "1", "--out", "two"}));
  ASSERT_EQ(two.exit_code, 0) << two.err;

  // The oracle: the step's 4 rows (sequential order: rows 0-3) as one batch.
  const data::TokenFile tokens(path("chat/train.bin")), mask(path("chat/train.mask"));
  const data::LmBatch b = data::masked_rows(tokens, mask, 79, {0, 1, 2, 3}, 0);
  const std::vector<int64_t> y = b.y.to_vector<int64_t>();
  std::vector<int64_t> per_row(4, 0);
  for (size_t k = 0; k < y.size(); ++k) per_row[k / 79] += y[k] != data::kIgnoreIndex;
  ASSERT_NE(per_row[0] + per_row[1], per_row[2] + per_row[3]) << "the test needs batches of different target counts";
  const StateDict twin = test::run_lm_twin(
      "gpt_oracle.py", "grads", "chat_oracle",
      R"({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 79, "vocab_size": 300, "bias": true})", *model,
      {{"x", b.x}, {"y", b.y}});
  ASSERT_FALSE(twin.empty());
  const double want_loss = twin.at("loss").to_vector<double>()[0];
  for (const char* run : {"one", "two"}) {
    const std::vector<uint8_t> metrics = read_file(path(std::string(run) + "/metrics.jsonl"));
    const std::string text(metrics.begin(), metrics.end());
    const Json line = Json::parse(text.substr(0, text.find('\n')));
    EXPECT_NEAR(line.at("loss").as_double(), want_loss, 1e-6 * want_loss) << run;
    const Checkpoint ck = read_checkpoint(path(run));
    for (const auto& [name, p] : model->named_parameters()) {
      const Tensor moved = sub(p.to(DType::Float64), ck.model.at(name).to(DType::Float64));  // lr * grad
      const Tensor want = mul(twin.at("grad." + name).to(DType::Float64), 0.5);
      EXPECT_TRUE(test::close(moved, want, 1e-6, 1e-4)) << run << " " << name;
    }
  }
}

TEST_F(ChatTrain, RowsSetTheBlockSizeAndDataWithoutTargetsIsRefused) {
  CastorProcess bad = castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "chat", "--n-layer", "1",
                              "--n-head", "2", "--n-embd", "16", "--block-size", "20", "--steps", "1", "--out", "r"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--block-size 20: chat holds rows of 80 tokens"), std::string::npos) << bad.err;
  // Every mask entry zeroed (with the record's checksums still those of train.bin and val.bin): refused before step 1.
  const data::TokenFile mask(path("chat/train.mask"));
  data::write_token_file(path("chat/train.mask"), std::vector<uint16_t>(static_cast<size_t>(mask.size()), 0));
  CastorProcess none = castor({"train", "--model", "gpt", "--data", "tokens", "--data-dir", "chat", "--n-layer", "1",
                               "--n-head", "2", "--n-embd", "16", "--batch-size", "2", "--steps", "1", "--out", "r2"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("train.mask: no token is a loss target"), std::string::npos) << none.err;
  EXPECT_FALSE(file_exists(path("r2/config.json")));
}

}  // namespace castor::train
