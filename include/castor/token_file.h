// Token files in llm.c's formats: int32 header[256] = {20240520, 1, n_tokens, 0...}, then n_tokens uint16 tokens
// (GPT-2's), or {20240801, 7, n_tokens, 0...} then uint32 tokens (llm.c's llama-3 files, for vocabularies past 65,536).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace castor::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int32_t kTokenFileMagic32 = 20240801;  // llm.c's dev/data/data_common.py, "llama-3"
constexpr int32_t kTokenFileVersion32 = 7;
constexpr size_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

// The bytes per token a vocabulary of `vocab_size` ids needs: 2 up to 65,536, else 4.
int token_width(int64_t vocab_size);

// Writes `tokens` to `path` whole (temp file, fsync, rename: an old file there survives any failure), `width` bytes
// per token (2: the uint16 format, each id below 65,536; 4: the uint32 one). Throws castor::Error naming the path
// (more than INT32_MAX tokens, an id too large for 16 bits, unwritable directory, full disk).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int width);

// Checks a whole token file's bytes: the magic number and version of either format and a size of exactly header +
// width * n_tokens bytes. Returns n_tokens and sets `width`; castor::Error naming `what` otherwise.
int64_t check_token_file(std::span<const uint8_t> bytes, const std::string& what, int& width);

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

  int width() const { return width_; }  // bytes per token: 2 or 4
  // Token i (no bounds check), read from the mapping whichever the width.
  uint32_t operator[](int64_t i) const {
    if (width_ == 2) return reinterpret_cast<const uint16_t*>(tokens_)[i];
    return reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  std::vector<uint32_t> ids() const;  // all of them, copied (small files, tests)
  std::span<const uint8_t> token_bytes() const { return {tokens_, static_cast<size_t>(size_) * width_}; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t size_ = 0;
  int width_ = 2;
};

}  // namespace castor::data
