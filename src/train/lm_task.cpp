// The language-model task: llm.c token files in (B, T) windows, a GPT or Llama of the config's (or --init's) sizes,
// and validation loss, perplexity and next-token accuracy.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "castor/checkpoint.h"
#include "castor/corpus.h"
#include "castor/dist.h"
#include "castor/formats.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llama.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/lm_batch.h"
#include "castor/models.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "castor/trainer.h"
#include "castor/gguf.h"
#include "castor/model_source.h"
#include "train/family.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// The vocabulary a model needs for the tokens in `dir`: the model's own when it has one (c.real_vocab_size: a run's
// recorded, an llm.c --init's header V), else --vocab-size, else the tokenizer's recorded beside them; a tokenizer.json
// there may only agree with the model's. A GPT's padded to a multiple of 64 above 1024 (GPT-2's 50,257 -> 50,304, as
// nanoGPT and llm.c), a Llama's exactly the tokenizer's (llama2.c's run.c reads the tokenizer's size from the model).
// Returns (model's, real).
std::pair<int64_t, int64_t> vocabulary(const TrainConfig& c, const std::string& dir) {
  const std::string found = data::token_record_path(dir);
  const std::string record = found.empty() ? dir + "/" + data::kTokenRecord : found;
  const int64_t recorded = !found.empty() ? data::Tokenizer::recorded_vocab_size(dir) : 0;
  CASTOR_CHECK(recorded == 0 || c.real_vocab_size == 0 || recorded == c.real_vocab_size, record, ": a vocabulary of ",
               recorded, " tokens, but the model was made for ", c.real_vocab_size,
               c.init.empty() ? "" : " (--init " + c.init + ")");
  const int64_t real = c.real_vocab_size > 0 ? c.real_vocab_size : recorded;
  CASTOR_CHECK(real > 0 || c.vocab_size > 0, "--vocab-size: not given, and ", record,
               " (written by castor tokenize) is missing");
  const bool pad = family(c).pads_vocab && real > 1024;
  const int64_t padded = c.vocab_size > 0 ? c.vocab_size : pad ? (real + 63) / 64 * 64 : real;
  CASTOR_CHECK(real <= padded, "--vocab-size ", padded, ": smaller than the tokenizer's ", real, " (", record, ")");
  // (a model of another tool's directory, whose description names its architecture, keeps its own vocabulary)
  const bool own_vocab = c.model_config.is_object() && c.model_config.find("architecture");
  CASTOR_CHECK(family(c).pads_vocab || own_vocab || real == 0 || padded == real, "--vocab-size ", padded, ": a ",
               family(c).name, "'s vocabulary is the tokenizer's, ", real, " (", record, ")");
  return {padded, real > 0 ? real : padded};
}

// The vocabulary --init's model was trained in (model_vocabulary's), into c.vocab.
void take_init_vocabulary(TrainConfig& c) {
  Json recorded;
  try {
    recorded = castor_config(formats::read_weights_header(c.init).metadata, c.init);
  } catch (const Error&) {
    return;  // (the family's reading of --init names what is wrong with it)
  }
  take_model_vocabulary(c, c.init, recorded);
}

