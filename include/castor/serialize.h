// Tensors to and from safetensors files: a StateDict plus string metadata.
#pragma once
#include <map>
#include <string>

#include "castor/state_dict.h"

namespace castor {

using Metadata = std::map<std::string, std::string>;

// Writes `tensors` crash-safely (temp file, fsync, rename, directory fsync).
void save_safetensors(const std::string& path, const StateDict& tensors, const Metadata& metadata = {});

struct LoadedTensors {
  StateDict tensors;
  Metadata metadata;
};
// Reads and validates a safetensors file; castor::Error naming the file on any problem.
LoadedTensors load_safetensors(const std::string& path);

}  // namespace castor
