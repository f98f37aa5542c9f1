// llama2.c's model files (export.py's v0 "legacy" and v1 layouts, float32) to and from llama2.c-named state dicts
// (docs/llama.md, "llama2.c files").
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "castor/llama.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/state_dict.h"
#include "castor/tensor.h"

namespace castor::formats {

constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42" read as a little-endian uint32: v1 files open with it
constexpr uint64_t kLlama2cV0HeaderBytes = 7 * sizeof(int32_t);
constexpr uint64_t kLlama2cV1HeaderBytes = 256;

// The architecture a llama2.c file records: export.py's seven header ints (vocab_size positive here) and, for v0
// files, the theta of its RoPE tables (v1 files have none: llama2.c's 10000).
struct Llama2cConfig {
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, max_seq_len = 0;
  double rope_theta = 10000.0;
  int64_t head_size() const { return dim / n_heads; }
  // castor::Error "<what>: <field> ..." unless every size is positive and fits an int32, dim is a multiple of
  // n_heads with an even head size, and n_heads a multiple of n_kv_heads.
  void validate(const std::string& what) const;
};

// A llama2.c file's header, checked against the file's size.
struct Llama2cHeader {
  Llama2cConfig config;
  int version = 0;                // 0 (no magic, 7-int header) or 1 ("ak42", 256-byte header)
  bool shared_classifier = true;  // v0: vocab_size > 0 in the file; v1: the flag byte
};

// A model as llama2.c files hold it: llama2.c's parameter names (model.py's: tok_embeddings.weight,
// layers.N.attention.{wq,wk,wv,wo}.weight, layers.N.feed_forward.{w1,w2,w3}.weight,
// layers.N.{attention_norm,ffn_norm}.weight, norm.weight, output.weight), float32. output.weight is always there;
// when the classifier is shared it is tok_embeddings.weight's tensor itself.
struct Llama2cWeights {
  Llama2cConfig config;
  StateDict state;
};

// The names and shapes of a model's tensors in `version`'s file order, output.weight last when not shared; v0's
// RoPE tables appear as "freq_cis_real" and "freq_cis_imag" (max_seq_len, head_size / 2).
std::vector<std::pair<std::string, Shape>> llama2c_tensors(const Llama2cConfig& config, int version, bool shared);

// Reads and checks the header: v1 when the file opens with kLlama2cMagic, else v0. castor::Error, one line naming
// the file, when it is shorter than its header, has another version (2 is llama2.c's int8 format), a field out of
// range, or a size other than exactly header + 4 x (the floats the header implies). A v0 file's rope_theta is read
// from its tables, which must be llama2.c's (export.py's precompute_freqs_cis) for some theta.
Llama2cHeader read_llama2c_header(const std::string& path);

// Reads the whole model (read_llama2c_header's checks), one read per kind of tensor.
Llama2cWeights read_llama2c(const std::string& path);

// Writes `weights` as llama2.c `version` 0 or 1 (temp file, fsync, rename: a failure leaves an old file intact).
// The classifier is written as shared when output.weight equals tok_embeddings.weight bit for bit (export.py's
// torch.equal); v0 files get the RoPE tables of config.rope_theta, and v1 files, which record no theta, need
// 10000. castor::Error naming `path` for an invalid config, a missing tensor or one of another shape.
void write_llama2c(const std::string& path, const Llama2cWeights& weights, int version);

// Whether `weights` share the classifier: no output.weight, or one equal to tok_embeddings.weight bit for bit
// (export.py's torch.equal).
bool shares_classifier(const Llama2cWeights& weights);

// The Llama a llama2.c file holds: its sizes, its hidden_dim, tied when it shares the classifier, run.c's RMSNorm eps
// 1e-5, the file's RoPE theta, no dropout.
models::LlamaConfig llama_config(const Llama2cWeights& weights);

// The llama2.c config of a Llama. castor::Error naming `what` when it cannot be written as one: a norm eps other than
// run.c's 1e-5 (llama2.c files record none) or a size beyond int32.
Llama2cConfig llama2c_config(const models::LlamaConfig& config, const std::string& what);

// The --multiple-of that gives `c`'s hidden_dim by model.py's rule (Castor's run settings hold no hidden_dim):
// LlamaConfig's default 32 when it does, else hidden_dim itself. castor::Error naming `what` when none does
// (hidden_dim below model.py's 2/3 of 4 dim).
int64_t llama2c_multiple_of(const Llama2cConfig& c, const std::string& what);

// A llama2.c file as `castor eval` reads it: its tensors with llama2.c's names (output.weight as well when shared)
// and the model settings a Llama run trained on `data` (a --data name) would record ("castor.config": model
// llama, its sizes; llama2c_multiple_of's castor::Error when its hidden_dim has no --multiple-of), plus
// "llama2c.header" (the header, as text).
LoadedTensors load_llama2c_weights_file(const std::string& path, const std::string& data);
// The same, names, dtypes, shapes and metadata only (`castor info`: the data is not read), in the file's order with
// v0's RoPE tables; "castor.config" without "data" (and without multiple_of when none gives hidden_dim).
SafetensorsFile read_llama2c_weights_header(const std::string& path);

}  // namespace castor::formats
