// `castor train` flag parsing: defaults, values, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "castor/check.h"
#include "castor/train_config.h"
#include "support/support.h"
#include "train/settings.h"

namespace castor::train {

TEST(TrainFlags, DefaultsAreAGoodRun) {
  TrainConfig c = parse_train_flags({});
  EXPECT_EQ(c.data, Dataset::FashionMnist);
  EXPECT_EQ(c.model, ModelKind::SimpleCnn);
  EXPECT_EQ(c.amp, amp::OptLevel::O1);
  EXPECT_EQ(c.dtype, DType::BFloat16);
  EXPECT_EQ(c.optimizer, OptimizerKind::Adam);
  EXPECT_EQ(c.epochs, 1);
}

TEST(TrainFlags, ValuesBothSpellings) {
  TrainConfig c = parse_train_flags(
      {"--amp", "O2", "--dtype=fp16", "--lr", "0.05", "--batch-size=32", "--deterministic"});
  EXPECT_EQ(c.amp, amp::OptLevel::O2);
  EXPECT_EQ(c.dtype, DType::Float16);
  EXPECT_DOUBLE_EQ(c.lr, 0.05);
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_TRUE(c.deterministic);
}

TEST(TrainFlags, ErrorsNameTheFlag) {
  auto message = [](const std::vector<std::string>& args) { return test::error_of([&] { parse_train_flags(args); }); };
  EXPECT_NE(message({"--bogus"}).find("--bogus"), std::string::npos);
  EXPECT_NE(message({"--amp", "O7"}).find("--amp"), std::string::npos);
  EXPECT_NE(message({"--lr", "fast"}).find("--lr"), std::string::npos);
  EXPECT_NE(message({"--lr", "-1"}).find("--lr"), std::string::npos);
  EXPECT_NE(message({"--batch-size", "2.5"}).find("--batch-size"), std::string::npos);
  EXPECT_NE(message({"--epochs"}).find("missing value"), std::string::npos);
  EXPECT_NE(message({"--stochastic-rounding"}).find("O3"), std::string::npos);
  EXPECT_EQ(message({"--lr", "fast"}).find('\n'), std::string::npos);
}

TEST(TrainFlags, NonFiniteNumbersAreRefused) {
  for (const char* flag : {"--lr", "--weight-decay", "--momentum", "--checkpoint-minutes"})
    for (const char* v : {"inf", "nan", "-inf"}) {
      test::expect_error([&] { parse_train_flags({flag, v}); }, {flag});
    }
}

TEST(TrainFlags, ResumeKeepsTheRecordingAndTakesOnlyHarmlessFlags) {
  TrainConfig first = parse_train_flags({"--data", "synthetic", "--lr", "0.01", "--schedule", "cosine", "--steps", "10",
                                         "--deterministic", "--log-every", "3"});
  Json recorded = settings_json(first);
  recorded["threads"] = 4;  // what the run used
  TrainConfig c = resume_config(parse_train_flags({"--resume", "run", "--steps", "20", "--keep", "5"}), recorded,
                                "run");
  EXPECT_EQ(c.data, Dataset::Synthetic);
  EXPECT_EQ(c.lr, 0.01);
  EXPECT_EQ(c.schedule, Schedule::Cosine);
  EXPECT_EQ(c.steps, 20);
  EXPECT_EQ(c.keep, 5);
  EXPECT_EQ(c.log_every, 3);  // not given now: the recorded value
  EXPECT_EQ(c.threads, 4);    // deterministic: the recorded thread count
  EXPECT_EQ(c.resume, "run");
  const std::string m = test::error_of([&] {
    resume_config(parse_train_flags({"--lr", "0.02", "--model", "resnet9", "--threads", "2", "--steps", "30"}),
                  recorded, "run");
  });
  for (const char* part :
       {"--lr 0.02 (recorded 0.01)", "--model \"resnet9\" (recorded \"simplecnn\")", "--threads 2 (recorded 4)"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in " << m;
  EXPECT_EQ(m.find("--steps"), std::string::npos) << m;
  recorded["deterministic"] = false;
  EXPECT_EQ(resume_config(parse_train_flags({"--threads", "2"}), recorded, "run").threads, 2);
}

// --conv-algorithm is recorded; a run recorded before it existed ran its float32 convolutions direct and resumes so,
// and changing it on resume is refused like any other numerics setting.
TEST(TrainFlags, ConvAlgorithmIsRecordedAndOlderRunsResumeDirect) {
  EXPECT_EQ(parse_train_flags({}).conv_algorithm, backends::ConvAlgorithm::Auto);
  Json recorded = settings_json(parse_train_flags({"--conv-algorithm", "direct"}));
  EXPECT_EQ(recorded.at("conv_algorithm").as_string(), "direct");
  EXPECT_EQ(resume_config(parse_train_flags({}), recorded, "run").conv_algorithm, backends::ConvAlgorithm::Direct);
  Json older = settings_json(parse_train_flags({}));
  older.as_object().erase("conv_algorithm");
  EXPECT_EQ(resume_config(parse_train_flags({}), older, "run").conv_algorithm, backends::ConvAlgorithm::Direct);
  recorded["conv_algorithm"] = "auto";
  EXPECT_EQ(resume_config(parse_train_flags({}), recorded, "run").conv_algorithm, backends::ConvAlgorithm::Auto);
  EXPECT_THROW(resume_config(parse_train_flags({"--conv-algorithm", "direct"}), recorded, "run"), Error);
  EXPECT_THROW(parse_train_flags({"--conv-algorithm", "winograd"}), Error);
}

// TrainConfig::given takes a flag of the settings table: each name the sources ask about is a row (a typo or a
// renamed flag would otherwise answer "no" forever), and a name that is no row stops the program, naming it.
TEST(TrainFlags, GivenAsksOnlyAboutRowsOfTheSettingsTable) {
  const std::regex call(R"re(given\("([^"]*)"\))re");
  int calls = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(CASTOR_SOURCE_DIR) + "/src")) {
    if (e.path().extension() != ".cpp" && e.path().extension() != ".h") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator m(s.begin(), s.end(), call), end; m != end; ++m, ++calls)
      EXPECT_NE(find_setting((*m)[1].str()), nullptr) << e.path() << " asks given(\"" << (*m)[1] << "\")";
  }
  EXPECT_GE(calls, 20);  // the scan found the calls (29 when this test was written)
  const TrainConfig c = parse_train_flags({"--lr", "0.1"});
  EXPECT_TRUE(c.given("--lr"));
  EXPECT_FALSE(c.given("--weight-decay"));
  EXPECT_DEATH(c.given("--learning-rate"), "--learning-rate.*no row of the settings table");
}

}  // namespace castor::train
