// The file layer: FIFOs refused without blocking, locks, whole-line appends, checksums, printable names.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>

#include "castor/fs.h"
#include "io/file_test_util.h"

namespace castor {

TEST(Fs, ReadFileRefusesAFifoWithoutBlocking) {
  test::ScratchDir dir;
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0644), 0);
  test::expect_error([&] { read_file(dir.file("pipe")); }, {dir.file("pipe"), "not a regular file"});
  test::expect_error([&] { read_file(dir.path().string()); }, {"not a regular file"});
}

// Only a regular file or a missing path is replaced: a FIFO, socket, directory or symbolic link (even one to a
// regular file) is refused naming it and left as it was, with no temp file left behind.
TEST(Fs, AtomicWriteReplacesOnlyRegularFilesOrMissingPaths) {
  test::ScratchDir dir;
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0644), 0);
  std::filesystem::create_directory(dir.file("folder"));
  test::write_bytes(dir.file("target"), {1, 2});
  std::filesystem::create_symlink("target", dir.file("link"));
  std::filesystem::create_symlink("missing", dir.file("dangling"));
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = dir.file("sock");
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::strcpy(addr.sun_path, sock_path.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  for (const auto& [name, kind] : std::vector<std::pair<std::string, std::string>>{{"pipe", "a FIFO"},
                                                                                   {"folder", "a directory"},
                                                                                   {"link", "a symbolic link"},
                                                                                   {"dangling", "a symbolic link"},
                                                                                   {"sock", "a socket"}}) {
    test::expect_error([&] { atomic_write_file(dir.file(name), std::string_view("x")); },
                       {dir.file(name), "is " + kind, "only a regular file or a missing path"});
    test::expect_error([&] { check_replaceable(dir.file(name)); }, {dir.file(name), kind});
  }
  ::close(sock);
  EXPECT_EQ(std::filesystem::status(dir.file("pipe")).type(), std::filesystem::file_type::fifo);
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("link")));
  EXPECT_EQ(read_file(dir.file("target")), (std::vector<uint8_t>{1, 2}));
  test::expect_error([&] { atomic_write_file("", std::string_view("x")); }, {"empty path"});
  atomic_write_file(dir.file("target"), std::string_view("y"));  // a regular file and a new path are written
  atomic_write_file(dir.file("new"), std::string_view("z"));
  EXPECT_EQ(read_file(dir.file("new")), (std::vector<uint8_t>{'z'}));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(Fs, SecondLockNamesTheOwner) {
  test::ScratchDir dir;
  FileLock first(dir.file(".lock"));
  test::expect_error([&] { FileLock second(dir.file(".lock")); },
                     {dir.path().string() + " is in use by pid " + std::to_string(::getpid())});
}

TEST(Fs, LockIsReleasedWithItsOwner) {
  test::ScratchDir dir;
  { FileLock first(dir.file(".lock")); }
  EXPECT_NO_THROW(FileLock again(dir.file(".lock")));
}

TEST(Fs, AppendFileAddsWholeLines) {
  test::ScratchDir dir;
  {
    AppendFile f(dir.file("log"), /*truncate=*/true);
    EXPECT_EQ(f.append("one\n"), "");
    EXPECT_EQ(f.append("two\n"), "");
  }
  AppendFile again(dir.file("log"), /*truncate=*/false);
  EXPECT_EQ(again.append("three\n"), "");
  const std::vector<uint8_t> b = read_file(dir.file("log"));
  EXPECT_EQ(std::string(b.begin(), b.end()), "one\ntwo\nthree\n");
  test::expect_error([&] { AppendFile(dir.path().string(), false); }, {dir.path().string()});
}

TEST(Fs, Checksum64IsFnv1a) {
  // FNV-1a 64 worked by hand: offset basis 0xcbf29ce484222325, prime 0x100000001b3.
  EXPECT_EQ(checksum64({}), 0xcbf29ce484222325ull);
  const uint8_t a[] = {'a'};
  EXPECT_EQ(checksum64(a), (0xcbf29ce484222325ull ^ 'a') * 0x100000001b3ull);
  const uint8_t ab[] = {'a', 'b'}, ac[] = {'a', 'c'};
  EXPECT_NE(checksum64(ab), checksum64(ac));
}

// A file's checksum read 1 MiB at a time is checksum64 of its whole bytes (pieces of 1 MiB, 1 MiB, and 7 bytes over),
// an empty file's is the offset basis, and a FIFO is refused naming it without blocking.
TEST(Fs, FileChecksumIsTheChecksumOfTheWholeFile) {
  test::ScratchDir dir;
  std::vector<uint8_t> bytes((size_t{2} << 20) + 7);
  uint32_t x = 12345;
  for (uint8_t& b : bytes) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  test::write_bytes(dir.file("big"), bytes);
  EXPECT_EQ(file_checksum64_hex(dir.file("big")), checksum64_hex(bytes));
  bytes.back() ^= 1;
  EXPECT_NE(file_checksum64_hex(dir.file("big")), checksum64_hex(bytes));
  test::write_bytes(dir.file("empty"), {});
  EXPECT_EQ(file_checksum64_hex(dir.file("empty")), "cbf29ce484222325");
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0644), 0);
  test::expect_error([&] { file_checksum64_hex(dir.file("pipe")); }, {dir.file("pipe"), "not a regular file"});
}

TEST(Fs, PrintableEscapesControlsAndBadUtf8) {
  EXPECT_EQ(printable("plain/path.txt"), "plain/path.txt");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");  // é stays
  EXPECT_EQ(printable("\x1b[31mred\x07"), "\\x1b[31mred\\x07");
  EXPECT_EQ(printable("a\xff"
                      "b"),
            "a\\xffb");
  EXPECT_EQ(printable("\xc3"), "\\xc3");  // cut-short sequence
  EXPECT_EQ(printable("tab\there\x7f"), "tab\\x09here\\x7f");
}

}  // namespace castor