// --data brown | brown-char | brown-bpe | tokens: DIR/train.bin and DIR/val.bin (llm.c's token files), batches of
// (B, T) windows.
class LmTask : public Task {
 public:
  // Resolves c.vocab_size (recorded, so a resumed run builds the same model); a new run with --init takes the
  // model's sizes from that file (the family's take_init_sizes).
  LmTask(TrainConfig& c, int rank, int world, bool new_run)
      : family_(family(c)), dir_(data_dir(c)), eval_iters_(c.eval_iters), batch_size_(c.batch_size) {
    // The ids mean the tokens of the model's vocabulary: the folder's must be it (before anything else is read).
    if (new_run && !c.init.empty()) take_init_vocabulary(c);
    folder_vocab_ = check_folder_vocabulary(
        c, dir_, c.data_dir.empty() ? detail::cat("--data ", name(c.data)) : std::string("--data-dir"));
    model_vocab_ = c.vocab;
    if (new_run && !c.init.empty()) family_.take_init_sizes(c, dir_);
    CASTOR_CHECK(c.data != Dataset::Tokens || !c.data_dir.empty(),
                 "--data tokens: needs --data-dir DIR holding "
                 "train.bin and val.bin (castor tokenize writes them)");
    CASTOR_CHECK(fs::exists(dir_ + "/train.bin") || c.data == Dataset::Tokens, "--data ", name(c.data), ": ", dir_,
                 "/train.bin is missing; ./scripts/setup.sh prepares the Brown corpus there (or give --data-dir)");
    train_.emplace(dir_ + "/train.bin");
    val_.emplace(dir_ + "/val.bin");
    std::tie(c.vocab_size, real_vocab_) = vocabulary(c, dir_);
    take_row_length(c);
    vocab_size_ = c.vocab_size;
    block_size_ = c.block_size;
    // The model's configuration checked before any step (config.cpp names the flags for what it can get wrong).
    family_.check(c);
    // Everything the data can get wrong is found here, before step 1: token files of another tokenize than the
    // vocabulary, a split too short for one window, ids outside the vocabulary (all of them up to 2^31 tokens).
    const std::string record = data::token_record_path(dir_);
    if (!record.empty()) data::check_token_folder(dir_, *train_, *val_);
    for (const data::TokenFile* f : {&*train_, &*val_}) {
      CASTOR_CHECK(f->size() >= c.block_size + 1, f->path(), ": ", f->size(),
                   " tokens, fewer than one window of "
                   "--block-size ",
                   c.block_size,
                   " + 1 (give a smaller --block-size, or more text to castor "
                   "tokenize)");
      const int64_t n = std::min<int64_t>(f->size(), int64_t{1} << 31);
      int64_t bad = 0;
      while (bad < n && (*f)[bad] < real_vocab_) ++bad;
      if (bad == n) continue;
      throw Error(detail::cat(f->path(), ": token ", (*f)[bad], " at position ", bad, " is outside the vocabulary of ",
                              real_vocab_, !record.empty() ? " (" + record + ")" : " (--vocab-size)"));
    }
    const data::LmBatchOptions options{.batch_size = c.batch_size,
                                       .block_size = c.block_size,
                                       .order = c.data_order,
                                       .seed = c.seed,
                                       .rank = rank,
                                       .num_ranks = world};
    if (masked()) {
      rows_.emplace(*train_, *train_mask_, options);
      per_epoch_ = rows_->batches_per_epoch();
      data::masked_row_count(*val_, *val_mask_, block_size_);
      // A data set whose training rows hold no target would train on nothing: refused before step 1.
      int64_t first = 0;
      while (first < train_mask_->size() && (*train_mask_)[first] == 0) ++first;
      CASTOR_CHECK(first < train_mask_->size(), train_mask_->path(),
                   ": no token is a loss target (castor tokenize --train-on-prompt trains on every token)");
    } else {
      source_.emplace(*train_, options);
      per_epoch_ = source_->batches_per_epoch();
    }
  }
  bool masked() const override { return train_mask_.has_value(); }
  int64_t batches_per_epoch() const override { return per_epoch_; }
  void start_epoch(int64_t epoch, int64_t batch) override {
    epoch_ = epoch;
    if (rows_)
      rows_->set_state({epoch * per_epoch_ + batch});
    else
      source_->set_state({epoch * per_epoch_ + batch});
  }
  std::optional<Batch> next() override {
    const int64_t i = (rows_ ? rows_->state() : source_->state()).next_batch - epoch_ * per_epoch_;
    if (i >= per_epoch_) return std::nullopt;
    data::LmBatch b = rows_ ? rows_->next() : source_->next();
    return lm_batch(b, i);
  }
  nn::ModulePtr make_model(const TrainConfig& c) const override {
    return make_language_model(c, real_vocab_, c.seed + 1337);
  }
  std::pair<std::vector<Tensor>, std::vector<Tensor>> param_groups(const nn::Module& model) const override {
    // nanoGPT's configure_optimizers: weight decay on the 2-D tensors (matrices, embeddings) only.
    std::vector<Tensor> decay, no_decay;
    for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    return {decay, no_decay};
  }
  FlopRate flop_rate(const TrainConfig& c, const nn::Module& model) const override;
  Tensor loss(nn::Module& model, const Batch& b, F::Reduction reduction, double label_smoothing) const override {
    return models::lm_loss(dynamic_cast<models::LanguageModel&>(model), b.input, b.target, reduction, label_smoothing);
  }
  std::pair<double, std::vector<int64_t>> scores(nn::Module& model, const amp::Amp& amp,
                                                 const Batch& b) const override {
    auto fw = amp.forward();
    models::LmScores s = models::lm_scores(dynamic_cast<models::LanguageModel&>(model), b.input, b.target);
    return {s.loss_sum, std::move(s.predicted)};
  }

