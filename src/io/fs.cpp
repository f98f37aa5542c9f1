// POSIX implementation of regular-file reads, whole writes, run-directory locks and checksums.
#include "castor/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "castor/check.h"

namespace castor {
namespace {

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  // Closes now, reporting failure (close can be the first to notice a failed write-back).
  bool close() {
    int f = fd;
    fd = -1;
    return ::close(f) == 0;
  }
};

// errno as text; EFBIG (a write past the file-size limit, SIGXFSZ being ignored: castor's main) says which limit.
std::string errno_text() {
  if (errno == EFBIG) return "File too large (past the file-size limit: ulimit -f, or a disk quota)";
  return std::strerror(errno);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The CASTOR_FAIL_WRITES test hook (see fs.h): true when this write to `path` is to fail.
bool injected_write_failure(const std::string& path) {
  static std::once_flag once;
  static std::string match;
  static long first = 0, count = 0, seen = 0;
  static std::mutex mu;
  std::call_once(once, [] {
    const char* env = std::getenv("CASTOR_FAIL_WRITES");
    if (!env) return;
    const std::string spec = env;
    const size_t a = spec.find(':'), b = spec.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) return;
    match = spec.substr(0, a);
    first = std::atol(spec.c_str() + a + 1);
    count = std::atol(spec.c_str() + b + 1);
  });
  if (count <= 0 || path.find(match) == std::string::npos) return false;
  std::lock_guard<std::mutex> lock(mu);
  ++seen;
  return seen >= first && seen < first + count;
}

// Writes all of `bytes`; false with errno set on failure.
bool write_bytes(int fd, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = ENOSPC;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// The same as one write of the CASTOR_FAIL_WRITES hook's count (`pieces` one after another).
bool write_all(int fd, std::span<const std::span<const uint8_t>> pieces, const std::string& path) {
  if (injected_write_failure(path)) {
    errno = ENOSPC;
    return false;
  }
  for (std::span<const uint8_t> bytes : pieces)
    if (!write_bytes(fd, bytes)) return false;
  return true;
}
bool write_all(int fd, std::span<const uint8_t> bytes, const std::string& path) {
  const std::span<const uint8_t> one[] = {bytes};
  return write_all(fd, std::span<const std::span<const uint8_t>>(one), path);
}

// Opens a regular file for reading; castor::Error naming the path otherwise. Sets `size` to its size.
int open_regular(const std::string& path, uint64_t& size) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not a regular file.
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  CASTOR_CHECK(f.fd >= 0, path, ": cannot open: ", errno_text());
  struct stat st;
  CASTOR_CHECK(::fstat(f.fd, &st) == 0, path, ": cannot stat: ", errno_text());
  CASTOR_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  CASTOR_CHECK(::fcntl(f.fd, F_SETFL, 0) == 0, path, ": cannot read: ", errno_text());
  size = static_cast<uint64_t>(st.st_size);
  const int fd = f.fd;
  f.fd = -1;
  return fd;
}

// Reads bytes.size() bytes at `offset`.
void read_at(int fd, std::span<uint8_t> bytes, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    CASTOR_CHECK(n >= 0, path, ": read failed: ", errno_text());
    CASTOR_CHECK(n > 0, path, ": file shrank while being read");
    done += static_cast<size_t>(n);
  }
}

// What a path that is not a regular file is, for refusing to replace it.
const char* kind_of(mode_t mode) {
  return S_ISLNK(mode)                    ? "a symbolic link"
         : S_ISDIR(mode)                  ? "a directory"
         : S_ISFIFO(mode)                 ? "a FIFO"
         : S_ISSOCK(mode)                 ? "a socket"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                          : "not a regular file";
}

}  // namespace

void check_replaceable(const std::string& path) {
  CASTOR_CHECK(!path.empty(), "an empty path names no file to write");
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    // Missing, or under something that is not a directory: nothing there to replace (writing will say why not).
    CASTOR_CHECK(errno == ENOENT || errno == ENOTDIR, path, ": cannot stat: ", errno_text());
    return;
  }
  CASTOR_CHECK(S_ISREG(st.st_mode), path, ": is ", kind_of(st.st_mode),
               "; only a regular file or a missing path is replaced");
}

std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  Fd f(open_regular(path, size));
  CASTOR_CHECK(size <= max_bytes, path, ": ", size, " bytes, more than the limit of ", max_bytes);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  read_at(f.fd, bytes, 0, path);
  return bytes;
}

std::vector<uint8_t> read_file_range(const std::string& path, uint64_t offset, uint64_t count, uint64_t& file_size) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  read_file_range_into(path, offset, bytes, file_size);
  return bytes;
}

void read_file_range_into(const std::string& path, uint64_t offset, std::span<uint8_t> out, uint64_t& file_size) {
  Fd f(open_regular(path, file_size));
  CASTOR_CHECK(offset <= file_size && out.size() <= file_size - offset, path, ": file is ", file_size,
               " bytes, too short for bytes ", offset, " to ", offset + out.size());
  read_at(f.fd, out, offset, path);
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) p = std::filesystem::absolute(path, ec).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void atomic_write_file(const std::string& path, std::span<const uint8_t> bytes) {
  const std::span<const uint8_t> one[] = {bytes};
  atomic_write_file(path, std::span<const std::span<const uint8_t>>(one));
}

