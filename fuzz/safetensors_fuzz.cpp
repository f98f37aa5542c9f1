// libFuzzer target: the safetensors parser (and its JSON parser); accepted files must survive a write/read round trip.
#include <cstdlib>

#include "castor/check.h"
#include "castor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  castor::SafetensorsFile f;
  try {
    f = castor::parse_safetensors(data, size, "fuzz");
  } catch (const castor::Error&) {
    return 0;
  }
  std::vector<castor::SafetensorsTensor> tensors;
  for (const auto& e : f.entries) tensors.push_back({e.name, e.dtype, e.shape, f.data(e), e.end - e.begin});
  std::vector<uint8_t> bytes = castor::serialize_safetensors(tensors, f.metadata, "fuzz");
  castor::SafetensorsFile g = castor::parse_safetensors(bytes.data(), bytes.size(), "fuzz round trip");
  if (g.metadata != f.metadata || g.bytes.size() != f.bytes.size() || g.entries.size() != f.entries.size())
    std::abort();
  for (const auto& e : f.entries) {
    const castor::SafetensorsEntry* h = g.find(e.name);
    if (!h || h->dtype != e.dtype || h->shape != e.shape || h->end - h->begin != e.end - e.begin) std::abort();
  }
  return 0;
}