  // The validation split in rows of T tokens, each once: all of them, or --eval-iters batches of --batch-size rows
  // spread evenly over the split (row k of m of all n: k n / m) when it holds more.
  int64_t eval_batches(int64_t batch_size) const override {
    if (masked()) return (eval_row_count() + batch_size - 1) / batch_size;
    const int64_t n = data::eval_batch_count(*val_, batch_size, block_size_);
    CASTOR_CHECK(n > 0, val_->path(), ": no whole window of ", block_size_ + 1, " tokens to evaluate on");
    return (eval_row_count() + batch_size - 1) / batch_size;
  }
  Batch eval_batch(int64_t i, int64_t batch_size) const override {
    const int64_t all = all_eval_rows(), m = eval_row_count();
    std::vector<int64_t> rows;
    for (int64_t k = i * batch_size; k < std::min(m, (i + 1) * batch_size); ++k) rows.push_back(k * all / m);
    return lm_batch(masked() ? data::masked_rows(*val_, *val_mask_, block_size_, rows, i)
                             : data::eval_rows(*val_, block_size_, rows, i),
                    i);
  }
  // Rows of the block size: about 4096 tokens a batch while their logits stay within 4M values (16 MiB in float32),
  // else the training batch's rows (whose step holds logits of that size and their gradient): GPT-2's vocabulary
  // evaluated 4096 tokens at once held 0.8 GB of logits, 5x the training step's peak.
  int64_t eval_batch_size() const override {
    const int64_t tokens = std::min<int64_t>(4096, (int64_t{1} << 22) / vocab_size_);
    return std::max({int64_t{1}, tokens / block_size_, std::min(batch_size_, 4096 / block_size_)});
  }

  void record(Json& o) const override {
    o["vocab_size"] = vocab_size_;
    o["real_vocab_size"] = real_vocab_;
    // The vocabulary the ids mean: the folder's (checked to be the model's), else the model's where it is known.
    const data::VocabularyId& v = folder_vocab_.known() ? folder_vocab_ : model_vocab_;
    if (!v.kind.empty()) o["tokenizer"] = v.kind;
    if (!v.checksum.empty()) o["vocab_checksum"] = v.checksum;
    o["train_tokens"] = train_->size();
    o["val_tokens"] = val_->size();
    if (masked()) o["loss_mask"] = true;
  }
  const char* unit() const override { return "tok"; }
  const char* rate_key() const override { return "tokens_per_sec"; }
  std::vector<std::pair<std::string, double>> evaluation_keys(const Evaluation& ev) const override {
    return {{"val_loss", ev.loss}, {"val_perplexity", std::exp(ev.loss)}};
  }
  std::vector<std::string> eval_fields(const Evaluation& ev) const override {
    return {figure("val loss %.4f", ev.loss), figure("perplexity %.2f", std::exp(ev.loss))};
  }
  std::vector<std::string> epoch_fields(const Evaluation& ev, double train_loss) const override {
    return {figure("val loss %.4f", ev.loss), figure("perplexity %.2f", std::exp(ev.loss)),
            figure("train loss %.4f", train_loss)};
  }
  void summary_keys(Json& summary, const Evaluation* ev, double tokens_per_sec) const override {
    summary["val_loss"] = ev ? Json(ev->loss) : Json();
    summary["val_perplexity"] = ev ? Json(std::exp(ev->loss)) : Json();
    summary["train_tokens_per_sec"] = tokens_per_sec;
  }
  Json eval_json(const Evaluation& ev) const override {
    return Json::Object{{"val_loss", ev.loss}, {"val_perplexity", std::exp(ev.loss)}, {"val_accuracy", ev.accuracy}};
  }

