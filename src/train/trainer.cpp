// The training job: data, model, optimizer, opt level, the loop, metrics, checkpoints, exact resume.
#include "castor/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "castor/allocator.h"
#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/checkpoint.h"
#include "castor/corpus.h"
#include "castor/data.h"
#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/explain.h"
#include "castor/fs.h"
#include "castor/functional.h"
#include "castor/llmc.h"
#include "castor/lm_batch.h"
#include "castor/lr_scheduler.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/report.h"
#include "castor/safetensors.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "castor/version.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/progress.h"
#include "train/run_log.h"

namespace castor::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kStateVersion = 1;

struct Datasets {
  ImageDataset train, test;
  data::Normalization norm;
  std::vector<std::string> classes;  // label i's name
};

// The class names of the built-in datasets (their documentation's order).
std::vector<std::string> builtin_classes(Dataset data) {
  if (data == Dataset::FashionMnist)
    return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  if (data == Dataset::Cifar10)
    return {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) names.push_back("class " + std::to_string(i));
  return names;
}

// --data folder: DIR/train, and DIR/val or a --val-split share of DIR/train held out (the same one for a seed).
void load_folder(const TrainConfig& c, const std::string& dir, Datasets& d) {
  ImageFolderOptions o{.image_size = c.image_size, .skip_bad_images = c.skip_bad_images,
                       .cache_bytes = c.image_cache_mb < 0 ? -1 : c.image_cache_mb << 20};
  ImageFolder train = load_image_folder(dir + "/train", o);
  d.classes = train.classes;
  int64_t skipped = train.skipped;
  std::error_code ec;
  if (fs::is_directory(dir + "/val", ec)) {
    o.classes = train.classes;
    ImageFolder val = load_image_folder(dir + "/val", o);
    skipped += val.skipped;
    d.train = std::move(train.data);
    d.test = std::move(val.data);
  } else {
    const ImageDataset& all = train.data;
    const int64_t n_val = std::llround(static_cast<double>(all.n) * c.val_split);
    CASTOR_CHECK(n_val > 0 && n_val < all.n, "--data-dir ", dir, ": no val/ folder, and --val-split ", c.val_split,
                 " of ", all.n, " training images leaves no test or no training images");
    Generator gen(c.seed * 0x9e3779b97f4a7c15ull + 11);
    std::vector<int64_t> order(all.n);
    for (int64_t i = 0; i < all.n; ++i) order[i] = i;
    for (int64_t i = all.n - 1; i > 0; --i) std::swap(order[i], order[gen.next_u64() % (i + 1)]);
    std::vector<bool> held(all.n, false);
    for (int64_t i = 0; i < n_val; ++i) held[order[i]] = true;
    const int64_t sz = all.channels * all.height * all.width;
    for (ImageDataset* part : {&d.train, &d.test}) *part = {0, all.channels, all.height, all.width, {}, {}, all.num_classes};
    auto train_index = std::make_shared<std::vector<int64_t>>(), test_index = std::make_shared<std::vector<int64_t>>();
    for (int64_t i = 0; i < all.n; ++i) {  // in file order within each part
      ImageDataset& part = held[i] ? d.test : d.train;
      if (all.load) (held[i] ? test_index : train_index)->push_back(i);
      else part.images.insert(part.images.end(), all.images.begin() + i * sz, all.images.begin() + (i + 1) * sz);
      part.labels.push_back(all.labels[i]);
      ++part.n;
    }
    if (all.load) {  // streamed (too large to cache): each part loads through the folder's indices
      d.train.load = [load = all.load, train_index](int64_t i, uint8_t* dst) { load((*train_index)[i], dst); };
      d.test.load = [load = all.load, test_index](int64_t i, uint8_t* dst) { load((*test_index)[i], dst); };
    }
  }
  if (skipped > 0 && dist::rank() == 0)
    std::fprintf(stderr, "note: %lld unreadable images left out (--skip-bad-images)\n", static_cast<long long>(skipped));
}

// The dataset directory: --data-dir, or the dataset's default location.
std::string data_dir(const TrainConfig& c) {
  if (!c.data_dir.empty()) return c.data_dir;
  if (c.data == Dataset::Brown) return "data/brown";
  if (c.data == Dataset::BrownChar) return "data/brown-char";
  return c.data == Dataset::Cifar10 ? "cifar-10-batches-bin" : "/usr/share/datasets/fashion-mnist";
}

Datasets load_data(const TrainConfig& c) {
  Datasets d;
  const std::string dir = data_dir(c);
  if (c.data == Dataset::FashionMnist) {
    d.train = load_fashion_mnist(dir, /*train=*/true);
    d.test = load_fashion_mnist(dir, /*train=*/false);
  } else if (c.data == Dataset::Cifar10) {
    d.train = load_cifar10(dir, /*train=*/true);
    d.test = load_cifar10(dir, /*train=*/false);
  } else if (c.data == Dataset::Folder) {
    CASTOR_CHECK(!c.data_dir.empty(), "--data folder: needs --data-dir DIR holding DIR/train/<class>/*.png|jpg (and "
                 "optionally DIR/val/<class>/...)");
    load_folder(c, dir, d);
  } else {
    // One draw split in two, so train and test share the class patterns.
    const int64_t n_test = std::max<int64_t>(c.synthetic_size / 4, 1);
    ImageDataset all = data::make_synthetic(c.synthetic_size + n_test, 3, 32, 32, 10, c.seed + 7);
    const int64_t sz = 3 * 32 * 32;
    d.train = {c.synthetic_size, 3, 32, 32, {}, {}, 10};
    d.test = {n_test, 3, 32, 32, {}, {}, 10};
    d.train.images.assign(all.images.begin(), all.images.begin() + c.synthetic_size * sz);
    d.train.labels.assign(all.labels.begin(), all.labels.begin() + c.synthetic_size);
    d.test.images.assign(all.images.begin() + c.synthetic_size * sz, all.images.end());
    d.test.labels.assign(all.labels.begin() + c.synthetic_size, all.labels.end());
  }
  const std::string source = c.data == Dataset::Synthetic ? std::string("--synthetic-size") : "--data-dir " + dir;
  CASTOR_CHECK(d.train.n > 0, source, ": the training set is empty");
  CASTOR_CHECK(d.test.n > 0, source, ": the test set is empty");
  d.norm = data::compute_normalization(d.train);
  if (d.classes.empty()) d.classes = builtin_classes(c.data);
  return d;
}

struct Evaluation {
  double loss = 0, accuracy = 0;   // mean loss per image or token; top-1 accuracy
  std::vector<int64_t> confusion;  // images: (K, K), row = true class, column = predicted class
};

Evaluation evaluate(nn::Module& model, const amp::Amp& amp, const ImageDataset& ds, const data::Normalization& norm,
                    int64_t batch_size);

// One micro-batch: the model's input, the targets, its number in the epoch and how many examples (images or
// tokens, of this rank) it holds.
struct Batch {
  Tensor input, target;
  int64_t index = 0;
  double examples = 0;
};

// What a run learns from: its batches, its model, its evaluation and what config.json records of its data. An image
// classification task (ImageTask) or a language-model task (LmTask).
class Task {
 public:
  virtual ~Task() = default;
  virtual int64_t batches_per_epoch() const = 0;
  virtual void start_epoch(int64_t epoch, int64_t batch) = 0;
  virtual std::optional<Batch> next() = 0;  // none at the end of the epoch
  virtual nn::ModulePtr make_model(const TrainConfig& c) const = 0;
  virtual Evaluation evaluate(nn::Module& model, const amp::Amp& amp, int64_t batch_size) const = 0;
  virtual void record(Json& config) const = 0;
  // Per-class results for the report and castor eval (null when the task has no classes).
  virtual Json by_class(const Evaluation& ev) const = 0;
  virtual const char* unit() const = 0;  // of examples/s: "img" or "tok"
  // --init's weights for the model (a safetensors file with PyTorch's names; a GPT also llm.c's format).
  virtual StateDict init_weights(const std::string& path) const { return load_safetensors(path).tensors; }
};

Json by_class(const std::vector<std::string>& names, const std::vector<int64_t>& confusion);

class ImageTask : public Task {
 public:
  ImageTask(const TrainConfig& c, int rank, int world) : d_(load_data(c)) {
    CASTOR_CHECK(d_.train.n >= c.batch_size * world, "--batch-size ", c.batch_size, (world > 1 ? " x " : ""),
                 (world > 1 ? std::to_string(world) + " ranks" : std::string()), " is larger than the ", d_.train.n,
                 " training images");
    // Each rank takes its contiguous shard of the global batch a single process with batch x ranks would see.
    data::LoaderOptions lo{.batch_size = c.batch_size * world, .shuffle = true,
                           .augment = c.augment == Augment::Standard, .drop_last = true, .seed = c.seed,
                           .norm = d_.norm, .shard = rank, .num_shards = world};
    loader_.emplace(d_.train, lo);
  }
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t batch) override { loader_->start_epoch(epoch, batch); }
  std::optional<Batch> next() override {
    auto b = loader_->next();
    if (!b) return std::nullopt;
    return Batch{b->images, b->labels, b->index, static_cast<double>(b->labels.numel())};
  }
  nn::ModulePtr make_model(const TrainConfig& c) const override {
    return models::make_model(name(c.model), d_.train.channels, d_.train.height, d_.train.width, d_.train.num_classes);
  }
  Evaluation evaluate(nn::Module& model, const amp::Amp& amp, int64_t batch_size) const override {
    return train::evaluate(model, amp, d_.test, d_.norm, batch_size);
  }
  void record(Json& o) const override {
    Json::Array mean, std;
    for (double v : d_.norm.mean) mean.push_back(v);
    for (double v : d_.norm.std) std.push_back(v);
    o["normalization"] = Json::Object{{"mean", mean}, {"std", std}};
    o["input_shape"] = Json::Array{d_.train.channels, d_.train.height, d_.train.width};
    o["num_classes"] = d_.train.num_classes;
    Json::Array classes;
    for (const std::string& n : d_.classes) classes.push_back(n);
    o["class_names"] = classes;
  }
  Json by_class(const Evaluation& ev) const override { return train::by_class(d_.classes, ev.confusion); }
  const char* unit() const override { return "img"; }
  const Datasets& datasets() const { return d_; }

 private:
  Datasets d_;
  std::optional<data::DataLoader> loader_;
};

