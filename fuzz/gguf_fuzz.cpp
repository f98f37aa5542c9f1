// libFuzzer target: the GGUF header reader (castor/gguf.h's read_gguf_header), given each input as a file; an
// accepted header's tensors must lie inside the file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "castor/check.h"
#include "castor/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/castor-fuzz-gguf-" + std::to_string(getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const castor::formats::GgufHeader h = castor::formats::read_gguf_header(path);
    for (const castor::formats::GgufTensorInfo& t : h.tensors)
      if (t.begin > size || t.bytes > size - t.begin) std::abort();
  } catch (const castor::Error&) {
  }
  return 0;
}
