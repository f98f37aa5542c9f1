// The classic CIFAR-10 example (shared AMP loop 1): SimpleCNN, Adam, float16 autocast and a GradScaler.
#include <castor/castor.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cifar10_amp CIFAR_DIR [EPOCHS] [BATCH_SIZE]\n"
                 "  CIFAR_DIR holds data_batch_1.bin .. data_batch_5.bin and test_batch.bin: the folder\n"
                 "  cifar-10-batches-bin of %s\n", castor::kCifar10Url);
    return 2;
  }
  const int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 10;
  const int64_t batch_size = argc > 3 ? std::atoll(argv[3]) : 64;
  try {
    const castor::ImageDataset train = castor::load_cifar10(argv[1], /*train=*/true);
    const castor::ImageDataset test = castor::load_cifar10(argv[1], /*train=*/false);
    const castor::data::Normalization norm = castor::data::compute_normalization(train);

    castor::manual_seed(0);
    auto model = castor::models::simple_cnn(3, 32, 32);
    castor::optim::Adam opt(model->parameters(), {.lr = 1e-3});
    castor::amp::GradScaler scaler({.dtype = castor::DType::Float16});

    castor::data::DataLoader loader(train, {.batch_size = batch_size, .shuffle = true, .norm = norm});
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      loader.start_epoch(epoch);
      double loss_sum = 0;
      int64_t batches = 0;
      while (auto batch = loader.next()) {
        opt.zero_grad();
        castor::Tensor loss;
        {
          castor::amp::AutocastGuard autocast(castor::DType::Float16);  // forward and loss inside
          loss = castor::F::cross_entropy((*model)(batch->images), batch->labels);
        }
        scaler.scale(loss).backward();
        scaler.step(opt);  // unscales; skips the step if a gradient is inf/NaN
        scaler.update();
        loss_sum += loss.item();
        ++batches;
      }
      std::printf("epoch %lld: loss %.4f, scale %g\n", static_cast<long long>(epoch + 1), loss_sum / batches,
                  scaler.get_scale());
    }

    model->eval();
    castor::NoGradGuard no_grad;
    castor::data::DataLoader test_loader(test, {.batch_size = 256, .shuffle = false, .norm = norm});
    test_loader.start_epoch(0);
    int64_t correct = 0;
    while (auto batch = test_loader.next()) {
      const castor::Tensor pred = castor::argmax((*model)(batch->images), /*dim=*/1);
      correct += static_cast<int64_t>(castor::sum(castor::eq(pred, batch->labels)).item());
    }
    std::printf("test accuracy: %.2f%% of %lld images\n", 100.0 * correct / test.n, static_cast<long long>(test.n));
  } catch (const castor::Error& e) {
    std::fprintf(stderr, "cifar10_amp: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