// The vocabulary a GPT needs for the tokens in `dir`: --vocab-size, else the tokenizer's recorded beside them, padded to
// a multiple of 64 above 1024 (GPT-2's 50,257 -> 50,304, as nanoGPT and llm.c). Returns (padded, real).
std::pair<int64_t, int64_t> vocabulary(const TrainConfig& c, const std::string& dir) {
  const std::string record = dir + "/tokenizer.json";
  const int64_t real = fs::exists(record) ? data::Tokenizer::recorded_vocab_size(dir) : 0;
  CASTOR_CHECK(real > 0 || c.vocab_size > 0, "--vocab-size: not given, and ", record,
               " (written by castor tokenize) is missing");
  const int64_t padded = c.vocab_size > 0 ? c.vocab_size : real > 1024 ? (real + 63) / 64 * 64 : real;
  CASTOR_CHECK(real <= padded, "--vocab-size ", padded, ": smaller than the tokenizer's ", real, " (", record, ")");
  return {padded, real > 0 ? real : padded};
}

// --data brown | brown-char | tokens: DIR/train.bin and DIR/val.bin (llm.c's token files), batches of (B, T) windows.
class LmTask : public Task {
 public:
  // Resolves c.vocab_size (recorded, so a resumed run builds the same model); a new run with --init takes the
  // model's sizes from that file (llm.c's gpt2_124M.bin or nanoGPT-named safetensors).
  LmTask(TrainConfig& c, int rank, int world, bool new_run) : dir_(data_dir(c)) {
    if (new_run && !c.init.empty()) take_init_sizes(c);
    CASTOR_CHECK(c.data != Dataset::Tokens || !c.data_dir.empty(), "--data tokens: needs --data-dir DIR holding "
                 "train.bin and val.bin (castor tokenize writes them)");
    CASTOR_CHECK(fs::exists(dir_ + "/train.bin") || c.data == Dataset::Tokens, "--data ", name(c.data), ": ", dir_,
                 "/train.bin is missing; ./scripts/setup.sh prepares the Brown corpus there (or give --data-dir)");
    train_.emplace(dir_ + "/train.bin");
    val_.emplace(dir_ + "/val.bin");
    std::tie(c.vocab_size, real_vocab_) = vocabulary(c, dir_);
    config_ = gpt_config(c, real_vocab_);
    // Everything the data can get wrong is found here, before step 1: token files of another tokenize than the
    // vocabulary, a split too short for one window, ids outside the vocabulary (all of them up to 2^31 tokens).
    if (fs::exists(dir_ + "/tokenizer.json")) data::check_token_folder(dir_, *train_, *val_);
    for (const data::TokenFile* f : {&*train_, &*val_}) {
      CASTOR_CHECK(f->size() >= c.block_size + 1, f->path(), ": ", f->size(), " tokens, fewer than one window of "
                   "--block-size ", c.block_size, " + 1 (give a smaller --block-size, or more text to castor tokenize)");
      const std::span<const uint16_t> ids = f->tokens().subspan(0, std::min<size_t>(f->tokens().size(), size_t{1} << 31));
      if (*std::max_element(ids.begin(), ids.end()) < real_vocab_) continue;
      const auto bad = std::find_if(ids.begin(), ids.end(), [&](uint16_t t) { return t >= real_vocab_; });
      throw Error(detail::cat(f->path(), ": token ", *bad, " at position ", bad - ids.begin(),
                              " is outside the vocabulary of ", real_vocab_,
                              fs::exists(dir_ + "/tokenizer.json") ? " (" + dir_ + "/tokenizer.json)" : " (--vocab-size)"));
    }
    source_.emplace(*train_, data::LmBatchOptions{.batch_size = c.batch_size, .block_size = c.block_size,
                                                   .sequential = c.data_order == DataOrder::Sequential,
                                                   .seed = c.seed, .rank = rank, .num_ranks = world});
    per_epoch_ = source_->batches_per_epoch();
  }
  static models::GPTConfig gpt_config(const TrainConfig& c, int64_t real_vocab) {
    models::GPTConfig g;
    g.n_layer = c.n_layer, g.n_head = c.n_head, g.n_embd = c.n_embd, g.block_size = c.block_size;
    g.vocab_size = c.vocab_size, g.real_vocab_size = real_vocab, g.dropout = c.dropout, g.bias = c.bias;
    return g;
  }
  int64_t batches_per_epoch() const override { return per_epoch_; }
  void start_epoch(int64_t epoch, int64_t batch) override {
    epoch_ = epoch;
    source_->set_state({epoch * per_epoch_ + batch});
  }
  std::optional<Batch> next() override {
    const int64_t i = source_->state().next_batch - epoch_ * per_epoch_;
    if (i >= per_epoch_) return std::nullopt;
    data::LmBatch b = source_->next();
    return Batch{b.x, b.y, i, static_cast<double>(b.x.numel())};
  }
  nn::ModulePtr make_model(const TrainConfig& c) const override { return models::gpt(config_, c.seed + 1337); }
  // Mean loss and next-token accuracy over the whole validation split (rows of T tokens, each once).
  Evaluation evaluate(nn::Module& model, const amp::Amp& amp, int64_t batch_size) const override {
    model.eval();
    NoGradGuard no_grad;
    const int64_t T = config_.block_size, n = data::eval_batch_count(*val_, batch_size, T);
    const int world = dist::world_size();
    std::vector<double> sums(3, 0.0);  // loss sum, correct, tokens
    for (int64_t i = dist::rank(); i < n; i += world) {
      const data::LmBatch b = data::eval_batch(*val_, batch_size, T, i);
      Tensor logits;
      {
        auto fw = amp.forward();
        logits = model(b.x);
      }
      const Tensor flat = logits.reshape({-1, logits.size(-1)}), target = b.y.reshape({-1});
      sums[0] += F::cross_entropy(flat, target, F::Reduction::Sum).item();
      const auto predicted = argmax(flat, 1).to_vector<int64_t>(), truth = target.to_vector<int64_t>();
      for (size_t k = 0; k < truth.size(); ++k) sums[1] += predicted[k] == truth[k];
      sums[2] += static_cast<double>(truth.size());
    }
    model.train();
    if (world > 1) {
      Tensor t = tensor(sums, {3}, DType::Float64);
      dist::all_reduce(t);
      sums = t.to_vector<double>();
    }
    CASTOR_CHECK(sums[2] > 0, val_->path(), ": no whole window of ", T + 1, " tokens to evaluate on");
    return {sums[0] / sums[2], sums[1] / sums[2], {}};
  }
  void record(Json& o) const override {
    o["vocab_size"] = config_.vocab_size;
    o["real_vocab_size"] = config_.real_vocab_size;
    o["train_tokens"] = train_->size();
    o["val_tokens"] = val_->size();
  }
  Json by_class(const Evaluation&) const override { return Json(); }
  const char* unit() const override { return "tok"; }
  StateDict init_weights(const std::string& path) const override {
    return init_ ? init_->state : models::load_gpt_init(path).state;
  }

 private:
  // The sizes of --init's model; a size flag given with another value is an error naming both.
  void take_init_sizes(TrainConfig& c) {
    try {
      init_ = models::load_gpt_init(c.init, given(c, "--n-head") ? c.n_head : 0);
    } catch (const Error& e) {
      const std::string msg = e.what();
      throw Error(msg.rfind(c.init, 0) == 0 ? "--init " + msg : detail::cat("--init ", c.init, ": ", msg));
    }
    const models::GPTConfig& g = init_->config;
    auto take = [&](const char* flag, int64_t& field, int64_t value) {
      CASTOR_CHECK(!given(c, flag) || field == value, flag, " ", field, ": --init ", c.init, " holds ", value);
      field = value;
    };
    take("--n-layer", c.n_layer, g.n_layer);
    take("--n-head", c.n_head, g.n_head);
    take("--n-embd", c.n_embd, g.n_embd);
    take("--block-size", c.block_size, g.block_size);
    take("--vocab-size", c.vocab_size, g.vocab_size);
    CASTOR_CHECK(!given(c, "--bias") || c.bias == g.bias, "--bias: --init ", c.init, g.bias ? " has" : " has no",
                 " biases");
    c.bias = g.bias;
  }
  static bool given(const TrainConfig& c, const char* flag) {
    return std::find(c.given.begin(), c.given.end(), flag) != c.given.end();
  }

  std::optional<models::GPTWeights> init_;
  std::string dir_;
  std::optional<data::TokenFile> train_, val_;
  std::optional<data::LmBatchSource> source_;
  models::GPTConfig config_;
  int64_t real_vocab_ = 0, per_epoch_ = 0, epoch_ = 0;
};

