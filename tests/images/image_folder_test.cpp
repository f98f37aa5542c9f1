// Image folders (torchvision's ImageFolder) from real PNG and JPEG files written here with libpng and libjpeg: decoding,
// resize and crop worked by hand, class order, bad files named, and `castor train --data folder` / `castor eval`.
// (CIFAR-10's missing-file message: datasets_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "castor/check.h"
#include "castor/data.h"
#include "castor/datasets.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "images/image_files.h"
#include "test_util.h"
#include "train/run_test_util.h"

namespace castor {

namespace fs = std::filesystem;

namespace {

// (H, W, C) bytes with a distinct value per pixel and channel.
std::vector<uint8_t> pattern(int h, int w, int c, int seed = 0) {
  std::vector<uint8_t> p(static_cast<size_t>(h * w * c));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>((i * 37 + seed * 101) % 251);
  return p;
}

using test::error_of;

// Cuts a file to its first `keep` bytes.
void truncate_file(const std::string& path, size_t keep) {
  std::vector<uint8_t> b = read_file(path);
  b.resize(keep);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST(ImageDecode, PngIsLosslessAndGreyBecomesRgb) {
  const test::ScratchDir dir;
  const std::vector<uint8_t> rgb = pattern(5, 7, 3);
  test::write_png(dir + "/rgb.png", rgb, 5, 7, 3);
  const RgbImage a = decode_image(read_file(dir + "/rgb.png"), "rgb.png");
  EXPECT_EQ(a.height, 5);
  EXPECT_EQ(a.width, 7);
  EXPECT_EQ(a.pixels, rgb);
  const std::vector<uint8_t> grey = pattern(3, 4, 1);
  test::write_png(dir + "/grey.png", grey, 3, 4, 1);
  const RgbImage g = decode_image(read_file(dir + "/grey.png"), "grey.png");
  ASSERT_EQ(g.pixels.size(), 3u * 4 * 3);
  for (size_t i = 0; i < grey.size(); ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(g.pixels[i * 3 + c], grey[i]) << i;
}

// A JPEG of a flat colour decodes to that colour (up to the codec's rounding), in RGB and in grey.
TEST(ImageDecode, JpegOfFlatColoursDecodesToThem) {
  const test::ScratchDir dir;
  std::vector<uint8_t> rgb;
  for (int i = 0; i < 16 * 24; ++i) rgb.insert(rgb.end(), {200, 40, 90});
  test::write_jpeg(dir + "/flat.jpg", rgb, 16, 24, 3, /*quality=*/100);
  const RgbImage a = decode_image(read_file(dir + "/flat.jpg"), "flat.jpg");
  ASSERT_EQ(a.height, 16);
  ASSERT_EQ(a.width, 24);
  for (size_t i = 0; i < rgb.size(); ++i) EXPECT_NEAR(a.pixels[i], rgb[i], 2) << i;
  test::write_jpeg(dir + "/grey.jpg", std::vector<uint8_t>(8 * 8, 77), 8, 8, 1, /*quality=*/100);
  const RgbImage g = decode_image(read_file(dir + "/grey.jpg"), "grey.jpg");
  ASSERT_EQ(g.pixels.size(), 8u * 8 * 3);
  for (uint8_t v : g.pixels) EXPECT_NEAR(v, 77, 1);
}

// CMYK and YCCK JPEGs (Photoshop's print files) decode to RGB as PIL's convert("RGB") does (they used to fail as
// "truncated or corrupt"). Worked by hand, and checked against PIL 9.4: ink (55, 155, 205, 127), stored as Adobe
// does as 255 - ink = (200, 100, 50, 128), gives r = (255 - 127) - 55 (255 - 127) / 255 = 100.4 -> 100, g = 50,
// b = 25.
TEST(ImageDecode, CmykAndYcckJpegsDecodeAsPilConvertsThem) {
  const test::ScratchDir dir;
  std::vector<uint8_t> stored;
  for (int i = 0; i < 16 * 8; ++i) stored.insert(stored.end(), {200, 100, 50, 128});
  for (bool ycck : {false, true}) {
    const std::string path = dir + (ycck ? "/ycck.jpg" : "/cmyk.jpg");
    test::write_jpeg(path, stored, 16, 8, 4, /*quality=*/100, ycck);
    const RgbImage a = decode_image(read_file(path), path);
    ASSERT_EQ(a.height, 16);
    ASSERT_EQ(a.width, 8);
    ASSERT_EQ(a.pixels.size(), 16u * 8 * 3);
    for (size_t i = 0; i < a.pixels.size(); i += 3) {
      EXPECT_NEAR(a.pixels[i], 100, 1) << path << " " << i;
      EXPECT_NEAR(a.pixels[i + 1], 50, 1) << path << " " << i;
      EXPECT_NEAR(a.pixels[i + 2], 25, 1) << path << " " << i;
    }
  }
}

TEST(ImageDecode, TruncatedAndForeignFilesAreErrorsNamingThem) {
  const test::ScratchDir dir;
  test::write_png(dir + "/cut.png", pattern(32, 32, 3), 32, 32, 3);
  truncate_file(dir + "/cut.png", 200);
  test::write_jpeg(dir + "/cut.jpg", pattern(32, 32, 3), 32, 32, 3);
  truncate_file(dir + "/cut.jpg", 400);
  std::ofstream(dir + "/text.png") << "not an image";
  for (const char* name : {"cut.png", "cut.jpg", "text.png"}) {
    test::expect_error([&] { decode_image(read_file(dir + "/" + name), dir + "/" + name); }, {dir + "/" + name});
  }
}

// Worked by hand: scale 1 is the identity on the centre crop; halving a 4x4 image whose columns are 0, 70, 140, 210
// weights source columns 0, 1, 2 by 3/7, 3/7, 1/7 (a triangle of radius 2 around 1.0) for output column 0 (= 50), and
// columns 1, 2, 3 by 1/7, 3/7, 3/7 for output column 1 (= 160), as PIL's antialiased bilinear resize does.
TEST(ImageDecode, ResizeAndCentreCropWorkedByHand) {
  RgbImage wide{6, 8, pattern(6, 8, 3)};
  std::vector<uint8_t> out(3 * 6 * 6);
  resize_center_crop(wide, 6, out.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 6; ++x)
        ASSERT_EQ(out[(c * 6 + y) * 6 + x], wide.pixels[(y * 8 + x + 1) * 3 + c]) << c << " " << y << " " << x;
  RgbImage cols{4, 4, {}};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) cols.pixels.insert(cols.pixels.end(), 3, static_cast<uint8_t>(70 * x));
  std::vector<uint8_t> half(3 * 2 * 2);
  resize_center_crop(cols, 2, half.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 2; ++y) {
      EXPECT_EQ(half[(c * 2 + y) * 2 + 0], 50);
      EXPECT_EQ(half[(c * 2 + y) * 2 + 1], 160);
    }
}

TEST(ImageFolder, ClassesSortedFilesDecodedBadOnesNamedOrSkipped) {
  const test::ScratchDir dir;
  const std::string root = dir + "/train";
  for (const char* cls : {"zebra", "ant", "moth"}) fs::create_directories(root + "/" + cls);
  test::write_png(root + "/zebra/b.png", pattern(4, 4, 3, 1), 4, 4, 3);
  test::write_png(root + "/zebra/a.PNG", pattern(4, 4, 3, 2), 4, 4, 3);
  test::write_jpeg(root + "/ant/x.jpeg", pattern(4, 4, 3, 3), 4, 4, 3);
  fs::create_directories(root + "/moth/deeper");  // subfolders of a class count, as in torchvision
  test::write_jpeg(root + "/moth/deeper/y.jpg", pattern(4, 4, 1, 4), 4, 4, 1);
  std::ofstream(root + "/moth/notes.txt") << "ignored: not an image extension";
  ImageFolder f = load_image_folder(root, {.image_size = 4, .threads = 2});
  EXPECT_EQ(f.classes, (std::vector<std::string>{"ant", "moth", "zebra"}));
  ASSERT_EQ(f.data.n, 4);
  EXPECT_EQ(f.data.channels, 3);
  EXPECT_EQ(f.data.labels, (std::vector<uint8_t>{0, 1, 2, 2}));
  const std::vector<uint8_t> a = pattern(4, 4, 3, 2);  // zebra/a.PNG sorts before zebra/b.png
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 16; ++k) ASSERT_EQ(f.data.images[(2 * 3 + c) * 16 + k], a[k * 3 + c]);

  test::write_png(root + "/ant/cut.png", pattern(40, 40, 3), 40, 40, 3);
  truncate_file(root + "/ant/cut.png", 300);
  const std::string msg = error_of([&] { load_image_folder(root, {.image_size = 4}); });
  EXPECT_NE(msg.find(root + "/ant/cut.png"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--skip-bad-images"), std::string::npos) << msg;
  f = load_image_folder(root, {.image_size = 4, .skip_bad_images = true});
  EXPECT_EQ(f.skipped, 1);
  EXPECT_EQ(f.data.n, 4);
  // A class folder named in bytes that are not UTF-8 cannot be recorded (config.json): refused naming it.
  fs::create_directories(root + "/bad\xff");
  test::write_png(root + "/bad\xff/p.png", pattern(4, 4, 3), 4, 4, 3);
  EXPECT_NE(error_of([&] {
              load_image_folder(root, {.image_size = 4});
            }).find("bad\\xff: a class folder whose name is not valid UTF-8"),
            std::string::npos);
  fs::remove_all(root + "/bad\xff");
  // The val/ folder of a training set with other classes is refused by name.
  EXPECT_NE(error_of([&] {
              load_image_folder(root, {.image_size = 4, .classes = {"ant", "moth"}});
            }).find("zebra"),
            std::string::npos);
}

// A folder larger than its cache budget is streamed: the same images, decoded again on demand, give the same
// normalisation and the same batches as the cached folder.
TEST(ImageFolder, StreamedFolderGivesTheSameBatchesAsCached) {
  const test::ScratchDir root;
  for (int k = 0; k < 3; ++k) {
    fs::create_directories(root + "/c" + std::to_string(k));
    for (int i = 0; i < 5; ++i) {
      const std::string stem = root + "/c" + std::to_string(k) + "/" + std::to_string(i);
      if (i % 2)
        test::write_png(stem + ".png", pattern(9 + i, 7 + k, 3, i + k), 9 + i, 7 + k, 3);
      else
        test::write_jpeg(stem + ".jpg", pattern(12, 10 + i, 3, i * k), 12, 10 + i, 3);
    }
  }
  const ImageFolder cached = load_image_folder(root, {.image_size = 6});
  const ImageFolder streamed = load_image_folder(root, {.image_size = 6, .cache_bytes = 0});
  ASSERT_FALSE(cached.data.images.empty());
  ASSERT_TRUE(streamed.data.images.empty() && streamed.data.load);
  EXPECT_EQ(streamed.data.n, cached.data.n);
  EXPECT_EQ(streamed.data.labels, cached.data.labels);
  const data::Normalization a = data::compute_normalization(cached.data),
                            b = data::compute_normalization(streamed.data);
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_EQ(a.std, b.std);
  data::DataLoader la(cached.data, {.batch_size = 4, .augment = true, .seed = 5, .norm = a});
  data::DataLoader lb(streamed.data, {.batch_size = 4, .augment = true, .seed = 5, .norm = a});
  for (int64_t batch = 0; batch < la.batches_per_epoch(); ++batch) {
    const data::Batch x = la.make_batch(1, batch), y = lb.make_batch(1, batch);
    EXPECT_EQ(x.images.to_vector<float>(), y.images.to_vector<float>()) << batch;
    EXPECT_EQ(x.labels.to_vector<int64_t>(), y.labels.to_vector<int64_t>()) << batch;
  }
  // A file gone after the load is an error naming it when a batch needs it, from the loader's threads.
  fs::remove(root + "/c1/2.jpg");
  lb.start_epoch(0);
  test::expect_error(
      [&] {
        while (lb.next()) {
        }
      },
      {root + "/c1/2.jpg"});
}

// `castor train --data folder` on two classes told apart by colour, held out by --val-split, then `castor eval`
// shows the recorded class names with per-class accuracy and a confusion matrix over the held-out images.
TEST(ImageFolder, TrainAndEvalFromTheCommandLine) {
  const test::ScratchDir dir;
  const int per_class = 20;
  for (const char* cls : {"blue", "red"}) {
    fs::create_directories(dir + "/data/train/" + cls);
    for (int i = 0; i < per_class; ++i) {
      std::vector<uint8_t> px;
      for (int k = 0; k < 12 * 10; ++k)
        px.insert(px.end(), {static_cast<uint8_t>(cls[0] == 'r' ? 200 + i : 10), 30,
                             static_cast<uint8_t>(cls[0] == 'b' ? 200 + i : 10)});
      const std::string stem = dir + "/data/train/" + cls + "/" + std::to_string(i);
      if (i % 2)
        test::write_png(stem + ".png", px, 12, 10, 3);
      else
        test::write_jpeg(stem + ".jpg", px, 12, 10, 3);
    }
  }
  const test::CastorRun run{dir, {"OMP_WAIT_POLICY=passive"}};
  auto train = test::run_castor({"train", "--data", "folder", "--data-dir", "data", "--image-size", "8", "--batch-size",
                                 "8", "--steps", "8", "--lr", "0.01", "--amp", "O0", "--threads", "2", "--out", "run"},
                                run);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::vector<uint8_t> cj = read_file(dir + "/run/config.json");
  const Json config = Json::parse(std::string(cj.begin(), cj.end()));
  EXPECT_EQ(config.at("class_names").dump(), R"(["blue","red"])");
  EXPECT_EQ(config.at("input_shape").dump(), "[3,8,8]");
  const std::vector<uint8_t> report = read_file(dir + "/run/report.html");  // the classes of the last evaluation
  const std::string html(report.begin(), report.end());
  EXPECT_NE(html.find("<th>1 red</th>"), std::string::npos);
  // The op dtype table groups SimpleCNN's ops by the module whose parameters they use.
  for (const char* module : {"conv1", "conv2", "fc1", "fc2"})
    EXPECT_NE(html.find(std::string("class='module'>") + module + "<"), std::string::npos) << module;
  // (the ops run inside the fused convolution are listed with it, under conv1, not before the first module)
  EXPECT_EQ(html.find("class='module'>(input)<"), std::string::npos);
  auto eval = test::run_castor({"eval", "--checkpoint", "run"}, run);
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const Json result = Json::parse(eval.out);
  EXPECT_EQ(result.at("images").as_int(), 4);  // 10% of 40
  int64_t total = 0;
  for (const Json& row : result.at("confusion_matrix").as_array())
    for (const Json& v : row.as_array()) total += v.as_int();
  EXPECT_EQ(total, 4);
  EXPECT_EQ(result.at("classes").as_array()[1].at("name").as_string(), "red");
  EXPECT_NE(eval.err.find("red"), std::string::npos) << eval.err;
  EXPECT_NE(eval.err.find("accuracy"), std::string::npos) << eval.err;
  // On a terminal 30 columns wide (a pty, through script(1)) the per-class lines fit and the matrix is left out.
  std::string narrow;
  ASSERT_EQ(test::run_command(test::on_terminal(dir, "eval --checkpoint run", 30), &narrow), 0) << narrow;
  EXPECT_NE(narrow.find("matrix in the JSON"), std::string::npos) << narrow;
  for (size_t begin = 0, end; begin < narrow.size(); begin = end + 1) {
    end = narrow.find('\n', begin);
    if (end == std::string::npos) end = narrow.size();
    std::string line = narrow.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    EXPECT_LE(line.size(), 30u) << line;
  }
  // Streamed (--image-cache-mb 0: decoded again for each batch) the run ends at the same weights, bit for bit.
  for (const char* cache : {"-1", "0"}) {
    // clang-format off
    auto r = test::run_castor({"train", "--data", "folder", "--data-dir", "data", "--image-size", "8", "--batch-size",
                               "8", "--steps", "6", "--amp", "O0", "--deterministic", "--threads", "2", "--augment",
                               "standard", "--image-cache-mb", cache, "--out", std::string("cache") + cache},
                              run);
    // clang-format on
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  test::expect_same_checkpoint(dir + "/cache-1", dir + "/cache0");
  // The held-out images are a function of --seed: the same seed holds out the same ones (the training set's
  // normalisation is the same), another seed others.
  auto normalization = [&](const std::string& seed, const std::string& out) {
    auto r = test::run_castor({"train", "--data", "folder", "--data-dir", "data", "--image-size", "8", "--batch-size",
                               "8", "--steps", "1", "--amp", "O0", "--threads", "2", "--seed", seed, "--out", out},
                              run);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::vector<uint8_t> b = read_file(dir + "/" + out + "/config.json");
    return Json::parse(std::string(b.begin(), b.end())).at("normalization").dump();
  };
  EXPECT_EQ(normalization("0", "seed0"), config.at("normalization").dump());
  EXPECT_NE(normalization("1", "seed1"), config.at("normalization").dump());
  // A missing --data-dir is one line naming the flag.
  auto bare = test::run_castor({"train", "--data", "folder", "--out", "run2"}, run);
  EXPECT_EQ(bare.exit_code, 1);
  EXPECT_NE(bare.err.find("--data-dir"), std::string::npos) << bare.err;
  // A folder flag with another dataset is refused by name, not ignored.
  auto other = test::run_castor({"train", "--data", "synthetic", "--image-size", "64", "--out", "run3"}, run);
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("--image-size: applies to --data folder only"), std::string::npos) << other.err;
}

}  // namespace castor
