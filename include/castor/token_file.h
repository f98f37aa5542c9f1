// Token files in llm.c's format: int32 header[256] = {20240520, 1, n_tokens, 0...}, then n_tokens uint16 tokens.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace castor::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr size_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

// Writes `tokens` to `path` whole (temp file, fsync, rename: an old file there survives any failure). Throws
// castor::Error naming the path (more than INT32_MAX tokens, unwritable directory, full disk).
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);

// Checks a whole token file's bytes: the magic number, the version and a size of exactly header + 2 * n_tokens
// bytes. Returns n_tokens; castor::Error naming `what` otherwise.
int64_t check_token_file(std::span<const uint8_t> bytes, const std::string& what);

// A token file memory-mapped read-only. Opening checks it (check_token_file); each failure is one castor::Error
// line naming the file.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(size_)}; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace castor::data
