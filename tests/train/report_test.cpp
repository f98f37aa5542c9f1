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
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

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
  for (const char* field :
       {"epoch 2/3", "step 120/938", "loss 0.4521", "lr 0.001", "scale 65536", "1234 img/s", "0:01:23<0:09:26", "[###"})
    EXPECT_NE(wide.find(field), std::string::npos) << field << " in " << wide;
  // At 80 columns the most important fields stay (ETA: 83 s for 120 steps, 818 to go).
  const std::string narrow = progress_line(s, 79);
  EXPECT_NE(narrow.find("loss 0.4521"), std::string::npos) << narrow;
  ProgressState bf16 = s;  // no loss scaling: no scale field
  bf16.loss_scaling = false;
  EXPECT_EQ(progress_line(bf16, 200).find("scale"), std::string::npos);
}

// A run resumed at step 900 of 1,000 that has run 50 steps in 10 s since: 50 steps to go take 10 s more (paced by
// this process's 50 steps, worked by hand), not 10 / 950 x 50 = 0.53 s (every step counted against the restart's
// clock, the ETA 19x too short).
TEST(Progress, TimeLeftAfterResumeIsPacedByThisProcessesSteps) {
  ProgressState s;
  s.step = 950, s.total_steps = 1000, s.elapsed_seconds = 10, s.start_step = 900;
  EXPECT_DOUBLE_EQ(remaining_seconds(s), 10.0);
  EXPECT_NE(progress_line(s, 200).find("0:00:10<0:00:10"), std::string::npos) << progress_line(s, 200);
  s.step = 900;  // (none done yet here: no pace to go by)
  EXPECT_EQ(remaining_seconds(s), 0.0);
  s.start_step = 0, s.step = 950;  // a run that started here
  EXPECT_DOUBLE_EQ(remaining_seconds(s), 10.0 / 950 * 50);
}

