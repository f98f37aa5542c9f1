// libFuzzer target: the CIFAR-10 binary batch parser.
#include "castor/check.h"
#include "castor/datasets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    castor::parse_cifar10_batch({data, size}, "fuzz");
  } catch (const castor::Error&) {
  }
  return 0;
}
