// Folders of PNG/JPEG images (torchvision's ImageFolder): decoding with libpng and libjpeg-turbo, resize and crop.
#include <cstdio>  // before jpeglib.h, which uses FILE

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "castor/check.h"
#include "castor/datasets.h"
#include "castor/fs.h"
#include "castor/json.h"

namespace castor {
namespace {

namespace fs = std::filesystem;

// Larger images are refused before their pixels are allocated (a corrupt header can claim any size).
constexpr int64_t kMaxSide = 1 << 15, kMaxPixels = int64_t{1} << 26;  // 8192 x 8192

bool size_ok(int64_t height, int64_t width) {
  return height > 0 && width > 0 && height <= kMaxSide && width <= kMaxSide && height * width <= kMaxPixels;
}

RgbImage decode_png(std::span<const uint8_t> bytes, const std::string& what) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  // (the simplified API frees the png_image itself when a call fails)
  CASTOR_CHECK(png_image_begin_read_from_memory(&img, bytes.data(), bytes.size()) != 0, what,
               ": unreadable PNG: ", img.message);
  img.format = PNG_FORMAT_RGB;  // any bit depth and colour type; alpha is composited onto black
  RgbImage out{img.height, img.width, {}};
  if (!size_ok(out.height, out.width)) {
    png_image_free(&img);
    throw Error(detail::cat(what, ": image size ", out.width, "x", out.height, " is larger than this loader takes"));
  }
  out.pixels.resize(PNG_IMAGE_SIZE(img));
  CASTOR_CHECK(png_image_finish_read(&img, nullptr, out.pixels.data(), 0, nullptr) != 0, what,
               ": truncated or corrupt PNG: ", img.message);
  return out;
}

// libjpeg reports errors through error_exit, which must not return: it jumps back to decode_jpeg_raw. A premature
// end of the data is only a warning to libjpeg (it fills the rest with grey); here it is an error too.
struct JpegErrors {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

// (H, W, 4) CMYK bytes to (H, W, 3) RGB in place, as PIL's convert("RGB"): r = (255 - k) - c (255 - k) / 255,
// rounded as PIL's MULDIV255. `inverted`: the bytes hold 255 - ink (Adobe's convention, marked by its APP14).
void cmyk_to_rgb(std::vector<uint8_t>& pixels, bool inverted) {
  const size_t n = pixels.size() / 4;
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* px = &pixels[i * 4];
    const int ink[4] = {inverted ? 255 - px[0] : px[0], inverted ? 255 - px[1] : px[1], inverted ? 255 - px[2] : px[2],
                        inverted ? 255 - px[3] : px[3]};
    const int nk = 255 - ink[3];
    uint8_t rgb[3];
    for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(nk - muldiv255(ink[c], nk));
    std::copy(rgb, rgb + 3, &pixels[i * 3]);  // i * 3 <= i * 4: never ahead of what is read
  }
  pixels.resize(n * 3);
}

// Plain C-style code between setjmp and longjmp: no C++ object is created there whose destructor a jump would skip.
bool decode_jpeg_raw(std::span<const uint8_t> bytes, RgbImage* out, JpegErrors* errors) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_fail;
  errors->mgr.emit_message = jpeg_message;
  jpeg_create_decompress(&cinfo);
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  // libjpeg-turbo converts YCCK to CMYK but neither to RGB: four-channel files are read as CMYK and converted below.
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool inverted = cinfo.saw_Adobe_marker;  // Adobe's files (Photoshop's, PIL's) store 255 - ink
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int64_t h = cinfo.output_height, w = cinfo.output_width;
  if (!size_ok(h, w)) {
    std::snprintf(errors->message, sizeof(errors->message), "image size %lldx%lld is larger than this loader takes",
                  static_cast<long long>(w), static_cast<long long>(h));
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  out->height = h;
  out->width = w;
  out->pixels.resize(static_cast<size_t>(h * w * (cmyk ? 4 : 3)));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + static_cast<size_t>(cinfo.output_scanline) * w * (cmyk ? 4 : 3);
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (cmyk) cmyk_to_rgb(out->pixels, inverted);
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

RgbImage decode_jpeg(std::span<const uint8_t> bytes, const std::string& what) {
  RgbImage out;
  JpegErrors errors{};
  CASTOR_CHECK(bytes.size() < (size_t{1} << 32), what, ": JPEG file too large");
  CASTOR_CHECK(decode_jpeg_raw(bytes, &out, &errors), what, ": truncated or corrupt JPEG: ", errors.message);
  return out;
}

// Separable resampling weights (PIL's antialiased bilinear): output i of `out_len` samples the centre-crop window
// that starts `offset` output pixels into the resized line; a triangle filter widened to 1/scale when shrinking.
struct Taps {
  std::vector<int64_t> first;  // per output: the first source index
  std::vector<std::vector<float>> weights;
};

Taps taps(int64_t in_len, double scale, int64_t offset, int64_t out_len) {
  const double support = std::max(1.0, 1.0 / scale), inv = std::min(1.0, scale);
  Taps t;
  for (int64_t i = 0; i < out_len; ++i) {
    const double center = (static_cast<double>(i + offset) + 0.5) / scale;
    const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(std::floor(center - support)));
    const int64_t hi = std::min<int64_t>(in_len, static_cast<int64_t>(std::ceil(center + support)));
    std::vector<float> w;
    double total = 0;
    for (int64_t k = lo; k < hi; ++k) {
      const double x = std::fabs((static_cast<double>(k) + 0.5 - center) * inv);
      w.push_back(static_cast<float>(std::max(0.0, 1.0 - x)));
      total += w.back();
    }
    for (float& v : w) v = static_cast<float>(v / total);
    t.first.push_back(lo);
    t.weights.push_back(std::move(w));
  }
  return t;
}

bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

RgbImage decode_image(std::span<const uint8_t> bytes, const std::string& what) {
  static const uint8_t kPng[] = {0x89, 'P', 'N', 'G'};
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPng, 4) == 0) return decode_png(bytes, what);
  if (bytes.size() >= 2 && bytes[0] == 0xff && bytes[1] == 0xd8) return decode_jpeg(bytes, what);
  throw Error(detail::cat(what, ": neither a PNG nor a JPEG file (", bytes.size(), " bytes)"));
}

