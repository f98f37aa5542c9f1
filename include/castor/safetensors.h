// Safetensors files as plain structs over byte buffers: a strict reader and a deterministic, crash-safe writer.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <map>
#include <string>
#include <vector>

#include "castor/dtype.h"

namespace castor {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;   // empty for rank 0
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  int64_t numel() const;
};

struct SafetensorsFile {
  std::vector<SafetensorsEntry> entries;  // in data-buffer order
  std::map<std::string, std::string> metadata;
  std::vector<uint8_t> bytes;  // the data buffer: little-endian, row-major
  // A tensor's bytes. Not necessarily aligned to its element size: copy with memcpy.
  const uint8_t* data(const SafetensorsEntry& e) const { return bytes.data() + e.begin; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
};

// Validates and parses a whole safetensors file held in memory; `what` names it in errors (castor::Error).
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what);
SafetensorsFile read_safetensors(const std::string& path);
// The entries and metadata of a safetensors file, validated against its size, reading only its header (bytes is
// left empty): for listing a file of any size.
SafetensorsFile read_safetensors_header(const std::string& path);

// One tensor to write; `data` holds `nbytes` = numel * dtype_size bytes, little-endian, row-major.
struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};

// The file's bytes: tensors sorted by name, header padded with spaces to a multiple of 8.
// `what` names the destination in errors about inconsistent tensors.
std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata, const std::string& what);
// serialize_safetensors's bytes written with atomic_write_file: the header, then each tensor from where it is (the
// file is never assembled in memory).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same with each tensor's bytes made only as it is written (`data` may be null): bytes(i) gives tensors[i]'s,
// asked in the file's order (by name) and valid until the next call, so the file is never whole in memory.
void write_safetensors_each(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                            const std::function<std::span<const uint8_t>(size_t)>& bytes,
                            const std::map<std::string, std::string>& metadata = {});

}  // namespace castor
