// The data loader: epoch order is a pure function of the seed, resume mid-epoch, augmentation, normalisation.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "castor/data.h"
#include "castor/ops.h"

namespace castor::data {

namespace {
ImageDataset tiny() { return make_synthetic(50, 3, 8, 8, 5, /*seed=*/3); }

std::vector<Batch> epoch_batches(DataLoader& l, int64_t epoch, int64_t first = 0) {
  std::vector<Batch> out;
  l.start_epoch(epoch, first);
  while (auto b = l.next()) out.push_back(*b);
  return out;
}
}  // namespace

TEST(DataLoader, EveryImageOncePerEpochAndOrderDependsOnEpoch) {
  ImageDataset ds = tiny();
  DataLoader l(ds, {.batch_size = 8, .seed = 1});
  auto e0 = epoch_batches(l, 0), e1 = epoch_batches(l, 1);
  ASSERT_EQ(e0.size(), 7u);  // 50 images, last batch of 2
  std::multiset<double> firsts0, firsts1;
  for (auto& b : e0)
    for (int64_t i = 0; i < b.images.size(0); ++i)
      firsts0.insert(b.images.select(0, i).reshape({-1}).select(0, 0).item());
  for (auto& b : e1)
    for (int64_t i = 0; i < b.images.size(0); ++i)
      firsts1.insert(b.images.select(0, i).reshape({-1}).select(0, 0).item());
  EXPECT_EQ(firsts0, firsts1);                         // the same images, ...
  EXPECT_FALSE(allclose(e0[0].images, e1[0].images));  // ... in another order
}

TEST(DataLoader, ResumedEpochSeesTheSameBatches) {
  ImageDataset ds = tiny();
  LoaderOptions o{.batch_size = 8, .augment = true, .drop_last = true, .seed = 9};
  DataLoader a(ds, o), b(ds, o);
  auto full = epoch_batches(a, 2), tail = epoch_batches(b, 2, /*first=*/3);
  ASSERT_EQ(full.size(), 6u);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < tail.size(); ++i) {
    EXPECT_EQ(tail[i].index, full[i + 3].index);
    EXPECT_TRUE(allclose(tail[i].images, full[i + 3].images, 0, 0));
    EXPECT_TRUE(allclose(tail[i].labels.to(DType::Float64), full[i + 3].labels.to(DType::Float64), 0, 0));
  }
}

TEST(DataLoader, NormalisationByHand) {
  ImageDataset ds{1, 1, 1, 2, {0, 255}, {0}, 2};
  Normalization n = compute_normalization(ds);
  EXPECT_NEAR(n.mean[0], 0.5, 1e-12);
  EXPECT_NEAR(n.std[0], 0.5, 1e-12);
  DataLoader l(ds, {.batch_size = 1, .shuffle = false, .norm = n});
  Batch b = l.make_batch(0, 0);
  auto px = b.images.to_vector<float>();
  EXPECT_NEAR(px[0], -1.0f, 1e-6);
  EXPECT_NEAR(px[1], 1.0f, 1e-6);
}

TEST(DataLoader, FlipAndCropMoveImagePixels) {
  // A 1x1x3 image: with augmentation every output row is a shifted/flipped copy padded with zeros.
  ImageDataset ds{1, 1, 9, 9, std::vector<uint8_t>(81), {0}, 2};
  for (int i = 0; i < 81; ++i) ds.images[i] = static_cast<uint8_t>(i + 1);
  DataLoader l(ds, {.batch_size = 1, .augment = true, .seed = 4, .norm = {{0.0}, {1.0 / 255}}});
  bool saw_change = false;
  for (int64_t e = 0; e < 8; ++e) {
    auto px = l.make_batch(e, 0).images.to_vector<float>();
    double total = 0;
    for (float v : px) total += v;
    EXPECT_LE(total, 81 * 82 / 2);  // never more than the original pixels (zero padding)
    if (px[40] != 41) saw_change = true;
  }
  EXPECT_TRUE(saw_change);
}

TEST(DataLoader, ErrorOnTheLoaderThreadReachesTheCaller) {
  // A dataset whose epoch order cannot even be allocated: make_batch throws on the background thread. (The
  // loader refuses such a size with buffers that do not hold it, so the size grows after the loader is made.)
  ImageDataset ds{1, 1, 1, 1, {0}, {0}, 2};
  DataLoader loader(ds, {.batch_size = 1, .shuffle = false});
  ds.n = INT64_MAX / 2;
  loader.start_epoch(0);
  EXPECT_THROW(loader.next(), std::length_error);
  loader.start_epoch(1);  // and the loader stays usable
  EXPECT_THROW(loader.next(), std::length_error);
}

TEST(DataLoader, BadOptionsAreErrors) {
  ImageDataset ds = tiny();
  EXPECT_THROW(DataLoader(ds, {.batch_size = 0}), Error);
  EXPECT_THROW(make_synthetic(0, 1, 1, 1, 2, 0), Error);
}

}  // namespace castor::data
