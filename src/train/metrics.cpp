// metrics.jsonl (one JSON object per line) and metrics.csv (the same records as rows, for spreadsheets and plots).
#include "train/metrics.h"

#include <algorithm>
#include <filesystem>

#include "castor/check.h"

namespace castor::train {

const std::vector<std::string> MetricsLog::kColumns = {
    "step", "epoch", "loss", "loss_avg", "lr", "loss_scale", "skipped", "images_per_sec", "peak_memory_bytes",
    "train_loss", "test_loss", "test_accuracy", "skipped_steps"};

MetricsLog::MetricsLog(const std::string& dir, bool append) : dir_(dir) {
  const auto mode = append ? std::ios::app : std::ios::trunc;
  const bool csv_is_new = !append || !std::filesystem::exists(dir + "/metrics.csv");
  jsonl_.open(dir + "/metrics.jsonl", mode);
  csv_.open(dir + "/metrics.csv", mode);
  CASTOR_CHECK(jsonl_.good() && csv_.good(), "--out ", dir, ": cannot write metrics.jsonl and metrics.csv");
  if (csv_is_new) {
    for (size_t i = 0; i < kColumns.size(); ++i) csv_ << (i ? "," : "") << kColumns[i];
    csv_ << "\n" << std::flush;
  }
}

void MetricsLog::write(const Json::Object& record) {
  for (const auto& [key, value] : record)
    CASTOR_ASSERT(std::find(kColumns.begin(), kColumns.end(), key) != kColumns.end(), "metrics key ", key,
                  " has no CSV column");
  jsonl_ << Json(record).dump() << "\n" << std::flush;
  for (size_t i = 0; i < kColumns.size(); ++i) {
    if (i) csv_ << ",";
    auto it = record.find(kColumns[i]);
    if (it != record.end()) csv_ << (it->second.is_bool() ? (it->second.as_bool() ? "1" : "0") : it->second.dump());
  }
  csv_ << "\n" << std::flush;
}

std::vector<Json> read_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<Json> records;
  std::string line;
  while (std::getline(in, line)) {
    try {
      records.push_back(Json::parse(line));
    } catch (const Error&) {
      // A line cut short by a crash: the records around it still count.
    }
  }
  return records;
}

}  // namespace castor::train
