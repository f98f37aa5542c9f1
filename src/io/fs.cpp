// POSIX implementation of whole-file reads and atomic writes.
#include "castor/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

std::string errno_text() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  CASTOR_CHECK(f.fd >= 0, path, ": cannot open: ", errno_text());
  struct stat st;
  CASTOR_CHECK(::fstat(f.fd, &st) == 0, path, ": cannot stat: ", errno_text());
  CASTOR_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    CASTOR_CHECK(n >= 0, path, ": read failed: ", errno_text());
    CASTOR_CHECK(n > 0, path, ": file shrank while being read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void atomic_write_file(const std::string& path, std::span<const uint8_t> bytes) {
  std::string tmp = path + ".tmp.XXXXXX";
  Fd f(::mkstemp(tmp.data()));
  CASTOR_CHECK(f.fd >= 0, path, ": cannot create a temp file in ", parent_dir(path), ": ", errno_text());
  auto fail = [&](const char* what) {
    std::string msg = detail::cat(path, ": ", what, ": ", errno_text());
    ::unlink(tmp.c_str());
    throw Error(msg);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    done += static_cast<size_t>(n);
  }
  if (::fchmod(f.fd, 0644) != 0) fail("chmod failed");
  if (::fsync(f.fd) != 0) fail("fsync failed");
  if (!f.close()) fail("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
  fsync_directory(parent_dir(path));
}

void fsync_directory(const std::string& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CASTOR_CHECK(d.fd >= 0 && ::fsync(d.fd) == 0, dir, ": fsync of the directory failed: ", errno_text());
}

}  // namespace castor
