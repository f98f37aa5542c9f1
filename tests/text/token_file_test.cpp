// llm.c token files: the header layout byte for byte, round trips, and one-line errors naming damaged files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "castor/fs.h"
#include "castor/token_file.h"
#include "io/file_test_util.h"

namespace castor::data {
namespace {

std::vector<uint8_t> header(int32_t magic, int32_t version, int32_t n) {
  std::vector<uint8_t> b(1024, 0);
  const int32_t h[3] = {magic, version, n};
  std::memcpy(b.data(), h, sizeof(h));
  return b;
}

}  // namespace

TEST(TokenFile, WritesLlmcLayoutAndReadsItBack) {
  test::ScratchDir dir;
  const std::vector<uint32_t> tokens = {0, 1, 50256, 65535, 7};
  write_token_file(dir.file("t.bin"), tokens, 2);
  // The layout, built by hand: 256 int32 (magic, version, count, zeros), then little-endian uint16s.
  std::vector<uint8_t> want = header(20240520, 1, 5);
  for (uint16_t t : tokens) want.insert(want.end(), {static_cast<uint8_t>(t & 0xFF), static_cast<uint8_t>(t >> 8)});
  EXPECT_EQ(read_file(dir.file("t.bin")), want);
  TokenFile f(dir.file("t.bin"));
  EXPECT_EQ(f.size(), 5);
  EXPECT_EQ(f.width(), 2);
  EXPECT_EQ(f.ids(), tokens);
  TokenFile moved = std::move(f);
  EXPECT_EQ(moved[2], 50256u);
  write_token_file(dir.file("empty.bin"), {}, 2);
  EXPECT_EQ(TokenFile(dir.file("empty.bin")).size(), 0);
  test::expect_error([&] { write_token_file(dir.file("big.bin"), std::vector<uint32_t>{65536}, 2); },
                     {"big.bin", "65536", "16-bit"});
}

TEST(TokenFile, WritesLlmcLlama3LayoutWith32BitIds) {
  test::ScratchDir dir;
  const std::vector<uint32_t> tokens = {128000, 0, 151645, 4294967295u};
  write_token_file(dir.file("t.bin"), tokens, 4);
  // llm.c's dev/data/data_common.py "llama-3": magic 20240801, version 7, then little-endian uint32s.
  std::vector<uint8_t> want = header(20240801, 7, 4);
  for (uint32_t t : tokens)
    for (int k = 0; k < 4; ++k) want.push_back(static_cast<uint8_t>(t >> (8 * k)));
  EXPECT_EQ(read_file(dir.file("t.bin")), want);
  TokenFile f(dir.file("t.bin"));
  EXPECT_EQ(f.width(), 4);
  EXPECT_EQ(f.size(), 4);
  EXPECT_EQ(f.ids(), tokens);
  EXPECT_EQ(f.token_bytes().size(), 16u);
  std::vector<uint8_t> b = header(20240801, 7, 2);
  b.insert(b.end(), 6, 0);  // one and a half 32-bit tokens
  test::write_bytes(dir.file("bad.bin"), b);
  test::expect_error([&] { TokenFile g(dir.file("bad.bin")); }, {"bad.bin", "2 tokens", "6 bytes"});
  test::write_bytes(dir.file("v1.bin"), header(20240801, 1, 0));
  test::expect_error([&] { TokenFile g(dir.file("v1.bin")); }, {"v1.bin", "version 1", "expected 7"});
}

TEST(TokenFile, DamagedFilesAreOneLineErrorsNamingThem) {
  test::ScratchDir dir;
  const std::string p = dir.file("bad.bin");
  test::expect_error([&] { TokenFile f(dir.file("missing.bin")); }, {"missing.bin", "cannot open"});
  test::write_bytes(p, std::vector<uint8_t>(100, 0));
  test::expect_error([&] { TokenFile f(p); }, {p, "too short"});
  test::write_bytes(p, header(20240326, 1, 0));
  test::expect_error([&] { TokenFile f(p); }, {p, "magic 20240326"});
  test::write_bytes(p, header(20240520, 2, 0));
  test::expect_error([&] { TokenFile f(p); }, {p, "version 2"});
  std::vector<uint8_t> b = header(20240520, 1, 3);
  b.insert(b.end(), 4, 0);  // two tokens, not three
  test::write_bytes(p, b);
  test::expect_error([&] { TokenFile f(p); }, {p, "3 tokens", "4 bytes"});
  b.insert(b.end(), 4, 0);  // four
  test::write_bytes(p, b);
  test::expect_error([&] { TokenFile f(p); }, {p, "3 tokens", "8 bytes"});
  test::expect_error([&] { TokenFile f(dir.path().string()); }, {dir.path().string(), "not a regular file"});
}

TEST(TokenFile, AFailedWriteLeavesTheOldFile) {
  test::ScratchDir dir;
  const std::string p = dir.file("keep.bin");
  write_token_file(p, std::vector<uint32_t>{1, 2, 3}, 2);
  test::expect_error([&] { write_token_file(dir.file("nodir/x.bin"), std::vector<uint32_t>{1}, 2); }, {"nodir/x.bin"});
  EXPECT_EQ(TokenFile(p).size(), 3);
}

}  // namespace castor::data
