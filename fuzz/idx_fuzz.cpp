// libFuzzer target: the IDX image and label parsers, including gzip decompression.
#include "castor/check.h"
#include "castor/datasets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  try {
    castor::parse_idx_images(bytes, "fuzz");
  } catch (const castor::Error&) {
  }
  try {
    castor::parse_idx_labels(bytes, 10, "fuzz");
  } catch (const castor::Error&) {
  }
  return 0;
}
