// llm.c's checkpoint format and nanoGPT-named safetensors: bit-exact round trips, one-line errors on bad files,
// load_gpt_init, and ten AdamW steps from a PyTorch-written llm.c file against PyTorch's losses
// (tests/oracle/llmc_oracle.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "castor/fs.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/serialize.h"
#include "castor/json.h"
#include "llmc_interop.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor {
namespace {

// The interop config: 2 layers, 2 heads, 64 wide, V = 101 padded to 128, block 32.
models::GPTConfig small_config() {
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 32, c.vocab_size = 128, c.real_vocab_size = 101;
  return c;
}

using test::read_text;

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

using test::error_of;

TEST(Llmc, RoundTripIsBitExact) {
  const test::ScratchDir dir("llmc_round_trip");
  std::filesystem::create_directories(dir);
  auto model = models::gpt(small_config(), 5);
  formats::write_llmc_checkpoint(dir + "/a.bin", *model);
  // The size llm.c's reader expects: header + every float, wte with its padded rows.
  EXPECT_EQ(read_file(dir + "/a.bin").size(), 1024u + 4u * model->num_params());
  const formats::GPTWeights w = formats::read_llmc_checkpoint(dir + "/a.bin");
  EXPECT_EQ(w.config.n_layer, 2);
  EXPECT_EQ(w.config.n_head, 2);
  EXPECT_EQ(w.config.n_embd, 64);
  EXPECT_EQ(w.config.block_size, 32);
  EXPECT_EQ(w.config.vocab_size, 128);
  EXPECT_EQ(w.config.real_vocab_size, 101);
  EXPECT_TRUE(w.config.bias);
  StateDict want = model->state_dict();
  want.erase("lm_head.weight");
  ASSERT_EQ(w.state.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(w.state.count(name)) << name;
    EXPECT_TRUE(test::bit_equal(w.state.at(name), t)) << name;
  }
  // Header fields as llm.c reads them.
  int32_t h[8];
  std::memcpy(h, read_text(dir + "/a.bin").data(), sizeof(h));
  EXPECT_EQ(std::vector<int32_t>(h, h + 8), (std::vector<int32_t>{20240326, 3, 32, 101, 2, 2, 64, 128}));
  // Written again from what was read: the same bytes.
  formats::write_llmc_checkpoint(dir + "/b.bin", w);
  EXPECT_TRUE(read_text(dir + "/a.bin") == read_text(dir + "/b.bin"));
  // Version 5 (llm.c's bfloat16 files): the same layout in 2-byte floats, read widened to float32.
  std::string v5 = read_text(dir + "/a.bin").substr(0, 1024);
  const int32_t five = 5;
  std::memcpy(v5.data() + 4, &five, 4);
  const std::string floats = read_text(dir + "/a.bin").substr(1024);
  for (size_t i = 0; i < floats.size(); i += 4) v5 += floats.substr(i + 2, 2);  // the upper half: bf16 by truncation
  write_bytes(dir + "/v5.bin", v5);
  const formats::GPTWeights w5 = formats::read_llmc_checkpoint(dir + "/v5.bin");
  for (const auto& [name, t] : want) {
    std::vector<float> truncated = t.contiguous().to_vector<float>();
    for (float& f : truncated) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits &= 0xFFFF0000u;
      std::memcpy(&f, &bits, 4);
    }
    EXPECT_TRUE(test::bit_equal(w5.state.at(name), from_blob(truncated.data(), t.shape(), DType::Float32))) << name;
  }
  // A GPT without biases is written with zero biases, which compute the same function.
  models::GPTConfig nb = small_config();
  nb.bias = false;
  auto no_bias = models::gpt(nb, 6);
  formats::write_llmc_checkpoint(dir + "/c.bin", *no_bias);
  const formats::GPTWeights z = formats::read_llmc_checkpoint(dir + "/c.bin");
  EXPECT_EQ(z.state.at("transformer.h.1.mlp.c_fc.bias").to_vector<double>(), std::vector<double>(256, 0.0));
  EXPECT_TRUE(test::bit_equal(z.state.at("transformer.h.1.mlp.c_fc.weight"),
                              no_bias->state_dict().at("transformer.h.1.mlp.c_fc.weight")));
}

