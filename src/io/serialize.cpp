// Tensors to and from safetensors files.
#include "castor/serialize.h"

#include "castor/safetensors.h"

namespace castor {

void save_safetensors(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  std::vector<Tensor> keep;  // contiguous copies alive until written
  std::vector<SafetensorsTensor> entries;
  for (const auto& [name, t] : tensors) {
    CASTOR_CHECK(t.defined(), path, ": tensor '", name, "' is undefined");
    keep.push_back(t.contiguous());
    entries.push_back({name, t.dtype(), t.shape(), keep.back().data_ptr(), keep.back().nbytes()});
  }
  write_safetensors(path, entries, metadata);
}

LoadedTensors load_safetensors(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  LoadedTensors out;
  out.metadata = f.metadata;
  for (const SafetensorsEntry& e : f.entries) out.tensors[e.name] = from_blob(f.data(e), e.shape, e.dtype);
  return out;
}

}  // namespace castor
