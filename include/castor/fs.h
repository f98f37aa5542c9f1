// Whole-file reads and crash-safe whole-file writes (safetensors, checkpoints).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace castor {

// Reads a regular file into memory; castor::Error naming the path when it cannot be opened or read.
std::vector<uint8_t> read_file(const std::string& path);

// True when `path` names an existing file (of any kind).
bool file_exists(const std::string& path);

// Replaces `path` atomically: writes a temp file in the same directory, fsyncs it, renames it over `path` and
// fsyncs the directory. On failure (unwritable directory, full disk, ...) throws castor::Error naming the path,
// removes the temp file and leaves any old file at `path` untouched.
// Flushes a directory's entries (after a rename or create inside it) to disk.
void fsync_directory(const std::string& dir);

void atomic_write_file(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace castor
