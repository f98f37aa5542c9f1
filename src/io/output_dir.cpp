// Output directories written whole: the rule for replacing one, and the switch to the new one in one step.
#include "castor/output_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "castor/check.h"
#include "castor/fs.h"

namespace castor {
namespace {

namespace fs = std::filesystem;

// An output directory's path as one spelling: absolute, normal, without a trailing slash ("tok/" is "tok": a link
// named so is refused, not followed).
fs::path output_dir_path(const std::string& flag, const std::string& dir) {
  CASTOR_CHECK(!dir.empty(), flag, ": empty (the directory to write)");
  fs::path out = fs::absolute(dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  CASTOR_CHECK(out.has_filename() && out != out.root_path(), flag, ": ", dir, ": not a directory that can be replaced");
  return out;
}

// The entries of `dir` that `owns` does not, sorted.
std::vector<std::string> foreign_entries(const fs::path& dir, const OwnsEntry& owns) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (!owns(it->path().filename().string())) names.push_back(it->path().filename().string());
  CASTOR_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

// The sibling folders a writer of `out` works in: .NAME.new-PID (being written) and .NAME.old-PID (the folder it
// replaced, until removed).
fs::path work_folder(const fs::path& out, const char* what, long pid) {
  return out.parent_path() / detail::cat(".", out.filename().string(), ".", what, "-", pid);
}

// What killed writers left beside `out` (write_output_dir's rule). Folders of live processes stay.
void clean_up_after_killed_writers(const fs::path& out, const OwnsEntry& owns) {
  std::error_code ec;
  const std::string stem = "." + out.filename().string() + ".";
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(stem, 0) != 0) continue;
    const std::string rest = name.substr(stem.size());
    const bool is_new = rest.rfind("new-", 0) == 0, is_old = rest.rfind("old-", 0) == 0;
    if (!is_new && !is_old) continue;
    const long pid = std::atol(rest.c_str() + 4);
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code e2;
    if (is_old && !fs::exists(fs::symlink_status(out, e2))) {
      fs::rename(it->path(), out, e2);
    } else if (is_new || foreign_entries(it->path(), owns).empty()) {
      fs::remove_all(it->path(), e2);
    }
  }
}

// Puts the complete folder `fresh` at `out` in one step (RENAME_EXCHANGE swaps them atomically; a filesystem without
// it gets two renames, which clean_up_after_killed_writers completes), moves the `keep` entries from the old folder
// into it, and removes the old folder.
void switch_folder(const fs::path& fresh, const fs::path& out, const std::vector<std::string>& keep) {
  const fs::path old = work_folder(out, "old", ::getpid());
  std::error_code ec;
  auto fail = [&](const std::string& what) {
    const std::string msg = detail::cat(out.string(), ": ", what, ": ", std::strerror(errno));
    fs::remove_all(fresh, ec);  // the previous folder is still at `out`, as it was
    throw Error(msg);
  };
  if (!fs::exists(fs::symlink_status(out, ec))) {
    if (::rename(fresh.c_str(), out.c_str()) != 0) fail("cannot rename the new folder into place");
  } else if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    // `fresh` now names the old folder: to be removed below (a failure here leaves it for the next writer).
    CASTOR_CHECK(::rename(fresh.c_str(), old.c_str()) == 0, fresh.string(),
                 ": cannot rename the replaced folder: ", std::strerror(errno));
  } else {
    if (errno != EINVAL && errno != ENOSYS) fail("cannot switch to the new folder");
    if (::rename(out.c_str(), old.c_str()) != 0) fail("cannot move the old folder aside");
    CASTOR_CHECK(::rename(fresh.c_str(), out.c_str()) == 0, out.string(),
                 ": cannot rename the new folder into place: ", std::strerror(errno), " (the old one is at ",
                 old.string(), ")");
  }
  fsync_directory(out.parent_path().string());
  for (const std::string& name : keep) {
    fs::rename(old / name, out / name, ec);
    CASTOR_CHECK(!ec, (old / name).string(), ": cannot move back into ", out.string(), ": ", ec.message());
  }
  fs::remove_all(old, ec);
}

}  // namespace

std::vector<std::string> check_output_dir(const std::string& flag, const std::string& dir, const OwnsEntry& owns,
                                          const std::string& what, bool keep_others, const std::string& remedy) {
  const fs::path path = output_dir_path(flag, dir);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (st.type() == fs::file_type::not_found) return {};
  CASTOR_CHECK(!ec, flag, ": ", dir, ": cannot stat: ", ec.message());
  CASTOR_CHECK(st.type() != fs::file_type::symlink, flag, ": ", dir,
               ": is a symbolic link; give the directory itself (", what, " is replaced whole, never through a link)");
  CASTOR_CHECK(st.type() == fs::file_type::directory, flag, ": ", dir, ": exists and is not a directory; ", what,
               " is a directory");
  for (const char* run_file : {".castor.lock", "checkpoints"})
    CASTOR_CHECK(!fs::exists(fs::symlink_status(path / run_file, ec)), flag, ": ", dir,
                 ": a Castor run directory (it holds ", run_file, "); ", what,
                 " never replaces one (its checkpoints and metrics would be lost): give another ", flag);
  const std::vector<std::string> other = foreign_entries(path, owns);
  if (!other.empty() && !keep_others) {
    std::string list;
    for (size_t i = 0; i < other.size() && i < 5; ++i) list += (i ? ", " : "") + printable(other[i]);
    if (other.size() > 5) list += detail::cat(" and ", other.size() - 5, " more");
    throw Error(detail::cat(
        flag, ": ", dir, " holds files ", what, " does not (", list, "); give another ", flag,
        remedy.empty() ? detail::cat(" (a directory is replaced only when it holds nothing but ", what, "'s files)")
                       : remedy));
  }
  return other;
}

void write_output_dir(const std::string& flag, const std::string& dir, const OwnsEntry& owns, const std::string& what,
                      const std::vector<std::string>& keep,
                      const std::function<void(const std::string& folder)>& fill) {
  const fs::path out = output_dir_path(flag, dir);
  const auto owned_or_kept = [&](const std::string& name) {
    return owns(name) || std::find(keep.begin(), keep.end(), name) != keep.end();
  };
  check_output_dir(flag, dir, owned_or_kept, what);
  std::error_code ec;
  fs::create_directories(out.parent_path(), ec);
  CASTOR_CHECK(!ec, flag, ": ", dir, ": cannot create its parent directory: ", ec.message());
  clean_up_after_killed_writers(out, owns);
  const fs::path fresh = work_folder(out, "new", ::getpid());
  fs::remove_all(fresh, ec);
  CASTOR_CHECK(fs::create_directory(fresh, ec) && !ec, flag, ": ", dir, ": cannot create ", fresh.string(), ": ",
               ec.message());
  try {
    fill(fresh.string());
    check_output_dir(flag, dir, owned_or_kept, what);  // (what appeared meanwhile is not replaced either)
  } catch (...) {
    fs::remove_all(fresh, ec);
    throw;
  }
  switch_folder(fresh, out, keep);
}

}  // namespace castor
