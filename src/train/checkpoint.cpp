// Checkpoint directories: atomic commit with checksums, discovery of the newest intact one, pruning.
#include "castor/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "castor/fs.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCommit = "COMMIT";
constexpr const char* kHead = "HEAD";  // checkpoints/HEAD names the checkpoint the run continues from
constexpr const char* kPrefix = "step-";
constexpr const char* kFiles[] = {"model.safetensors", "train_state.safetensors"};

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%010lld", kPrefix, static_cast<long long>(step));
  return buf;
}

// Complete checkpoints under dir, oldest first.
std::vector<fs::path> complete_checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name.find('.') == std::string::npos && fs::exists(e.path() / kCommit, ec))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The checkpoint checkpoints/HEAD names, when it is a complete one (HEAD is written after each checkpoint; run
// directories of older builds have none).
std::optional<fs::path> head_checkpoint(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(root / kHead, ec))) return std::nullopt;
  std::vector<uint8_t> bytes;
  try {
    bytes = read_file((root / kHead).string(), /*max_bytes=*/64);
  } catch (const Error&) {
    return std::nullopt;
  }
  std::string name(bytes.begin(), bytes.end());
  while (!name.empty() && name.back() == '\n') name.pop_back();
  if (name.rfind(kPrefix, 0) != 0 || name.find_first_of("./") != std::string::npos) return std::nullopt;
  if (!fs::exists(root / name / kCommit, ec)) return std::nullopt;
  return root / name;
}

// The head's lineage, newest first: the head, then the complete checkpoints of lower steps. Without a head, every
// complete checkpoint. Checkpoints above the head (abandoned when a run resumed from an older one) are not in it.
std::vector<fs::path> lineage(const fs::path& root) {
  std::vector<fs::path> all = complete_checkpoints(root);
  std::reverse(all.begin(), all.end());
  const std::optional<fs::path> head = head_checkpoint(root);
  if (!head) return all;
  std::vector<fs::path> out;
  for (const fs::path& p : all)
    if (p.filename() <= head->filename()) out.push_back(p);
  return out;
}

void ensure_dir(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  CASTOR_CHECK(!ec && fs::is_directory(p), p.string(), ": cannot create the directory: ", ec.message());
}

// The COMMIT marker: "complete", then "<file> <checksum>" per file (markers of older builds hold only "complete").
std::string commit_marker(const fs::path& dir) {
  std::string marker = "complete\n";
  for (const char* f : kFiles) marker += std::string(f) + " " + file_checksum64_hex((dir / f).string()) + "\n";
  return marker;
}

// Checks each file's checksum against the marker; castor::Error naming the damaged file, or the marker when it does
// not record every file's checksum.
void verify(const fs::path& dir) {
  const std::string commit = (dir / kCommit).string();
  const std::vector<uint8_t> bytes = read_file(commit);
  std::istringstream marker(std::string(bytes.begin(), bytes.end()));
  std::string word, name, sum;
  CASTOR_CHECK(marker >> word && word == "complete", commit, ": not a commit marker");
  std::vector<std::string> checked;
  while (marker >> name >> sum) {
    CASTOR_CHECK(std::find(std::begin(kFiles), std::end(kFiles), name) != std::end(kFiles), commit, ": unknown file '",
                 printable(name), "'");
    const std::string actual = file_checksum64_hex((dir / name).string());
    CASTOR_CHECK(actual == sum, (dir / name).string(), ": damaged (checksum ", actual, ", the commit marker records ",
                 printable(sum), ")");
    checked.push_back(name);
  }
  CASTOR_CHECK(checked.size() > 0, commit,
               ": records no checksums (a checkpoint of a Castor build before "
               "2026-11-24), so damage to it cannot be detected and it is not read; to go on from its weights, start a "
               "new run with --init ",
               (dir / kFiles[0]).string());
  for (const char* f : kFiles)
    CASTOR_CHECK(std::find(checked.begin(), checked.end(), f) != checked.end(), commit, ": records no checksum of ", f);
}

Checkpoint read_verified(const fs::path& dir) {
  verify(dir);
  Checkpoint c;
  LoadedTensors m = load_safetensors((dir / kFiles[0]).string());
  LoadedTensors s = load_safetensors((dir / kFiles[1]).string());
  c.model = std::move(m.tensors);
  c.model_meta = std::move(m.metadata);
  c.state = std::move(s.tensors);
  c.state_meta = std::move(s.metadata);
  return c;
}

bool is_temp_name(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 &&
         (name.find(".tmp") != std::string::npos || name.find(".old") != std::string::npos);
}

}  // namespace

