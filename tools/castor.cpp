// The `castor` command: train, eval, tokenize, sample, export, info, env, help and completion subcommands (the work lives in src/train).
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "castor/check.h"
#include "castor/corpus.h"
#include "castor/dist.h"
#include "castor/fs.h"
#include "castor/export.h"
#include "castor/sample.h"
#include "castor/trainer.h"
#include "castor/version.h"

namespace {

const char* kUsage = R"(usage: castor <command> [flags]   (castor -V: the version)
  train       train an image classifier, a GPT or a Llama; fine-tune
              one (--init: a run, weights or a Hugging Face model
              directory), all weights or LoRA (castor help train)
  eval        accuracy, loss, per class and confusion matrix of a
              checkpoint, or of PyTorch/llm.c/llama2.c weights or a
              Hugging Face directory (--lora DIR: with PEFT adapters)
  tokenize    text or the Brown corpus to llm.c token files (char,
              GPT-2, a BPE vocabulary llama2.c reads, or --tokenizer
              a Hugging Face directory's tokenizer.json)
  sample      text from a GPT or Llama: a run, a LoRA run, llm.c,
              llama2.c or safetensors weights, a Hugging Face
              directory (--lora DIR: with PEFT adapters)
  export      a GPT or Llama for another tool (--format): llm.c .bin,
              nanoGPT ckpt.pt, llama2.c model.bin, safetensors, GGUF,
              a Hugging Face directory; a LoRA run merged, or its
              adapters as PEFT files
  info        a checkpoint's or Hugging Face directory's model, sizes,
              step, precision, parameters, metrics (--tensors: every
              tensor)
  env         version, commit, CPU/ISA, oneDNN, threads, MPI
  help [cmd]  this list, or a command's flags
  completion bash|zsh   a shell completion script
)";

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// `castor train --nproc N` from a shell: replaces this process with `mpirun -np N castor train ...` (its exit status
// becomes the job's). Returns only when no re-launch is needed.
void relaunch_under_mpirun(const castor::train::TrainConfig& c, const std::vector<std::string>& args) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  CASTOR_CHECK(n > 0, "--nproc: cannot find this program's path: ", std::strerror(errno));
  exe[n] = '\0';
  const std::vector<std::string> cmd = castor::train::mpirun_command(c, exe, args);
  if (cmd.empty()) return;
  std::vector<char*> argv;
  for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  execvp(argv[0], argv.data());
  throw castor::Error(castor::detail::cat("--nproc ", c.nproc, ": cannot run mpirun (", std::strerror(errno),
                                          "); install openmpi-bin (scripts/setup.sh)"));
}

// After an error in a data-parallel job, the other ranks would wait for this one: end them all.
int fail(int code) {
  if (castor::dist::is_launched_by_mpirun() && castor::dist::world_size() > 1) castor::dist::abort(code);
  return code;
}

