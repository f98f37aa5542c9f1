// libFuzzer target: the PNG and JPEG decoders (libpng, libjpeg-turbo) behind --data folder, then resize and crop.
#include "castor/check.h"
#include "castor/datasets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const castor::RgbImage image = castor::decode_image({data, size}, "fuzz");
    std::vector<uint8_t> out(3 * 8 * 8);
    castor::resize_center_crop(image, 8, out.data());
  } catch (const castor::Error&) {
  }
  return 0;
}