TEST(Llmc, BadFilesAreOneLineErrorsNamingTheFile) {
  const test::ScratchDir dir("llmc_bad");
  std::filesystem::create_directories(dir);
  auto model = models::gpt(small_config(), 5);
  formats::write_llmc_checkpoint(dir + "/good.bin", *model);
  const std::string good = read_text(dir + "/good.bin");
  auto with_header = [&](int index, int32_t value) {
    std::string b = good;
    std::memcpy(b.data() + 4 * index, &value, 4);
    return b;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "shorter than its 1024-byte header"},
      {good.substr(0, 1000), "shorter than its 1024-byte header"},
      {with_header(0, 20240520), "magic number 20240520"},
      {with_header(1, 4), "version 4 is not supported"},
      {with_header(1, 5), "bytes, its header"},  // bfloat16: half the size
      {with_header(4, 0), "L must be positive"},
      {with_header(5, 3), "not a multiple of NH 3"},
      {with_header(3, 129), "V 129 larger than padded Vp 128"},
      {with_header(6, 2000000000), "needs more than 2^64"},
      {good.substr(0, good.size() - 4), "bytes, its header"},
      {good + "x", "bytes, its header"},
  };
  for (const auto& [bytes, want] : cases) {
    const std::string path = dir + "/bad.bin";
    write_bytes(path, bytes);
    const std::string err = error_of([&] { formats::read_llmc_checkpoint(path); });
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find(want), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  EXPECT_NE(error_of([&] { formats::read_llmc_checkpoint(dir + "/missing.bin"); }).find("missing.bin"),
            std::string::npos);
  EXPECT_NE(error_of([&] { formats::read_llmc_checkpoint(dir); }).find(dir), std::string::npos);
  // A failed write leaves the old file whole.
  write_bytes(dir + "/keep.bin", good);
  auto other = models::gpt(small_config(), 6);
  StateDict broken = other->state_dict();
  broken.erase("transformer.h.1.ln_2.weight");
  EXPECT_NE(error_of([&] {
              formats::write_llmc_checkpoint(dir + "/keep.bin", {small_config(), broken});
            }).find("no tensor transformer.h.1.ln_2.weight"),
            std::string::npos);
  EXPECT_TRUE(read_text(dir + "/keep.bin") == good);
}

TEST(Llmc, LoadGptInitTakesBothFormats) {
  const test::ScratchDir dir("llmc_init");
  std::filesystem::create_directories(dir);
  models::GPTConfig c = small_config();
  auto model = models::gpt(c, 7);
  const StateDict sd = model->state_dict();  // with lm_head.weight, as nanoGPT's state_dict()
  formats::write_llmc_checkpoint(dir + "/m.bin", *model);
  save_safetensors(dir + "/with_heads.safetensors", sd, {{"castor.config", "{\"n_head\": 2}"}});
  // torch.compile's prefix and nanoGPT's mask buffers, as a nanoGPT checkpoint would hold them.
  StateDict compiled;
  for (const auto& [k, t] : sd) compiled["_orig_mod." + k] = t;
  compiled["_orig_mod.transformer.h.0.attn.bias"] = zeros({1, 1, 32, 32});
  save_safetensors(dir + "/plain.safetensors", compiled);
  for (const auto& [file, n_head] : std::vector<std::pair<std::string, int64_t>>{
           {"m.bin", 0}, {"with_heads.safetensors", 0}, {"plain.safetensors", 2}, {"m.bin", 2}}) {
    const formats::GPTWeights w = formats::load_gpt_init(dir + "/" + file, n_head);
    EXPECT_EQ(w.config.n_head, 2) << file;
    EXPECT_EQ(w.config.n_layer, 2) << file;
    EXPECT_EQ(w.config.vocab_size, 128) << file;
    EXPECT_EQ(w.config.block_size, 32) << file;
    EXPECT_FALSE(w.state.count("lm_head.weight")) << file;
    EXPECT_EQ(w.state.size(), sd.size() - 1) << file;
    for (const auto& [name, t] : w.state) EXPECT_TRUE(test::bit_equal(t, sd.at(name))) << file << " " << name;
    auto loaded = models::gpt(w.config);
    EXPECT_NO_THROW(loaded->load_state_dict(w.state)) << file;
  }
  // 16-bit weights (an O3 run's) are widened to float32.
  StateDict half;
  for (const auto& [k, t] : sd) half[k] = t.to(DType::BFloat16);
  save_safetensors(dir + "/bf16.safetensors", half, {{"castor.config", "{\"n_head\": 2}"}});
  const formats::GPTWeights hw = formats::load_gpt_init(dir + "/bf16.safetensors");
  for (const auto& [name, t] : hw.state) {
    EXPECT_EQ(t.dtype(), DType::Float32) << name;
    EXPECT_TRUE(test::bit_equal(t, half.at(name).to(DType::Float32))) << name;
  }
  // What cannot be loaded, each one line naming the file.
  const std::string plain = dir + "/plain.safetensors";
  EXPECT_NE(error_of([&] { formats::load_gpt_init(plain); }).find(plain + ": the number of heads is not recorded"),
            std::string::npos);
  EXPECT_NE(error_of([&] { formats::load_gpt_init(dir + "/m.bin", 4); }).find("NH 2, but 4 was given"),
            std::string::npos);
  EXPECT_NE(error_of([&] { formats::load_gpt_init(plain, 3); }).find("not a multiple of n_head 3"), std::string::npos);
  StateDict bad = sd;
  bad["lm_head.weight"] = mul(sd.at("lm_head.weight"), 2.0);
  save_safetensors(dir + "/untied.safetensors", bad);
  EXPECT_NE(error_of([&] { formats::load_gpt_init(dir + "/untied.safetensors", 2); }).find("lm_head.weight differs"),
            std::string::npos);
  bad = sd;
  bad["transformer.h.1.mlp.c_fc.weight"] = zeros({256, 63});
  save_safetensors(dir + "/shape.safetensors", bad);
  EXPECT_NE(error_of([&] {
              formats::load_gpt_init(dir + "/shape.safetensors", 2);
            }).find("transformer.h.1.mlp.c_fc.weight is [256, 63], expected [256, 64]"),
            std::string::npos);
  bad = sd;
  bad["transformer.h.0.extra"] = zeros({2});
  save_safetensors(dir + "/extra.safetensors", bad);
  EXPECT_NE(error_of([&] {
              formats::load_gpt_init(dir + "/extra.safetensors", 2);
            }).find("unexpected tensor transformer.h.0.extra"),
            std::string::npos);
  save_safetensors(dir + "/image.safetensors", models::simple_cnn(1, 28, 28)->state_dict());
  EXPECT_NE(
      error_of([&] { formats::load_gpt_init(dir + "/image.safetensors", 2); }).find("no tensor transformer.wte.weight"),
      std::string::npos);
}

