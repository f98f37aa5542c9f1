// File-layer safety: regular-file reads, whole writes (atomic replace, whole-line appends), locks, checksums.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace castor {

// Reads a regular file into memory; castor::Error naming the path when it cannot be opened or read, or is not a
// regular file (a FIFO, device or directory is refused without blocking on it), or larger than `max_bytes`.
std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);

// Reads `count` bytes at `offset` of a regular file (read_file's checks) and sets `file_size` to the file's size;
// castor::Error naming the path when the file ends before them. For reading a header without the whole file.
std::vector<uint8_t> read_file_range(const std::string& path, uint64_t offset, uint64_t count, uint64_t& file_size);
// The same into `out` (out.size() bytes): straight into a tensor's memory, with no buffer between.
void read_file_range_into(const std::string& path, uint64_t offset, std::span<uint8_t> out, uint64_t& file_size);

// The absolute, normal spelling of `path`: symbolic links resolved as far as it exists, no trailing slash. One
// spelling per file, for recording paths and comparing them.
std::string absolute_path(const std::string& path);

// True when `path` names an existing file (of any kind).
bool file_exists(const std::string& path);

// Flushes a directory's entries (after a rename or create inside it) to disk.
void fsync_directory(const std::string& dir);

// Test hook: with CASTOR_FAIL_WRITES=SUBSTRING:FIRST:COUNT in the environment, writes number FIRST to
// FIRST+COUNT-1 (counted from 1) to files whose path contains SUBSTRING fail with ENOSPC, as on a full disk.
// Read once, at the first write; both writers below go through it.

// castor::Error naming `path` unless it is a regular file or missing: a directory, FIFO, socket, device or symbolic
// link (not followed: lstat) is never replaced by a file Castor writes; an empty path is refused too.
void check_replaceable(const std::string& path);

// Replaces `path` atomically: check_replaceable, then writes a temp file in the same directory, fsyncs it, checks
// `path` again, renames the temp file over it and fsyncs the directory. On failure (unwritable directory, full disk,
// a FIFO at `path`, ...) throws castor::Error naming the path, removes the temp file and leaves `path` untouched.
void atomic_write_file(const std::string& path, std::span<const uint8_t> bytes);
// The same for the concatenation of `pieces`, written one after another (a big file never assembled in memory).
void atomic_write_file(const std::string& path, std::span<const std::span<const uint8_t>> pieces);
// The same, each piece made as it is written: piece(i) for i = 0 .. count - 1 in order, its bytes valid until the
// next call (a file larger than memory, made a part at a time). An exception from piece() removes the temp file.
void atomic_write_file(const std::string& path, size_t count,
                       const std::function<std::span<const uint8_t>(size_t)>& piece);
void atomic_write_file(const std::string& path, std::string_view text);

// A file that lines are appended to whole or not at all: a failed or short write is cut back off the file.
class AppendFile {
 public:
  // Opens (creating it; emptying it when `truncate`) or throws castor::Error naming the path.
  AppendFile(const std::string& path, bool truncate);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  // Appends `line` whole; on failure leaves the file as it was and returns the reason (empty on success).
  std::string append(std::string_view line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// An exclusive advisory lock (flock) on `path` held for this object's lifetime; the file records the owner's pid.
class FileLock {
 public:
  // Takes the lock at once or throws castor::Error "<path> is in use by pid N".
  explicit FileLock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// A 64-bit checksum of `bytes` (FNV-1a), for detecting damaged files.
uint64_t checksum64(std::span<const uint8_t> bytes);
// checksum64 as 16 lowercase hex digits, as checkpoints and config.json record it.
std::string checksum64_hex(std::span<const uint8_t> bytes);
// checksum64_hex of a regular file's bytes (read_file's checks), read a piece at a time: a checkpoint's gigabytes are
// never held whole.
std::string file_checksum64_hex(const std::string& path);

// Text with control characters and bytes that are not UTF-8 shown as \xNN, for printing names from files.
std::string printable(std::string_view text);

}  // namespace castor
