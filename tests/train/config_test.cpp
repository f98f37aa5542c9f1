// `castor train` flag parsing: defaults, values, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include "castor/check.h"
#include "castor/train_config.h"

namespace castor::train {

TEST(TrainFlags, DefaultsAreAGoodRun) {
  TrainConfig c = parse_train_flags({});
  EXPECT_EQ(c.data, "fashion-mnist");
  EXPECT_EQ(c.model, "simplecnn");
  EXPECT_EQ(c.amp, "O1");
  EXPECT_EQ(c.dtype, DType::BFloat16);
  EXPECT_EQ(c.optimizer, "adam");
  EXPECT_EQ(c.epochs, 1);
}

TEST(TrainFlags, ValuesBothSpellings) {
  TrainConfig c = parse_train_flags({"--amp", "O2", "--dtype=fp16", "--lr", "0.05", "--batch-size=32", "--deterministic"});
  EXPECT_EQ(c.amp, "O2");
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

}  // namespace castor::train