// MFU's two terms for a language model: model FLOPs per trained token (nanoGPT's estimate_mfu: 6 N + 12 L C T, N
// without the position embeddings) and the GEMM peak in the dtype the GEMMs run in; none for image models.
FlopRate flop_rate(const TrainConfig& c, const nn::Module& model) {
  if (!is_language_model(c.model)) return {};
  double n = 0;
  for (const auto& [name, p] : model.named_parameters())
    if (name != "transformer.wpe.weight") n += static_cast<double>(p.numel());
  const double per_token = 6 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * c.block_size);
  const DType dtype = c.amp == amp::OptLevel::O0 ? DType::Float32 : c.dtype;
  const FlopRate r{per_token, gemm_peak(dtype)};
  if (dist::rank() == 0)
    std::fprintf(stderr, "model: %.2fM parameters, %.3g FLOP per token; MFU against a measured %s GEMM peak of %.0f "
                 "GFLOP/s\n", n / 1e6, per_token, dtype_name(dtype), r.peak / 1e9);
  return r;
}

// `new_run`: a run that starts now (not a resume or an evaluation), which reads --init.
std::unique_ptr<Task> make_task(TrainConfig& c, int rank, int world, bool new_run) {
  if (is_language_model(c.model)) return std::make_unique<LmTask>(c, rank, world, new_run);
  return std::make_unique<ImageTask>(c, rank, world);
}

// "2026-11-25T14:05:09Z".
std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// What ran: Castor's version and commit, the host CPU and its ISA (config.json, summary.json, the report's header).
Json build_json() {
  return Json::Object{{"castor_version", CASTOR_VERSION}, {"git_commit", git_commit()}, {"host_cpu", host_cpu()}};
}

// What config.json and every checkpoint record: the settings, the thread count used, the schedule's length
// and the data's shape and statistics.
Json config_json(const TrainConfig& c, const Task& task, int64_t schedule_steps) {
  Json o = settings_json(c);
  o["threads"] = omp_get_max_threads();
  o["nproc"] = dist::world_size();
  o["schedule_steps"] = schedule_steps;
  task.record(o);
  const Json build = build_json();
  for (const auto& [k, v] : build.as_object()) o[k] = v;
  o["started"] = utc_now();
  return o;
}

// The run's model, optimizer, opt level and scheduler, built from a config.
struct Run {
  nn::ModulePtr model;
  std::shared_ptr<nn::DistributedDataParallel> ddp;  // with more than one rank: wraps model
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  std::unique_ptr<optim::LRScheduler> sched;
};

// `load_init`: load --init's weights (a new run; a checkpoint's weights replace them, so resume and eval do not read
// the file, which may be gone by then).
Run build_run(const TrainConfig& c, const Task& task, int64_t total_steps, bool load_init) {
  Run r;
  manual_seed(c.seed);
  r.model = task.make_model(c);
  if (!c.init.empty() && load_init) {
    try {
      r.model->load_state_dict(task.init_weights(c.init), /*strict=*/true);
    } catch (const Error& e) {
      const std::string msg = e.what();  // names the file when reading it failed; name the flag too
      throw Error(msg.rfind(c.init, 0) == 0 ? "--init " + msg : detail::cat("--init ", c.init, ": ", msg));
    }
  }
  // Every rank starts from rank 0's weights; the wrapper is made before amp::initialize (which changes the
  // parameters in place), so O2/O3 masters copy the broadcast values.
  if (dist::world_size() > 1) {
    if (c.sync_batchnorm) nn::convert_sync_batchnorm(*r.model);
    nn::DDPOptions o;
    if (c.compress_grads != Compression::None)
      o.compression = c.compress_grads == Compression::BFloat16 ? DType::BFloat16 : DType::Float16;
    r.ddp = std::make_shared<nn::DistributedDataParallel>(r.model, o);
  }
  const std::vector<Tensor> params = r.model->parameters();
  if (c.optimizer == OptimizerKind::Sgd) {
    r.opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum,
                                                                   .weight_decay = c.weight_decay});
  } else if (is_language_model(c.model)) {
    // nanoGPT's configure_optimizers: weight decay on the 2-D tensors (matrices, embeddings) only.
    std::vector<Tensor> decay, no_decay;
    for (const Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    optim::AdamOptions o{.lr = c.lr, .beta2 = c.beta2, .weight_decay = c.weight_decay};
    r.opt = c.optimizer == OptimizerKind::Adam ? std::make_unique<optim::Adam>(decay, o) : optim::make_adamw(decay, o);
    if (!no_decay.empty()) r.opt->add_param_group(no_decay, c.lr, /*weight_decay=*/0.0);
  } else {
    optim::AdamOptions o{.lr = c.lr, .beta2 = c.beta2, .weight_decay = c.weight_decay};
    r.opt = c.optimizer == OptimizerKind::Adam ? std::make_unique<optim::Adam>(params, o) : optim::make_adamw(params, o);
  }
  amp::Overrides ov;
  if (c.loss_scale) ov.loss_scale = Json(*c.loss_scale).dump();
  if (c.stochastic_rounding) {
    ov.rounding = optim::Rounding::Stochastic;
    ov.rounding_seed = c.seed;
  }
  r.amp = amp::initialize(*r.model, {r.opt.get()}, c.amp, c.dtype, ov);
  if (c.schedule == Schedule::Step)
    r.sched = std::make_unique<optim::StepLR>(*r.opt, std::max<int64_t>(total_steps / 3, 1), 0.1);
  else if (c.schedule == Schedule::Cosine)
    r.sched = std::make_unique<optim::CosineAnnealingLR>(*r.opt, total_steps);
  else if (c.schedule == Schedule::WarmupCosine)
    r.sched = std::make_unique<optim::WarmupCosineLR>(*r.opt, c.warmup_steps, total_steps, c.min_lr);
  else if (c.schedule == Schedule::OneCycle)
    r.sched = std::make_unique<optim::OneCycleLR>(*r.opt, optim::OneCycleLROptions{{c.lr}, total_steps});
  return r;
}

// Prefixes every key of `sd` into `out`.
void put(StateDict& out, const std::string& prefix, const StateDict& sd) {
  for (const auto& [k, v] : sd) out[prefix + k] = v;
}
StateDict take(const StateDict& in, const std::string& prefix) {
  StateDict out;
  for (const auto& [k, v] : in)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v;
  return out;
}

Tensor i64(int64_t v) { return scalar_tensor(static_cast<double>(v), DType::Int64); }

// Test loss, accuracy and confusion matrix; with several ranks each evaluates every world_size-th batch and the sums
// are all-reduced.
Evaluation evaluate(nn::Module& model, const amp::Amp& amp, const ImageDataset& ds, const data::Normalization& norm,
                    int64_t batch_size) {
  model.eval();
  NoGradGuard no_grad;
  data::DataLoader loader(ds, {.batch_size = batch_size, .shuffle = false, .norm = norm});
  const int64_t K = ds.num_classes;
  std::vector<double> sums(static_cast<size_t>(1 + K * K), 0.0);  // loss sum, then the confusion counts
  const int world = dist::world_size();
  for (int64_t i = dist::rank(); i < loader.batches_per_epoch(); i += world) {
    data::Batch b = loader.make_batch(0, i);
    Tensor logits;
    {
      auto fw = amp.forward();
      logits = model(b.images);  // at O2/O3 the patched forward casts the input
    }
    sums[0] += F::cross_entropy(logits.float_(), b.labels, F::Reduction::Sum).item();
    const std::vector<int64_t> predicted = argmax(logits, 1).to_vector<int64_t>(), truth = b.labels.to_vector<int64_t>();
    for (size_t k = 0; k < truth.size(); ++k) sums[static_cast<size_t>(1 + truth[k] * K + predicted[k])] += 1;
  }
  model.train();
  if (world > 1) {
    Tensor t = tensor(sums, {static_cast<int64_t>(sums.size())}, DType::Float64);
    dist::all_reduce(t);
    sums = t.to_vector<double>();
  }
  Evaluation ev;
  int64_t correct = 0;
  for (int64_t k = 0; k < K * K; ++k) {
    ev.confusion.push_back(static_cast<int64_t>(sums[static_cast<size_t>(1 + k)]));
    if (k / K == k % K) correct += ev.confusion.back();
  }
  ev.loss = sums[0] / static_cast<double>(ds.n);
  ev.accuracy = static_cast<double>(correct) / static_cast<double>(ds.n);
  return ev;
}

// {"classes": [{"name", "accuracy", "images"}...], "confusion_matrix": rows of true classes} of an evaluation, as
// castor eval prints it and the report shows it.
Json by_class(const std::vector<std::string>& names, const std::vector<int64_t>& confusion) {
  Json::Array classes, matrix;
  const size_t K = names.size();
  for (size_t t = 0; t < K; ++t) {
    Json::Array row;
    int64_t images = 0;
    for (size_t p = 0; p < K; ++p) row.push_back(confusion[t * K + p]), images += confusion[t * K + p];
    matrix.push_back(row);
    classes.push_back(Json::Object{{"name", names[t]}, {"images", images},
                                   {"accuracy", images ? static_cast<double>(confusion[t * K + t]) / images : 0.0}});
  }
  return Json::Object{{"classes", classes}, {"confusion_matrix", matrix}};
}

// The explain rows with the module each op belongs to: the module whose parameters it used (conv1 for conv1.weight),
// for an op without parameters (relu, pooling) the module of the op before it ("(input)" before the first), and for
// an op run inside another (listed before it) the module of that op.
std::vector<amp::ExplainRow> with_modules(std::vector<amp::ExplainRow> rows, const nn::Module& model) {
  std::map<const TensorImpl*, std::string> owner;
  for (const auto& [name, t] : model.named_parameters()) {
    const size_t dot = name.rfind('.');
    owner[t.impl()] = dot == std::string::npos ? std::string("(model)") : name.substr(0, dot);
  }
  std::string current = "(input)";
  for (amp::ExplainRow& r : rows) {
    if (r.depth > 0) continue;
    for (const TensorImpl* in : r.inputs)
      if (auto it = owner.find(in); it != owner.end()) current = it->second;
    r.module = current;
  }
  std::string enclosing = current;
  for (size_t i = rows.size(); i-- > 0;) {
    if (rows[i].depth == 0) enclosing = rows[i].module;
    else rows[i].module = enclosing;
  }
  return rows;
}

