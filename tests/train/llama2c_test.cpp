// llama2.c's model files: v0 and v1 round trips bit for bit, files laid out by tests/oracle/llama2c_oracle.py from
// export.py's layouts load to their tensors, Castor's files read as run.c reads them, and one-line errors naming the
// file for damaged ones.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "castor/autograd.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/model_source.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor {
namespace {

using formats::Llama2cConfig;
using formats::Llama2cWeights;

// Grouped-query attention (4 heads, 2 kv heads), head size 4, a hidden size that is no multiple of anything.
Llama2cConfig small_config() {
  Llama2cConfig c;
  c.dim = 16, c.hidden_dim = 40, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 37;
  c.max_seq_len = 12;
  return c;
}

Llama2cWeights random_weights(const Llama2cConfig& c, bool shared, uint64_t seed) {
  Generator g(seed);
  Llama2cWeights w{c, {}};
  for (const auto& [name, shape] : formats::llama2c_tensors(c, 1, shared))
    w.state[name] = randn(shape, DType::Float32, &g);
  if (shared) w.state["output.weight"] = w.state.at("tok_embeddings.weight");
  return w;
}

using Bytes = std::vector<uint8_t>;

Bytes head(const Bytes& b, size_t n) { return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)); }

void expect_same_config(const Llama2cConfig& got, const Llama2cConfig& want) {
  EXPECT_EQ(got.dim, want.dim);
  EXPECT_EQ(got.hidden_dim, want.hidden_dim);
  EXPECT_EQ(got.n_layers, want.n_layers);
  EXPECT_EQ(got.n_heads, want.n_heads);
  EXPECT_EQ(got.n_kv_heads, want.n_kv_heads);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.max_seq_len, want.max_seq_len);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
}

void expect_same_model(const Llama2cWeights& got, const Llama2cWeights& want) {
  expect_same_config(got.config, want.config);
  ASSERT_EQ(got.state.size(), want.state.size());
  for (const auto& [name, t] : want.state) {
    ASSERT_TRUE(got.state.count(name)) << name;
    EXPECT_TRUE(test::bit_equal(got.state.at(name), t)) << name;
  }
}

int32_t int_at(const Bytes& bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

// Each version, shared and unshared: write, read back (the same tensors and config), write again (the same bytes);
// the size is the header plus every float; the header ints sit where run.c and export.py put them.
TEST(Llama2c, RoundTripsBitForBit) {
  const test::ScratchDir dir;
  for (int version : {0, 1}) {
    for (bool shared : {true, false}) {
      SCOPED_TRACE(detail::cat("v", version, shared ? " shared" : " unshared"));
      const Llama2cWeights w = random_weights(small_config(), shared, 7);
      const std::string a = dir + "/a.bin", b = dir + "/b.bin";
      formats::write_llama2c(a, w, version);
      const Bytes bytes = read_file(a);
      int64_t floats = 0;
      for (const auto& [name, shape] : formats::llama2c_tensors(w.config, version, shared)) floats += shape_numel(shape);
      EXPECT_EQ(bytes.size(), (version == 0 ? 28u : 256u) + 4u * floats);
      const size_t at = version == 0 ? 0 : 8;
      if (version == 1) {
        EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "24ka");  // 0x616b3432 little-endian
        EXPECT_EQ(int_at(bytes, 4), 1);
        EXPECT_EQ(bytes[36], shared ? 1 : 0);
      }
      const std::vector<int32_t> header{16, 40, 2, 4, 2, version == 0 && !shared ? -37 : 37, 12};
      for (size_t i = 0; i < 7; ++i) EXPECT_EQ(int_at(bytes, at + 4 * i), header[i]) << "header field " << i;
      const formats::Llama2cHeader h = formats::read_llama2c_header(a);
      EXPECT_EQ(h.version, version);
      EXPECT_EQ(h.shared_classifier, shared);
      const Llama2cWeights r = formats::read_llama2c(a);
      expect_same_model(r, w);
      EXPECT_EQ(shared, r.state.at("output.weight").data_ptr() == r.state.at("tok_embeddings.weight").data_ptr());
      formats::write_llama2c(b, r, version);
      EXPECT_TRUE(read_file(b) == bytes);
      // Through the other version and back: the same bytes again.
      formats::write_llama2c(b, r, 1 - version);
      formats::write_llama2c(b, formats::read_llama2c(b), version);
      EXPECT_TRUE(read_file(b) == bytes);
    }
  }
}

