// The resolved settings of a `castor train` run, parsed from command-line flags and validated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "castor/dtype.h"

namespace castor::train {

struct TrainConfig {
  std::string data = "fashion-mnist";  // fashion-mnist | cifar10 | synthetic
  std::string data_dir;                // default: the dataset's Debian location
  std::string model = "simplecnn";     // simplecnn | resnet18 | resnet9
  std::string amp = "O1";              // O0 | O1 | O2 | O3
  DType dtype = DType::BFloat16;       // the 16-bit type of O1-O3
  bool stochastic_rounding = false;    // O3: round optimizer updates stochastically
  std::string optimizer = "adam";      // sgd | adam | adamw
  double lr = 1e-3;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string schedule = "none";       // none | step | cosine | onecycle
  int64_t batch_size = 64;
  int64_t epochs = 1;
  int64_t steps = 0;                   // > 0: stop after this many steps (overrides epochs)
  std::string augment = "none";        // none | standard
  uint64_t seed = 0;
  int threads = 0;                     // 0: all cores
  bool deterministic = false;
  std::string out = "runs/latest";
  std::string resume;                  // a run directory to continue from
  std::string init;                    // a safetensors file of initial weights (PyTorch names)
  int64_t checkpoint_every = 0;        // steps; 0: at each epoch end
  int64_t keep = 2;                    // checkpoints kept
  int64_t log_every = 50;              // steps between metric lines
  int64_t synthetic_size = 2048;       // training images of --data synthetic
  bool profile = false;
};

// Parses `castor train` flags (argv after the subcommand). Throws castor::Error naming the flag and problem.
TrainConfig parse_train_flags(const std::vector<std::string>& args);
std::string train_help();

}  // namespace castor::train