// llm.c's test on a small config: PyTorch writes a random nanoGPT twin as an llm.c file and trains it 10 AdamW steps
// (lr 1e-4, weight decay 0.01) on llm.c-order batches; Castor loads the file and does the same. O0: every step's
// loss within 1e-4 relative of PyTorch's; O1 bf16 autocast: within 0.02 of PyTorch's float32 losses.
TEST(LlmcInterop, TenAdamWStepsMatchPyTorch) {
  const test::ScratchDir dir("llmc_interop");
  std::filesystem::create_directories(dir);
  const int64_t B = 4, T = 32, steps = 10;
  const double lr = 1e-4, wd = 0.01;
  const std::string config = detail::cat(
      "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64, \"block_size\": 32, \"vocab_size\": 101, "
      "\"padded_vocab_size\": 128, \"batch_size\": ",
      B, ", \"seq_len\": ", T, ", \"steps\": ", steps, ", \"lr\": ", lr, ", \"weight_decay\": ", wd, ", \"seed\": 1}");
  ASSERT_TRUE(test::run_oracle("llmc_oracle.py", {config, dir}));
  const StateDict want = load_safetensors(dir + "/losses.safetensors").tensors;
  const std::vector<double> torch_loss = want.at("loss").to_vector<double>(),
                            untrained = want.at("loss_untrained").to_vector<double>();
  // The file is what the PyTorch side wrote: V and Vp from its header, padded rows zero.
  const formats::GPTWeights w = formats::read_llmc_checkpoint(dir + "/model.bin");
  EXPECT_EQ(w.config.real_vocab_size, 101);
  EXPECT_EQ(w.config.vocab_size, 128);
  EXPECT_EQ(w.state.at("transformer.wte.weight").narrow(0, 101, 27).contiguous().to_vector<double>(),
            std::vector<double>(27 * 64, 0.0));

  const test::LlmcSteps o0 = test::llmc_train_steps(dir + "/model.bin", dir + "/train.bin", B, T, steps, lr, wd, false);
  const test::LlmcSteps o1 = test::llmc_train_steps(dir + "/model.bin", dir + "/train.bin", B, T, steps, lr, wd, true);
  ASSERT_EQ(o0.losses.size(), static_cast<size_t>(steps));
  double rel0 = 0, abs1 = 0;
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_NEAR(o0.losses[i], torch_loss[i], 1e-4 * torch_loss[i]) << "O0 step " << i;
    EXPECT_NEAR(o1.losses[i], torch_loss[i], 0.02) << "O1 bf16 step " << i;
    rel0 = std::max(rel0, std::fabs(o0.losses[i] - torch_loss[i]) / torch_loss[i]);
    abs1 = std::max(abs1, std::fabs(o1.losses[i] - torch_loss[i]));
  }
  std::printf("losses %.6f -> %.6f; O0 max relative difference %.2e, O1 bf16 max difference %.4f\n", torch_loss[0],
              torch_loss[steps - 1], rel0, abs1);
  // Training moved the loss by far more than the tolerance: a Castor run that skipped its updates would fail above.
  EXPECT_GT(untrained[steps - 1] - torch_loss[steps - 1], 20 * 1e-4 * torch_loss[steps - 1]);
}

