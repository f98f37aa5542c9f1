// Checkpoint directories: atomic commit, discovery of the newest complete one, pruning.
#include "castor/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "castor/fs.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCommit = "COMMIT";
constexpr const char* kPrefix = "step-";

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

void ensure_dir(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  CASTOR_CHECK(!ec && fs::is_directory(p), p.string(), ": cannot create the directory: ", ec.message());
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
    save_safetensors((tmp / "model.safetensors").string(), ckpt.model, ckpt.model_meta);
    save_safetensors((tmp / "train_state.safetensors").string(), ckpt.state, ckpt.state_meta);
    const std::string marker = "complete\n";
    atomic_write_file((tmp / kCommit).string(),
                      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(marker.data()), marker.size()));
    // Replace an older checkpoint of the same step (a resumed run) only once the new one is complete.
    const fs::path old = root / (step_name(step) + ".old" + std::to_string(getpid()));
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_directory(root.string());
    fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(detail::cat(final_dir.string(), ": cannot write the checkpoint: ", e.code().message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  std::vector<fs::path> all = complete_checkpoints(root);
  for (size_t i = 0; i + keep < all.size(); ++i) fs::remove_all(all[i], ec);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  std::vector<fs::path> all = complete_checkpoints(fs::path(run_dir) / "checkpoints");
  if (all.empty()) return std::nullopt;
  return all.back().string();
}

Checkpoint read_checkpoint(const std::string& path) {
  fs::path dir = path;
  if (!fs::exists(dir / kCommit)) {
    auto latest = latest_checkpoint(path);
    CASTOR_CHECK(latest.has_value(), path, ": no complete checkpoint here (expected a directory with a ", kCommit,
                 " marker, or a run directory with checkpoints/step-*)");
    dir = *latest;
  }
  Checkpoint c;
  LoadedTensors m = load_safetensors((dir / "model.safetensors").string());
  LoadedTensors s = load_safetensors((dir / "train_state.safetensors").string());
  c.model = std::move(m.tensors);
  c.model_meta = std::move(m.metadata);
  c.state = std::move(s.tensors);
  c.state_meta = std::move(s.metadata);
  return c;
}

}  // namespace castor::train