std::string write_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt, int64_t keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  ensure_dir(root);
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = root / (step_name(step) + ".tmp" + std::to_string(getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ensure_dir(tmp);
  try {
    save_safetensors((tmp / kFiles[0]).string(), ckpt.model, ckpt.model_meta);
    save_safetensors((tmp / kFiles[1]).string(), ckpt.state, ckpt.state_meta);
    atomic_write_file((tmp / kCommit).string(), commit_marker(tmp));
    // Replace an older checkpoint of the same step (a resumed run) only once the new one is complete.
    const fs::path old = root / (step_name(step) + ".old" + std::to_string(getpid()));
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_directory(root.string());
    fs::remove_all(old, ec);
    atomic_write_file((root / kHead).string(), step_name(step) + "\n");
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(detail::cat(final_dir.string(), ": cannot write the checkpoint: ", e.code().message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Pruning follows the lineage of this new head: it and the newest keep - 1 before it stay.
  // Each is renamed away first, so a reader sees a checkpoint whole or not at all (then looks again).
  std::vector<fs::path> line = lineage(root);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < line.size(); ++i) {
    if (fs::exists(line[i] / kLoraRunsFile, ec)) continue;  // a LoRA run's base
    const fs::path doomed = root / (line[i].filename().string() + ".tmp" + std::to_string(getpid()) + "-pruned");
    fs::rename(line[i], doomed, ec);
    fs::remove_all(ec ? line[i] : doomed, ec);
  }
  return final_dir.string();
}

void keep_best_checkpoint(const std::string& run_dir, const std::string& checkpoint, const Json& best) {
  const fs::path dest = fs::path(run_dir) / "best";
  const fs::path tmp = fs::path(run_dir) / ("best.tmp" + std::to_string(getpid()));
  const fs::path old = fs::path(run_dir) / ("best.old" + std::to_string(getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    ensure_dir(tmp);
    for (const auto& e : fs::directory_iterator(checkpoint)) {
      if (!e.is_regular_file()) continue;
      const fs::path to = tmp / e.path().filename();
      fs::create_hard_link(e.path(), to, ec);
      if (ec) fs::copy_file(e.path(), to);
    }
    atomic_write_file((tmp / "best.json").string(), best.dump(2) + "\n");
    if (fs::exists(dest)) fs::rename(dest, old);
    fs::rename(tmp, dest);
    fsync_directory(run_dir);
    fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(detail::cat(dest.string(), ": cannot keep the best checkpoint: ", e.code().message()));
  }
}

Json read_best(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / "best" / "best.json").string();
  if (!file_exists(path)) return nullptr;
  const std::vector<uint8_t> bytes = read_file(path);
  try {
    return Json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  std::vector<fs::path> line = lineage(fs::path(run_dir) / "checkpoints");
  if (line.empty()) return std::nullopt;
  return line.front().string();
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / kCommit, ec);
}

Checkpoint read_checkpoint(const std::string& path, std::string* used) {
  if (is_checkpoint_dir(path)) {
    if (used) *used = path;
    return read_verified(path);
  }
  // A live run may prune the checkpoint being read (its files vanish): then look again, a few times.
  for (int attempt = 0;; ++attempt) {
    std::vector<fs::path> line = lineage(fs::path(path) / "checkpoints");
    CASTOR_CHECK(!line.empty(), path, ": no complete checkpoint here (expected a directory with a ", kCommit,
                 " marker, or a run directory with checkpoints/step-*)");
    // Newest first; each damaged one is reported and passed over, and the oldest one's error is the last word.
    for (size_t i = 0; i < line.size(); ++i) {
      try {
        Checkpoint c = read_verified(line[i]);
        if (used) *used = line[i].string();
        return c;
      } catch (const Error& e) {
        std::error_code ec;
        if (!fs::exists(line[i] / kCommit, ec) && attempt < 20) break;  // pruned meanwhile
        if (i + 1 == line.size()) throw;
        std::fprintf(stderr, "warning: %s; using the older checkpoint %s\n", e.what(), line[i + 1].c_str());
      }
    }
  }
}

void remove_stale_temps(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (is_temp_name(e.path().filename().string())) stale.push_back(e.path());
  for (const fs::path& p : stale) {
    // A kill between write_checkpoint's two renames leaves a step's only copy as step-N.oldPID: put it back.
    const std::string name = p.filename().string();
    const fs::path final_dir = root / name.substr(0, name.find('.'));
    if (name.find(".old") != std::string::npos && !fs::exists(final_dir, ec) && fs::exists(p / kCommit, ec))
      fs::rename(p, final_dir, ec);
    else
      fs::remove_all(p, ec);
  }
}

}  // namespace castor::train