// GNU OpenMP's default wait policy spins each idle thread for up to 300,000 iterations between parallel regions:
// fastest on cores of its own, but many times slower when other work shares the cores, where OMP_WAIT_POLICY=passive
// (threads sleep at once) is the remedy, but costs small models up to 1.8x on idle cores (docs/benchmarks.md).
// Unless the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT set), castor chooses (train: per job and for the machine's
// load, choose_openmp_wait; the other commands: a bounded spin) and runs itself again with it, since libgomp reads
// these once, as it loads. CASTOR_OPENMP_WAIT says what was chosen and why (config.json records it), and marks the
// second start (and the ranks mpirun starts), which chooses nothing. If the exec fails, castor goes on as it is.
bool openmp_wait_set() {
  return std::getenv("CASTOR_OPENMP_WAIT") || std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT");
}
void run_with_openmp_wait(const castor::train::OpenMpWait& w, char** argv) {
  if (openmp_wait_set()) return;
  if (setenv(w.variable, w.value, /*overwrite=*/0) != 0) return;
  if (setenv("CASTOR_OPENMP_WAIT", w.text().c_str(), /*overwrite=*/0) != 0) return;
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  unsetenv(w.variable);  // (not in effect: this process's OpenMP read the environment before)
  unsetenv("CASTOR_OPENMP_WAIT");
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f, a quota) a write fails with EFBIG, which castor reports naming the file and
  // cleans up after (temp file removed, the previous file intact), instead of SIGXFSZ killing it mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "--help" || all[0] == "-h") {
    std::fputs(kUsage, all.empty() ? stderr : stdout);
    return all.empty() ? 2 : 0;
  }
  if (all[0] == "--version" || all[0] == "-V") return std::printf("castor %s\n", CASTOR_VERSION), 0;
  if (all[0] == "completion" && all.size() == 2 && (all[1] == "bash" || all[1] == "zsh"))
    return std::fputs(castor::train::shell_completion(all[1]).c_str(), stdout), 0;
  // `castor help CMD` is `castor CMD --help`.
  const std::string cmd = all[0] == "help" && all.size() == 2 ? all[1] : all[0];
  std::vector<std::string> args(all.begin() + 1, all.end());
  if (all[0] == "help") {
    if (all.size() == 1) return std::fputs(kUsage, stdout), 0;
    args = {"--help"};
  }
  if (cmd != "train") run_with_openmp_wait(castor::train::default_openmp_wait(), argv);
  try {
    if (cmd == "train") {
      if (wants_help(args)) return std::fputs(castor::train::train_help().c_str(), stdout), 0;
      const castor::train::TrainConfig config = castor::train::parse_train_flags(args);
      if (config.dry_run) return std::printf("%s\n", castor::train::run_dry_run(config).dump().c_str()), 0;
      if (!openmp_wait_set())  // (measuring the machine takes 0.1 s: not again in the second start or the ranks)
        run_with_openmp_wait(castor::train::choose_openmp_wait(castor::train::openmp_wait_job(config),
                                                               castor::train::online_cpus(),
                                                               castor::train::busy_cores()),
                             argv);
      relaunch_under_mpirun(config, args);
      castor::train::install_interrupt_handlers();
      const castor::Json summary = castor::train::run_train(config);
      if (castor::dist::rank() == 0) std::printf("%s\n", summary.dump().c_str());
      // Interrupted: checkpointed and stopped; the status says by what, as if the signal had ended it.
      if (const castor::Json* sig = summary.find("interrupted_by_signal")) return 128 + static_cast<int>(sig->as_int());
    } else if (cmd == "eval") {
      if (wants_help(args)) return std::fputs(castor::train::eval_help().c_str(), stdout), 0;
      std::printf("%s\n", castor::train::run_eval(castor::train::parse_eval_flags(args)).dump().c_str());
    } else if (cmd == "tokenize") {
      if (wants_help(args)) return std::fputs(castor::train::tokenize_help().c_str(), stdout), 0;
      std::printf("%s\n", castor::data::run_tokenize(castor::train::parse_tokenize_flags(args)).dump().c_str());
    } else if (cmd == "sample") {
      if (wants_help(args)) return std::fputs(castor::train::sample_help().c_str(), stdout), 0;
      castor::train::run_sample(
          castor::train::parse_sample_flags(args),
          [](std::string_view text) {
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
          },
          [](std::string& line) { return static_cast<bool>(std::getline(std::cin, line)); });
      std::fputs("\n", stdout);
    } else if (cmd == "export") {
      if (wants_help(args)) return std::fputs(castor::train::export_help().c_str(), stdout), 0;
      std::printf("%s\n", castor::train::run_export(castor::train::parse_export_flags(args)).dump().c_str());
    } else if (cmd == "info") {
      if (wants_help(args)) return std::fputs(castor::train::info_help().c_str(), stdout), 0;
      std::fputs(castor::train::run_info(args).c_str(), stdout);
    } else if (cmd == "env") {
      std::fputs(castor::train::run_env().c_str(), stdout);
    } else if (cmd == "completion") {
      std::fprintf(stderr, "castor completion: expected bash or zsh\n");
      return 2;
    } else {
      std::fprintf(stderr, "castor: unknown command '%s'\n%s", cmd.c_str(), kUsage);
      return 2;
    }
  } catch (const castor::Error& e) {
    std::fprintf(stderr, "castor %s: error: %s\n", cmd.c_str(), castor::printable(e.what()).c_str());
    return fail(1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "castor %s: error: out of memory\n", cmd.c_str());
    return fail(1);
  } catch (const std::exception& e) {
    // Not expected (every user error is a castor::Error), but still one line and a non-zero exit.
    std::fprintf(stderr, "castor %s: error: internal: %s\n", cmd.c_str(), castor::printable(e.what()).c_str());
    return fail(1);
  }
  return 0;
}