 private:
  // A token folder of fine-tuning rows (castor tokenize --format, its record's row_tokens): opens the masks and
  // takes the block size from the rows (a --block-size given with another value is refused).
  void take_row_length(TrainConfig& c) {
    const std::string path = data::token_record_path(dir_);
    if (path.empty()) return;
    const Json record = data::read_tokenizer_record(dir_);
    const Json* row = record.find("row_tokens");
    if (!row) return;
    CASTOR_CHECK(row->is_int() && row->as_int() >= 2, path, ": row_tokens must be an integer >= 2");
    const bool fixed = c.given("--block-size") || !c.init.empty();  // given, or --init's model's
    CASTOR_CHECK(!fixed || c.block_size == row->as_int() - 1, "--block-size ", c.block_size,
                 c.given("--block-size") ? "" : " (--init's)", ": ", dir_, " holds rows of ", row->as_int(),
                 " tokens (block size ", row->as_int() - 1, "; castor tokenize --block-size sets it)");
    c.block_size = row->as_int() - 1;
    train_mask_.emplace(dir_ + "/train.mask");
    val_mask_.emplace(dir_ + "/val.mask");
  }
  // A batch of the task: its targets that count (all of them without a mask).
  Batch lm_batch(const data::LmBatch& b, int64_t i) const {
    double targets = static_cast<double>(b.y.numel());
    if (masked()) {
      const int64_t* y = b.y.data<int64_t>();
      targets = static_cast<double>(
          std::count_if(y, y + b.y.numel(), [](int64_t t) { return t != data::kIgnoreIndex; }));
    }
    return Batch{b.x, b.y, i, static_cast<double>(b.x.numel()), targets};
  }
  // Rows of the validation split, and those an evaluation covers.
  int64_t all_eval_rows() const {
    return masked() ? data::masked_row_count(*val_, *val_mask_, block_size_) : (val_->size() - 1) / block_size_;
  }
  int64_t eval_row_count() const {
    const int64_t all = all_eval_rows();
    return eval_iters_ > 0 ? std::min(all, eval_iters_ * batch_size_) : all;
  }

  const Family& family_;
  data::VocabularyId folder_vocab_, model_vocab_;  // the token folder's, the model's (c.vocab)
  std::string dir_;
  int64_t eval_iters_ = 0, batch_size_ = 0;
  std::optional<data::TokenFile> train_, val_;
  std::optional<data::LmBatchSource> source_;
  std::optional<data::TokenFile> train_mask_, val_mask_;  // fine-tuning rows: the loss masks
  std::optional<data::RowBatchSource> rows_;
  int64_t block_size_ = 0, vocab_size_ = 0, real_vocab_ = 0, per_epoch_ = 0, epoch_ = 0;
};

