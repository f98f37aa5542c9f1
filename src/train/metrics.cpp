// metrics.jsonl (one JSON object per line) and metrics.csv (the same records as rows, for spreadsheets and plots).
#include "train/metrics.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "castor/check.h"
#include "castor/log.h"

namespace castor::train {

std::vector<std::string> MetricsLog::columns(const std::string& rate_key,
                                             const std::vector<std::string>& evaluation_keys) {
  std::vector<std::string> c = {"step",       "epoch",   "loss",   "loss_avg",          "lr",
                                "loss_scale", "skipped", rate_key, "peak_memory_bytes", "train_loss"};
  c.insert(c.end(), evaluation_keys.begin(), evaluation_keys.end());
  c.push_back("skipped_steps");
  return c;
}

namespace {
bool empty_file(const std::string& path) {
  std::error_code ec;
  return !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
}
}  // namespace

MetricsLog::MetricsLog(const std::string& dir, bool append, std::vector<std::string> columns)
    : jsonl_(dir + "/metrics.jsonl", /*truncate=*/!append),
      csv_(dir + "/metrics.csv", /*truncate=*/!append),
      columns_(std::move(columns)) {
  if (empty_file(csv_.path())) {
    std::string header;
    for (const std::string& c : columns_) header += (header.empty() ? "" : ",") + c;
    this->append(csv_, header + "\n", {});
  }
}

void MetricsLog::write(const Json::Object& record) {
  std::string row;
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (i) row += ",";
    auto it = record.find(columns_[i]);
    if (it != record.end()) row += it->second.is_bool() ? (it->second.as_bool() ? "1" : "0") : it->second.dump();
  }
  for (const auto& [key, value] : record)
    CASTOR_ASSERT(std::find(columns_.begin(), columns_.end(), key) != columns_.end(), "metrics key ", key,
                  " has no CSV column");
  if (!append(jsonl_, Json(record).dump() + "\n", record)) ++lost_;
  append(csv_, row + "\n", record);
}

bool MetricsLog::append(AppendFile& file, const std::string& line, const Json::Object& record) {
  const std::string why = file.append(line);
  if (why.empty()) return true;
  auto step = record.find("step");
  warn(detail::cat(file.path(), ": a metrics line was lost at step ",
                   step == record.end() ? std::string("-") : step->second.dump(), ": ", why));
  return false;
}

std::vector<Json> read_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<Json> records;
  std::string line;
  while (std::getline(in, line)) {
    try {
      records.push_back(Json::parse(line));
    } catch (const Error&) {
      // Not expected (lines are appended whole), but one bad line must not cost the report the others.
    }
  }
  return records;
}

}  // namespace castor::train