// The first interrupting signal (0: none yet); set by the handler install_interrupt_handlers() puts in place.
std::atomic<int> g_interrupt{0};
// Whether the handler says what it does (rank 0 only: every rank of a job gets the signal).
std::atomic<bool> g_say_interrupt{true};

void on_interrupt(int sig) {
  int none = 0;
  if (!g_interrupt.compare_exchange_strong(none, sig)) _exit(128 + sig);  // the second one: stop at once
  static const char msg[] = "\ncastor: finishing this step to write a checkpoint (interrupt again to stop at once)\n";
  if (!g_say_interrupt.load()) return;
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

// Everything a checkpoint holds besides the model: precision and optimizer state, schedule, RNG and position.
struct TrainState {
  int64_t step = 0, epoch = 0, batch = 0;  // steps done; the epoch and batch within it that come next

  // The checkpoint of `run` at this position; `config` is the run's recorded settings.
  Checkpoint save(const Run& run, const Json& config) const {
    Checkpoint ck;
    ck.model = run.amp->model_state_dict();
    ck.model_meta = {{"format", "pt"}, {"castor.model", config.at("model").as_string()},
                     {"castor.config", config.dump()}};
    amp::PrecisionState ps = run.amp->precision_state();  // holds the optimizer's state too
    put(ck.state, "amp.", ps.tensors);
    for (const auto& [k, v] : ps.metadata) ck.state_meta["amp." + k] = v;
    if (run.sched) put(ck.state, "scheduler.", run.sched->state_dict());
    const Generator::State st = default_generator().state();
    Tensor rng = empty({static_cast<int64_t>(st.size())}, DType::Int64);
    for (size_t i = 0; i < st.size(); ++i) rng.data<int64_t>()[i] = static_cast<int64_t>(st[i]);
    ck.state["rng.default"] = rng;
    ck.state["progress.step"] = i64(step);
    ck.state["progress.epoch"] = i64(epoch);
    ck.state["progress.batch"] = i64(batch);
    ck.state_meta["config"] = config.dump();
    ck.state_meta["castor.train_state_version"] = std::to_string(kStateVersion);
    return ck;
  }

  // Validates `ck` (`what` names it) and restores it into `run`: every counter a finite integer consistent with
  // the others, `batches_per_epoch` and `grad_accum` batches per step, the RNG state whole; the model and
  // precision state check their shapes.
  static TrainState load(const Checkpoint& ck, Run& run, int64_t batches_per_epoch, int64_t grad_accum,
                         const std::string& what) {
    auto version = ck.state_meta.find("castor.train_state_version");
    CASTOR_CHECK(version != ck.state_meta.end() && version->second == std::to_string(kStateVersion), what,
                 ": the training state has version ",
                 version == ck.state_meta.end() ? std::string("none") : printable(version->second),
                 "; this build reads version ", kStateVersion);
    TrainState s;
    s.step = counter(ck, "progress.step", what);
    s.epoch = counter(ck, "progress.epoch", what);
    s.batch = counter(ck, "progress.batch", what);
    const int64_t steps_per_epoch = (batches_per_epoch + grad_accum - 1) / grad_accum;
    CASTOR_CHECK(s.batch <= batches_per_epoch && s.epoch <= s.step &&
                     s.step == s.epoch * steps_per_epoch + (s.batch + grad_accum - 1) / grad_accum,
                 what, ": the training state's position (step ", s.step, ", epoch ", s.epoch, ", batch ", s.batch,
                 ") is not one this run reaches with ", batches_per_epoch, " batches per epoch");
    auto rng = ck.state.find("rng.default");
    Generator::State st;
    CASTOR_CHECK(rng != ck.state.end() && rng->second.dtype() == DType::Int64 &&
                     rng->second.numel() == static_cast<int64_t>(st.size()),
                 what, ": the training state's rng.default is missing or not ", st.size(), " int64 words");
    try {
      run.model->load_state_dict(ck.model, /*strict=*/true);
      amp::PrecisionState ps{take(ck.state, "amp."), {}};
      for (const auto& [k, v] : ck.state_meta)
        if (k.rfind("amp.", 0) == 0) ps.metadata[k.substr(4)] = v;
      run.amp->load_precision_state(ps);
      if (run.sched) run.sched->load_state_dict(take(ck.state, "scheduler."));
    } catch (const std::out_of_range& e) {
      throw Error(detail::cat(what, ": the training state is incomplete (", e.what(), ")"));
    } catch (const Error& e) {
      throw Error(detail::cat(what, ": ", e.what()));
    }
    const std::vector<int64_t> words = rng->second.to_vector<int64_t>();
    for (size_t i = 0; i < st.size(); ++i) st[i] = static_cast<uint64_t>(words[i]);
    CASTOR_CHECK(st[0] | st[1] | st[2] | st[3], what, ": the training state's rng.default is all zero (no generator "
                 "reaches that state)");
    default_generator().set_state(st);
    return s;
  }

 private:
  // A non-negative integer counter of the state; NaN, fractions, negatives and wrong shapes are errors.
  static int64_t counter(const Checkpoint& ck, const std::string& key, const std::string& what) {
    auto it = ck.state.find(key);
    CASTOR_CHECK(it != ck.state.end() && it->second.numel() == 1, what, ": the training state has no ", key);
    const double v = it->second.to(DType::Float64).item();
    CASTOR_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9e15, what, ": the training state's ", key,
                 " is ", v, ", not a non-negative integer");
    return static_cast<int64_t>(v);
  }
};

// The run directory of `--resume PATH` (a run directory, or a checkpoint folder inside one) and the checkpoint
// to start from (a folder, or the run directory: its newest intact checkpoint).
std::pair<std::string, std::string> resolve_resume(const std::string& path) {
  if (!is_checkpoint_dir(path)) {
    std::error_code ec;
    CASTOR_CHECK(fs::is_directory(path, ec), "--resume ", path, ": not a run directory");
    return {path, path};
  }
  // (a trailing slash, as tab completion writes it, names the same folder)
  const fs::path folder = fs::path(absolute_path(path)).parent_path();
  CASTOR_CHECK(folder.filename() == "checkpoints", "--resume ", path,
               ": a checkpoint folder outside a run directory (expected RUN/checkpoints/step-N); start a new run "
               "from its weights with --init ",
               path, "/model.safetensors");
  return {folder.parent_path().string(), path};
}

// The files a run writes in its directory (besides its lock file and checkpoints).
constexpr const char* kRunFiles[] = {"config.json", "metrics.jsonl", "metrics.csv", "report.html", "summary.json"};

// The run directory of a new run without --out: runs/<date>-<time>-<model>-<precision>, a new one each time (as timm and
// Lightning do); every rank of a job takes rank 0's clock.
std::string default_out(const TrainConfig& c) {
  double now = static_cast<double>(std::time(nullptr));
  if (dist::world_size() > 1) {
    Tensor t = tensor({dist::rank() == 0 ? now : 0.0}, {1}, DType::Float64);
    dist::all_reduce(t);
    now = t.to_vector<double>()[0];
  }
  const std::time_t when = static_cast<std::time_t>(now);
  std::tm local{};
  localtime_r(&when, &local);
  char date[32];
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &local);
  const std::string base = detail::cat("runs/", date, "-", name(c.model), "-", precision_name(c));
  std::string out = base;
  std::error_code ec;
  for (int k = 2; dist::world_size() == 1 && fs::exists(out, ec); ++k) out = base + "-" + std::to_string(k);
  return out;
}

// Takes ownership of the run directory `c.out` for the run's lifetime: creates it, locks it, refuses (or with
// --overwrite clears) another run's files in a new run, removes stale temp folders, checks `checkpoints`.
// In a data-parallel job only rank 0 calls it (the other ranks write nothing).
std::unique_ptr<FileLock> own_run_dir(const TrainConfig& c, bool continuing) {
  std::error_code ec;
  fs::create_directories(c.out, ec);
  CASTOR_CHECK(!ec && fs::is_directory(c.out), "--out ", c.out, ": cannot create the directory: ",
               ec ? ec.message() : "not a directory");
  // A run's own files are never symbolic links: writing through one would replace whatever it points to.
  std::vector<std::string> own = {".castor.lock", "checkpoints", "checkpoints/HEAD"};
  own.insert(own.end(), std::begin(kRunFiles), std::end(kRunFiles));
  std::string links;
  for (const std::string& f : own)
    if (fs::is_symlink(c.out + "/" + f, ec)) links += (links.empty() ? "" : ", ") + f;
  CASTOR_CHECK(links.empty(), "--out ", c.out, ": symbolic links where a run writes its files (", links,
               "); a run directory's own files must not be links (remove them)");
  const bool castor_dir = fs::exists(c.out + "/.castor.lock", ec);
  auto lock = std::make_unique<FileLock>(c.out + "/.castor.lock");
  const std::string checkpoints = c.out + "/checkpoints";
  const bool has_metrics = fs::is_regular_file(c.out + "/metrics.jsonl", ec) && fs::file_size(c.out + "/metrics.jsonl", ec) > 0;
  if (!continuing && (latest_checkpoint(c.out) || has_metrics)) {
    CASTOR_CHECK(c.overwrite, "--out ", c.out,
                 " holds another run (checkpoints or metrics.jsonl); continue it with --resume ", c.out,
                 ", choose another --out, or pass --overwrite to replace it");
    fs::remove_all(c.out + "/checkpoints", ec);
    for (const char* f : kRunFiles) fs::remove_all(c.out + "/" + f, ec);
  } else if (!continuing && !castor_dir) {
    // Not a Castor run directory (no lock file ever made there): files a run writes belong to someone else.
    std::string foreign;
    for (const char* f : kRunFiles)
      if (fs::exists(c.out + "/" + f, ec)) foreign += (foreign.empty() ? "" : ", ") + std::string(f);
    CASTOR_CHECK(foreign.empty() || c.overwrite, "--out ", c.out, " is not a Castor run directory but holds ", foreign,
                 ", which a run would replace; choose another --out, or pass --overwrite to replace them");
    if (c.overwrite)
      for (const char* f : kRunFiles) fs::remove(c.out + "/" + f, ec);
  }
  remove_stale_temps(c.out);
  fs::create_directories(checkpoints, ec);
  CASTOR_CHECK(fs::is_directory(checkpoints) && access(checkpoints.c_str(), W_OK) == 0, "--out ", c.out, ": ",
               checkpoints, " is not a writable directory");
  return lock;
}