// The padded-vocabulary tests' model: PyTorch (llmc_oracle.py) writes a 2-layer GPT of vocabulary 101 padded to 128 as
// DIR/model.bin with its tokens (DIR/train.bin, 3 batches of B 4 x T 32) and their untrained losses; the padding rows
// are then set large (3.0) in DIR/padded.bin, so that a softmax over them would be far off.
constexpr int64_t kPaddedB = 4, kPaddedT = 32;
void write_padded_model(const std::string& dir, int seed, std::vector<double>* torch_loss) {
  const std::string config = detail::cat(
      "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64, \"block_size\": 32, \"vocab_size\": 101, "
      "\"padded_vocab_size\": 128, \"batch_size\": ",
      kPaddedB, ", \"seq_len\": ", kPaddedT, ", \"steps\": 3, \"lr\": 1e-4, \"weight_decay\": 0.0, \"seed\": ", seed,
      "}");
  ASSERT_TRUE(test::run_oracle("llmc_oracle.py", {config, dir}));
  *torch_loss = load_safetensors(dir + "/losses.safetensors").tensors.at("loss_untrained").to_vector<double>();
  formats::GPTWeights w = formats::read_llmc_checkpoint(dir + "/model.bin");
  w.state.at("transformer.wte.weight").narrow(0, 101, 27).fill_(3.0);
  formats::write_llmc_checkpoint(dir + "/padded.bin", w);
}

