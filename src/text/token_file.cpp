// llm.c token files: the whole-file writer and the validating memory-mapped reader.
#include "castor/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "castor/check.h"
#include "castor/fs.h"

namespace castor::data {

static_assert(std::endian::native == std::endian::little, "token files are little-endian, as llm.c writes them");

int token_width(int64_t vocab_size) { return vocab_size > 65536 ? 4 : 2; }

void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int width) {
  CASTOR_CHECK(width == 2 || width == 4, path, ": token width ", width, " (2 or 4 bytes)");
  CASTOR_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), path, ": ", tokens.size(),
               " tokens do not fit the header's int32 count");
  std::vector<uint8_t> bytes(kTokenFileHeaderBytes + tokens.size() * width, 0);
  const int32_t head[3] = {width == 2 ? kTokenFileMagic : kTokenFileMagic32,
                           width == 2 ? kTokenFileVersion : kTokenFileVersion32, static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), head, sizeof(head));
  uint8_t* out = bytes.data() + kTokenFileHeaderBytes;
  if (width == 4) {
    if (!tokens.empty()) std::memcpy(out, tokens.data(), tokens.size_bytes());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      CASTOR_CHECK(tokens[i] <= 0xFFFF, path, ": token ", tokens[i], " does not fit the 16-bit token format");
      const auto t = static_cast<uint16_t>(tokens[i]);
      std::memcpy(out + 2 * i, &t, 2);
    }
  }
  atomic_write_file(path, bytes);
}

int64_t check_token_file(std::span<const uint8_t> bytes, const std::string& what, int& width) {
  CASTOR_CHECK(bytes.size() >= kTokenFileHeaderBytes, what, ": ", bytes.size(), " bytes, too short for the ",
               kTokenFileHeaderBytes, "-byte token-file header");
  int32_t head[3];
  std::memcpy(head, bytes.data(), sizeof(head));
  CASTOR_CHECK(head[0] == kTokenFileMagic || head[0] == kTokenFileMagic32, what, ": not a token file (magic ", head[0],
               ", expected ", kTokenFileMagic, " or ", kTokenFileMagic32, ")");
  const bool wide = head[0] == kTokenFileMagic32;
  const int32_t version = wide ? kTokenFileVersion32 : kTokenFileVersion;
  CASTOR_CHECK(head[1] == version, what, ": token-file version ", head[1], ", expected ", version, " (magic ", head[0],
               ")");
  width = wide ? 4 : 2;
  CASTOR_CHECK(head[2] >= 0 && bytes.size() == kTokenFileHeaderBytes + width * static_cast<size_t>(head[2]), what,
               ": the header says ", head[2], " tokens but the file has ", bytes.size() - kTokenFileHeaderBytes,
               " bytes after it (truncated or damaged)");
  return head[2];
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  CASTOR_CHECK(fd >= 0, path, ": cannot open token file: ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd);
    CASTOR_CHECK(stat_ok, path, ": cannot stat token file: ", std::strerror(stat_errno));
    throw Error(detail::cat(path, ": not a regular file"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kTokenFileHeaderBytes) {  // too short to map usefully (or at all, when empty): refused from a copy
    ::close(fd);
    check_token_file(read_file(path), path, width_);
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  CASTOR_CHECK(map != MAP_FAILED, path, ": cannot map token file: ", std::strerror(map_errno));
  map_ = map;
  map_bytes_ = bytes;
  try {
    size_ = check_token_file({static_cast<const uint8_t*>(map), bytes}, path, width_);
  } catch (const Error&) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
  tokens_ = static_cast<const uint8_t*>(map) + kTokenFileHeaderBytes;
  ::madvise(map_, map_bytes_, MADV_WILLNEED);
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      width_(other.width_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
    width_ = other.width_;
  }
  return *this;
}

std::vector<uint32_t> TokenFile::ids() const {
  std::vector<uint32_t> out(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) out[i] = (*this)[i];
  return out;
}

}  // namespace castor::data