// What the schedule does past the step it was set up for, printed when a resumed run extends it.
void check_extension(const TrainConfig& c, int64_t schedule_steps, int64_t total_steps) {
  if (c.schedule == Schedule::None || total_steps <= schedule_steps) return;
  CASTOR_CHECK(c.schedule != Schedule::OneCycle, "--steps/--epochs: the onecycle schedule ends at step ", schedule_steps,
               " and cannot run past it; start a new run (--init from the last checkpoint) to train longer");
  std::fprintf(stderr, "note: the %s schedule was set for %lld steps and keeps it; past step %lld %s\n", name(c.schedule),
              static_cast<long long>(schedule_steps), static_cast<long long>(schedule_steps),
              c.schedule == Schedule::Cosine         ? "its cosine continues, so the learning rate rises again from its minimum"
              : c.schedule == Schedule::WarmupCosine ? "the learning rate stays at --min-lr (nanoGPT's get_lr)"
                                                     : "the learning rate keeps dropping 10x every third of that length");
}

// The training loop with its logging, checkpoints, divergence and interrupt checks.
class Trainer {
 public:
  Trainer(const TrainConfig& c, Task& task, Run& run, Json config, TrainState state, int64_t total_steps,
          int64_t epochs, FlopRate flops)
      : c_(c), task_(task), run_(run), config_(std::move(config)), state_(state), total_(total_steps),
        rank0_(dist::rank() == 0), world_(dist::world_size()),
        dynamic_scale_(run.amp->scaler().is_enabled() && run.amp->properties().loss_scale == "dynamic"),
        epochs_(epochs) {
    if (rank0_) log_.emplace(c, total_steps, epochs, /*append=*/!c.resume.empty(), flops);
  }

  // Runs to the end (or an interrupt); returns the summary line, also written to summary.json.
  Json run() {
    const auto wall_start = Clock::now();
    reset_peak_memory_stats();
    std::unique_ptr<Profiler> profiler = c_.profile ? std::make_unique<Profiler>() : nullptr;
    last_save_ = Clock::now();
    const bool was_done = state_.step >= total_;
    while (state_.step < total_ && !interrupted()) {
      task_.start_epoch(state_.epoch, state_.batch);
      EpochTotals e;
      const auto epoch_start = Clock::now();
      while (state_.step < total_ && !interrupted()) {
        auto batch = task_.next();
        if (!batch) break;
        if (!micro_batch(*batch, e)) continue;  // the step needs more micro-batches
        if (due_for_checkpoint()) checkpoint();
      }
      if (interrupted()) break;
      end_epoch(e, std::chrono::duration<double>(Clock::now() - epoch_start).count());
    }
    // A signal during the final evaluation comes after the last step: the report below finishes the run.
    if (interrupted() && state_.step < total_) return stop_interrupted();
    if (was_done) {  // resumed after its last step without its report (or its epoch end): evaluate again for it
      if (rank0_) std::fprintf(stderr, "castor train: %s finished at step %lld without its report; writing it\n",
                               c_.out.c_str(), static_cast<long long>(state_.step));
      if (state_.batch >= task_.batches_per_epoch())
        end_epoch(EpochTotals{}, 0);  // as a resume mid-run does at an epoch end cut off by a kill
      else
        last_eval_ = task_.evaluate(*run_.model, *run_.amp, eval_batch_size());
    }
    Json summary = summary_json();
    summary["wall_seconds"] = std::chrono::duration<double>(Clock::now() - wall_start).count();
    const Json build = build_json();
    for (const auto& [k, v] : build.as_object()) summary[k] = v;
    summary["finished"] = utc_now();
    if (!rank0_) return summary;
    // The report covers the whole run, resumed parts included, from metrics.jsonl.
    const std::string title = detail::cat("castor: ", name(c_.model), " on ", name(c_.data), ", ",
                                          amp::opt_level_name(c_.amp));
    const Json classes = last_eval_ ? task_.by_class(*last_eval_) : Json();
    atomic_write_file(c_.out + "/report.html",
                      render_report(title, config_, read_metrics(c_.out), op_dtypes_, classes));
    if (profiler) std::fprintf(stderr, "%s", profiler->table(15).c_str());
    atomic_write_file(c_.out + "/summary.json", summary.dump(2) + "\n");
    return summary;
  }

 private:
  struct EpochTotals {
    double loss = 0, images = 0;
    int64_t batches = 0;
  };

  // A signal asked to stop: this process's flag, or with several ranks the flag of any rank as of the last step
  // (all-reduced with the loss, so every rank stops after the same step).
  bool interrupted() const { return world_ == 1 ? g_interrupt.load() != 0 : stop_all_; }

