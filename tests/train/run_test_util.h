// Test helpers for whole runs: the real `castor` binary run in a directory (environment, memory limit, signals), and
// bit-for-bit comparison of checkpoints. Nothing here bounds a run by wall time but a hang guard far beyond any run's
// length at any load: a loaded machine makes a test slower, never its outcome different.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "castor/checkpoint.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor::test {

struct CastorRun {
  std::string dir;               // the working directory (relative paths in args resolve there)
  std::vector<std::string> env;  // extra NAME=VALUE entries
  long address_space_kib = 0;    // > 0: `ulimit -v` for the child
  std::string program;           // another program to run (found on PATH); empty: the castor binary
  long file_size_bytes = 0;      // > 0: the child's RLIMIT_FSIZE (`ulimit -f`: a write past it fails, or SIGXFSZ)
};

// A started `castor` process; its stdout and stderr go to files in the run's directory.
class CastorProcess {
 public:
  CastorProcess(const std::vector<std::string>& args, const CastorRun& run) : dir_(run.dir) {
    static int serial = 0;
    const std::string tag = std::to_string(::getpid()) + "." + std::to_string(serial++);
    out_path_ = dir_ + "/.stdout." + tag;
    err_path_ = dir_ + "/.stderr." + tag;
    std::vector<std::string> argv_s = {run.program.empty() ? std::string(CASTOR_BINARY_DIR) + "/castor" : run.program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test killed by ctest's TIMEOUT leaves no castor running
      if (::chdir(dir_.c_str()) != 0) ::_exit(126);
      const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      for (const std::string& e : run.env) ::putenv(const_cast<char*>(e.c_str()));
      if (run.address_space_kib > 0) {
        const rlimit lim{static_cast<rlim_t>(run.address_space_kib) * 1024,
                         static_cast<rlim_t>(run.address_space_kib) * 1024};
        ::setrlimit(RLIMIT_AS, &lim);
      }
      if (run.file_size_bytes > 0) {
        const rlimit lim{static_cast<rlim_t>(run.file_size_bytes), static_cast<rlim_t>(run.file_size_bytes)};
        ::setrlimit(RLIMIT_FSIZE, &lim);
      }
      std::vector<char*> argv;
      for (std::string& s : argv_s) argv.push_back(s.data());
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
  }

  pid_t pid() const { return pid_; }
  // What the process has written to stdout so far (while it runs).
  std::string out_so_far() const { return test::read_text(out_path_); }
  void signal(int sig) const { ::kill(pid_, sig); }

  // Whether the process has ended (left for wait() to collect).
  bool ended() const {
    siginfo_t info{};
    return ::waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
  }

  // Polls until `done()` holds or the process has ended, and returns done(): no deadline, so a loaded machine only
  // makes it take longer (a hang is ctest's TIMEOUT).
  template <class F>
  bool wait_until(F&& done) const {
    while (!done()) {
      if (ended()) return done();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // Waits for the process to end, however long a loaded machine makes it take: a hang is ctest's TIMEOUT (the
  // child dies with the test, PR_SET_PDEATHSIG), never a wall-clock deadline here.
  void wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    killed_by = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    out = test::read_text(out_path_);
    err = test::read_text(err_path_);
    std::remove(out_path_.c_str());
    std::remove(err_path_.c_str());
  }

  int exit_code = -1, killed_by = 0;
  std::string out, err;

 private:
  std::string dir_, out_path_, err_path_;
  pid_t pid_ = -1;
};

// A learnable text for language-model runs: `count` sentences drawn from a small grammar ("the jury said the report.",
// subjects capitalized when `capitalized`) by a generator seeded with `seed`, `per_line` to a line.
inline void write_grammar_text(const std::string& path, int count, int per_line, uint64_t seed, bool capitalized) {
  const char* subjects[] = {"the jury", "a clerk", "the city", "his wife", "the court"};
  const char* verbs[] = {"said", "found", "saw", "asked", "heard"};
  const char* objects[] = {"the report.", "no evidence.", "the man.", "a letter.", "the news."};
  Generator gen(seed);
  std::ofstream text(path);
  for (int i = 0; i < count; ++i) {
    std::string subject = subjects[gen.next_u64() % 5];
    if (capitalized) subject[0] = static_cast<char>(subject[0] - 'a' + 'A');
    text << subject << " " << verbs[gen.next_u64() % 5] << " " << objects[gen.next_u64() % 5]
         << (i % per_line == per_line - 1 ? "\n" : " ");
  }
}

// Runs `castor args...` to the end.
inline CastorProcess run_castor(const std::vector<std::string>& args, const CastorRun& run) {
  CastorProcess p(args, run);
  p.wait();
  return p;
}

// The error of a failed run: exit 1, exactly one line on stderr naming every part.
inline void expect_one_line_error(const CastorProcess& p, const std::vector<std::string>& parts) {
  EXPECT_EQ(p.exit_code, 1) << p.err;
  ASSERT_FALSE(p.err.empty());
  const size_t at = p.err.find("error: ");
  ASSERT_NE(at, std::string::npos) << p.err;
  EXPECT_EQ(p.err.find('\n', at), p.err.size() - 1) << "not one line: " << p.err;
  EXPECT_EQ(p.err.find("terminate called"), std::string::npos) << p.err;
  for (const std::string& s : parts) EXPECT_NE(p.err.find(s), std::string::npos) << "'" << s << "' not in: " << p.err;
}

// A learnable text of 3000 sentences from a small grammar ("the jury said the report."), eight to a line, written to
// `run.dir`/text.txt and tokenized by characters into `run.dir`/tok (a tenth for validation).
inline CastorProcess make_grammar_tokens(const CastorRun& run) {
  write_grammar_text(run.dir + "/text.txt", 3000, 8, 3, /*capitalized=*/false);
  return run_castor({"tokenize", "--tokenizer", "char", "--input", "text.txt", "--out", "tok", "--val-fraction", "0.1"},
                    run);
}

// `castor train` flags for a one-layer language model on the character tokens in `tok` (make_grammar_tokens): a GPT
// (`model` "gpt", 2 heads) or a Llama ("llama", 4 heads over 2 key/value heads), 32 wide, blocks of 16, `batch`
// sequences a step for `steps` steps, then `extra` (a flag given again there wins), then `--out out` last.
inline std::vector<std::string> tiny_lm_args(const std::string& model, const std::string& out, int64_t steps,
                                             int64_t batch, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"train", "--model", model, "--data", "tokens", "--data-dir", "tok", "--n-layer", "1"};
  if (model == "llama")
    a.insert(a.end(), {"--n-head", "4", "--n-kv-head", "2"});
  else
    a.insert(a.end(), {"--n-head", "2"});
  a.insert(a.end(), {"--n-embd", "32", "--block-size", "16", "--batch-size", std::to_string(batch), "--steps",
                     std::to_string(steps)});
  a.insert(a.end(), extra.begin(), extra.end());
  a.insert(a.end(), {"--out", out});
  return a;
}

// Every tensor of both checkpoints (or run directories: their newest), bit for bit, step counters and all.
inline void expect_same_checkpoint(const std::string& a, const std::string& b) {
  train::Checkpoint x = train::read_checkpoint(a), y = train::read_checkpoint(b);
  for (auto [p, q] : {std::pair{&x.model, &y.model}, std::pair{&x.state, &y.state}}) {
    ASSERT_EQ(p->size(), q->size());
    for (const auto& [k, t] : *p) {
      ASSERT_TRUE(q->count(k)) << k;
      EXPECT_TRUE(bit_equal(t, q->at(k))) << k;
    }
  }
}

}  // namespace castor::test
