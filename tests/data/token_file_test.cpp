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
  const std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 7};
  write_token_file(dir.file("t.bin"), tokens);
  // The layout, built by hand: 256 int32 (magic, version, count, zeros), then little-endian uint16s.
  std::vector<uint8_t> want = header(20240520, 1, 5);
  for (uint16_t t : tokens) want.insert(want.end(), {static_cast<uint8_t>(t & 0xFF), static_cast<uint8_t>(t >> 8)});
  EXPECT_EQ(read_file(dir.file("t.bin")), want);
  TokenFile f(dir.file("t.bin"));
  EXPECT_EQ(f.size(), 5);
  EXPECT_EQ(std::vector<uint16_t>(f.tokens().begin(), f.tokens().end()), tokens);
  TokenFile moved = std::move(f);
  EXPECT_EQ(moved.tokens()[2], 50256);
  write_token_file(dir.file("empty.bin"), {});
  EXPECT_EQ(TokenFile(dir.file("empty.bin")).size(), 0);
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
  write_token_file(p, std::vector<uint16_t>{1, 2, 3});
  test::expect_error([&] { write_token_file(dir.file("nodir/x.bin"), std::vector<uint16_t>{1}); }, {"nodir/x.bin"});
  EXPECT_EQ(TokenFile(p).size(), 3);
}

}  // namespace castor::data