  // Forward and backward of one micro-batch; an optimizer step once grad_accum of them (or the rest of the
  // epoch) have summed their gradients. Returns whether it stepped.
  bool micro_batch(const Batch& batch, EpochTotals& e) {
    const auto t0 = Clock::now();
    if (micro_ == 0) run_.opt->zero_grad();
    Tensor loss;
    {
      std::optional<amp::ExplainGuard> explain;  // the report's op dtype table, from the first forward
      if (op_dtypes_.empty()) explain.emplace();
      auto fw = run_.amp->forward();
      // At O2/O3 the patched forward casts the batch to the model's dtype and the logits back to float32.
      // The loss is computed in float32 from 16-bit logits as they are (no float32 copy of a GPT's vocabulary).
      Tensor logits = (*run_.model)(batch.input);
      loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.target.reshape({-1}), F::Reduction::Mean,
                              c_.label_smoothing);
      if (explain) op_dtypes_ = with_modules(explain->rows(), *run_.model);
    }
    // Summed over grad_accum micro-batches, the gradients are those of the mean loss of one big batch. With
    // several ranks, backward averages them across ranks, once per step (the other micro-batches run in no_sync).
    const int64_t next_batch = batch.index + 1;
    const bool last_micro = micro_ + 1 >= c_.grad_accum || next_batch >= task_.batches_per_epoch();
    {
      std::optional<nn::DistributedDataParallel::NoSync> no_sync;
      if (run_.ddp && !last_micro) no_sync.emplace(*run_.ddp);
      run_.amp->scale_loss(c_.grad_accum > 1 ? loss / static_cast<double>(c_.grad_accum) : loss, *run_.opt).backward();
    }
    const double n = batch.examples * world_;  // the whole job's images or tokens
    images_ += n;
    e.images += n;
    micro_loss_ += loss.item();
    if (++micro_ < c_.grad_accum && !last_micro) {
      train_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
      return false;
    }
    if (c_.clip_grad_norm > 0) {
      run_.amp->unscale_(*run_.opt);
      amp::clip_grad_norm_(*run_.opt, c_.clip_grad_norm);
    }
    const bool stepped = run_.amp->step(*run_.opt);
    if (run_.sched) run_.sched->step();
    double lv = micro_loss_ / static_cast<double>(micro_);
    if (world_ > 1) {
      // The mean loss over ranks; whether any rank was asked to stop or (by its own clock) is due a timed
      // checkpoint: decisions every rank must take at the same step.
      Tensor t = tensor({lv, g_interrupt.load() != 0 ? 1.0 : 0.0, minutes_due() ? 1.0 : 0.0}, {3}, DType::Float64);
      dist::all_reduce(t);
      const std::vector<double> v = t.to_vector<double>();
      lv = v[0] / world_;
      stop_all_ = v[1] > 0;
      minutes_due_all_ = v[2] > 0;
    }
    micro_ = 0;
    micro_loss_ = 0;
    ++state_.step;
    state_.batch = next_batch;
    train_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    e.loss += lv;
    ++e.batches;
    check_divergence(lv, stepped);
    if (log_) log_->step({state_.step, state_.epoch + 1, lv, run_.opt->param_groups()[0].lr,
               run_.amp->scaler().get_scale(), !stepped, images_, train_seconds_, run_.amp->scaler().is_enabled()});
    // (an epoch's end evaluates anyway)
    if (c_.eval_every > 0 && state_.step % c_.eval_every == 0 && state_.step < total_ &&
        next_batch < task_.batches_per_epoch()) {
      const Evaluation ev = evaluate_now();
      if (log_) log_->evaluation(state_.step, state_.epoch + 1, ev.loss, ev.accuracy);
    }
    return true;
  }

  // Stops the run with "diverged at step N" on a non-finite loss without dynamic loss scaling (O0, O3 bf16),
  // or when dynamic scaling skips step after step or drives the scale below a floor; and when a static loss
  // scale overflows the gradients kMaxSkippedStatic steps in a row (nothing would be trained).
  void check_divergence(double loss, bool stepped) {
    skipped_in_a_row_ = stepped ? 0 : skipped_in_a_row_ + 1;
    const double scale = run_.amp->scaler().get_scale();
    if (!dynamic_scale_) {
      CASTOR_CHECK(std::isfinite(loss), "diverged at step ", state_.step, ": the loss is ", loss,
                   " (try a lower --lr); the newest checkpoint holds the last finite state");
      CASTOR_CHECK(skipped_in_a_row_ < kMaxSkippedStatic, "stopped at step ", state_.step, ": ", skipped_in_a_row_,
                   " steps in a row were skipped because the gradients overflow at the static loss scale ", scale,
                   "; use a lower --loss-scale, or --loss-scale dynamic");
    } else {
      CASTOR_CHECK(skipped_in_a_row_ < kMaxSkippedInARow && scale >= kMinLossScale, "diverged at step ", state_.step,
                   ": ", skipped_in_a_row_, " skipped steps in a row, loss scale ", scale,
                   " (try a lower --lr); the newest checkpoint holds the last finite state");
    }
  }

  void end_epoch(const EpochTotals& e, double seconds) {
    const bool epoch_end = state_.batch >= task_.batches_per_epoch();
    // The last step goes to disk before the final evaluation (a long one for a language model's validation split):
    // a kill during it loses no training, and --resume evaluates again and writes the report.
    if (state_.step >= total_ && !saved_now()) checkpoint();
    last_eval_ = evaluate_now();
    const double ips = e.images / std::max(seconds, 1e-9);
    const double train_loss = e.batches ? e.loss / static_cast<double>(e.batches) : 0.0;
    const auto& scaler = run_.amp->scaler();
    const int64_t epoch = state_.epoch + 1;  // numbered from 1, as the progress line does
    char buf[64];
    std::vector<std::string> fields;  // most important first: the terminal shows those that fit
    auto add = [&](const char* fmt, auto... args) {
      std::snprintf(buf, sizeof(buf), fmt, args...);
      fields.push_back(buf);
    };
    add("epoch %lld/%lld", static_cast<long long>(epoch), static_cast<long long>(epochs_));
    const bool lm = is_language_model(c_.model);
    if (lm) {
      add("val loss %.4f", last_eval_->loss);
      add("perplexity %.2f", std::exp(last_eval_->loss));
      add("train loss %.4f", train_loss);
    } else {
      add("test acc %.2f%%", 100 * last_eval_->accuracy);
      add("train loss %.4f", train_loss);
      add("test loss %.4f", last_eval_->loss);
    }
    add("%.0f %s/s", ips, task_.unit());
    if (log_ && log_->mfu(ips) > 0) add("MFU %.1f%%", 100 * log_->mfu(ips));
    if (scaler.is_enabled()) {
      add("scale %g", scaler.get_scale());
      add("skipped %lld", static_cast<long long>(scaler.steps_skipped()));
    }
    add("peak mem %.1f MiB", memory_stats().peak_bytes / 1048576.0);
    if (log_) log_->epoch({{"epoch", epoch}, {"step", state_.step}, {"train_loss", train_loss},
                {"test_loss", last_eval_->loss}, {"test_accuracy", last_eval_->accuracy}, {"images_per_sec", ips},
                {"loss_scale", scaler.get_scale()}, {"skipped_steps", scaler.steps_skipped()},
                {"peak_memory_bytes", memory_stats().peak_bytes}},
               fields);
    if (epoch_end) {
      ++state_.epoch;
      state_.batch = 0;
    }
    if ((c_.checkpoint_every == 0 || state_.step >= total_) && !saved_now()) checkpoint();
  }

  // The test set's loss and accuracy; its ops are left out of --profile's table (which is about training).
  Evaluation evaluate_now() {
    OpObserver* profiler = op_observer();
    set_op_observer(nullptr);
    Evaluation ev = task_.evaluate(*run_.model, *run_.amp, eval_batch_size());
    set_op_observer(profiler);
    return ev;
  }

  // Whether the newest checkpoint holds the current position already.
  bool saved_now() const { return saved_ == std::tuple{state_.step, state_.epoch, state_.batch}; }

  bool due_for_checkpoint() const {
    if (c_.checkpoint_every > 0 && state_.step % c_.checkpoint_every == 0) return true;
    return world_ == 1 ? minutes_due() : minutes_due_all_;
  }
  bool minutes_due() const {
    const double minutes = std::chrono::duration<double>(Clock::now() - last_save_).count() / 60;
    return c_.checkpoint_minutes > 0 && minutes >= c_.checkpoint_minutes;
  }

  // Writes a checkpoint of the current state, refusing to replace good ones with non-finite weights.
  // With several ranks (whose weights are equal) rank 0 writes it, and the others wait until it is on disk.
  void checkpoint() {
    if (rank0_) {
      const Checkpoint ck = state_.save(run_, config_);
      for (const auto& [name, t] : ck.model)
        CASTOR_CHECK(!is_floating(t.dtype()) || isfinite_all(t), "diverged at step ", state_.step, ": ", name,
                     " is not finite (try a lower --lr); the newest checkpoint holds the last finite state");
      write_checkpoint(c_.out, state_.step, ck, c_.keep);
    }
    if (world_ > 1) dist::barrier();
    saved_ = {state_.step, state_.epoch, state_.batch};
    last_save_ = Clock::now();
  }

  // Checkpoints the finished step and says how to go on; the summary carries the signal for the exit status.
  Json stop_interrupted() {
    if (log_) log_->finish_progress_line();
    if (!saved_now()) checkpoint();
    if (rank0_)
      std::fprintf(stderr, "interrupted at step %lld; continue with: castor train --resume %s\n",
                 static_cast<long long>(state_.step), c_.out.c_str());
    Json summary = summary_json();
    summary["interrupted_by_signal"] = g_interrupt.load();
    return summary;
  }

  Json summary_json() const {
    const auto& scaler = run_.amp->scaler();
    // (an interrupted run may stop before its first evaluation: null, not a made-up 0)
    Json summary = Json::Object{{"test_accuracy", last_eval_ ? Json(last_eval_->accuracy) : Json()},
                        {"test_loss", last_eval_ ? Json(last_eval_->loss) : Json()},
                        {"train_images_per_sec", train_seconds_ > 0 ? images_ / train_seconds_ : 0.0},
                        {"steps", state_.step},
                        {"skipped_steps", scaler.steps_skipped()},
                        {"final_loss_scale", scaler.get_scale()},
                        {"peak_memory_bytes", memory_stats().peak_bytes},
                        {"lost_metric_lines", log_ ? log_->lost_lines() : 0},
                        {"nproc", world_},
                        {"out", c_.out}};
    if (is_language_model(c_.model)) {
      const double tps = train_seconds_ > 0 ? images_ / train_seconds_ : 0.0;
      summary["val_loss"] = last_eval_ ? Json(last_eval_->loss) : Json();
      summary["val_perplexity"] = last_eval_ ? Json(std::exp(last_eval_->loss)) : Json();
      summary["train_tokens_per_sec"] = tps;
      if (log_ && log_->mfu(tps) > 0) summary["mfu"] = log_->mfu(tps);
    }
    return summary;
  }

  static constexpr int64_t kMaxSkippedInARow = 64;
  static constexpr int64_t kMaxSkippedStatic = 20;
  static constexpr double kMinLossScale = 0x1p-24;

  // Images: 256 a batch; tokens: rows of the block size, about 4096 tokens a batch.
  int64_t eval_batch_size() const {
    return is_language_model(c_.model) ? std::max<int64_t>(1, 4096 / c_.block_size) : 256;
  }

  const TrainConfig& c_;
  Task& task_;
  Run& run_;
  const Json config_;
  TrainState state_;
  const int64_t total_;
  const bool rank0_;  // prints, and writes metrics, report and checkpoints
  const int world_;
  std::optional<RunLog> log_;  // rank 0's
  const bool dynamic_scale_;
  std::vector<amp::ExplainRow> op_dtypes_;  // of this process's first forward pass, for the report
  std::optional<Evaluation> last_eval_;  // the newest epoch-end evaluation
  const int64_t epochs_;
  double images_ = 0, train_seconds_ = 0, micro_loss_ = 0;
  int64_t micro_ = 0;  // micro-batches whose gradients are summed so far
  int64_t skipped_in_a_row_ = 0;
  bool stop_all_ = false, minutes_due_all_ = false;  // as of the last step, over all ranks
  std::tuple<int64_t, int64_t, int64_t> saved_{-1, -1, -1};  // (step, epoch, batch) of the newest checkpoint
  Clock::time_point last_save_;
};

// The settings a checkpoint recorded (an object with the schedule's length, or its steps/epochs in older ones).
Json recorded_config(const Checkpoint& ck, const std::string& what) {
  auto it = ck.state_meta.find("config");
  CASTOR_CHECK(it != ck.state_meta.end(), what, ": the checkpoint has no recorded config");
  try {
    Json recorded = Json::parse(it->second);
    for (const char* key : {"schedule_steps", "steps", "epochs"})
      CASTOR_CHECK(!recorded.find(key) || recorded.at(key).is_int(), "\"", key, "\" is not an integer");
    return recorded;
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": the recorded config is invalid: ", e.what()));
  }
}