// A v0 file's RoPE tables record theta: another theta reads back exactly and rewrites the same bytes; v1 files,
// which record none, refuse it.
TEST(Llama2c, V0TablesRecordRopeTheta) {
  const test::ScratchDir dir;
  for (double theta : {500000.0, 12345.0, 10000.0}) {
    Llama2cConfig c = small_config();
    c.rope_theta = theta;
    const Llama2cWeights w = random_weights(c, true, 3);
    formats::write_llama2c(dir + "/a.bin", w, 0);
    const Llama2cWeights r = formats::read_llama2c(dir + "/a.bin");
    EXPECT_EQ(r.config.rope_theta, theta);
    formats::write_llama2c(dir + "/b.bin", r, 0);
    EXPECT_TRUE(read_file(dir + "/a.bin") == read_file(dir + "/b.bin")) << theta;
  }
  Llama2cConfig c = small_config();
  c.rope_theta = 500000.0;
  test::expect_error([&] { formats::write_llama2c(dir + "/v1.bin", random_weights(c, true, 3), 1); },
                     {dir + "/v1.bin", "v1 files record no RoPE theta"});
  EXPECT_FALSE(file_exists(dir + "/v1.bin"));
}

// PyTorch lays out v0 and v1 files as export.py's legacy_export and version1_export write them (its own struct
// packing and model.py's precompute_freqs_cis tables): they load to the oracle's tensors, bit for bit.
TEST(Llama2c, FilesLaidOutByExportPyLoad) {
  const test::ScratchDir dir;
  Llama2cConfig want_config;
  want_config.dim = 24, want_config.hidden_dim = 64, want_config.n_layers = 3, want_config.n_heads = 6;
  want_config.n_kv_heads = 3, want_config.vocab_size = 50, want_config.max_seq_len = 40;
  for (bool shared : {true, false}) {
    const std::string config = detail::cat(
        "{\"dim\": 24, \"hidden_dim\": 64, \"n_layers\": 3, \"n_heads\": 6, \"n_kv_heads\": 3, \"vocab_size\": 50, "
        "\"max_seq_len\": 40, \"theta\": 10000.0, \"seed\": 5, \"shared\": ",
        shared ? "true" : "false", "}");
    ASSERT_TRUE(test::run_oracle("llama2c_oracle.py", {"write", config, dir}));
    std::map<std::string, Tensor> want = test::read_oracle_case(dir + "/expected.bin");
    want.erase("freq_cis_real");
    want.erase("freq_cis_imag");
    for (const char* file : {"/v0.bin", "/v1.bin"}) {
      SCOPED_TRACE(detail::cat(file, shared ? " shared" : " unshared"));
      const formats::Llama2cHeader h = formats::read_llama2c_header(dir + file);
      EXPECT_EQ(h.shared_classifier, shared);
      const Llama2cWeights w = formats::read_llama2c(dir + file);
      expect_same_config(w.config, want_config);
      ASSERT_EQ(w.state.size(), want.size());
      for (const auto& [name, t] : want) {
        ASSERT_TRUE(w.state.count(name)) << name;
        EXPECT_TRUE(test::bit_equal(w.state.at(name).to(DType::Float64), t)) << name;
      }
    }
  }
}

