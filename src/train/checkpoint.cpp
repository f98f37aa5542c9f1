// Checkpoint directories: atomic commit with checksums, discovery of the newest intact one, pruning.
#include "castor/checkpoint.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "castor/fs.h"
#include "castor/json.h"
#include "castor/ops.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"

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

// The COMMIT marker: "complete", then "<file> <checksum>" per file (markers of older builds hold only "complete"),
// the shard files of a sharded checkpoint after the two others.
std::string commit_marker(const fs::path& dir, const std::vector<std::string>& shards) {
  std::string marker = "complete\n";
  std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
  files.insert(files.end(), shards.begin(), shards.end());
  for (const std::string& f : files) marker += f + " " + file_checksum64_hex((dir / f).string()) + "\n";
  return marker;
}

constexpr const char* kManifest = "castor.shards";  // the train state's metadata key of a sharded checkpoint's manifest

std::string shard_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

bool is_shard_name(const std::string& name) {
  return name.rfind("shard-", 0) == 0 && name.size() > 18 && name.find('/') == std::string::npos &&
         name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// A sharded checkpoint's state made whole: each tensor of the manifest put together from every shard file's slice.
void join_shards(const fs::path& dir, const std::vector<std::string>& checked, Checkpoint& c) {
  auto it = c.state_meta.find(kManifest);
  if (it == c.state_meta.end()) return;
  const std::string what = (dir / kFiles[1]).string();
  Json manifest;
  try {
    manifest = Json::parse(it->second);
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": the shard manifest is not JSON: ", e.what()));
  }
  const Json::Array& files = manifest.at("files").as_array();
  std::vector<StateDict> shards;
  for (const Json& f : files) {
    CASTOR_CHECK(f.is_string() && is_shard_name(f.as_string()) &&
                     std::find(checked.begin(), checked.end(), f.as_string()) != checked.end(),
                 what, ": the shard manifest names a file '", printable(f.is_string() ? f.as_string() : f.dump()),
                 "' that is not a shard whose checksum the commit marker records");
    shards.push_back(load_safetensors((dir / f.as_string()).string()).tensors);
  }
  for (const auto& [key, entry] : manifest.at("tensors").as_object()) {
    Shape shape;
    for (const Json& d : entry.at("shape").as_array()) shape.push_back(d.as_int());
    const Json::Array &begins = entry.at("begin").as_array(), &lengths = entry.at("length").as_array();
    CASTOR_CHECK(begins.size() == shards.size() && lengths.size() == shards.size(), what, ": the shard manifest's '",
                 key, "' does not have one slice per shard file");
    Tensor whole;
    int64_t next = 0;
    for (size_t r = 0; r < shards.size(); ++r) {
      auto t = shards[r].find(key);
      const int64_t begin = begins[r].as_int(), length = lengths[r].as_int();
      CASTOR_CHECK(t != shards[r].end() && t->second.numel() == length && begin == next,
                   (dir / files[r].as_string()).string(), ": '", key,
                   "' is missing or not the slice the manifest records");
      if (!whole.defined()) whole = empty({shape_numel(shape)}, t->second.dtype());
      CASTOR_CHECK(begin + length <= whole.numel() && t->second.dtype() == whole.dtype(), what, ": '", key,
                   "': the slices do not fit the manifest's shape");
      if (length > 0) whole.narrow(0, begin, length).copy_(t->second.contiguous().view({-1}));
      next = begin + length;
    }
    CASTOR_CHECK(whole.defined() && next == whole.numel(), what, ": '", key, "': the slices do not cover the tensor");
    c.state[key] = whole.view(shape);
  }
  c.state_meta.erase(it);
}