// The schedule length a resumed run keeps: what its first run recorded (older records: its own steps/epochs).
int64_t recorded_schedule_steps(const Json& recorded, int64_t steps_per_epoch) {
  if (const Json* s = recorded.find("schedule_steps")) return s->as_int();
  const int64_t steps = recorded.at("steps").as_int(), epochs = recorded.at("epochs").as_int();
  CASTOR_CHECK(steps > 0 || epochs <= INT64_MAX / steps_per_epoch, "the recorded --epochs ", epochs, " is too many");
  return steps > 0 ? steps : epochs * steps_per_epoch;
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESTART;  // reads and writes in flight go on; the loop checks the flag after each step
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// --batch-size of a resumed run: the recorded global batch (batch x ranks) split among this job's ranks, with a note
// when the number of ranks changed.
void resume_batch_size(TrainConfig& c, const Json& recorded, int world) {
  const Json* n = recorded.find("nproc");
  const int64_t recorded_world = n && n->is_int() && n->as_int() > 0 ? n->as_int() : 1;
  const int64_t global = recorded.at("batch_size").as_int() * recorded_world;
  if (std::find(c.given.begin(), c.given.end(), "--batch-size") != c.given.end())
    CASTOR_CHECK(c.batch_size * world == global, "--batch-size ", c.batch_size, ": with ", world,
                 " ranks the global batch would be ", c.batch_size * world, ", the run's is ", global,
                 " (keep it: --batch-size ", global / world, ")");
  CASTOR_CHECK(global % world == 0, "--resume: the run's global batch of ", global, " does not split evenly among ",
               world, " ranks");
  c.batch_size = global / world;
  if (recorded_world != world && dist::rank() == 0)
    std::fprintf(stderr, "note: the run was recorded with %lld ranks and continues on %d with the same global batch "
                 "of %lld; the gradients are summed in another order, so it is no longer bit-exact\n",
                 static_cast<long long>(recorded_world), world, static_cast<long long>(global));
}

Json run_train(TrainConfig c) {
  dist::init();
  const int world = dist::world_size(), rank = dist::rank();
  g_say_interrupt = rank == 0;
  CASTOR_CHECK(c.nproc == 0 || c.nproc == world, "--nproc ", c.nproc, ": this process is one of ", world,
               " ranks (run `castor train --nproc N` from a shell, or `mpirun -np N castor train`)");
  const bool resuming = !c.resume.empty();
  std::string run_dir, resume_from;
  if (resuming) {
    std::tie(run_dir, resume_from) = resolve_resume(c.resume);
    if (std::find(c.given.begin(), c.given.end(), "--out") == c.given.end()) c.out = run_dir;
  }
  if (c.out.empty()) {
    c.out = default_out(c);
    if (rank == 0) std::fprintf(stderr, "castor train: run directory %s\n", c.out.c_str());
  }
  // config.json, metrics and checkpoints record these paths in JSON, which holds only UTF-8 text.
  for (const auto& [flag, value] : {std::pair{"--out", c.out}, std::pair{"--data-dir", c.data_dir},
                                    std::pair{"--init", c.init}, std::pair{"--resume", c.resume}})
    CASTOR_CHECK(is_valid_utf8(value), flag, " ", printable(value), ": not valid UTF-8; a run records its paths in "
                 "JSON, which holds only UTF-8 text: rename it");
  std::error_code ec;
  const bool continuing = resuming && fs::equivalent(run_dir, c.out, ec);
  // Rank 0 owns the run directory; the others wait until it has been set up, then read the same checkpoint.
  const std::unique_ptr<FileLock> lock = rank == 0 ? own_run_dir(c, continuing) : nullptr;
  if (world > 1) dist::barrier();
  std::optional<Checkpoint> ck;
  Json recorded;
  if (resuming) {
    ck = read_checkpoint(resume_from, &resume_from);
    recorded = recorded_config(*ck, resume_from);
    c = resume_config(c, recorded, resume_from);
    resume_batch_size(c, recorded, world);
  }
  c.nproc = world;
  if (c.threads > 0)
    omp_set_num_threads(c.threads);
  else if (dist::local_size() > 1)  // the machine's cores shared among its ranks
    omp_set_num_threads(std::max(1, omp_get_num_procs() / dist::local_size()));
  if (c.deterministic) omp_set_dynamic(0);
  backends::set_conv_algorithm(c.conv_algorithm);

  for (const std::string& flag : c.given) {  // flags of one dataset given with another
    const bool folder_flag = flag == "--image-size" || flag == "--val-split" || flag == "--skip-bad-images" ||
                             flag == "--image-cache-mb";
    CASTOR_CHECK(!folder_flag || c.data == Dataset::Folder, flag, ": applies to --data folder only, not --data ",
                 name(c.data));
    CASTOR_CHECK(flag != "--synthetic-size" || c.data == Dataset::Synthetic, flag,
                 ": applies to --data synthetic only, not --data ", name(c.data));
  }
  if (const Json* was = resuming ? recorded.find("real_vocab_size") : nullptr; was && was->is_int()) {
    // The data's vocabulary is still the one the run was trained with (not tokenized again since).
    const std::string dir = data_dir(c);
    if (fs::exists(dir + "/tokenizer.json")) {
      const int64_t is = data::Tokenizer::recorded_vocab_size(dir);
      CASTOR_CHECK(is == was->as_int(), dir, "/tokenizer.json: a vocabulary of ", is, " tokens, but ", resume_from,
                   " was trained on one of ", was->as_int(), " (tokenized again since?)");
    }
  }
  const std::unique_ptr<Task> task = make_task(c, rank, world, /*new_run=*/!resuming);
  const int64_t per_epoch = task->batches_per_epoch();
  const int64_t steps_per_epoch = (per_epoch + c.grad_accum - 1) / c.grad_accum;
  CASTOR_CHECK(c.steps > 0 || c.epochs <= INT64_MAX / steps_per_epoch, "--epochs ", c.epochs, ": too many steps");
  const int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * steps_per_epoch;
  const int64_t schedule_steps = resuming ? recorded_schedule_steps(recorded, steps_per_epoch) : total_steps;
  CASTOR_CHECK(schedule_steps > 0, resume_from, ": the recorded schedule length ", schedule_steps, " is not positive");
  Run run = build_run(c, *task, schedule_steps, /*load_init=*/!ck);
  TrainState state;
  if (ck) {
    state = TrainState::load(*ck, run, per_epoch, c.grad_accum, resume_from);
    if (rank == 0)
      std::fprintf(stderr, "castor train: resuming from step %lld (checkpoint %s)\n", static_cast<long long>(state.step),
                   resume_from.c_str());
  }
  // A run stopped after its last step but before its epoch end or report (killed during the final evaluation)
  // finishes them; a summary older than the checkpoint is an earlier run's (one resumed from an older checkpoint).
  const auto written = [&](const std::string& f) {
    std::error_code ec;
    const auto t = fs::last_write_time(f, ec);
    return ec ? fs::file_time_type::min() : t;
  };
  const bool reported = ck && fs::exists(c.out + "/report.html") &&
                        written(c.out + "/summary.json") >= written(resume_from + "/COMMIT");
  if (state.step >= total_steps && reported && state.batch < per_epoch) {
    if (rank == 0)
      std::fprintf(stderr, "castor train: %s is already complete at step %lld (extend it with --steps or --epochs)\n",
                 c.out.c_str(), static_cast<long long>(state.step));
    return Json::Object{{"already_complete", true}, {"steps", state.step}, {"out", c.out}};
  }
  if (rank == 0) check_extension(c, schedule_steps, total_steps);
  Json config = config_json(c, *task, schedule_steps);
  // Provenance only: what --init and --data-dir were (absolute, so the run resumes from any directory) and the init
  // file's checksum; once the first checkpoint exists, the run needs nothing outside its directory but the data.
  if (!c.data_dir.empty()) config["data_dir"] = absolute_path(c.data_dir);
  if (!c.init.empty()) {
    config["init"] = absolute_path(c.init);
    if (!resuming)
      config["init_checksum"] = checksum64_hex(read_file(c.init));
    else if (const Json* sum = recorded.find("init_checksum"))
      config["init_checksum"] = *sum;
  }
  if (rank == 0) {
    atomic_write_file(c.out + "/config.json", config.dump(2) + "\n");
    // As many of the settings as fit a terminal's width (all of them in a log).
    const std::vector<std::string> fields = {
        detail::cat("castor train: ", name(c.model), " on ", name(c.data)),
        detail::cat(precision_name(c), " (", amp::opt_level_name(c.amp), ")"),
        detail::cat(name(c.optimizer), " lr ", c.lr),
        detail::cat("batch ", c.batch_size * c.grad_accum * world),
        detail::cat(total_steps, " steps"),
        detail::cat(omp_get_max_threads(), " threads", world > 1 ? detail::cat(" per rank, ", world, " ranks") : "")};
    std::fprintf(stderr, "%s\n",
                 fit_fields(fields, isatty(STDERR_FILENO) ? terminal_width(STDERR_FILENO) - 1 : INT32_MAX).c_str());
  }
  const int64_t epochs = c.steps > 0 ? (total_steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs;
  return Trainer(c, *task, run, config, state, total_steps, epochs, flop_rate(c, *run.model)).run();
}

namespace {

// Per-class accuracy and the confusion matrix as text (rows: true class, columns: predicted, by index); the matrix
// only where its rows fit in `width` columns.
std::string class_report(const std::vector<std::string>& classes, const std::vector<int64_t>& confusion, int width) {
  const size_t K = classes.size();
  size_t name_width = 5;
  for (const std::string& n : classes) name_width = std::max(name_width, std::min<size_t>(n.size(), 24));
  const bool matrix = 3 + 1 + name_width + 1 + 8 + 1 + 7 + 7 * K <= static_cast<size_t>(std::max(width, 0));
  std::string out = matrix ? detail::cat("per class (columns 0..", K - 1, ": the predicted class)\n")
                           : std::string("per class (matrix in the JSON)\n");
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%3s %-*s %8s %7s", "", static_cast<int>(name_width), "class", "accuracy", "images");
  out += buf;
  for (size_t p = 0; matrix && p < K; ++p) std::snprintf(buf, sizeof(buf), "  %5zu", p), out += buf;
  out += "\n";
  for (size_t t = 0; t < K; ++t) {
    int64_t images = 0;
    for (size_t p = 0; p < K; ++p) images += confusion[t * K + p];
    std::snprintf(buf, sizeof(buf), "%3zu %-*s %7.2f%% %7lld", t, static_cast<int>(name_width),
                  printable(classes[t]).substr(0, 24).c_str(),
                  images ? 100.0 * static_cast<double>(confusion[t * K + t]) / static_cast<double>(images) : 0.0,
                  static_cast<long long>(images));
    out += buf;
    for (size_t p = 0; matrix && p < K; ++p)
      std::snprintf(buf, sizeof(buf), "  %5lld", static_cast<long long>(confusion[t * K + p])), out += buf;
    out += "\n";
  }
  return out;
}

}  // namespace

Json run_eval(const EvalConfig& e) {
  LoadedTensors model_file;
  if (fs::is_directory(e.path)) {
    Checkpoint ck = read_checkpoint(e.path);
    model_file = {std::move(ck.model), std::move(ck.model_meta)};
  } else {
    model_file = load_safetensors(e.path);
  }
  TrainConfig c;
  const Json recorded = castor_config(model_file.metadata, e.path);
  std::vector<std::string> recorded_classes;
  if (!recorded.is_null()) {
    c = resume_config(TrainConfig{}, recorded, e.path);
    if (const Json* names = recorded.find("class_names"); names && names->is_array())
      for (const Json& n : names->as_array()) recorded_classes.push_back(n.is_string() ? n.as_string() : n.dump());
    CASTOR_CHECK(!e.model || *e.model == c.model, "--model ", name(*e.model), ": ", e.path, " holds a ", name(c.model));
    CASTOR_CHECK(!e.data || *e.data == c.data, "--data ", name(*e.data), ": ", e.path, " was trained on ",
                 name(c.data));
  } else {
    CASTOR_CHECK(e.model && e.data, e.path,
                 ": no castor metadata (castor.config); say what it holds with --model and --data");
    c.model = *e.model;
    c.data = *e.data;
    c.amp = amp::OptLevel::O0;  // weights without castor metadata are evaluated in float32
  }
  if (!e.data_dir.empty()) c.data_dir = e.data_dir;
  const std::unique_ptr<Task> task = make_task(c, /*rank=*/0, /*world=*/1, /*new_run=*/false);
  Run run = build_run(c, *task, 1, /*load_init=*/false);
  try {
    run.model->load_state_dict(model_file.tensors, /*strict=*/true);
  } catch (const Error& err) {
    throw Error(detail::cat(e.path, ": ", err.what()));
  }
  Json out;
  if (const auto* images = dynamic_cast<const ImageTask*>(task.get())) {
    const Datasets& d = images->datasets();
    if (!recorded_classes.empty())
      CASTOR_CHECK(recorded_classes == d.classes, e.path, ": the model was trained on other classes than ",
                   "--data-dir ", data_dir(c), " holds (", recorded_classes.size(), " recorded, ", d.classes.size(),
                   " found, or in another order)");
    const Evaluation ev = task->evaluate(*run.model, *run.amp, e.batch_size);
    // On a terminal too narrow for the confusion matrix, the per-class columns alone (the JSON has the matrix).
    const int width = isatty(STDERR_FILENO) ? terminal_width(STDERR_FILENO) - 1 : INT32_MAX;
    std::fputs(class_report(d.classes, ev.confusion, width).c_str(), stderr);
    out = by_class(d.classes, ev.confusion);
    out["test_accuracy"] = ev.accuracy;
    out["test_loss"] = ev.loss;
    out["images"] = d.test.n;
  } else {
    // The whole validation split, in windows of the block size.
    const Evaluation ev = task->evaluate(*run.model, *run.amp, c.batch_size);
    out = Json::Object{{"val_loss", ev.loss}, {"val_perplexity", std::exp(ev.loss)}, {"val_accuracy", ev.accuracy}};
  }
  out["checkpoint"] = e.path;
  return out;
}

namespace {

// `castor info`'s default: what a person asks of a checkpoint first.
std::string info_summary(const std::string& path, const std::string& used, const SafetensorsFile& model,
                         const StateDict* state) {
  std::string out;
  auto line = [&](const char* key, const std::string& value) { out += detail::cat(key, std::string(12 - std::strlen(key), ' '), value, "\n"); };
  int64_t values = 0;
  std::string dtypes;
  for (const SafetensorsEntry& e : model.entries) {
    values += e.numel();
    if (dtypes.find(dtype_name(e.dtype)) == std::string::npos) dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(e.dtype));
  }
  line("file", printable(used));
  Json config = castor_config(model.metadata, used);
  if (config.is_null()) config = Json::Object{};
  const std::string model_name = config.find("model") ? config.at("model").as_string() : "unknown (no castor metadata)";
  line("model", detail::cat(model_name, ", ", model.entries.size(), " tensors, ", values, " values (", dtypes, ")"));
  if (config.find("amp") && config.find("dtype")) {
    TrainConfig c;
    c.amp = amp::parse_opt_level(config.at("amp").as_string());
    c.dtype = parse_dtype(config.at("dtype").as_string());
    line("precision", detail::cat(precision_name(c), " (", amp::opt_level_name(c.amp), ", ",
                                  c.amp == amp::OptLevel::O0 ? "float32" : dtype_name(c.dtype), ")"));
  }
  if (config.find("data")) {
    std::string data = config.at("data").as_string();
    if (const Json* k = config.find("num_classes")) data += detail::cat(", ", k->dump(), " classes");
    if (const Json* shape = config.find("input_shape")) data += ", input (C, H, W) " + shape->dump();
    line("data", data);
  }
  if (state) {
    auto counter = [&](const char* key) {
      auto it = state->find(key);
      return it == state->end() ? int64_t{-1} : static_cast<int64_t>(it->second.to(DType::Float64).item());
    };
    const int64_t step = counter("progress.step"), epoch = counter("progress.epoch"), batch = counter("progress.batch");
    if (step >= 0)  // (epochs numbered from 1, as training shows them)
      line("step", batch == 0 && epoch > 0 ? detail::cat(step, " (the end of epoch ", epoch, ")")
                                           : detail::cat(step, " (in epoch ", epoch + 1, ")"));
  }
  // In a run directory: its last evaluation and its checkpoints.
  std::error_code ec;
  fs::path run = fs::is_directory(path + "/checkpoints", ec) ? fs::path(path) : fs::path(used).parent_path().parent_path();
  if (fs::is_directory(run / "checkpoints", ec)) {
    const std::vector<Json> records = read_metrics(run.string());
    for (auto r = records.rbegin(); r != records.rend(); ++r)
      if (const Json* acc = r->find("test_accuracy"); acc && acc->is_number()) {
        char text[128];
        std::snprintf(text, sizeof(text), "test accuracy %.2f%%, test loss %.4f at step %lld", 100 * acc->as_double(),
                      r->at("test_loss").as_double(), static_cast<long long>(r->at("step").as_int()));
        line("metrics", text);
        break;
      }
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(run / "checkpoints", ec))
      if (is_checkpoint_dir(e.path().string())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    line("checkpoints", list.empty() ? "none" : list);
  }
  for (const auto& [k, v] : model.metadata)  // the recorded config is summarised above
    if (k != "castor.config" && k != "format") line("metadata", printable(k) + " = " + printable(v));
  out += "(castor info --tensors " + printable(path) + ": every tensor)\n";
  return out;
}

}  // namespace

std::string run_info(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  bool tensors = false;
  for (const std::string& a : args) {
    if (a == "--tensors") tensors = true;
    else paths.push_back(a);
  }
  CASTOR_CHECK(paths.size() == 1, "castor info: expected one FILE or DIR, got ", paths.size(), " arguments");
  const std::string& path = paths[0];
  // Names, dtypes and shapes only: of a file, its header is read, not its data (of any size).
  std::vector<std::pair<std::string, SafetensorsFile>> files;
  std::string used = path;
  std::optional<StateDict> state;
  if (fs::is_directory(path)) {
    // A checkpoint is read whole, to verify its checksums.
    const Checkpoint ck = read_checkpoint(path, &used);
    auto listing = [](const StateDict& tensors, const Metadata& metadata) {
      SafetensorsFile f;
      for (const auto& [k, t] : tensors) f.entries.push_back({k, t.dtype(), t.shape(), 0, t.nbytes()});
      f.metadata = metadata;
      return f;
    };
    files.push_back({"model.safetensors", listing(ck.model, ck.model_meta)});
    files.push_back({"train_state.safetensors", listing(ck.state, ck.state_meta)});
    state = ck.state;
  } else {
    files.push_back({path, read_safetensors_header(path)});
  }
  if (!tensors) return info_summary(path, used, files[0].second, state ? &*state : nullptr);
  std::string out;
  for (auto& [name, f] : files) {
    int64_t bytes = 0, values = 0;
    std::sort(f.entries.begin(), f.entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    out += printable(name) + ": " + std::to_string(f.entries.size()) + " tensors\n";
    for (const SafetensorsEntry& e : f.entries) {
      out += "  " + printable(e.name) + "  " + dtype_name(e.dtype) + shape_str(e.shape) + "  " +
             std::to_string(e.numel()) + "\n";
      bytes += static_cast<int64_t>(e.end - e.begin);
      values += e.numel();
    }
    out += "  total " + std::to_string(values) + " values (parameters and buffers), " + std::to_string(bytes) +
           " bytes\n";
    for (const auto& [k, v] : f.metadata) out += "  metadata " + printable(k) + " = " + printable(v) + "\n";
  }
  return out;
}

}  // namespace castor::train
