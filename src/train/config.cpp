// Parsing and validating `castor train` flags.
#include <functional>
#include <map>
#include <sstream>

#include "castor/check.h"
#include "castor/train_config.h"

namespace castor::train {

namespace {

double parse_number(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  CASTOR_CHECK(used == v.size() && !v.empty(), flag, ": expected a number, got '", v, "'");
  return d;
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  const double d = parse_number(flag, v);
  CASTOR_CHECK(d == static_cast<double>(static_cast<int64_t>(d)), flag, ": expected an integer, got '", v, "'");
  CASTOR_CHECK(d >= static_cast<double>(min), flag, ": must be at least ", min, ", got ", v);
  return static_cast<int64_t>(d);
}

std::string one_of(const std::string& flag, const std::string& v, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (v == c) return v;
    list += (list.empty() ? "" : "|") + std::string(c);
  }
  throw Error(detail::cat(flag, ": expected ", list, ", got '", v, "'"));
}

}  // namespace

TrainConfig parse_train_flags(const std::vector<std::string>& args) {
  TrainConfig c;
  using Setter = std::function<void(const std::string&)>;
  const std::map<std::string, Setter> valued = {
      {"--data", [&](const std::string& v) { c.data = one_of("--data", v, {"fashion-mnist", "cifar10", "synthetic"}); }},
      {"--data-dir", [&](const std::string& v) { c.data_dir = v; }},
      {"--model", [&](const std::string& v) { c.model = one_of("--model", v, {"simplecnn", "resnet18", "resnet9"}); }},
      {"--amp", [&](const std::string& v) { c.amp = one_of("--amp", v, {"O0", "O1", "O2", "O3"}); }},
      {"--dtype",
       [&](const std::string& v) {
         c.dtype = one_of("--dtype", v, {"bf16", "fp16"}) == "bf16" ? DType::BFloat16 : DType::Float16;
       }},
      {"--optimizer", [&](const std::string& v) { c.optimizer = one_of("--optimizer", v, {"sgd", "adam", "adamw"}); }},
      {"--lr",
       [&](const std::string& v) {
         c.lr = parse_number("--lr", v);
         CASTOR_CHECK(c.lr > 0, "--lr: must be positive, got ", v);
       }},
      {"--momentum",
       [&](const std::string& v) {
         c.momentum = parse_number("--momentum", v);
         CASTOR_CHECK(c.momentum >= 0 && c.momentum < 1, "--momentum: must be in [0, 1), got ", v);
       }},
      {"--weight-decay",
       [&](const std::string& v) {
         c.weight_decay = parse_number("--weight-decay", v);
         CASTOR_CHECK(c.weight_decay >= 0, "--weight-decay: must be non-negative, got ", v);
       }},
      {"--schedule",
       [&](const std::string& v) { c.schedule = one_of("--schedule", v, {"none", "step", "cosine", "onecycle"}); }},
      {"--batch-size", [&](const std::string& v) { c.batch_size = parse_int("--batch-size", v, 1); }},
      {"--epochs", [&](const std::string& v) { c.epochs = parse_int("--epochs", v, 1); }},
      {"--steps", [&](const std::string& v) { c.steps = parse_int("--steps", v, 1); }},
      {"--augment", [&](const std::string& v) { c.augment = one_of("--augment", v, {"none", "standard"}); }},
      {"--seed", [&](const std::string& v) { c.seed = static_cast<uint64_t>(parse_int("--seed", v, 0)); }},
      {"--threads", [&](const std::string& v) { c.threads = static_cast<int>(parse_int("--threads", v, 0)); }},
      {"--out", [&](const std::string& v) { c.out = v; }},
      {"--resume", [&](const std::string& v) { c.resume = v; }},
      {"--init", [&](const std::string& v) { c.init = v; }},
      {"--checkpoint-every", [&](const std::string& v) { c.checkpoint_every = parse_int("--checkpoint-every", v, 0); }},
      {"--keep", [&](const std::string& v) { c.keep = parse_int("--keep", v, 1); }},
      {"--log-every", [&](const std::string& v) { c.log_every = parse_int("--log-every", v, 1); }},
      {"--synthetic-size", [&](const std::string& v) { c.synthetic_size = parse_int("--synthetic-size", v, 1); }},
  };
  const std::map<std::string, std::function<void()>> switches = {
      {"--deterministic", [&] { c.deterministic = true; }},
      {"--profile", [&] { c.profile = true; }},
      {"--stochastic-rounding", [&] { c.stochastic_rounding = true; }},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (auto s = switches.find(flag); s != switches.end()) {
      CASTOR_CHECK(!inline_value, flag, ": takes no value");
      s->second();
      continue;
    }
    auto v = valued.find(flag);
    CASTOR_CHECK(v != valued.end(), "unknown flag '", flag, "' (see castor train --help)");
    if (!inline_value) {
      CASTOR_CHECK(i + 1 < args.size(), flag, ": missing value");
      value = args[++i];
    }
    v->second(value);
  }
  CASTOR_CHECK(!c.stochastic_rounding || c.amp == "O3", "--stochastic-rounding: needs --amp O3 (pure 16-bit)");
  return c;
}

std::string train_help() {
  return R"(usage: castor train [flags]
Trains an image classifier with mixed precision. `castor train` alone trains SimpleCNN on Fashion-MNIST
(Debian's dataset-fashion-mnist) for one epoch with O1 bfloat16 autocast and Adam.

  --data fashion-mnist|cifar10|synthetic   dataset (default fashion-mnist)
  --data-dir DIR          dataset directory (default /usr/share/datasets/fashion-mnist, or ./cifar-10-batches-bin)
  --model simplecnn|resnet18|resnet9       model (default simplecnn)
  --amp O0|O1|O2|O3       opt level: O0 float32, O1 autocast + dynamic loss scaling, O2 16-bit model with
                          float32 master weights (BatchNorm float32), O3 pure 16-bit (default O1)
  --dtype bf16|fp16       the 16-bit type (default bf16)
  --stochastic-rounding   O3 only: round optimizer updates stochastically (pure-bf16 training)
  --optimizer sgd|adam|adamw  (default adam)   --lr X (1e-3)   --momentum X (0.9, sgd)   --weight-decay X (0)
  --schedule none|step|cosine|onecycle     learning-rate schedule (default none)
  --batch-size N (64)     --epochs N (1)      --steps N (stop after N steps)
  --augment none|standard random crop (pad 4) and horizontal flip (default none)
  --seed N (0)            --threads N (all cores)    --deterministic (bit-exact resume)
  --out DIR (runs/latest) --resume DIR        --init FILE.safetensors (PyTorch names and layouts)
  --checkpoint-every N    steps between checkpoints (default: each epoch end)   --keep K (2)
  --log-every N (50)      --synthetic-size N (2048)   --profile (top ops by time, with dtypes)
)";
}

}  // namespace castor::train
