// `castor train` flag parsing: defaults, values, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include <algorithm>

#include "castor/check.h"
#include "castor/train_config.h"

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
  TrainConfig c = parse_train_flags({"--amp", "O2", "--dtype=fp16", "--lr", "0.05", "--batch-size=32", "--deterministic"});
  EXPECT_EQ(c.amp, amp::OptLevel::O2);
  EXPECT_EQ(c.dtype, DType::Float16);
  EXPECT_DOUBLE_EQ(c.lr, 0.05);
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_TRUE(c.deterministic);
}

TEST(TrainFlags, ErrorsNameTheFlag) {
  auto message = [](std::vector<std::string> args) {
    try {
      parse_train_flags(args);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
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
      try {
        parse_train_flags({flag, v});
        ADD_FAILURE() << flag << " " << v << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      }
    }
}

TEST(TrainFlags, ResumeKeepsTheRecordingAndTakesOnlyHarmlessFlags) {
  TrainConfig first = parse_train_flags({"--data", "synthetic", "--lr", "0.01", "--schedule", "cosine", "--steps",
                                         "10", "--deterministic", "--log-every", "3"});
  Json recorded = settings_json(first);
  recorded["threads"] = 4;  // what the run used
  TrainConfig c = resume_config(parse_train_flags({"--resume", "run", "--steps", "20", "--keep", "5"}), recorded, "run");
  EXPECT_EQ(c.data, Dataset::Synthetic);
  EXPECT_EQ(c.lr, 0.01);
  EXPECT_EQ(c.schedule, Schedule::Cosine);
  EXPECT_EQ(c.steps, 20);
  EXPECT_EQ(c.keep, 5);
  EXPECT_EQ(c.log_every, 3);  // not given now: the recorded value
  EXPECT_EQ(c.threads, 4);    // deterministic: the recorded thread count
  EXPECT_EQ(c.resume, "run");
  try {
    resume_config(parse_train_flags({"--lr", "0.02", "--model", "resnet9", "--threads", "2", "--steps", "30"}),
                  recorded, "run");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : {"--lr 0.02 (recorded 0.01)", "--model \"resnet9\" (recorded \"simplecnn\")",
                             "--threads 2 (recorded 4)"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in " << m;
    EXPECT_EQ(m.find("--steps"), std::string::npos) << m;
  }
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

}  // namespace castor::train

namespace castor::train {

std::string flag_error(const std::vector<std::string>& args) {
  try {
    parse_train_flags(args);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TrainFlags, FlagsOfAnotherJobAreRefusedNamingTheFlag) {
  // A GPT's sizes given to an image classifier (castor ignored them before).
  EXPECT_EQ(flag_error({"--model", "simplecnn", "--n-head", "3", "--block-size", "99"}),
            "--n-head: applies to language models only (--model gpt, gpt-mini or gpt2), not --model simplecnn");
  for (const char* flag : {"--n-layer", "--n-embd", "--block-size", "--vocab-size", "--dropout", "--data-order"})
    EXPECT_NE(flag_error({"--model", "resnet9", flag, flag == std::string("--data-order") ? "sequential" : "0"})
                  .find(std::string(flag) + ": applies to language models only"),
              std::string::npos)
        << flag;
  EXPECT_EQ(flag_error({"--model", "gpt", "--augment", "standard"}),
            "--augment: applies to image models only, not --model gpt");
  EXPECT_EQ(flag_error({"--image-size", "64"}), "--image-size: applies to --data folder only, not --data fashion-mnist");
  EXPECT_EQ(flag_error({"--synthetic-size", "64"}),
            "--synthetic-size: applies to --data synthetic only, not --data fashion-mnist");
  // Each job takes its own.
  EXPECT_EQ(parse_train_flags({"--model", "gpt", "--n-head", "2", "--n-embd", "32"}).n_head, 2);
  EXPECT_EQ(parse_train_flags({"--data", "synthetic", "--synthetic-size", "64"}).synthetic_size, 64);
  // A resume's job is the recorded one: an image run's recording (n_head 0 among its keys) resumes.
  const Json recorded = settings_json(parse_train_flags({"--data", "synthetic"}));
  EXPECT_EQ(resume_config(parse_train_flags({"--resume", "run", "--steps", "3"}), recorded, "run").steps, 3);
  try {
    resume_config(parse_train_flags({"--resume", "run", "--dropout", "0"}), recorded, "run");
    ADD_FAILURE() << "--dropout accepted on an image run's resume";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dropout: applies to language models only"), std::string::npos) << e.what();
  }
}

TEST(TrainFlags, AnUnknownFlagIsNamedAloneWithTheNearestOne) {
  EXPECT_EQ(flag_error({"--eval_every", "1"}),
            "unknown flag --eval_every; did you mean --eval-every? (see castor train --help)");
  EXPECT_EQ(flag_error({"--lr", "0.1", "--wieght-decay=0.1"}),
            "unknown flag --wieght-decay; did you mean --weight-decay? (see castor train --help)");
  EXPECT_EQ(flag_error({"--frobnicate"}), "unknown flag --frobnicate (see castor train --help)");
  EXPECT_EQ(flag_error({"stray"}).find("unexpected argument 'stray'"), 0u) << flag_error({"stray"});
}

TEST(TrainFlags, ConfigJsonAndResumeHelpComeFromTheSettingsTable) {
  // Every recorded key is a flag of castor train, and reads back as the same setting.
  const TrainConfig c = parse_train_flags({"--lr", "0.25", "--no-bias", "--model", "gpt", "--loss-scale", "128"});
  const Json recorded = settings_json(c);
  EXPECT_EQ(recorded.as_object().size(), 48u);
  const std::string help = train_help();
  for (const auto& [key, v] : recorded.as_object()) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    EXPECT_NE(help.find(flag), std::string::npos) << key;
  }
  EXPECT_EQ(settings_json(resume_config(TrainConfig{}, recorded, "run")), recorded);
  EXPECT_EQ(recorded.at("loss_scale").as_double(), 128);
  EXPECT_EQ(recorded.at("dtype").as_string(), "bfloat16");
  // --resume's help lists what a resume may change; --lr is not among them.
  const size_t at = help.find("Only these may change: ");
  ASSERT_NE(at, std::string::npos);
  const std::string rule = help.substr(at, help.find('\n', at) - at);
  EXPECT_NE(rule.find("--log-every"), std::string::npos) << rule;
  EXPECT_NE(rule.find("--steps (to extend)"), std::string::npos) << rule;
  EXPECT_EQ(rule.find("--lr"), std::string::npos) << rule;
}

}  // namespace castor::train