// Castor's files read as run.c reads them (tests/oracle/llama2c_oracle.py's read_checkpoint, at
// memory_map_weights' offsets; v1 at version1_export's): the same tensors, the header run.c sees, and v0 tables
// within float32 rounding of model.py's precompute_freqs_cis.
TEST(Llama2c, CastorFilesReadAsRunCReadsThem) {
  const test::ScratchDir dir;
  for (int version : {0, 1}) {
    for (bool shared : {true, false}) {
      SCOPED_TRACE(detail::cat("v", version, shared ? " shared" : " unshared"));
      const Llama2cWeights w = random_weights(small_config(), shared, 11);
      formats::write_llama2c(dir + "/model.bin", w, version);
      ASSERT_TRUE(test::run_oracle("llama2c_oracle.py", {"read", dir + "/model.bin", dir + "/read"}));
      std::map<std::string, Tensor> got = test::read_oracle_case(dir + "/read.bin");
      EXPECT_EQ(got.at("header").to_vector<int64_t>(),
                (std::vector<int64_t>{16, 40, 2, 4, 2, version == 0 && !shared ? -37 : 37, 12, shared, version}));
      if (version == 0) {
        EXPECT_TRUE(test::close(got.at("freq_cis_real"), got.at("want_freq_cis_real"), 0, 1e-6));
        EXPECT_TRUE(test::close(got.at("freq_cis_imag"), got.at("want_freq_cis_imag"), 0, 1e-6));
        for (const char* name : {"freq_cis_real", "freq_cis_imag", "want_freq_cis_real", "want_freq_cis_imag"})
          got.erase(name);
      }
      got.erase("header");
      ASSERT_EQ(got.size(), w.state.size());
      for (const auto& [name, t] : w.state) {
        ASSERT_TRUE(got.count(name)) << name;
        EXPECT_TRUE(test::bit_equal(got.at(name), t.to(DType::Float64))) << name;
      }
    }
  }
}