void resize_center_crop(const RgbImage& src, int64_t size, uint8_t* dst) {
  CASTOR_CHECK(size > 0 && src.height > 0 && src.width > 0, "resize: bad sizes");
  const double scale = static_cast<double>(size) / static_cast<double>(std::min(src.height, src.width));
  const int64_t rh = std::max<int64_t>(size, std::llround(static_cast<double>(src.height) * scale));
  const int64_t rw = std::max<int64_t>(size, std::llround(static_cast<double>(src.width) * scale));
  const Taps ty = taps(src.height, scale, (rh - size) / 2, size), tx = taps(src.width, scale, (rw - size) / 2, size);
  std::vector<float> rows(static_cast<size_t>(src.height * size * 3));  // (H, size, 3): horizontal pass
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t x = 0; x < size; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        float acc = 0;
        const std::vector<float>& w = tx.weights[x];
        const uint8_t* row = src.pixels.data() + (y * src.width + tx.first[x]) * 3 + c;
        for (size_t k = 0; k < w.size(); ++k) acc += w[k] * row[k * 3];
        rows[static_cast<size_t>((y * size + x) * 3 + c)] = acc;
      }
  for (int64_t c = 0; c < 3; ++c)  // vertical pass, into (3, size, size)
    for (int64_t y = 0; y < size; ++y)
      for (int64_t x = 0; x < size; ++x) {
        float acc = 0;
        const std::vector<float>& w = ty.weights[y];
        for (size_t k = 0; k < w.size(); ++k)
          acc += w[k] * rows[static_cast<size_t>(((ty.first[y] + static_cast<int64_t>(k)) * size + x) * 3 + c)];
        dst[(c * size + y) * size + x] = static_cast<uint8_t>(std::clamp(std::lround(acc), 0L, 255L));
      }
}

ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& o) {
  std::error_code ec;
  CASTOR_CHECK(fs::is_directory(root, ec), root, ": not a directory (expected ", root, "/<class>/*.png|jpg)");
  CASTOR_CHECK(o.image_size > 0 && o.image_size <= 4096, root, ": image size ", o.image_size, " is not in 1..4096");
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string()[0] != '.') found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  CASTOR_CHECK(!found.empty(), root, ": no class folders (expected ", root, "/<class>/*.png|jpg)");
  for (const std::string& cls : found)  // class names are recorded in JSON (config.json, checkpoints): UTF-8 only
    CASTOR_CHECK(is_valid_utf8(cls), root, "/", printable(cls),
                 ": a class folder whose name is not valid UTF-8; "
                 "rename it");
  ImageFolder f;
  f.classes = o.classes.empty() ? found : o.classes;
  CASTOR_CHECK(f.classes.size() <= 256, root, ": ", f.classes.size(), " classes; at most 256 are supported");
  std::map<std::string, int> label_of;
  for (size_t i = 0; i < f.classes.size(); ++i) label_of[f.classes[i]] = static_cast<int>(i);
  std::vector<std::pair<std::string, int>> files;  // (path, label)
  for (const std::string& cls : found) {
    auto label = label_of.find(cls);
    CASTOR_CHECK(label != label_of.end(), root, "/", cls, ": a class the training set does not have");
    std::vector<std::string> paths;
    // (as torchvision, the files of a class's subfolders too)
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(fs::path(root) / cls, ec))
      if (e.is_regular_file() && has_image_extension(e.path())) paths.push_back(e.path().string());
    CASTOR_CHECK(!paths.empty(), root, "/", cls, ": no .png, .jpg or .jpeg files");
    std::sort(paths.begin(), paths.end());
    for (std::string& p : paths) files.emplace_back(std::move(p), label->second);
  }
  const int64_t n = static_cast<int64_t>(files.size()), S = o.image_size, sz = 3 * S * S;
  const int64_t memory = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
  const bool cache = n * sz <= (o.cache_bytes < 0 ? memory / 2 : o.cache_bytes);

  // Every image is decoded once here, on a pool of threads: into the dataset's (N, 3, S, S) bytes when they are
  // cached, else only to find the unreadable ones before training starts.
  std::vector<uint8_t> pixels(cache ? static_cast<size_t>(n * sz) : 0);
  std::vector<std::string> errors(files.size());
  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::vector<uint8_t> scratch(static_cast<size_t>(sz));
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        const std::vector<uint8_t> bytes = read_file(files[i].first);
        resize_center_crop(decode_image(bytes, files[i].first), S, cache ? pixels.data() + i * sz : scratch.data());
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  const int threads = static_cast<int>(
      std::min<int64_t>(n, o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();

  f.data = {0, 3, S, S, {}, {}, static_cast<int>(f.classes.size()), {}};
  auto kept = std::make_shared<std::vector<std::string>>();  // the streamed dataset's files, by index
  for (int64_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      CASTOR_CHECK(o.skip_bad_images, errors[i], " (--skip-bad-images leaves such files out)");
      ++f.skipped;
      continue;
    }
    if (cache && f.data.n != i)
      std::memmove(pixels.data() + f.data.n * sz, pixels.data() + i * sz, static_cast<size_t>(sz));
    if (!cache) kept->push_back(files[i].first);
    f.data.labels.push_back(static_cast<uint8_t>(files[i].second));
    ++f.data.n;
  }
  pixels.resize(cache ? static_cast<size_t>(f.data.n * sz) : 0);
  f.data.images = std::move(pixels);
  if (!cache)
    f.data.load = [kept, S](int64_t i, uint8_t* dst) {
      const std::string& path = (*kept)[static_cast<size_t>(i)];
      resize_center_crop(decode_image(read_file(path), path), S, dst);
    };
  return f;
}

}  // namespace castor