// A padded vocabulary (V 101 of Vp 128): every loss covers the real vocabulary only, as llm.c's and PyTorch's over an
// unpadded model do. PyTorch (tests/oracle/llmc_oracle.py) writes the llm.c file and its float32 losses per batch;
// the file's padding rows are then set large (3.0) so that a softmax over them would be far off. The library's
// loss, `castor eval` of the .bin and the first loss of `castor train --init` all match within 1e-6 relative, and the
// padding rows' gradients stay zero.
TEST(LlmcInterop, LossesCoverOnlyTheRealVocabulary) {
  const test::ScratchDir scratch("llmc_real_vocab");
  const std::string& dir = scratch.str();
  std::filesystem::create_directories(dir + "/tok");
  std::vector<double> torch_loss;
  ASSERT_NO_FATAL_FAILURE(write_padded_model(dir, 3, &torch_loss));
  const formats::GPTWeights w = formats::read_llmc_checkpoint(dir + "/padded.bin");
  // The token directory: the oracle's tokens as both splits, and the vocabulary's size.
  std::filesystem::copy_file(dir + "/train.bin", dir + "/tok/train.bin");
  std::filesystem::copy_file(dir + "/train.bin", dir + "/tok/val.bin");
  atomic_write_file(dir + "/tok/tokenizer.json", std::string("{\"tokenizer\": \"test\", \"vocab_size\": 101}"));

  // The library: logits over the 101 real tokens, the loss of batch 0, zero gradient rows for the padding.
  auto model = models::gpt(w.config);
  model->load_state_dict(w.state);
  data::TokenFile tokens(dir + "/train.bin");
  const data::LmBatch b = data::LmBatchSource(
                              tokens,
                              {.batch_size = kPaddedB, .block_size = kPaddedT, .order = data::LmOrder::Sequential})
                              .batch(0);
  const Tensor logits = (*model)(b.x);
  EXPECT_EQ(logits.shape(), (Shape{kPaddedB, kPaddedT, 101}));
  const Tensor loss = F::cross_entropy(logits.reshape({kPaddedB * kPaddedT, 101}), b.y.reshape({kPaddedB * kPaddedT}));
  EXPECT_NEAR(loss.item(), torch_loss[0], 1e-6 * torch_loss[0]);
  loss.backward();
  const Tensor grad = model->wte->weight.grad();
  EXPECT_EQ(grad.narrow(0, 101, 27).contiguous().to_vector<double>(), std::vector<double>(27 * 64, 0.0));
  EXPECT_GT(max(abs(grad.narrow(0, 0, 101))).item(), 0.0);

  // castor eval of the .bin: the whole split (3 batches of 4 rows) in float32.
  const test::CastorRun in_dir{dir};
  test::CastorProcess e = test::run_castor({"eval", "padded.bin", "--data-dir", "tok"}, in_dir);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const double mean_loss = (torch_loss[0] + torch_loss[1] + torch_loss[2]) / 3;
  EXPECT_NEAR(Json::parse(e.out).at("val_loss").as_double(), mean_loss, 1e-6 * mean_loss) << e.out;
  // castor train --init: the first step's loss (batch 0 in llm.c's validation order) before any update.
  test::CastorProcess t = test::run_castor({"train",  "--model",    "gpt", "--init",       "padded.bin", "--data",
                                            "tokens", "--data-dir", "tok", "--data-order", "sequential", "--batch-size",
                                            "4",      "--amp",      "O0",  "--steps",      "1",          "--log-every",
                                            "1",      "--threads",  "1",   "--out",        "run"},
                                           in_dir);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::vector<uint8_t> lines = read_file(dir + "/run/metrics.jsonl");
  const std::string first(lines.begin(), std::find(lines.begin(), lines.end(), '\n'));
  EXPECT_NEAR(Json::parse(first).at("loss").as_double(), torch_loss[0], 1e-6 * torch_loss[0]) << first;
}