// Checks each file's checksum against the marker; castor::Error naming the damaged file, or the marker when it does
// not record every file's checksum.
std::vector<std::string> verify(const fs::path& dir) {
  const std::string commit = (dir / kCommit).string();
  const std::vector<uint8_t> bytes = read_file(commit);
  std::istringstream marker(std::string(bytes.begin(), bytes.end()));
  std::string word, name, sum;
  CASTOR_CHECK(marker >> word && word == "complete", commit, ": not a commit marker");
  std::vector<std::string> checked;
  while (marker >> name >> sum) {
    CASTOR_CHECK(std::find(std::begin(kFiles), std::end(kFiles), name) != std::end(kFiles) || is_shard_name(name),
                 commit, ": unknown file '", printable(name), "'");
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
  return checked;
}

Checkpoint read_verified(const fs::path& dir) {
  const std::vector<std::string> checked = verify(dir);
  Checkpoint c;
  LoadedTensors m = load_safetensors((dir / kFiles[0]).string());
  LoadedTensors s = load_safetensors((dir / kFiles[1]).string());
  c.model = std::move(m.tensors);
  c.model_meta = std::move(m.metadata);
  c.state = std::move(s.tensors);
  c.state_meta = std::move(s.metadata);
  join_shards(dir, checked, c);
  return c;
}

bool is_temp_name(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 &&
         (name.find(".tmp") != std::string::npos || name.find(".old") != std::string::npos);
}

}  // namespace