// MFU's two terms for a language model: model FLOPs per trained token (nanoGPT's estimate_mfu: 6 N + 12 L C T, N
// without the position embeddings) and the GEMM peak in the dtype the GEMMs run in; none for image models.
FlopRate LmTask::flop_rate(const TrainConfig& c, const nn::Module& model) const {
  double n = 0;
  for (const auto& [name, p] : model.named_parameters())
    if (name != "transformer.wpe.weight") n += static_cast<double>(p.numel());
  const double per_token = 6 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * c.block_size);
  const DType dtype = c.amp == amp::OptLevel::O0 ? DType::Float32 : c.dtype;
  const int ranks = dist::world_size();
  const FlopRate r{per_token, cached_gemm_peak(dtype), dtype, ranks};
  if (dist::rank() == 0 && r.rank_peak > 0)
    std::fprintf(stderr,
                 "model: %.2fM parameters, %.3g FLOP per token; MFU against this machine's %s GEMM peak of "
                 "%.0f GFLOP/s (%d rank%s x %d threads, measured once and cached)\n",
                 n / 1e6, per_token, dtype_name(dtype), r.rank_peak * ranks / 1e9, ranks, ranks > 1 ? "s" : "",
                 omp_get_max_threads());
  else if (dist::rank() == 0)
    std::fprintf(stderr,
                 "model: %.2fM parameters, %.3g FLOP per token; MFU in the summary (this machine's %s GEMM "
                 "peak is measured after training, once)\n",
                 n / 1e6, per_token, dtype_name(dtype));
  return r;
}

}  // namespace

data::VocabularyId recorded_vocabulary(const Json& r) {
  data::VocabularyId id;
  if (!r.is_object()) return id;
  if (const Json* k = r.find("tokenizer"); k && k->is_string()) id.kind = k->as_string();
  if (const Json* v = r.find("real_vocab_size"); v && v->is_int()) id.size = v->as_int();
  if (const Json* sum = r.find("vocab_checksum"); sum && sum->is_string()) id.checksum = sum->as_string();
  return id;
}

std::string tokenizer_beside(const std::string& path) {
  formats::SourceFormat format;
  try {
    format = formats::source_format(path);
  } catch (const Error&) {
    return "";
  }
  if (format == formats::SourceFormat::HfDir) return data::is_hf_tokenizer_json(path + "/tokenizer.json") ? path : "";
  if (format == formats::SourceFormat::Gguf) return formats::gguf_tokenizer_dir(path);  // (its metadata's)
  if (format != formats::SourceFormat::Llama2c) return "";
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  return file_exists(dir + "/tokenizer.bin") ? dir : "";
}

data::VocabularyId model_vocabulary(const std::string& path, const Json& recorded) {
  data::VocabularyId id = recorded_vocabulary(recorded);
  if (!id.kind.empty() || !id.checksum.empty()) return id;
  const std::string dir = tokenizer_beside(path);
  if (dir.empty()) return id;
  const data::VocabularyId beside = data::Tokenizer::load(dir).vocabulary_id();
  // (a tokenizer.bin of another size is not this model's: run.c would read the model's count of pieces from it)
  const Json* v = recorded.is_object() ? recorded.find("vocab_size") : nullptr;
  const bool own = formats::is_source(path, formats::SourceFormat::HfDir) ||
                   formats::is_source(path, formats::SourceFormat::Gguf);  // (their embeddings may have more rows)
  if (!own && v && v->is_int() && v->as_int() != beside.size) return id;
  return beside;
}

std::string recorded_data_dir(const Json& config) {
  if (!config.is_object()) return "";
  if (const Json* d = config.find("data_dir"); d && d->is_string() && !d->as_string().empty()) return d->as_string();
  const Json* d = config.find("data");
  if (d && d->is_string() &&
      (d->as_string() == "brown" || d->as_string() == "brown-char" || d->as_string() == "brown-bpe"))
    return data::setup_path("data/" + d->as_string());
  return "";
}

std::string model_tokenizer_dir(const std::string& path, const Json& recorded) {
  const std::string dir = recorded_data_dir(recorded);
  if (!dir.empty() && data::Tokenizer::is_loadable(dir)) {
    const data::VocabularyId was = recorded_vocabulary(recorded), is = data::folder_vocabulary(dir);
    CASTOR_CHECK(data::same_vocabulary(was, is), path, " was trained in the vocabulary [", was.describe(),
                 "], but its token folder ", dir, " now holds [", is.describe(), "]",
                 " (tokenized again since?); give the folder of the model's vocabulary");
    return dir;
  }
  return tokenizer_beside(path);
}

