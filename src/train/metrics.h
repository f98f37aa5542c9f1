// A run's metrics log: each record appended whole as a JSON line of metrics.jsonl and a row of metrics.csv.
#pragma once
#include <string>
#include <vector>

#include "castor/fs.h"
#include "castor/json.h"

namespace castor::train {

class MetricsLog {
 public:
  // Opens DIR/metrics.jsonl and DIR/metrics.csv, appending to a resumed run's files (the CSV header, `columns`, is
  // written once, when the file is new).
  MetricsLog(const std::string& dir, bool append, std::vector<std::string> columns);
  // Appends the record to both files; keys must be among the columns (a step, evaluation or epoch record). A line
  // the disk refuses is left out whole and said through castor::warn; the run goes on. lost_lines() counts
  // metrics.jsonl's.
  void write(const Json::Object& record);
  int64_t lost_lines() const { return lost_; }

  // The CSV columns, in order: the union of the step, evaluation and epoch records' keys, with the task's throughput
  // key (images_per_sec or tokens_per_sec) and its evaluation's keys (test_loss and test_accuracy, or val_loss and
  // val_perplexity).
  static std::vector<std::string> columns(const std::string& rate_key, const std::vector<std::string>& evaluation_keys);

 private:
  bool append(AppendFile& file, const std::string& line, const Json::Object& record);

  AppendFile jsonl_, csv_;
  const std::vector<std::string> columns_;
  int64_t lost_ = 0;
};

// The records of DIR/metrics.jsonl (all of a resumed run's history), in order; an unreadable line is skipped.
std::vector<Json> read_metrics(const std::string& dir);

}  // namespace castor::train
