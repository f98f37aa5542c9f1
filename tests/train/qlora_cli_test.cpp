// `castor train --lora-rank R --quantize-base TYPE` through the real binary: a 256-wide Llama run as the base, its
// Linears quantized while loading; the runs train at O0, O1 and O2, report a smaller peak than the dense base's, and
// evaluate and merge; flag errors are one line.
#include <gtest/gtest.h>

#include <cmath>

#include "castor/checkpoint.h"
#include "castor/json.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

class QLoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CastorProcess p = test::make_grammar_tokens(in_dir);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    CastorProcess b = castor(args("base", {"--steps", "2", "--amp", "O0"}));
    ASSERT_EQ(b.exit_code, 0) << b.err;
  }
  CastorProcess castor(const std::vector<std::string>& a) { return test::run_castor(a, in_dir); }
  // A 2-layer Llama 256 wide (every Linear's rows whole blocks of 256) on the test's character tokens.
  static std::vector<std::string> args(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = {"train", "--model",   "llama", "--data",       "tokens", "--data-dir",
                                  "tok",   "--n-layer", "2",     "--n-head",     "4",      "--n-kv-head",
                                  "2",     "--n-embd",  "256",   "--block-size", "16",     "--batch-size",
                                  "2",     "--threads", "1",     "--eval-iters", "2",      "--deterministic"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--out", out});
    return a;
  }
  static std::vector<std::string> lora(const std::string& out, const std::string& amp, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--init", "base", "--lora-rank", "4", "--steps", "3", "--amp", amp, "--lr", "1e-3"};
    a.insert(a.end(), extra.begin(), extra.end());
    return args(out, a);
  }
  test::ScratchDir scratch;
  test::CastorRun in_dir{scratch.path().string()};
};

// Each type at O0, O1 and O2: a finite loss, the same adapters as a dense run's (names and shapes) and parameter
// counts, the type recorded, and a peak (castor's allocator) below the dense base's run at that level.
TEST_F(QLoraCli, TrainsAtO0O1O2BelowTheDensePeak) {
  for (const char* amp : {"O0", "O1", "O2"}) {
    CastorProcess dense = castor(lora(detail::cat("dense-", amp), amp, {}));
    ASSERT_EQ(dense.exit_code, 0) << dense.err;
    const Json dense_summary = Json::parse(dense.out);
    const double dense_peak = dense_summary.at("peak_memory_bytes").as_double();
    for (const char* type : {"nf4", "q8_0", "q4_0", "q4_k"}) {
      SCOPED_TRACE(detail::cat(type, " at ", amp));
      const std::string run = detail::cat(type, "-", amp);
      CastorProcess q = castor(lora(run, amp, {"--quantize-base", type}));
      ASSERT_EQ(q.exit_code, 0) << q.err;
      const Json summary = Json::parse(q.out);
      EXPECT_TRUE(std::isfinite(summary.at("val_loss").as_double()));
      EXPECT_LT(summary.at("peak_memory_bytes").as_double(), dense_peak);
      // The quantized weights count as the values they hold; the adapters are the dense run's.
      EXPECT_EQ(summary.at("all_params"), dense_summary.at("all_params"));
      EXPECT_EQ(summary.at("trainable_params"), dense_summary.at("trainable_params"));
      const Checkpoint ck = read_checkpoint(scratch.file(run)),
                       d = read_checkpoint(scratch.file(detail::cat("dense-", amp)));
      ASSERT_EQ(ck.model.size(), d.model.size());
      for (const auto& [k, t] : d.model) EXPECT_EQ(ck.model.at(k).shape(), t.shape()) << k;
      const Json config = castor_config(ck.model_meta, run);
      EXPECT_EQ(config.at("quantize_base").as_string(), type);
    }
  }
  // The run evaluates as it trained (its base quantized again from the recorded settings).
  CastorProcess e = castor({"eval", "nf4-O0"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_TRUE(std::isfinite(Json::parse(e.out).at("val_loss").as_double()));
}

TEST_F(QLoraCli, BadFlagsAreOneLineErrors) {
  test::expect_one_line_error(castor(args("x", {"--init", "base", "--quantize-base", "nf4", "--steps", "1"})),
                              {"--quantize-base", "--lora-rank"});
  test::expect_one_line_error(castor(lora("y", "O0", {"--quantize-base", "q8_0", "--no-double-quant"})),
                              {"--no-double-quant", "nf4"});
  test::expect_one_line_error(castor(lora("z", "O0", {"--quantize-base", "q3_k"})), {"--quantize-base", "q3_k"});
}

}  // namespace
}  // namespace castor::train
