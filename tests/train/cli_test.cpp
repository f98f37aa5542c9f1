// The `castor` command's flag table end to end: config files, aliases, the training-loop flags, eval of PyTorch
// weights, per-subcommand help and --version.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "castor/checkpoint.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "castor/trainer.h"
#include "castor/version.h"
#include "test_util.h"
#include "train/settings.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// The error parse_train_flags gives `args`.
std::string error_of(const std::vector<std::string>& args) {
  return test::error_of([&] { parse_train_flags(args); });
}

// stdout of `castor ARGS`.
std::string cli_stdout(const std::string& args) {
  std::string out;
  test::run_command(std::string(CASTOR_BINARY_DIR) + "/castor " + args + " 2>/dev/null", &out);
  return out;
}

std::vector<std::string> synthetic_flags(const std::string& out, int64_t steps) {
  // clang-format off
  return {"--data", "synthetic", "--synthetic-size", "128", "--amp", "O0", "--optimizer", "sgd", "--momentum", "0",
          "--lr", "0.05", "--steps", std::to_string(steps), "--deterministic", "--threads", "2", "--out", out};
  // clang-format on
}

StateDict final_weights(const std::string& out) { return read_checkpoint(*latest_checkpoint(out)).model; }

}  // namespace

TEST(TrainFlags, BothDtypeSpellingsAndThePrecisionAlias) {
  EXPECT_EQ(parse_train_flags({"--dtype", "bfloat16"}).dtype, DType::BFloat16);
  EXPECT_EQ(parse_train_flags({"--dtype", "float16"}).dtype, DType::Float16);
  struct Case {
    const char* precision;
    const char* amp;
    DType dtype;
  };
  // Lightning 2's spellings, its short forms ("32", "16", "bf16") included.
  for (const Case& k : {Case{"32", "O0", DType::BFloat16}, Case{"32-true", "O0", DType::BFloat16},
                        Case{"bf16-mixed", "O1", DType::BFloat16}, Case{"bf16", "O1", DType::BFloat16},
                        Case{"16-mixed", "O1", DType::Float16}, Case{"16", "O1", DType::Float16},
                        Case{"bf16-true", "O3", DType::BFloat16}, Case{"16-true", "O3", DType::Float16}}) {
    const TrainConfig c = parse_train_flags({"--precision", k.precision});
    EXPECT_STREQ(amp::opt_level_name(c.amp), k.amp) << k.precision;
    if (!std::string(k.precision).starts_with("32")) {
      EXPECT_EQ(c.dtype, k.dtype) << k.precision;
    }
  }
  EXPECT_NE(error_of({"--precision", "bf16-mixed", "--amp", "O2"}).find("--precision"), std::string::npos);
  EXPECT_NE(error_of({"--precision", "64"}).find("--precision"), std::string::npos);
}

TEST(TrainFlags, AutoPrecisionIsTheDefaultAndAnExplicitLevelIsObeyed) {
  // Auto (the default, --precision auto, --amp auto) takes amp::auto_precision()'s level and dtype and says why;
  // tests/train/auto_precision_test.cpp checks that choice under each ONEDNN_MAX_CPU_ISA cap.
  const amp::AutoPrecision here = amp::auto_precision();
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{}, {"--precision", "auto"}, {"--amp", "auto"}, {"--model", "gpt"}}) {
    const TrainConfig c = parse_train_flags(args);
    EXPECT_TRUE(c.precision_auto);
    EXPECT_EQ(c.amp, here.level);
    EXPECT_EQ(c.dtype, here.dtype);
    EXPECT_EQ(c.precision_reason, here.reason);
    EXPECT_EQ(settings_json(c).at("amp").as_string(), amp::opt_level_name(here.level));  // recorded as chosen
  }
  // Explicit levels are obeyed whatever the CPU has; --dtype alone is O1 in that type.
  for (const char* level : {"O0", "O1", "O2", "O3"}) {
    const TrainConfig c = parse_train_flags({"--amp", level});
    EXPECT_STREQ(amp::opt_level_name(c.amp), level);
    EXPECT_FALSE(c.precision_auto);
    EXPECT_TRUE(c.precision_reason.empty());
  }
  EXPECT_EQ(parse_train_flags({"--precision", "bf16-mixed"}).amp, amp::OptLevel::O1);
  EXPECT_EQ(parse_train_flags({"--precision", "32-true"}).amp, amp::OptLevel::O0);
  const TrainConfig fp16 = parse_train_flags({"--dtype", "fp16"});
  EXPECT_EQ(fp16.amp, amp::OptLevel::O1);
  EXPECT_EQ(fp16.dtype, DType::Float16);
  EXPECT_FALSE(fp16.precision_auto);
  // Auto with a level or dtype beside it is refused, naming both flags.
  EXPECT_EQ(error_of({"--precision", "auto", "--amp", "O1"}), "--amp excludes --precision");
  EXPECT_EQ(error_of({"--precision", "auto", "--dtype", "fp16"}), "--dtype excludes --precision");
  EXPECT_EQ(error_of({"--amp", "auto", "--dtype", "fp16"}),
            "--amp auto and --dtype float16: auto chooses the 16-bit type too (give --amp O1 --dtype float16, or "
            "drop --dtype)");
  // A run's config.json given as --config keeps its precision, even where it equals TrainConfig's member defaults.
  const test::ScratchDir scratch("auto_precision_config");
  const std::string& dir = scratch.str();
  std::ofstream(dir + "/config.json") << R"({"amp": "O1", "dtype": "bfloat16", "precision_auto": "auto: amx_bf16"})";
  const TrainConfig from_file = parse_train_flags({"--config", dir + "/config.json"});
  EXPECT_FALSE(from_file.precision_auto);
  EXPECT_EQ(from_file.amp, amp::OptLevel::O1);
  EXPECT_EQ(from_file.dtype, DType::BFloat16);
}

