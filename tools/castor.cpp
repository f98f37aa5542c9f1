// The `castor` command: train, eval and info subcommands (the work lives in src/train).
#include <cstdio>
#include <string>
#include <vector>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/trainer.h"
#include "castor/version.h"

namespace {

const char* kUsage = R"(usage: castor <command> [flags]   (castor --version prints the version)
  train   train an image classifier with mixed precision (castor train --help)
  eval    test-set accuracy and loss of a checkpoint or of PyTorch weights (castor eval --help)
  info    tensors, dtypes, shapes, parameter counts and metadata of a checkpoint (castor info --help)
  completion bash   a bash completion script (source it, or save it under /etc/bash_completion.d/)
)";

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "--help" || all[0] == "-h") {
    std::fputs(kUsage, all.empty() ? stderr : stdout);
    return all.empty() ? 2 : 0;
  }
  if (all[0] == "--version") return std::printf("castor %s\n", CASTOR_VERSION), 0;
  if (all[0] == "completion" && all.size() == 2 && all[1] == "bash")
    return std::fputs(castor::train::bash_completion().c_str(), stdout), 0;
  const std::string cmd = all[0];
  const std::vector<std::string> args(all.begin() + 1, all.end());
  try {
    if (cmd == "train") {
      if (wants_help(args)) return std::fputs(castor::train::train_help().c_str(), stdout), 0;
      castor::train::install_interrupt_handlers();
      const castor::Json summary = castor::train::run_train(castor::train::parse_train_flags(args));
      std::printf("%s\n", summary.dump().c_str());
      // Interrupted: checkpointed and stopped; the status says by what, as if the signal had ended it.
      if (const castor::Json* sig = summary.find("interrupted_by_signal")) return 128 + static_cast<int>(sig->as_int());
    } else if (cmd == "eval") {
      if (wants_help(args)) return std::fputs(castor::train::eval_help().c_str(), stdout), 0;
      std::printf("%s\n", castor::train::run_eval(castor::train::parse_eval_flags(args)).dump().c_str());
    } else if (cmd == "info") {
      if (wants_help(args)) return std::fputs(castor::train::info_help().c_str(), stdout), 0;
      std::fputs(castor::train::run_info(args).c_str(), stdout);
    } else {
      std::fprintf(stderr, "castor: unknown command '%s'\n%s", cmd.c_str(), kUsage);
      return 2;
    }
  } catch (const castor::Error& e) {
    std::fprintf(stderr, "castor %s: error: %s\n", cmd.c_str(), castor::printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "castor %s: error: out of memory\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    // Not expected (every user error is a castor::Error), but still one line and a non-zero exit.
    std::fprintf(stderr, "castor %s: error: internal: %s\n", cmd.c_str(), castor::printable(e.what()).c_str());
    return 1;
  }
  return 0;
}