namespace {

fs::path temp_dir(const fs::path& root, int64_t step, int64_t pid) {
  return root / (step_name(step) + ".tmp" + std::to_string(pid));
}

// Writes the model and state files into `tmp` (which holds `shards` already), commits it as step `step`, and prunes.
std::string commit_checkpoint(const fs::path& root, int64_t step, const fs::path& tmp, const Checkpoint& ckpt,
                              int64_t keep, const std::vector<std::string>& shards) {
  const fs::path final_dir = root / step_name(step);
  std::error_code ec;
  try {
    if (ckpt.model_each.empty()) save_safetensors((tmp / kFiles[0]).string(), ckpt.model, ckpt.model_meta);
    save_safetensors((tmp / kFiles[1]).string(), ckpt.state, ckpt.state_meta);
    atomic_write_file((tmp / kCommit).string(), commit_marker(tmp, shards));
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

// A fresh temp directory for step `step`'s checkpoint.
fs::path make_temp_dir(const fs::path& root, int64_t step) {
  ensure_dir(root);
  const fs::path tmp = temp_dir(root, step, getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ensure_dir(tmp);
  return tmp;
}

}  // namespace

std::string write_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt, int64_t keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  return commit_checkpoint(root, step, make_temp_dir(root, step), ckpt, keep, {});
}

namespace {

// Test-only: CASTOR_TEST_KILL_IN_SHARD=STEP:RANK makes that rank SIGKILL itself in the sharded write of that step,
// once its shard is on disk and before the ranks agree to commit (the point where a real kill leaves an uncommitted
// temp folder with some shards); tests/dist/mpirun_test.cpp's KillDuringShardedCheckpoint sets it. Read nowhere else.
void kill_in_shard_write_for_test(int64_t step, int rank) {
  const char* v = std::getenv("CASTOR_TEST_KILL_IN_SHARD");
  long long s = -1;
  int r = -1;
  if (v && std::sscanf(v, "%lld:%d", &s, &r) == 2 && s == step && r == rank) ::raise(SIGKILL);
}

}  // namespace

// Rank 0 (`write`) writes the model file of `ckpt.model_each` a tensor at a time while every rank makes each tensor
// in turn (collectives); an error there (the write, or a tensor the maker refuses) stops its writing, not its part
// in the collectives still to come. Returns the error ("" for none).
std::string write_model_each(const std::string& path, const Checkpoint& ckpt, bool write) {
  const std::vector<Checkpoint::LazyTensor>& lazy = ckpt.model_each;
  CASTOR_ASSERT(std::is_sorted(lazy.begin(), lazy.end(), [](auto& a, auto& b) { return a.name < b.name; }),
                "a checkpoint's lazy model is not in name order");
  size_t made = 0;
  std::string error;
  if (write) try {
      std::vector<SafetensorsTensor> entries;
      for (const Checkpoint::LazyTensor& t : lazy)
        entries.push_back(
            {t.name, t.dtype, t.shape, nullptr, static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype)});
      Tensor current;
      write_safetensors_each(
          path, entries,
          [&](size_t i) {
            CASTOR_ASSERT(i == made, "the model file's tensors are made in name order");
            ++made;
            current = Tensor();  // (the one written: gone before the next is made)
            current = lazy[i].make().contiguous();
            CASTOR_ASSERT(current.dtype() == lazy[i].dtype && current.shape() == lazy[i].shape, lazy[i].name, ": made ",
                          current.describe());
            return std::span<const uint8_t>(static_cast<const uint8_t*>(current.data_ptr()), current.nbytes());
          },
          ckpt.model_meta);
    } catch (const Error& e) {
      error = e.what();
    }
  for (; made < lazy.size(); ++made) lazy[made].make();
  return error;
}

std::string write_sharded_checkpoint(const std::string& run_dir, int64_t step, Checkpoint& ckpt, int64_t keep,
                                     dist::ProcessGroup& group) {
  const int rank = group.rank(), world = group.size();
  const fs::path root = fs::path(run_dir) / "checkpoints";
  // Where every rank's slices lie (the same keys on every rank, in order): (world, keys, 2) of begin and length.
  std::vector<double> mine;
  for (const auto& [key, w] : ckpt.shard_where) {
    mine.push_back(static_cast<double>(w.begin));
    mine.push_back(static_cast<double>(ckpt.shard.at(key).numel()));
  }
  const Tensor all = group.all_gather(tensor(mine, {static_cast<int64_t>(mine.size())}, DType::Int64));
  const std::vector<int64_t> where = all.to_vector<int64_t>();
  // Rank 0 makes the temp directory; the others learn its name (rank 0's pid).
  std::string error;
  fs::path tmp;
  if (rank == 0) try {
      tmp = make_temp_dir(root, step);
    } catch (const Error& e) {
      error = e.what();
    }
  Tensor pid = tensor({error.empty() ? static_cast<double>(getpid()) : -1.0}, {1}, DType::Int64);
  group.broadcast(pid, 0);
  const int64_t pid0 = pid.to_vector<int64_t>()[0];
  CASTOR_CHECK(pid0 >= 0, rank == 0 ? error : "rank 0 could not create the checkpoint's temp directory");
  tmp = temp_dir(root, step, pid0);
  try {
    save_safetensors((tmp / shard_name(rank, world)).string(), ckpt.shard);
  } catch (const Error& e) {
    error = e.what();
  }
  kill_in_shard_write_for_test(step, rank);
  if (!ckpt.model_each.empty()) {
    const std::string e = write_model_each((tmp / kFiles[0]).string(), ckpt, rank == 0 && error.empty());
    if (error.empty()) error = e;
  }
  // Every rank's shard is on disk before rank 0 commits; a failure anywhere fails the checkpoint on every rank.
  Tensor failed = scalar_tensor(error.empty() ? 0.0 : 1.0, DType::Float64);
  group.all_reduce(failed, dist::ReduceOp::Max);
  if (failed.item() != 0) {
    std::error_code ec;
    if (rank == 0) fs::remove_all(tmp, ec);
    throw Error(error.empty() ? detail::cat(tmp.string(),
                                            ": another rank could not write its part (its shard, or rank 0 the model)")
                              : error);
  }
  if (rank != 0) return "";
  Json::Object tensors;
  size_t k = 0;
  for (const auto& [key, w] : ckpt.shard_where) {
    Json::Array shape, begins, lengths;
    for (int64_t d : w.shape) shape.push_back(d);
    for (int r = 0; r < world; ++r) {
      const size_t at = (static_cast<size_t>(r) * ckpt.shard_where.size() + k) * 2;
      begins.push_back(where[at]);
      lengths.push_back(where[at + 1]);
    }
    tensors[key] = Json::Object{{"shape", shape}, {"begin", begins}, {"length", lengths}};
    ++k;
  }
  std::vector<std::string> files;
  Json::Array names;
  for (int r = 0; r < world; ++r) {
    files.push_back(shard_name(r, world));
    names.push_back(files.back());
  }
  ckpt.state_meta[kManifest] = Json(Json::Object{{"files", names}, {"tensors", tensors}}).dump();
  return commit_checkpoint(root, step, tmp, ckpt, keep, files);
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
