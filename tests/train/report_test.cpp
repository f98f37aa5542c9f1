// What a run shows and records: the progress line's width and fields, the metrics log's window means and CSV, the
// report rebuilt from the whole metrics.jsonl, summary.json, and a stdout that holds only the summary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "castor/fs.h"
#include "castor/report.h"
#include "castor/trainer.h"
#include "test_util.h"
#include "train/progress.h"
#include "train/run_log.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

std::string fresh(const std::string& name) {
  const std::string d = test::fresh_dir(name);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

}  // namespace

TEST(Progress, LineFitsEveryWidthAndShowsTheFields) {
  EXPECT_EQ(clock_text(3725), "1:02:05");
  EXPECT_EQ(clock_text(59.6), "0:01:00");
  const ProgressState s{2, 3, 120, 938, 0.45214, 1e-3, 65536, 1234.4, 83};  // the second of 3 epochs
  for (int width = 0; width <= 200; ++width) {
    const std::string line = progress_line(s, width);
    ASSERT_LE(line.size(), static_cast<size_t>(width)) << line;
  }
  const std::string wide = progress_line(s, 200);
  for (const char* field : {"epoch 2/3", "step 120/938", "loss 0.4521", "lr 0.001", "scale 65536", "1234 img/s",
                            "0:01:23<0:09:26", "[###"})
    EXPECT_NE(wide.find(field), std::string::npos) << field << " in " << wide;
  // At 80 columns the most important fields stay (ETA: 83 s for 120 steps, 818 to go).
  const std::string narrow = progress_line(s, 79);
  EXPECT_NE(narrow.find("loss 0.4521"), std::string::npos) << narrow;
  ProgressState bf16 = s;  // no loss scaling: no scale field
  bf16.loss_scaling = false;
  EXPECT_EQ(progress_line(bf16, 200).find("scale"), std::string::npos);
}

// The logged loss_avg is the mean of the window's step losses (worked by hand), skipped steps get a line of
// their own without one, and metrics.csv holds the same records under one header.
TEST(RunLog, WindowMeansAndCsvRows) {
  const std::string out = fresh("run_log");
  TrainConfig c;
  c.out = out;
  c.log_every = 3;
  {
    RunLog log(c, /*total_steps=*/7, /*epochs=*/1, /*append=*/false);
    for (int step = 1; step <= 7; ++step)
      log.step({step, 0, static_cast<double>(step), 0.1, 1024, /*skipped=*/step == 2, 64.0 * step, 0.5 * step});
    log.evaluation(7, 0, 0.25, 0.75);
  }
  std::vector<Json> records = read_metrics(out);
  ASSERT_EQ(records.size(), 5u);  // skipped step 2, steps 3 and 6 (window ends), 7 (the last), the evaluation
  EXPECT_EQ(records[0].at("step").as_int(), 2);
  EXPECT_EQ(records[0].find("loss_avg"), nullptr);
  EXPECT_DOUBLE_EQ(records[1].at("loss_avg").as_double(), (1 + 2 + 3) / 3.0);
  EXPECT_DOUBLE_EQ(records[2].at("loss_avg").as_double(), (4 + 5 + 6) / 3.0);
  EXPECT_DOUBLE_EQ(records[3].at("loss_avg").as_double(), 7.0);
  EXPECT_DOUBLE_EQ(records[4].at("test_accuracy").as_double(), 0.75);
  const std::vector<std::string> csv = lines_of(out + "/metrics.csv");
  ASSERT_EQ(csv.size(), 6u);
  EXPECT_EQ(csv[0].rfind("step,epoch,loss,loss_avg,lr,loss_scale,skipped", 0), 0u) << csv[0];
  EXPECT_EQ(csv[2].rfind("3,0,3.0,2.0,0.1,1024.0,0,128.0,", 0), 0u) << csv[2];
  // A resumed run appends, without a second header.
  {
    RunLog log(c, 8, 1, /*append=*/true);
    log.step({8, 0, 8.0, 0.1, 1024, false, 64, 1});
  }
  EXPECT_EQ(lines_of(out + "/metrics.csv").size(), 7u);
  EXPECT_EQ(read_metrics(out).size(), 6u);
}

TEST(Report, ShowsSettingsOpDtypesAndASinglePointHonestly) {
  const Json config = Json::Object{{"model", "simplecnn"}, {"lr", 0.001}, {"data_dir", "<dir>"}};
  std::vector<Json> records = {Json::Object{{"step", 4}, {"epoch", 0}, {"loss", 2.0}, {"loss_avg", 2.1},
                                            {"loss_scale", 65536.0}, {"skipped", true}},
                               Json::Object{{"step", 8}, {"epoch", 0}, {"train_loss", 1.5}, {"test_loss", 1.2},
                                            {"test_accuracy", 0.625}, {"images_per_sec", 900.0}}};
  amp::ExplainRow row{"conv2d", CastPolicy::LowerPrecision, true, {DType::Float32}, {DType::BFloat16},
                      DType::BFloat16, "float32 weight cast"};
  const std::string html = render_report("run", config, records, {row});
  EXPECT_NE(html.find("<th>lr</th><td>0.001</td>"), std::string::npos);
  EXPECT_NE(html.find("&lt;dir&gt;"), std::string::npos);  // escaped
  EXPECT_NE(html.find("<td>conv2d</td>"), std::string::npos);
  EXPECT_NE(html.find("62.5 at step 8"), std::string::npos);  // the one accuracy point, labelled
  EXPECT_NE(html.find("1 skipped"), std::string::npos);
  EXPECT_EQ(render_report("empty", config, {}, {}).find("62.5"), std::string::npos);
}

// The report of a resumed run covers the first part too; summary.json holds what stdout's only line holds.
TEST(TrainerOutput, ResumedReportKeepsHistoryAndStdoutIsTheSummary) {
  const std::string out = fresh("report_resume");
  const std::vector<std::string> flags = {"--data", "synthetic", "--synthetic-size", "128", "--batch-size", "16",
                                          "--log-every", "1", "--deterministic", "--threads", "2", "--out", out};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), flags.begin(), flags.end());
    return extra;
  };
  run_train(parse_train_flags(with({"--steps", "5", "--checkpoint-every", "5"})));
  const Json summary = run_train(parse_train_flags(with({"--steps", "10", "--resume", out})));
  const std::string html = [&] {
    const std::vector<uint8_t> b = read_file(out + "/report.html");
    return std::string(b.begin(), b.end());
  }();
  EXPECT_NE(html.find("<p>10 logged steps"), std::string::npos) << html.substr(0, 600);
  const std::vector<uint8_t> sj = read_file(out + "/summary.json");
  EXPECT_EQ(Json::parse(std::string(sj.begin(), sj.end())).at("steps").as_int(), summary.at("steps").as_int());

  // `castor train | jq` works: stdout is one JSON line.
  std::string cmd = std::string(CASTOR_BINARY_DIR) + "/castor train";
  for (const std::string& a : with({"--steps", "2", "--out", out + "/cli"})) cmd += " '" + a + "'";
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  std::string stdout_text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) stdout_text.append(buf, n);
  ASSERT_EQ(pclose(p), 0);
  ASSERT_FALSE(stdout_text.empty());
  EXPECT_EQ(stdout_text.find('\n'), stdout_text.size() - 1) << stdout_text;
  EXPECT_EQ(Json::parse(stdout_text.substr(0, stdout_text.size() - 1)).at("steps").as_int(), 2);
}

}  // namespace castor::train