// run.c's forward pass over a file Castor wrote (tests/oracle/llama2c_oracle.py forward: read_checkpoint's offsets,
// float64) gives the logits of Castor's Llama built from the file read back (llama_config, load_state_dict): v0 and
// v1, grouped-query attention with a shared classifier and multi-head attention with an unshared one.
TEST(Llama2c, RunCForwardMatchesCastorLlama) {
  const test::ScratchDir dir;
  struct Case {
    int version;
    int64_t n_kv_heads;
    bool shared;
  };
  for (const Case& k : {Case{0, 2, true}, Case{1, 4, false}, Case{0, 4, false}, Case{1, 1, true}}) {
    SCOPED_TRACE(detail::cat("v", k.version, ", ", k.n_kv_heads, " kv heads", k.shared ? ", shared" : ", unshared"));
    Llama2cConfig c = small_config();
    c.n_kv_heads = k.n_kv_heads;
    Llama2cWeights w = random_weights(c, k.shared, 21);
    for (auto& [name, t] : w.state)  // matrices of unit rows: activations of order one
      if (t.dim() == 2 && name != "tok_embeddings.weight" && name != "output.weight") t = t * 0.25;
    formats::write_llama2c(dir + "/model.bin", w, k.version);
    const std::vector<int64_t> ids{1, 5, 36, 0, 7, 7, 19, 2, 30, 11, 4, 25};  // max_seq_len of them
    std::string csv;
    for (int64_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
    ASSERT_TRUE(test::run_oracle("llama2c_oracle.py", {"forward", dir + "/model.bin", csv, dir + "/logits"}));
    const Tensor want = test::read_oracle_case(dir + "/logits.bin").at("logits");  // (T, V) float64
    const Llama2cWeights r = formats::read_llama2c(dir + "/model.bin");
    const models::LlamaConfig config = formats::llama_config(r);
    EXPECT_EQ(config.tied, k.shared);
    auto model = models::llama(config);
    model->load_state_dict(r.state);
    model->eval();
    NoGradGuard no_grad;
    const Tensor tokens = tensor(std::vector<double>(ids.begin(), ids.end()), {1, 12}, DType::Int64);
    const Tensor logits = (*model)(tokens).reshape({12, 37}).to(DType::Float64);
    EXPECT_TRUE(test::close(logits, want, 1e-4, 1e-4));
  }
}

// Damaged files: one line naming the file and the problem.
TEST(Llama2c, DamagedFilesAreOneLineErrors) {
  const test::ScratchDir dir;
  const std::string good = dir + "/good.bin", bad = dir + "/bad.bin";
  formats::write_llama2c(good, random_weights(small_config(), false, 1), 0);
  const Bytes bytes = read_file(good);
  auto expect_bad = [&](const Bytes& content, const std::vector<std::string>& parts) {
    test::write_bytes(bad, content);
    std::vector<std::string> all = parts;
    all.push_back(bad);
    test::expect_error([&] { formats::read_llama2c(bad); }, all);
  };
  expect_bad(head(bytes, bytes.size() - 4), {"llama2.c v0 file is", "needs " + std::to_string(bytes.size())});
  Bytes longer = bytes;
  longer.resize(bytes.size() + 4);
  expect_bad(longer, {"needs " + std::to_string(bytes.size())});
  expect_bad(head(bytes, 20), {"is 20 bytes, shorter than a llama2.c v0 header (28 bytes)"});
  expect_bad({}, {"is 0 bytes, shorter than a llama2.c v0 header (28 bytes)"});
  auto with_int = [&](const Bytes& base, size_t offset, int32_t v) {
    Bytes b = base;
    std::memcpy(b.data() + offset, &v, 4);
    return b;
  };
  expect_bad(with_int(bytes, 12, 3), {"dim 16 is not a multiple of n_heads 3"});
  expect_bad(with_int(bytes, 16, 3), {"n_heads 4 is not a multiple of n_kv_heads 3"});
  expect_bad(with_int(bytes, 0, -16), {"dim must be in 1..2^31-1, got -16"});
  expect_bad(with_int(bytes, 8, 1 << 30), {"n_layers 1073741824", "needs"});
  expect_bad(with_int(bytes, 20, 37), {"shared classifier) needs"});  // the output layer's floats are left over
  // The RoPE tables: a damaged entry is found.
  const size_t tables = bytes.size() - 4 * (37 * 16) - 4 * (2 * 12 * 2);
  Bytes damaged = bytes;
  const float junk = 0.5f;
  std::memcpy(damaged.data() + tables + 4 * (5 * 2 + 1), &junk, 4);
  expect_bad(damaged, {"RoPE tables", "not llama2.c's for any theta", "row 5, pair 1"});
  // v1: another version, a bad flag byte, a truncated header.
  formats::write_llama2c(good, random_weights(small_config(), true, 1), 1);
  const Bytes v1 = read_file(good);
  expect_bad(with_int(v1, 4, 2), {"llama2.c file version 2 is not supported"});
  Bytes flag = v1;
  flag[36] = 7;
  expect_bad(flag, {"shared-classifier byte is 7"});
  expect_bad(head(v1, 100), {"llama2.c v1 file is 100 bytes, shorter than its 256-byte header"});
  expect_bad(with_int(v1, 28, -37), {"vocab_size must be positive, got -37"});
}

// What eval, info and --init see of a llama2.c file: its format told by its first bytes (v1's magic number, or a v0
// header that fits the file exactly), its tensors and a Llama run's castor.config; a damaged v0 file is named with
// what reading it as one found.
TEST(Llama2c, WeightsFilesTellLlama2cFiles) {
  const test::ScratchDir dir;
  Llama2cConfig c = small_config();
  c.hidden_dim = 64;  // what --multiple-of 32 gives for dim 16 (2/3 of 64 = 42, rounded up)
  const Llama2cWeights w = random_weights(c, false, 4);
  for (int version : {0, 1}) {
    const std::string path = detail::cat(dir + "/v", version, ".bin");
    formats::write_llama2c(path, w, version);
    EXPECT_EQ(formats::source_format(path), formats::SourceFormat::Llama2c);
    const LoadedTensors loaded = formats::load_weights_file(path, "tokens");
    EXPECT_EQ(loaded.tensors.size(), w.state.size());
    EXPECT_TRUE(test::bit_equal(loaded.tensors.at("output.weight"), w.state.at("output.weight")));
    const Json config = Json::parse(loaded.metadata.at("castor.config"));
    EXPECT_EQ(config.at("model").as_string(), "llama");
    EXPECT_EQ(config.at("data").as_string(), "tokens");
    for (const auto& [key, value] : std::vector<std::pair<const char*, int64_t>>{{"n_embd", 16},
                                                                                 {"n_layer", 2},
                                                                                 {"n_head", 4},
                                                                                 {"n_kv_head", 2},
                                                                                 {"vocab_size", 37},
                                                                                 {"block_size", 12},
                                                                                 {"multiple_of", 32}})
      EXPECT_EQ(config.at(key).as_int(), value) << key;
    EXPECT_TRUE(config.at("untied").as_bool());
    const SafetensorsFile header = formats::read_weights_header(path);
    EXPECT_EQ(header.entries.size(), w.state.size() + (version == 0 ? 2 : 0));  // v0: the RoPE tables
    EXPECT_EQ(Json::parse(header.metadata.at("castor.config")).find("data"), nullptr);
  }
  const Bytes v0 = read_file(dir + "/v0.bin");
  test::write_bytes(dir + "/short.bin", head(v0, v0.size() - 1));
  test::expect_error(
      [&] { formats::source_format(dir + "/short.bin"); },
      {dir + "/short.bin: not a model file", "as a llama2.c v0 file", "needs " + std::to_string(v0.size())});
  test::expect_error([&] { formats::load_gpt_init(dir + "/v0.bin"); }, {dir + "/v0.bin", "not a GPT's weights"});
}

// The --multiple-of of a file's hidden_dim: 32 when model.py's rule gives it from 32, else hidden_dim itself; one
// below the rule's 2/3 of 4 dim has none.
TEST(Llama2c, MultipleOfGivesTheFilesHiddenDim) {
  Llama2cConfig c = small_config();  // dim 16: the rule's 42, rounded up
  c.hidden_dim = 64;
  EXPECT_EQ(formats::llama2c_multiple_of(c, "f"), 32);
  c.hidden_dim = 44;
  EXPECT_EQ(formats::llama2c_multiple_of(c, "f"), 44);
  c.hidden_dim = 42;
  EXPECT_EQ(formats::llama2c_multiple_of(c, "f"), 42);
  c.hidden_dim = 41;
  test::expect_error([&] { formats::llama2c_multiple_of(c, "f"); }, {"f: hidden_dim 41 is below 42"});
}

// Writing: an invalid config or a state dict that does not fit it is refused naming the file, and a good file at
// the path stays as it was.
TEST(Llama2c, WriteRefusesWhatDoesNotFitAndKeepsTheOldFile) {
  const test::ScratchDir dir;
  const std::string path = dir + "/model.bin";
  const Llama2cWeights w = random_weights(small_config(), true, 2);
  formats::write_llama2c(path, w, 0);
  const Bytes before = read_file(path);
  Llama2cWeights missing = w;
  missing.state.erase("layers.1.feed_forward.w3.weight");
  test::expect_error([&] { formats::write_llama2c(path, missing, 0); },
                     {path, "no tensor layers.1.feed_forward.w3.weight"});
  Llama2cWeights wrong = w;
  wrong.state["layers.0.attention.wk.weight"] = zeros({16, 16});
  test::expect_error([&] { formats::write_llama2c(path, wrong, 1); },
                     {path, "layers.0.attention.wk.weight is [16, 16], expected [8, 16]"});
  Llama2cWeights extra = w;
  extra.state["layers.2.ffn_norm.weight"] = zeros({16});
  test::expect_error([&] { formats::write_llama2c(path, extra, 0); }, {path, "unexpected tensor layers.2.ffn_norm"});
  Llama2cWeights odd = w;
  odd.config.n_heads = 16;
  test::expect_error([&] { formats::write_llama2c(path, odd, 0); }, {path, "head size 1 (dim / n_heads) is odd"});
  test::expect_error([&] { formats::write_llama2c(path, w, 2); }, {path, "version 2"});
  EXPECT_TRUE(read_file(path) == before);
}

}  // namespace
}  // namespace castor
