// What a path holds, decided in one place: the table of model formats Castor reads (a Castor run or checkpoint
// directory, safetensors, llm.c, llama2.c, a Hugging Face directory, GGUF), and a model source opened from it - the
// model's description (family and sizes, when the file says), its tensors read one at a time by Castor's names in
// their stored dtype, and their names, dtypes and shapes without the data. Commands ask source_format, never a
// format's own test (docs/design.md, "Formats").
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "castor/json.h"
#include "castor/nn.h"
#include "castor/quant.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"

namespace castor::formats {

enum class SourceFormat { CastorDir, HfDir, Gguf, Llmc, Llama2c, Safetensors };

// One row of the table: the format, its name in messages, what it is, and whether `path` holds it (the rows are
// asked in order; a llama2.c v0 file, which has no magic number, is told by its sizes and comes after the others).
struct SourceFormatRow {
  SourceFormat format;
  const char* name;  // "castor", "hf", "gguf", "llmc", "llama2c", "safetensors"
  const char* help;
  bool (*holds)(const std::string& path);
};
const std::vector<SourceFormatRow>& source_formats();
const SourceFormatRow& source_format_row(SourceFormat format);

// The format `path` holds; castor::Error "PATH: ..." naming what was looked for (a missing path: no such file or
// directory; a file none of the rows claims: what reading it as a llama2.c v0 file found).
SourceFormat source_format(const std::string& path);
// Whether `path` holds `format` (false for a path that holds none, or does not exist).
bool is_source(const std::string& path, SourceFormat format);

// The model a source describes, in the description runs record (castor/formats.h: "family" "llama" or "gpt" and its
// sizes; a Hugging Face directory's and a GGUF file's "architecture" too), or null when the file does not say (a
// safetensors file without castor metadata, a Castor directory: its checkpoint's settings say).
Json source_description(const std::string& path);

// A weights file, a Hugging Face directory or a GGUF file whole, with the metadata a float32 run of it on `data` (a
// --data name) would record ("castor.config": its model and sizes, no precision) where the file records none.
LoadedTensors load_weights_file(const std::string& path, const std::string& data);
// A reader's offer of a matrix in the quantized blocks its file stores it in (a GGUF file's): `wants(name)` says
// whether the blocks are taken as they are (`take`) instead of the matrix's values.
struct BlocksTake {
  std::function<bool(const std::string& name)> wants;
  std::function<void(const std::string& name, const std::shared_ptr<const quant::QuantizedMatrix>& blocks)> take;
};
// Its tensors one at a time (Castor's names for the formats Castor names its own way, each in the file's dtype -
// a GGUF file's quantized blocks as float32), each read from the file straight into a tensor of its own as it is
// given to `take` and dropped after it: a Hugging Face directory, a GGUF file, a safetensors file or an llm.c
// checkpoint is never held whole (a llama2.c file is read whole first: its versions 1 and 2 are not plain tensors).
// `blocks`: a GGUF file's quantized matrices it wants, as their blocks (the other formats store none).
void read_weights_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take,
                       const BlocksTake& blocks = {});
// Loads `path`'s weights (read_weights_each) into `model` strictly, tensor by tensor, each copied into its parameter
// or buffer in place and in that tensor's dtype (a 16-bit parameter made under nn::LoadInitGuard takes a float32
// file's values rounded once, as a float32 load then a cast would): the model is never held twice. A tensor of the
// model tied to another (GPT's lm_head, a tied Llama output) needs none of its own; torch.compile's "_orig_mod."
// prefix is dropped and nanoGPT's attention-mask buffers ".attn.bias" of 4 dimensions are skipped. castor::Error
// naming `path` and the tensor for one the model lacks, one of another shape, or a model tensor the file does not give.
// `filled`, when given, is called with each model tensor's name right after it is filled (a quantized base's Linear
// is quantized there, its dense weight then dropped). A placeholder weight (nn::LoadInitGuard's) gets its memory as it
// is filled. `keep_blocks`: each Linear weight (the output layer's too) the file stores quantized (a GGUF file's
// Q4_K, Q8_0, ...) is given to the Linear as those blocks (nn::Linear::take_blocks: frozen, never dense).
void load_weights_into(nn::Module& model, const std::string& path,
                       const std::function<void(const std::string& name)>& filled = nullptr, bool keep_blocks = false);
// The same, names, dtypes, shapes and metadata only (`castor info`: the data is not read); "castor.config" without
// "data" for the formats that record none.
SafetensorsFile read_weights_header(const std::string& path);

}  // namespace castor::formats
