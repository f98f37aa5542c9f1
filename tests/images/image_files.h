// Real PNG and JPEG files for the image-folder tests and benchmark, written with libpng and libjpeg themselves.
#pragma once
#include <cstdio>  // before jpeglib.h, which uses FILE

#include <jpeglib.h>
#include <png.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace castor::test {

// Writes (H, W, channels) bytes (channels 1: grey, 3: RGB) as an 8-bit PNG.
inline void write_png(const std::string& path, const std::vector<uint8_t>& pixels, int height, int width,
                      int channels) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(width);
  img.height = static_cast<png_uint_32>(height);
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (png_image_write_to_file(&img, path.c_str(), 0, pixels.data(), 0, nullptr) == 0)
    throw std::runtime_error(path + ": " + img.message);
}

// Writes (H, W, channels) bytes (channels 1: grey, 3: RGB) as a baseline JPEG of the given quality.
// channels 1: grey, 3: RGB, 4: CMYK as given (libjpeg adds Adobe's APP14 marker, so readers take the bytes as
// 255 - ink), stored as YCCK when `ycck`.
inline void write_jpeg(const std::string& path, const std::vector<uint8_t>& pixels, int height, int width, int channels,
                       int quality = 95, bool ycck = false) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot create");
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = channels;
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : channels == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  if (ycck) jpeg_set_colorspace(&cinfo, JCS_YCCK);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + static_cast<size_t>(cinfo.next_scanline) * width * channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
}

}  // namespace castor::test