TEST(TrainFlags, LoopFlagsAreRangeChecked) {
  const TrainConfig c = parse_train_flags(
      {"--clip-grad-norm", "1.5", "--grad-accum", "4", "--label-smoothing", "0.1", "--loss-scale", "128"});
  EXPECT_DOUBLE_EQ(c.clip_grad_norm, 1.5);
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_DOUBLE_EQ(c.label_smoothing, 0.1);
  ASSERT_TRUE(c.loss_scale.has_value());
  EXPECT_DOUBLE_EQ(*c.loss_scale, 128.0);
  EXPECT_FALSE(parse_train_flags({"--loss-scale", "dynamic"}).loss_scale.has_value());
  for (auto [flag, value] :
       {std::pair{"--grad-accum", "0"}, std::pair{"--label-smoothing", "1"}, std::pair{"--loss-scale", "-2"},
        std::pair{"--clip-grad-norm", "nan"}, std::pair{"--weight-decay", "inf"}, std::pair{"--lr", "inf"}}) {
    const std::string msg = error_of({flag, value});
    EXPECT_NE(msg.find(flag), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_NE(error_of({"--loss-scale", "8", "--amp", "O0"}).find("--loss-scale"), std::string::npos);
}

TEST(TrainFlags, ConfigFileKeysAreTheFlagNames) {
  const test::ScratchDir dir("config_file");
  fs::create_directories(dir);
  std::ofstream(dir + "/run.toml") << "lr = 0.25\nbatch-size = 7\ndeterministic = true\n"
                                      "precision = \"bf16-true\"\n";
  const TrainConfig c = parse_train_flags({"--config", dir + "/run.toml", "--batch-size", "9"});
  EXPECT_DOUBLE_EQ(c.lr, 0.25);
  EXPECT_EQ(c.batch_size, 9);  // the command line wins over the file
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(c.amp, amp::OptLevel::O3);
  std::ofstream(dir + "/bad.toml") << "learning-rate = 0.1\n";
  EXPECT_NE(error_of({"--config", dir + "/bad.toml"}).find("learning-rate"), std::string::npos);
  std::ofstream(dir + "/range.toml") << "lr = -3\n";
  EXPECT_NE(error_of({"--config", dir + "/range.toml"}).find("--lr"), std::string::npos);
  EXPECT_NE(error_of({"--config", dir + "/missing.toml"}).find("missing.toml"), std::string::npos);
}

TEST(TrainFlags, ConfigFilesRefuseDuplicateKeysNameThemselvesAndTakeConfigJsonSpellings) {
  const test::ScratchDir dir("config_file_keys");
  fs::create_directories(dir);
  // The keys of config.json (batch_size) as well as the flags' (batch-size).
  std::ofstream(dir + "/json_keys.toml") << "batch_size = 7\nweight_decay = 0.5\nsync_batchnorm = false\n";
  const TrainConfig c = parse_train_flags({"--config", dir + "/json_keys.toml"});
  EXPECT_EQ(c.batch_size, 7);
  EXPECT_DOUBLE_EQ(c.weight_decay, 0.5);
  EXPECT_FALSE(c.sync_batchnorm);
  // A key given twice, in either spelling, is refused (as TOML does), naming the file and the key.
  std::ofstream(dir + "/twice.toml") << "lr = 0.1\nlr = 0.2\n";
  std::string msg = error_of({"--config", dir + "/twice.toml"});
  EXPECT_NE(msg.find(dir + "/twice.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find(":2: key 'lr' is given twice"), std::string::npos) << msg;
  std::ofstream(dir + "/both.toml") << "batch-size = 1\nbatch_size = 2\n";
  EXPECT_NE(error_of({"--config", dir + "/both.toml"}).find("given twice"), std::string::npos);
  // Every error in a file names it: bad values, unknown keys, sections.
  std::ofstream(dir + "/value.toml") << "steps = many\n";
  msg = error_of({"--config", dir + "/value.toml"});
  EXPECT_NE(msg.find("--config " + dir + "/value.toml: --steps"), std::string::npos) << msg;
  std::ofstream(dir + "/section.toml") << "[train]\nlr = 0.1\n";
  msg = error_of({"--config", dir + "/section.toml"});
  EXPECT_NE(msg.find(dir + "/section.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sections ([train])"), std::string::npos) << msg;
  std::ofstream(dir + "/unknown.toml") << "learning_rate = 0.1\n";
  msg = error_of({"--config", dir + "/unknown.toml"});
  EXPECT_NE(msg.find(dir + "/unknown.toml: unknown key 'learning_rate'"), std::string::npos) << msg;
}

// TOML 1.0 as far as flat key = value lines go: a UTF-8 byte-order mark is skipped, CRLF lines and comments after a
// value are read, basic strings decode their escapes (\u0041, \t, \", \\, \U0001F600), literal strings keep
// backslashes, and an unterminated string, a bad escape or text after a value is an error naming the file and line.
TEST(TrainFlags, TomlConfigsFollowToml10) {
  const test::ScratchDir scratch("config_toml");
  const std::string& dir = scratch.str();
  std::ofstream(dir + "/bom.toml") << "\xEF\xBB\xBFlr = 0.25  # a quarter\r\nbatch-size = 7\r\n";
  TrainConfig c = parse_train_flags({"--config", dir + "/bom.toml"});
  EXPECT_DOUBLE_EQ(c.lr, 0.25);
  EXPECT_EQ(c.batch_size, 7);
  std::ofstream(dir + "/escapes.toml") << "data-dir = \"a\\u0041\\tb\\\"c\\\\d\\U0001F600\" # comment\n"
                                          "init = 'C:\\weights\\m.bin'\n";
  c = parse_train_flags({"--config", dir + "/escapes.toml"});
  EXPECT_EQ(c.data_dir, "aA\tb\"c\\d\xF0\x9F\x98\x80");
  EXPECT_EQ(c.init, "C:\\weights\\m.bin");
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"lr = 0.1\ndata-dir = \"tok\n", ":2: unterminated string"},
           {"init = 'w.bin\n", ":1: unterminated string"},
           {"data-dir = \"a\\qb\"\n", ":1: invalid escape '\\q'"},
           {"data-dir = \"\\u00zz\"\n", ":1: \\u needs 4 hex digits"},
           {"data-dir = \"\\uD800\"\n", ":1: \\uD800 is not a Unicode scalar value"},
           {"data-dir = \"a\" b\n", ":1: unexpected text after the value: 'b'"},
           {"lr =\n", ":1: the value is missing"},
           {"just words\n", ":1: expected key = value"}}) {
    std::ofstream(dir + "/bad.toml") << text;
    const std::string msg = error_of({"--config", dir + "/bad.toml"});
    EXPECT_NE(msg.find("--config " + dir + "/bad.toml" + want), std::string::npos) << text << " -> " << msg;
  }
}

TEST(TrainFlags, EachSubcommandHasItsOwnHelpAndThereIsAVersion) {
  EXPECT_NE(cli_stdout("train --help").find("--grad-accum"), std::string::npos);
  const std::string eval = cli_stdout("eval --help");
  EXPECT_NE(eval.find("--model"), std::string::npos) << eval;
  EXPECT_EQ(eval.find("--grad-accum"), std::string::npos) << eval;
  EXPECT_NE(cli_stdout("info --help").find("castor info"), std::string::npos);
  EXPECT_EQ(cli_stdout("--version"), std::string("castor ") + CASTOR_VERSION + "\n");
}

// The completion script offers each subcommand's own flags, and bash accepts it: completing
// `castor train --grad` in a bash that sourced it gives --grad-accum.
TEST(TrainFlags, BashCompletionComesFromTheFlagTable) {
  const test::ScratchDir dir("completion");
  fs::create_directories(dir);
  std::ofstream(dir + "/castor.bash") << shell_completion("bash");
  std::ofstream(dir + "/probe.sh") << "source '" << dir << "/castor.bash'\n"
                                   << "COMP_WORDS=(castor train --grad); COMP_CWORD=2; _castor; echo ${COMPREPLY[@]}\n"
                                   << "COMP_WORDS=(castor eval --mo); _castor; echo ${COMPREPLY[@]}\n";
  std::string out;
  ASSERT_EQ(test::run_command("bash '" + dir + "/probe.sh'", &out), 0) << out;
  EXPECT_EQ(out, "--grad-accum\n--model\n");
}

// Two micro-batches of 16 are one batch of 32: the summed gradients of the halves' mean losses over 2 equal
// the gradient of the whole batch's mean loss, so SGD ends at the same weights up to float32 rounding.
TEST(TrainFlags, FlagsOfAnotherJobAreRefusedNamingTheFlag) {
  // A GPT's sizes given to an image classifier (castor ignored them before).
  EXPECT_EQ(error_of({"--model", "simplecnn", "--n-head", "3", "--block-size", "99"}),
            "--n-head: applies to language models only (--model gpt, gpt-mini, gpt2, llama, llama-260k or llama-15m), "
            "not --model simplecnn");
  for (const char* flag : {"--n-layer", "--n-embd", "--block-size", "--vocab-size", "--dropout", "--data-order"})
    EXPECT_NE(error_of({"--model", "resnet9", flag, flag == std::string("--data-order") ? "sequential" : "0"})
                  .find(std::string(flag) + ": applies to language models only"),
              std::string::npos)
        << flag;
  EXPECT_EQ(error_of({"--model", "gpt", "--augment", "standard"}),
            "--augment: applies to image models only, not --model gpt");
  EXPECT_EQ(error_of({"--image-size", "64"}), "--image-size: applies to --data folder only, not --data fashion-mnist");
  EXPECT_EQ(error_of({"--synthetic-size", "64"}),
            "--synthetic-size: applies to --data synthetic only, not --data fashion-mnist");
  // Each job takes its own.
  EXPECT_EQ(parse_train_flags({"--model", "gpt", "--n-head", "2", "--n-embd", "32"}).n_head, 2);
  EXPECT_EQ(parse_train_flags({"--data", "synthetic", "--synthetic-size", "64"}).synthetic_size, 64);
  // A resume's job is the recorded one: an image run's recording (n_head 0 among its keys) resumes.
  const Json recorded = settings_json(parse_train_flags({"--data", "synthetic"}));
  EXPECT_EQ(resume_config(parse_train_flags({"--resume", "run", "--steps", "3"}), recorded, "run").steps, 3);
  test::expect_error(
      [&] {
        resume_config(parse_train_flags({"--resume", "run", "--dropout", "0"}), recorded, "run");
      },
      {"--dropout: applies to language models only"});
}

// --model llama: the preset's sizes and the default job's recipe (docs/llama.md) where not given; llama2.c's shapes.
TEST(TrainFlags, LlamaPresetsAndTheDefaultJob) {
  const TrainConfig d = parse_train_flags({"--model", "llama"});
  EXPECT_EQ(d.data, Dataset::BrownBpe);
  EXPECT_EQ(std::vector<int64_t>({d.n_embd, d.n_layer, d.n_head, d.n_kv_head, d.block_size, d.multiple_of}),
            std::vector<int64_t>({128, 4, 8, 4, 128, 32}));
  EXPECT_EQ(d.steps, 500);
  EXPECT_EQ(d.warmup_steps, 50);
  EXPECT_DOUBLE_EQ(d.lr, 2e-3);
  EXPECT_DOUBLE_EQ(d.min_lr, 2e-4);
  EXPECT_EQ(d.optimizer, OptimizerKind::AdamW);
  EXPECT_FALSE(d.untied);
  const TrainConfig s = parse_train_flags({"--model", "llama-260k"});
  EXPECT_EQ(std::vector<int64_t>({s.n_embd, s.n_layer, s.n_head, s.n_kv_head, s.block_size, s.multiple_of}),
            std::vector<int64_t>({64, 5, 8, 4, 512, 4}));
  const TrainConfig m = parse_train_flags({"--model", "llama-15m", "--lr", "5e-4", "--rope-theta", "500000"});
  EXPECT_EQ(std::vector<int64_t>({m.n_embd, m.n_layer, m.n_head, m.n_kv_head, m.block_size, m.multiple_of}),
            std::vector<int64_t>({288, 6, 6, 6, 256, 32}));
  EXPECT_DOUBLE_EQ(m.lr, 5e-4);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000);
  // --n-head given alone: as many key/value heads (multi-head attention).
  EXPECT_EQ(parse_train_flags({"--model", "llama-260k", "--n-head", "2"}).n_kv_head, 2);
  EXPECT_EQ(parse_train_flags({"--model", "gpt"}).steps, 2000);  // the GPT's recipe unchanged
}

