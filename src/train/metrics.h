// A run's metrics log: each record appended as a JSON line to metrics.jsonl and a row of metrics.csv.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "castor/json.h"

namespace castor::train {

class MetricsLog {
 public:
  // Opens DIR/metrics.jsonl and DIR/metrics.csv, appending to a resumed run's files (the CSV header is written
  // once, when the file is new).
  MetricsLog(const std::string& dir, bool append);
  // Keys must be among kColumns (a step, evaluation or epoch record).
  void write(const Json::Object& record);

  // The CSV columns, in order: the union of the step, evaluation and epoch records' keys.
  static const std::vector<std::string> kColumns;

 private:
  std::string dir_;
  std::ofstream jsonl_, csv_;
};

// The records of DIR/metrics.jsonl (all of a resumed run's history), in order; a torn last line is skipped.
std::vector<Json> read_metrics(const std::string& dir);

}  // namespace castor::train