std::string vocabulary_dir(const std::string& path) {
  std::error_code ec;
  CASTOR_CHECK(fs::exists(path, ec), "--vocab ", path, ": no such file or directory");
  if (fs::is_directory(path, ec) && data::Tokenizer::is_loadable(path)) return path;
  std::string model = path;  // the model file whose castor.config names the run's vocabulary
  Json recorded;
  try {
    if (formats::is_source(path, formats::SourceFormat::CastorDir)) {
      const std::optional<std::string> ck = is_checkpoint_dir(path) ? path : latest_checkpoint(path);
      CASTOR_CHECK(ck.has_value(), "not a token folder (no ", data::kTokenRecord,
                   ", tokenizer.json or tokenizer.bin), nor a run or checkpoint directory");
      model = (fs::path(*ck) / "model.safetensors").string();
    }
    recorded = castor_config(formats::read_weights_header(model).metadata, model);
    const std::string dir = model_tokenizer_dir(model, recorded);
    CASTOR_CHECK(!dir.empty(), model, " names no token folder (a run's recorded data_dir) and has no tokenizer.bin ",
                 "beside it");
    return dir;
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(msg.rfind(path, 0) == 0 ? "--vocab " + msg : detail::cat("--vocab ", path, ": ", msg));
  }
}

void take_model_vocabulary(TrainConfig& c, const std::string& path, const Json& recorded) {
  c.vocab = model_vocabulary(path, recorded);
  if (c.vocab.size == 0) c.vocab.size = c.real_vocab_size;
  c.vocab_of = c.vocab.known() ? path : "";
}

data::VocabularyId check_folder_vocabulary(const TrainConfig& c, const std::string& dir, const std::string& flag) {
  const data::VocabularyId folder = data::folder_vocabulary(dir);
  if (!c.vocab.known() || !folder.known() || data::same_vocabulary(c.vocab, folder)) return folder;
  const std::string record = data::token_record_path(dir);
  throw Error(
      detail::cat(flag, " ", record.empty() ? dir : record, " holds the vocabulary [", folder.describe(), "], but ",
                  c.vocab_of, " was trained in [", c.vocab.describe(), "]: the same ids would be other tokens",
                  c.vocab.kind.empty()
                      ? ""
                      : " (encode the text in the model's vocabulary: castor tokenize --vocab " + c.vocab_of + ")"));
}

void take_lm_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors& file, const Json& recorded) {
  if (!recorded.is_null())
    take_model_vocabulary(c, e.path, recorded);  // (a llama2.c file's tokenizer.bin)
  else
    family(c).take_file_sizes(c, file.tensors, file.metadata, e.n_head, e.block_size, e.path);
  if (e.block_size <= 0) return;
  // The evaluation window: the model keeps its context (its description), the task reads windows of --block-size.
  if (!c.model_config.is_object()) c.model_config = family(c).describe(c);
  // (the context a description gives: a Llama's max_seq_len, a GPT's block_size)
  const Json* context = c.model_config.find("max_seq_len") ? c.model_config.find("max_seq_len")
                                                           : c.model_config.find("block_size");
  CASTOR_CHECK(!context || !context->is_int() || e.block_size <= context->as_int(), "--block-size ", e.block_size, ": ",
               e.path, " reads at most ", context->dump(), " positions");
  c.block_size = e.block_size;
}

std::shared_ptr<models::LanguageModel> make_language_model(const TrainConfig& c, int64_t real_vocab, uint64_t seed) {
  return family(c).make(c, real_vocab, seed);
}

std::unique_ptr<Task> make_lm_task(TrainConfig& c, int rank, int world, bool new_run) {
  return std::make_unique<LmTask>(c, rank, world, new_run);
}

}  // namespace castor::train