TEST(TrainFlags, AnUnknownFlagIsNamedAloneWithTheNearestOne) {
  EXPECT_EQ(error_of({"--eval_every", "1"}),
            "unknown flag --eval_every; did you mean --eval-every? (see castor train --help)");
  EXPECT_EQ(error_of({"--lr", "0.1", "--wieght-decay=0.1"}),
            "unknown flag --wieght-decay; did you mean --weight-decay? (see castor train --help)");
  EXPECT_EQ(error_of({"--frobnicate"}), "unknown flag --frobnicate (see castor train --help)");
  EXPECT_EQ(error_of({"stray"}).find("unexpected argument 'stray'"), 0u) << error_of({"stray"});
}

TEST(TrainFlags, ConfigJsonAndResumeHelpComeFromTheSettingsTable) {
  // Every recorded key is a flag of castor train, and reads back as the same setting.
  const TrainConfig c = parse_train_flags({"--lr", "0.25", "--no-bias", "--model", "gpt", "--loss-scale", "128"});
  const Json recorded = settings_json(c);
  // one key for each row of the settings table that config.json records (every Resume rule but Unrecorded)
  std::set<std::string> keys;
  for (const Setting& s : settings())
    if (s.resume != Resume::Unrecorded) keys.insert(config_key(s.flag));
  EXPECT_GT(keys.size(), 60u);  // (the table's rows, not a table emptied by mistake)
  EXPECT_EQ(recorded.as_object().size(), keys.size());
  for (const std::string& key : keys) EXPECT_NE(recorded.find(key), nullptr) << key;
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

TEST(TrainerFlags, GradientAccumulationEqualsOneBigBatch) {
  const test::ScratchDir accum("grad_accum");
  const test::ScratchDir big("grad_big");
  auto a = synthetic_flags(accum, 4);
  a.insert(a.end(), {"--batch-size", "16", "--grad-accum", "2"});
  auto b = synthetic_flags(big, 4);
  b.insert(b.end(), {"--batch-size", "32"});
  Json ra = run_train(parse_train_flags(a)), rb = run_train(parse_train_flags(b));
  EXPECT_EQ(ra.at("steps").as_int(), 4);
  const StateDict wa = final_weights(accum), wb = final_weights(big);
  for (const auto& [name, t] : wb) EXPECT_TRUE(test::close(wa.at(name), t, 1e-4, 1e-6)) << name;
  // Without accumulation the runs differ, so the comparison above can fail.
  const test::ScratchDir plain("grad_plain");
  auto p = synthetic_flags(plain, 4);
  p.insert(p.end(), {"--batch-size", "16"});
  run_train(parse_train_flags(p));
  EXPECT_FALSE(test::close(final_weights(plain).at("fc2.weight"), wb.at("fc2.weight"), 1e-4, 1e-6));
}

// One plain SGD step on gradients clipped to norm c moves the weights by lr * c in total (when the gradient's
// norm exceeds c): worked out by hand from torch.nn.utils.clip_grad_norm_'s definition.
TEST(TrainerFlags, ClipGradNormBoundsTheStep) {
  const test::ScratchDir dir("clip");
  fs::create_directories(dir);
  manual_seed(3);
  auto model = models::make_model("simplecnn", 3, 32, 32, 10);
  const StateDict init = model->state_dict();
  save_safetensors(dir + "/init.safetensors", init);
  for (const char* amp : {"O0", "O1"}) {
    const std::string out = dir + "/" + amp;
    auto f = synthetic_flags(out, 1);
    f.insert(f.end(), {"--batch-size", "16", "--init", dir + "/init.safetensors", "--clip-grad-norm", "0.001", "--amp",
                       amp, "--loss-scale", "1024"});
    if (std::string(amp) == "O0") f.erase(f.end() - 2, f.end());  // O0 has no loss scale
    run_train(parse_train_flags(f));
    double moved = 0;
    for (const auto& [name, t] : final_weights(out)) {
      const std::vector<double> x = t.to_vector<double>(), x0 = init.at(name).to_vector<double>();
      for (size_t i = 0; i < x.size(); ++i) moved += (x[i] - x0[i]) * (x[i] - x0[i]);
    }
    EXPECT_NEAR(std::sqrt(moved), 0.05 * 0.001, 0.05 * 0.001 * 1e-3) << amp;
  }
}

TEST(TrainerFlags, StaticLossScaleAndLabelSmoothingReachTheLoop) {
  const test::ScratchDir scaled("static_scale");
  auto f = synthetic_flags(scaled, 6);
  f.insert(f.end(), {"--batch-size", "16", "--amp", "O1", "--dtype", "fp16", "--loss-scale", "256"});
  Json r = run_train(parse_train_flags(f));
  EXPECT_EQ(r.at("final_loss_scale").as_double(), 256.0);
  // The first step's loss with smoothing s is (1 - s) CE + s U (U: the mean of -log p over classes), linear in
  // s: so L(0.4) - L(0) = 2 (L(0.2) - L(0)), and L(0.2) != L(0) unless smoothing is ignored.
  auto first_loss = [](double smoothing) {
    const test::ScratchDir out("smoothing_" + std::to_string(smoothing));
    auto f = synthetic_flags(out, 1);
    f.insert(f.end(), {"--label-smoothing", std::to_string(smoothing)});
    run_train(parse_train_flags(f));
    std::ifstream in(out + "/metrics.jsonl");
    std::string line;
    std::getline(in, line);
    return Json::parse(line).at("loss").as_double();
  };
  const double l0 = first_loss(0), l2 = first_loss(0.2), l4 = first_loss(0.4);
  EXPECT_GT(std::fabs(l2 - l0), 1e-4);
  EXPECT_NEAR(l4 - l0, 2 * (l2 - l0), 1e-5);
}

// Weights saved by PyTorch (the twin's state_dict, no castor metadata) evaluate with --model and --data, and
// score exactly what the castor checkpoint they came from scores.
TEST(TrainerFlags, EvalOfPyTorchWrittenWeights) {
  const test::ScratchDir data("eval_torch_data");
  const test::ScratchDir out("eval_torch_run");
  test::write_tiny_cifar10(data);
  run_train(parse_train_flags(
      {"--data", "cifar10", "--data-dir", data, "--batch-size", "10", "--steps", "6", "--amp", "O0", "--out", out}));
  const std::string ckpt = *latest_checkpoint(out), torch_file = out + "/from_torch.safetensors";
  save_safetensors(out + "/input.safetensors", {{"input", zeros({1, 3, 32, 32})}});
  ASSERT_TRUE(test::run_oracle("models_oracle.py",
                               {"safetensors", "simplecnn", "3", "32", "32", "10", ckpt + "/model.safetensors",
                                out + "/input.safetensors", out + "/logits.safetensors", torch_file}));
  const Json own = run_eval(parse_eval_flags({"--checkpoint", ckpt}));
  const Json torch = run_eval(
      parse_eval_flags({torch_file, "--model", "simplecnn", "--data", "cifar10", "--data-dir", data}));
  EXPECT_EQ(torch.at("test_accuracy").as_double(), own.at("test_accuracy").as_double());
  EXPECT_EQ(torch.at("test_loss").as_double(), own.at("test_loss").as_double());
  test::expect_error([&] { run_eval(parse_eval_flags({torch_file, "--data-dir", data})); }, {"--model"});
}

}  // namespace castor::train
