// `castor train --lora-rank R --quantize-base TYPE` through the real binary: a 256-wide Llama and GPT run as the base,
// their Linears quantized while loading; the runs train at O0, O1 and O2, report a smaller peak than the dense base's,
// evaluate, and load for castor sample and eval in blocks with the adapters beside them, as the merged model computes;
// flag errors are one line.
#include <gtest/gtest.h>

#include <cmath>

#include "castor/checkpoint.h"
#include "castor/json.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/quant.h"
#include "nn/lm_twin.h"
#include "test_util.h"
#include "train/loaded_model.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

constexpr const char* kFamilies[] = {"llama", "gpt"};

class QLoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CastorProcess p = test::make_grammar_tokens(in_dir);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    for (const char* family : kFamilies) {
      CastorProcess b = castor(args(family, detail::cat("base-", family), {"--steps", "2", "--amp", "O0"}));
      ASSERT_EQ(b.exit_code, 0) << b.err;
    }
  }
  CastorProcess castor(const std::vector<std::string>& a) { return test::run_castor(a, in_dir); }
  // A 2-layer Llama (4 heads over 2 kv heads) or GPT (4 heads) 256 wide, every Linear's rows whole blocks of 256, on
  // the test's character tokens.
  static std::vector<std::string> args(const std::string& family, const std::string& out,
                                       std::vector<std::string> extra) {
    std::vector<std::string> a = {"train", "--model",      family, "--data",         "tokens", "--data-dir",
                                  "tok",   "--n-layer",    "2",    "--n-head",       "4",      "--n-embd",
                                  "256",   "--block-size", "16",   "--batch-size",   "2",      "--threads",
                                  "1",     "--eval-iters", "2",    "--deterministic"};
    if (family == "llama") a.insert(a.end(), {"--n-kv-head", "2"});
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--out", out});
    return a;
  }
  static std::vector<std::string> lora(const std::string& family, const std::string& out, const std::string& amp,
                                       std::vector<std::string> extra) {
    std::vector<std::string> a = {"--init", "base-" + family, "--lora-rank", "4",    "--steps",
                                  "3",      "--amp",          amp,           "--lr", "1e-3"};
    a.insert(a.end(), extra.begin(), extra.end());
    return args(family, out, a);
  }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

// The merged model of a LoRA run (its base dequantized, the adapters merged in: castor export --merge-lora's), as
// castor sample and eval loaded it before they kept a quantized base's blocks.
std::shared_ptr<models::LanguageModel> merged_model(const std::string& run) {
  LoadedGpt g = load_gpt(run, 0);
  if (g.llama) return g.llama;
  auto model = models::gpt(g.weights.config);
  model->load_state_dict(g.weights.state);
  return model;
}

// Each family and type at O0, O1 and O2: a finite loss, the same adapters as a dense run's (names and shapes) and
// parameter counts, the type recorded, and a peak (castor's allocator) below the dense base's run at that level.
TEST_F(QLoraCli, TrainsAtO0O1O2BelowTheDensePeak) {
  for (const char* family : kFamilies) {
    for (const char* amp : {"O0", "O1", "O2"}) {
      const std::string dense_run = detail::cat(family, "-dense-", amp);
      CastorProcess dense = castor(lora(family, dense_run, amp, {}));
      ASSERT_EQ(dense.exit_code, 0) << dense.err;
      const Json dense_summary = Json::parse(dense.out);
      const double dense_peak = dense_summary.at("peak_memory_bytes").as_double();
      for (const char* type : {"nf4", "q8_0", "q4_0", "q4_k"}) {
        SCOPED_TRACE(detail::cat(family, " ", type, " at ", amp));
        const std::string run = detail::cat(family, "-", type, "-", amp);
        CastorProcess q = castor(lora(family, run, amp, {"--quantize-base", type}));
        ASSERT_EQ(q.exit_code, 0) << q.err;
        const Json summary = Json::parse(q.out);
        EXPECT_TRUE(std::isfinite(summary.at("val_loss").as_double()));
        EXPECT_LT(summary.at("peak_memory_bytes").as_double(), dense_peak);
        // The quantized weights count as the values they hold; the adapters are the dense run's.
        EXPECT_EQ(summary.at("all_params"), dense_summary.at("all_params"));
        EXPECT_EQ(summary.at("trainable_params"), dense_summary.at("trainable_params"));
        const Checkpoint ck = read_checkpoint(scratch.file(run)), d = read_checkpoint(scratch.file(dense_run));
        ASSERT_EQ(ck.model.size(), d.model.size());
        for (const auto& [k, t] : d.model) EXPECT_EQ(ck.model.at(k).shape(), t.shape()) << k;
        const Json config = castor_config(ck.model_meta, run);
        EXPECT_EQ(config.at("quantize_base").as_string(), type);
      }
    }
    // The run evaluates as it trained (its base quantized again from the recorded settings).
    CastorProcess e = castor({"eval", detail::cat(family, "-nf4-O0")});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    EXPECT_TRUE(std::isfinite(Json::parse(e.out).at("val_loss").as_double()));
    // castor sample and eval --text|--task load it with the base in blocks and the adapters beside them (no dense
    // base), computing the merged model's logits.
    for (const auto& [type, block] :
         {std::pair{"nf4", quant::BlockType::NF4}, std::pair{"q4_k", quant::BlockType::Q4_K}}) {
      SCOPED_TRACE(detail::cat(family, " ", type, " loaded"));
      const std::string run = scratch.file(detail::cat(family, "-", type, "-O0"));
      const LoadedLm lm = load_language_model(run, 0, "", "", "");
      for (const auto& [name, layer] : nn::all_linear_layers(*lm.model)) {
        // (a Llama's w2, 704 wide here, is not whole K-quant blocks: it stays dense, as the run trained it)
        const bool whole = layer->in_features() % quant::block_type(block).block == 0;
        EXPECT_EQ(layer->quantized != nullptr, whole) << name;
        EXPECT_EQ(layer->weight.defined(), !whole) << name;
        EXPECT_TRUE(layer->lora && !layer->lora->merged()) << name;
      }
      const Tensor x = test::random_token_batch(2, 16, lm.model->vocab_size(), 5);
      auto merged = merged_model(run);
      merged->eval();
      EXPECT_TRUE(test::close((*lm.model)(x), (*merged)(x), 1e-5, 1e-5));
    }
  }
}

TEST_F(QLoraCli, BadFlagsAreOneLineErrors) {
  test::expect_one_line_error(
      castor(args("llama", "x", {"--init", "base-llama", "--quantize-base", "nf4", "--steps", "1"})),
      {"--quantize-base", "--lora-rank"});
  test::expect_one_line_error(castor(lora("llama", "y", "O0", {"--quantize-base", "q8_0", "--no-double-quant"})),
                              {"--no-double-quant", "nf4"});
  test::expect_one_line_error(castor(lora("llama", "z", "O0", {"--quantize-base", "q3_k"})),
                              {"--quantize-base", "q3_k"});
}

}  // namespace
}  // namespace castor::train
