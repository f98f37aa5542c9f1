// The image classification task: the datasets (built-in, synthetic or a folder of images), their loader, the
// classifier and what its evaluation shows (accuracy, per class, the confusion matrix).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "castor/data.h"
#include "castor/datasets.h"
#include "castor/dist.h"
#include "castor/fs.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/safetensors.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

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
  ImageFolderOptions o{.image_size = c.image_size,
                       .skip_bad_images = c.skip_bad_images,
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
    for (ImageDataset* part : {&d.train, &d.test})
      *part = {0, all.channels, all.height, all.width, {}, {}, all.num_classes};
    auto train_index = std::make_shared<std::vector<int64_t>>(), test_index = std::make_shared<std::vector<int64_t>>();
    for (int64_t i = 0; i < all.n; ++i) {  // in file order within each part
      ImageDataset& part = held[i] ? d.test : d.train;
      if (all.load)
        (held[i] ? test_index : train_index)->push_back(i);
      else
        part.images.insert(part.images.end(), all.images.begin() + i * sz, all.images.begin() + (i + 1) * sz);
      part.labels.push_back(all.labels[i]);
      ++part.n;
    }
    if (all.load) {  // streamed (too large to cache): each part loads through the folder's indices
      d.train.load = [load = all.load, train_index](int64_t i, uint8_t* dst) { load((*train_index)[i], dst); };
      d.test.load = [load = all.load, test_index](int64_t i, uint8_t* dst) { load((*test_index)[i], dst); };
    }
  }
  if (skipped > 0 && dist::rank() == 0)
    std::fprintf(stderr, "note: %lld unreadable images left out (--skip-bad-images)\n",
                 static_cast<long long>(skipped));
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
    CASTOR_CHECK(!c.data_dir.empty(),
                 "--data folder: needs --data-dir DIR holding DIR/train/<class>/*.png|jpg (and "
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
    classes.push_back(Json::Object{{"name", names[t]},
                                   {"images", images},
                                   {"accuracy", images ? static_cast<double>(confusion[t * K + t]) / images : 0.0}});
  }
  return Json::Object{{"classes", classes}, {"confusion_matrix", matrix}};
}

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

class ImageTask : public Task {
 public:
  ImageTask(const TrainConfig& c, int rank, int world) : d_(load_data(c)) {
    CASTOR_CHECK(d_.train.n >= c.batch_size * world, "--batch-size ", c.batch_size, (world > 1 ? " x " : ""),
                 (world > 1 ? std::to_string(world) + " ranks" : std::string()), " is larger than the ", d_.train.n,
                 " training images");
    // Each rank takes its contiguous shard of the global batch a single process with batch x ranks would see.
    data::LoaderOptions lo{.batch_size = c.batch_size * world,
                           .shuffle = true,
                           .augment = c.augment == Augment::Standard,
                           .drop_last = true,
                           .seed = c.seed,
                           .norm = d_.norm,
                           .shard = rank,
                           .num_shards = world};
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

  int64_t eval_batches(int64_t batch_size) const override { return test_loader(batch_size).batches_per_epoch(); }
  Batch eval_batch(int64_t i, int64_t batch_size) const override {
    data::Batch b = test_loader(batch_size).make_batch(0, i);
    return Batch{b.images, b.labels, i, static_cast<double>(b.labels.numel())};
  }
  int64_t eval_batch_size() const override { return 256; }
  int64_t num_classes() const override { return d_.test.num_classes; }

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
  const char* unit() const override { return "img"; }
  const char* rate_key() const override { return "images_per_sec"; }
  std::vector<std::pair<std::string, double>> evaluation_keys(const Evaluation& ev) const override {
    return {{"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}};
  }
  std::vector<std::string> eval_fields(const Evaluation& ev) const override {
    return {figure("test loss %.4f", ev.loss), figure("test acc %.2f%%", 100 * ev.accuracy)};
  }
  std::vector<std::string> epoch_fields(const Evaluation& ev, double train_loss) const override {
    return {figure("test acc %.2f%%", 100 * ev.accuracy), figure("train loss %.4f", train_loss),
            figure("test loss %.4f", ev.loss)};
  }
  void summary_keys(Json& summary, const Evaluation* ev, double images_per_sec) const override {
    summary["test_accuracy"] = ev ? Json(ev->accuracy) : Json();
    summary["test_loss"] = ev ? Json(ev->loss) : Json();
    summary["train_images_per_sec"] = images_per_sec;
  }
  Json by_class(const Evaluation& ev) const override { return train::by_class(d_.classes, ev.confusion); }
  std::vector<std::string> classes() const override { return d_.classes; }
  Json eval_json(const Evaluation& ev) const override {
    Json out = by_class(ev);
    out["test_accuracy"] = ev.accuracy;
    out["test_loss"] = ev.loss;
    out["images"] = d_.test.n;
    return out;
  }
  std::string eval_text(const Evaluation& ev, int width) const override {
    return class_report(d_.classes, ev.confusion, width);
  }

 private:
  // The test set's loader for `batch_size` (in order, unaugmented), made once per size.
  const data::DataLoader& test_loader(int64_t batch_size) const {
    if (!test_loader_ || test_batch_ != batch_size) {
      test_loader_.reset();
      test_loader_.emplace(d_.test, data::LoaderOptions{.batch_size = batch_size, .shuffle = false, .norm = d_.norm});
      test_batch_ = batch_size;
    }
    return *test_loader_;
  }

  Datasets d_;
  std::optional<data::DataLoader> loader_;
  mutable std::optional<data::DataLoader> test_loader_;
  mutable int64_t test_batch_ = 0;
};

}  // namespace

// The dataset directory: --data-dir, or the dataset's default location.
std::string data_dir(const TrainConfig& c) {
  if (!c.data_dir.empty()) return c.data_dir;
  if (c.data == Dataset::Brown || c.data == Dataset::BrownChar || c.data == Dataset::BrownBpe)
    return data::setup_path("data/" + std::string(name(c.data)));
  return c.data == Dataset::Cifar10 ? "cifar-10-batches-bin" : "/usr/share/datasets/fashion-mnist";
}

void take_image_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors&, const Json&) {
  CASTOR_CHECK(e.lora.empty(), "--lora: ", e.path, " is a ", name(c.model), ", not a language model");
}

std::unique_ptr<Task> make_image_task(const TrainConfig& c, int rank, int world) {
  return std::make_unique<ImageTask>(c, rank, world);
}

}  // namespace castor::train