// A token folder of bare llm.c files (train.bin and val.bin, no tokenizer.json): the model's own vocabulary rules, the
// llm.c header's V (101 of Vp 128) or the one a run recorded, never the padded one. PyTorch (tests/oracle/
// llmc_oracle.py, lm_eval_oracle.py) computes the losses over the real vocabulary on the same weights and windows; the
// padding rows are set large (3.0) so that a softmax over them would be far off. `castor eval` of the .bin, the first
// loss of `castor train --init` (whose config.json records 101) and `castor eval` of that run all match within 1e-6
// relative; a tokenizer.json of another size is an error naming both sizes.
TEST(LlmcInterop, BareTokenFoldersUseTheModelsVocabulary) {
  const test::ScratchDir scratch("llmc_bare_vocab");
  const std::string& dir = scratch.str();
  std::filesystem::create_directories(dir + "/bare");
  std::filesystem::create_directories(dir + "/other");
  std::vector<double> torch_loss;
  ASSERT_NO_FATAL_FAILURE(write_padded_model(dir, 4, &torch_loss));
  for (const char* folder : {"bare", "other"}) {
    std::filesystem::copy_file(dir + "/train.bin", dir + "/" + folder + "/train.bin");
    std::filesystem::copy_file(dir + "/train.bin", dir + "/" + folder + "/val.bin");
  }
  atomic_write_file(dir + "/other/tokenizer.json", std::string("{\"tokenizer\": \"test\", \"vocab_size\": 120}"));
  const test::CastorRun in_dir{dir};

  // castor eval of the .bin on the bare folder: the whole split (3 batches of 4 rows) in float32.
  test::CastorProcess e = test::run_castor({"eval", "padded.bin", "--data-dir", "bare"}, in_dir);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const double mean_loss = (torch_loss[0] + torch_loss[1] + torch_loss[2]) / 3;
  EXPECT_NEAR(Json::parse(e.out).at("val_loss").as_double(), mean_loss, 1e-6 * mean_loss) << e.out;
  // castor train --init: the first step's loss, and the vocabulary it records.
  test::CastorProcess t = test::run_castor(
      {"train", "--model",      "gpt",        "--init",       "padded.bin", "--data", "tokens", "--data-dir",
       "bare",  "--data-order", "sequential", "--batch-size", "4",          "--amp",  "O0",     "--steps",
       "1",     "--log-every",  "1",          "--threads",    "1",          "--out",  "run"},
      in_dir);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::vector<uint8_t> lines = read_file(dir + "/run/metrics.jsonl");
  const std::string first(lines.begin(), std::find(lines.begin(), lines.end(), '\n'));
  EXPECT_NEAR(Json::parse(first).at("loss").as_double(), torch_loss[0], 1e-6 * torch_loss[0]) << first;
  const std::vector<uint8_t> recorded = read_file(dir + "/run/config.json");
  EXPECT_EQ(Json::parse(std::string(recorded.begin(), recorded.end())).at("real_vocab_size").as_int(), 101);
  // castor eval of that run on the bare folder: PyTorch's loss of the trained weights over the 101 real tokens.
  const std::optional<std::string> step = train::latest_checkpoint(dir + "/run");
  ASSERT_TRUE(step.has_value());
  const std::string eval_config =
      "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64, \"block_size\": 32, \"vocab_size\": 101, \"bias\": true, "
      "\"seq_len\": 32}";
  ASSERT_TRUE(test::run_oracle("lm_eval_oracle.py", {eval_config, *step + "/model.safetensors", dir + "/bare/val.bin",
                                                     dir + "/trained_loss.safetensors"}));
  const double trained = load_safetensors(dir + "/trained_loss.safetensors").tensors.at("loss").item();
  test::CastorProcess er = test::run_castor({"eval", "run", "--data-dir", "bare"}, in_dir);
  ASSERT_EQ(er.exit_code, 0) << er.err;
  EXPECT_NEAR(Json::parse(er.out).at("val_loss").as_double(), trained, 1e-6 * trained) << er.out;
  EXPECT_GT(std::fabs(trained - mean_loss), 1e-4);  // the step changed the weights: not the untrained loss again

  // A folder whose metadata names another vocabulary: refused, naming both, by eval and train --init.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"eval", "padded.bin", "--data-dir", "other"},
                                               {"eval", "run", "--data-dir", "other"},
                                               {"train", "--model", "gpt", "--init", "padded.bin", "--data", "tokens",
                                                "--data-dir", "other", "--steps", "1", "--out", "run2"}}) {
    test::CastorProcess p = test::run_castor(args, in_dir);
    EXPECT_NE(p.exit_code, 0) << args[0] << " " << args[1];
    EXPECT_NE(p.err.find("other/tokenizer.json holds the vocabulary [test, 120 tokens], but "), std::string::npos)
        << p.err;
    EXPECT_NE(p.err.find(" was trained in [101 tokens]"), std::string::npos) << p.err;
  }
}

// castor eval and castor info read llm.c files; a file of neither format is named as such by --init, eval and info.
TEST(LlmcInterop, EvalAndInfoReadLlmcFilesAndNameOtherFiles) {
  const test::ScratchDir scratch("llmc_eval_info");
  const std::string& dir = scratch.str();
  formats::write_llmc_checkpoint(dir + "/m.bin", *models::gpt(small_config(), 5));
  const test::CastorRun in_dir{dir};
  test::CastorProcess info = test::run_castor({"info", "m.bin"}, in_dir);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  for (const char* want : {"model       gpt, 28 tensors", "float32", "V 101", "Vp 128"})
    EXPECT_NE(info.out.find(want), std::string::npos) << want << " in\n" << info.out;
  test::CastorProcess listing = test::run_castor({"info", "--tensors", "m.bin"}, in_dir);
  ASSERT_EQ(listing.exit_code, 0) << listing.err;
  EXPECT_NE(listing.out.find("transformer.h.1.mlp.c_proj.weight  float32[64, 256]"), std::string::npos) << listing.out;
  // Neither format: 12 bytes whose first 8 read as a huge safetensors header length.
  write_bytes(dir + "/junk.bin",
              "\x01\x02\x03\x04\x05\x06\x07\x08"
              "abcd");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info", "junk.bin"},
        {"eval", "junk.bin", "--data-dir", "."},
        {"train", "--model", "gpt", "--init", "junk.bin", "--data", "tokens", "--data-dir", ".", "--out", "r"}}) {
    test::CastorProcess p = test::run_castor(args, in_dir);
    EXPECT_EQ(p.exit_code, 1) << args[0];
    EXPECT_NE(p.err.find("junk.bin: not a model file"), std::string::npos) << args[0] << ": " << p.err;
    EXPECT_EQ(p.err.find("header length"), std::string::npos) << p.err;
  }
}

}  // namespace
}  // namespace castor