void atomic_write_file(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  atomic_write_file(path, pieces.size(), [&](size_t i) { return pieces[i]; });
}

void atomic_write_file(const std::string& path, size_t count,
                       const std::function<std::span<const uint8_t>(size_t)>& piece) {
  check_replaceable(path);
  std::string tmp = path + ".tmp.XXXXXX";
  Fd f(::mkstemp(tmp.data()));
  CASTOR_CHECK(f.fd >= 0, path, ": cannot create a temp file in ", parent_dir(path), ": ", errno_text());
  auto fail = [&](const char* what) {
    std::string msg = detail::cat(path, ": ", what, ": ", errno_text());
    ::unlink(tmp.c_str());
    throw Error(msg);
  };
  bool written = true;
  try {
    for (size_t i = 0; i < count && written; ++i) {
      const std::span<const uint8_t> bytes = piece(i);
      written = write_all(f.fd, bytes, path);
    }
  } catch (...) {  // (a piece that could not be made)
    ::unlink(tmp.c_str());
    throw;
  }
  if (!written) fail("write failed");
  if (::fchmod(f.fd, 0644) != 0) fail("chmod failed");
  if (::fsync(f.fd) != 0) fail("fsync failed");
  if (!f.close()) fail("close failed");
  // Again just before the rename: what appeared at `path` meanwhile is not replaced either.
  try {
    check_replaceable(path);
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
  fsync_directory(parent_dir(path));
}

void atomic_write_file(const std::string& path, std::string_view text) {
  atomic_write_file(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void fsync_directory(const std::string& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CASTOR_CHECK(d.fd >= 0 && ::fsync(d.fd) == 0, dir, ": fsync of the directory failed: ", errno_text());
}

AppendFile::AppendFile(const std::string& path, bool truncate) : path_(path) {
  // O_NOFOLLOW: a symbolic link planted in a run directory must not redirect (or truncate) another file.
  fd_ = ::open(path.c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | (truncate ? O_TRUNC : 0), 0644);
  CASTOR_CHECK(fd_ >= 0, path, ": cannot open for writing: ", errno == ELOOP ? "a symbolic link" : errno_text());
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(detail::cat(path, ": not a regular file"));
  }
}

AppendFile::~AppendFile() { ::close(fd_); }

std::string AppendFile::append(std::string_view line) {
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  if (before >= 0 && write_all(fd_, {reinterpret_cast<const uint8_t*>(line.data()), line.size()}, path_)) return {};
  const std::string why = errno_text();
  // Cut off whatever part of the line reached the file, so the next line starts on a line of its own.
  if (before >= 0 && ::ftruncate(fd_, before) != 0) return why + " (and the partial line could not be removed)";
  return why;
}

FileLock::FileLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, 0644);
  CASTOR_CHECK(fd_ >= 0, path, ": cannot create the lock file: ", errno == ELOOP ? "a symbolic link" : errno_text());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    CASTOR_CHECK(err == EWOULDBLOCK, path, ": cannot lock: ", std::strerror(err));
    throw Error(
        detail::cat(parent_dir(path), " is in use by pid ", n > 0 ? std::atol(buf) : 0L, " (lock file ", path, ")"));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd_);
    throw Error(detail::cat(path, ": cannot write the lock file: ", errno_text()));
  }
}

FileLock::~FileLock() { ::close(fd_); }

namespace {

// FNV-1a: `h` continued over `bytes`.
uint64_t fnv1a(uint64_t h, std::span<const uint8_t> bytes) {
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvStart = 0xcbf29ce484222325ull;

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

}  // namespace

uint64_t checksum64(std::span<const uint8_t> bytes) { return fnv1a(kFnvStart, bytes); }

std::string checksum64_hex(std::span<const uint8_t> bytes) { return hex64(checksum64(bytes)); }

std::string file_checksum64_hex(const std::string& path) {
  uint64_t size = 0;
  Fd f(open_regular(path, size));
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 20)));
  uint64_t h = kFnvStart;
  for (uint64_t at = 0; at < size; at += buf.size()) {
    const std::span<uint8_t> piece(buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at)));
    read_at(f.fd, piece, at, path);
    h = fnv1a(h, piece);
  }
  return hex64(h);
}

std::string printable(std::string_view text) {
  std::string out;
  auto hex = [&](uint8_t b) {
    static const char* digits = "0123456789abcdef";
    out += "\\x";
    out += digits[b >> 4];
    out += digits[b & 15];
  };
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<uint8_t>(text[i]);
    // A valid UTF-8 sequence's length, or 0 when `b` cannot start one (or the sequence is cut short/broken).
    size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > text.size()) len = 0;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<uint8_t>(text[i + k]) >> 6) != 2) len = 0;
    if (len == 0 || b < 0x20 || b == 0x7f) {
      hex(b);
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace castor