// The logged loss_avg is the mean of the window's step losses (worked by hand), skipped steps get a line of
// their own without one, and metrics.csv holds the same records under one header.
TEST(RunLog, WindowMeansAndCsvRows) {
  const test::ScratchDir out("run_log");
  TrainConfig c;
  c.out = out;
  c.log_every = 3;
  c.data = Dataset::Synthetic;
  c.synthetic_size = 8;
  c.batch_size = 4;
  const std::unique_ptr<Task> task = make_image_task(c, /*rank=*/0, /*world=*/1);
  {
    RunLog log(c, *task, /*total_steps=*/7, /*epochs=*/1, /*append=*/false);
    for (int step = 1; step <= 7; ++step)
      log.step({step, 0, static_cast<double>(step), 0.1, 1024, /*skipped=*/step == 2, /*examples_per_sec=*/128.0});
    log.evaluation(7, 0, Evaluation{.loss = 0.25, .accuracy = 0.75});
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
  EXPECT_EQ(csv[0],
            "step,epoch,loss,loss_avg,lr,loss_scale,skipped,images_per_sec,peak_memory_bytes,train_loss,"
            "test_loss,test_accuracy,skipped_steps");
  EXPECT_EQ(csv[2].rfind("3,0,3.0,2.0,0.1,1024.0,0,128.0,", 0), 0u) << csv[2];
  // A resumed run appends, without a second header.
  {
    RunLog log(c, *task, 8, 1, /*append=*/true);
    log.step({8, 0, 8.0, 0.1, 1024, false, /*examples_per_sec=*/64.0});
  }
  EXPECT_EQ(lines_of(out + "/metrics.csv").size(), 7u);
  EXPECT_EQ(read_metrics(out).size(), 6u);
}

// MFU with --nproc N: the job's tokens/s over the peak of all N ranks' cores together. Worked by hand: 1e6 FLOP per
// token and 100 GFLOP/s per rank; two ranks training 76,000 tok/s together use 7.6e10 of 2e11 FLOP/s, 38%; one rank
// at 59,000 tok/s uses 5.9e10 of 1e11, 59%. Without a peak (measured after training) there is none.
TEST(RunLog, MfuDividesTheJobsRateByEveryRanksPeak) {
  const FlopRate two{.flops_per_example = 1e6, .rank_peak = 100e9, .ranks = 2};
  EXPECT_DOUBLE_EQ(model_flops_utilization(76000, two), 0.38);
  const FlopRate one{.flops_per_example = 1e6, .rank_peak = 100e9, .ranks = 1};
  EXPECT_DOUBLE_EQ(model_flops_utilization(59000, one), 0.59);
  EXPECT_EQ(model_flops_utilization(76000, FlopRate{.flops_per_example = 1e6, .ranks = 2}), 0);
}

TEST(Report, ShowsSettingsOpDtypesAndASinglePointHonestly) {
  const Json config = Json::Object{{"model", "simplecnn"}, {"lr", 0.001}, {"data_dir", "<dir>"}};
  // clang-format off
  std::vector<Json> records = {Json::Object{{"step", 4}, {"epoch", 0}, {"loss", 2.0}, {"loss_avg", 2.1},
                                            {"loss_scale", 65536.0}, {"skipped", true}},
                               Json::Object{{"step", 8}, {"epoch", 0}, {"train_loss", 1.5}, {"test_loss", 1.2},
                                            {"test_accuracy", 0.625}, {"images_per_sec", 900.0}}};
  amp::ExplainRow row{"conv2d", CastPolicy::LowerPrecision, true, {DType::Float32}, {DType::BFloat16},
                      DType::BFloat16, "float32 weight cast"};
  amp::ExplainRow relu{"relu", CastPolicy::PassThrough, true, {DType::BFloat16}, {DType::BFloat16}, DType::BFloat16,
                       "runs in its input dtype"};
  // clang-format on
  row.module = relu.module = "layer1.conv";
  amp::ExplainRow head = row;
  head.module = "fc";
  const std::string html = render_report("run", config, records, {row, relu, head});
  // Grouped by module: a heading row where the module changes, none between ops of one module.
  EXPECT_NE(html.find("class='module'>layer1.conv</th></tr><tr><td>conv2d</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("</td></tr><tr><td>relu</td>"), std::string::npos);
  EXPECT_NE(html.find("class='module'>fc</th></tr><tr><td>conv2d</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>lr</th><td>0.001</td>"), std::string::npos);
  EXPECT_NE(html.find("&lt;dir&gt;"), std::string::npos);  // escaped
  EXPECT_NE(html.find("<td>conv2d</td>"), std::string::npos);
  EXPECT_NE(html.find("Test accuracy<b>62.5%</b>after step 8"), std::string::npos);  // one evaluation: a number
  EXPECT_NE(html.find("1 skipped"), std::string::npos);
  EXPECT_EQ(render_report("empty", config, {}, {}).find("62.5"), std::string::npos);
}

namespace {

// The <svg> chart titled `title`, or "" when the report has none.
std::string chart_of(const std::string& html, const std::string& title) {
  const size_t at = html.find("font-weight='bold'>" + title + "</text>");
  if (at == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", at), end = html.find("</svg>", at);
  return html.substr(begin, end - begin);
}

// The text of every element of class `cls` in `svg`.
std::vector<std::string> texts(const std::string& svg, const std::string& cls) {
  std::vector<std::string> out;
  for (size_t at = svg.find("class='" + cls + "'"); at != std::string::npos;
       at = svg.find("class='" + cls + "'", at + 1)) {
    const size_t begin = svg.find('>', at) + 1;
    out.push_back(svg.substr(begin, svg.find('<', begin) - begin));
  }
  return out;
}

}  // namespace

// The charts a run's report must have, with axis titles and round ticks: loss, test accuracy on 0-100, train vs test
// loss, learning rate, throughput and (only with loss scaling) the loss scale; settings grouped, the ones that do not
// apply left out; the header names the version, commit, date and CPU.
TEST(Report, HasTheChartsItMustWithRoundTicks) {
  // clang-format off
  Json config = Json::Object{{"model", "simplecnn"}, {"optimizer", "adam"}, {"momentum", 0.9}, {"lr", 0.001},
                             {"data", "fashion-mnist"}, {"synthetic_size", 2048}, {"amp", "O1"},
                             {"dtype", "float16"}, {"seed", 3}, {"castor_version", "9.8.7"},
                             {"git_commit", "abc123def456"}, {"started", "2026-11-25T14:05:09Z"},
                             {"host_cpu", "Test CPU; ISA avx2"}};
  // clang-format on
  std::vector<Json> records;
  for (int step = 1; step <= 40; ++step) {
    // clang-format off
    records.push_back(Json::Object{{"step", step}, {"epoch", 1}, {"loss", 2.0 - step / 40.0},
                                   {"loss_avg", 2.0 - step / 40.0}, {"lr", 0.001 * (1 - step / 80.0)},
                                   {"loss_scale", step < 20 ? 65536.0 : 32768.0}, {"skipped", step == 20},
                                   {"images_per_sec", 1000.0 + step}});
    // clang-format on
    if (step % 10 == 0)
      records.push_back(Json::Object{{"step", step}, {"epoch", 1}, {"test_loss", 1.5}, {"test_accuracy", step / 50.0}});
  }
  const std::string html = render_report("run", config, records, {});
  for (const char* title :
       {"Training loss", "Test accuracy", "Train vs test loss", "Learning rate", "Throughput", "Loss scale"}) {
    const std::string svg = chart_of(html, title);
    ASSERT_FALSE(svg.empty()) << title;
    EXPECT_NE(svg.find(">step</text>"), std::string::npos) << title;  // the x axis title
    EXPECT_GE(texts(svg, "xtick").size(), 3u) << title;
    for (const std::string& t : texts(svg, "ytick")) EXPECT_EQ(t.find('e'), std::string::npos) << title << ": " << t;
  }
  EXPECT_EQ(texts(chart_of(html, "Test accuracy"), "ytick").front(), "0");
  EXPECT_EQ(texts(chart_of(html, "Test accuracy"), "ytick").back(), "100");
  // Steps 1-40 in about 6 ticks: 39 / 6 = 6.5 rounds up to a step of 10, from 0; the accuracy chart (evaluations at
  // 10..40) spans the run's steps too, so the charts line up.
  EXPECT_EQ(texts(chart_of(html, "Training loss"), "xtick"), (std::vector<std::string>{"0", "10", "20", "30", "40"}));
  EXPECT_EQ(texts(chart_of(html, "Test accuracy"), "xtick"), texts(chart_of(html, "Training loss"), "xtick"));
  const std::vector<std::string> scale_ticks = texts(chart_of(html, "Loss scale"), "ytick");
  EXPECT_NE(std::find(scale_ticks.begin(), scale_ticks.end(), "65536"), scale_ticks.end());
  for (const char* header : {"Castor 9.8.7", "abc123def456", "2026-11-25T14:05:09Z", "Test CPU; ISA avx2"})
    EXPECT_NE(html.find(header), std::string::npos) << header;
  for (const char* group : {">model<", ">data<", ">precision<", ">optimizer<", ">schedule<", ">run<"})
    EXPECT_NE(html.find(group), std::string::npos) << group;
  EXPECT_NE(html.find("<th>seed</th>"), std::string::npos);            // in no group: under "run"
  EXPECT_EQ(html.find("<th>momentum</th>"), std::string::npos);        // Adam has none
  EXPECT_EQ(html.find("<th>synthetic_size</th>"), std::string::npos);  // real data

  // The last evaluation by class, as castor eval gives it: per-class accuracy and the confusion matrix.
  const Json by_class = Json::Object{
      {"classes", Json::Array{Json::Object{{"name", "cat"}, {"accuracy", 0.75}, {"images", 4}},
                              Json::Object{{"name", "dog"}, {"accuracy", 0.5}, {"images", 2}}}},
      {"confusion_matrix", Json::Array{Json::Array{3, 1}, Json::Array{1, 1}}}};
  const std::string with_classes = render_report("run", config, records, {}, by_class);
  EXPECT_NE(with_classes.find("<td>cat</td><td>75%</td><td>4</td>"), std::string::npos);
  EXPECT_NE(with_classes.find("<tr><th>0 cat</th><td style='font-weight:bold'>3</td><td>1</td></tr>"),
            std::string::npos);
  EXPECT_EQ(html.find("confusion"), std::string::npos);  // none without an evaluation by class

  // bf16 (no loss scaling: the scale stays 1): no loss-scale chart.
  for (Json& r : records)
    if (r.find("loss_scale")) r.as_object()["loss_scale"] = 1.0;
  EXPECT_TRUE(chart_of(render_report("bf16", config, records, {}), "Loss scale").empty());
}

// The report of a resumed run covers the first part too; summary.json holds what stdout's only line holds.
TEST(TrainerOutput, ResumedReportKeepsHistoryAndStdoutIsTheSummary) {
  const test::ScratchDir out("report_resume");
  const std::vector<std::string> flags = {
      "--data", "synthetic",       "--synthetic-size", "128", "--batch-size", "16", "--log-every",
      "1",      "--deterministic", "--threads",        "2",   "--out",        out};
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
  const std::string cmd = std::string(CASTOR_BINARY_DIR) + "/castor train" +
                          test::shell_words(with({"--steps", "2", "--out", out + "/cli"}));
  std::string stdout_text;
  ASSERT_EQ(test::run_command(cmd + " 2>/dev/null", &stdout_text), 0);
  ASSERT_FALSE(stdout_text.empty());
  EXPECT_EQ(stdout_text.find('\n'), stdout_text.size() - 1) << stdout_text;
  EXPECT_EQ(Json::parse(stdout_text.substr(0, stdout_text.size() - 1)).at("steps").as_int(), 2);
}

}  // namespace castor::train
