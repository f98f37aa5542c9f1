// Library misuse: each case runs in a forked child, so a crash (or a sanitizer report) fails its test instead of
// ending the test run; each must raise castor::Error naming the problem.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <string>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/data.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"

namespace castor {
namespace {

// Runs `misuse` in a child process: passes when it throws castor::Error whose message holds `expected`.
void expect_error_in_child(const std::function<void()>& misuse, const std::string& expected) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 3;  // returned without an error
    try {
      misuse();
    } catch (const Error& e) {
      code = std::string(e.what()).find(expected) != std::string::npos ? 0 : 4;
      if (code != 0) std::fprintf(stderr, "castor::Error without '%s': %s\n", expected.c_str(), e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not a castor::Error: %s\n", e.what());
      code = 2;
    }
    std::fflush(nullptr);
    ::_exit(code);  // no destructors or leak checks of the parent's state
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status)) << "crashed with signal " << WTERMSIG(status);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << (WEXITSTATUS(status) == 3   ? "no error raised"
                                        : WEXITSTATUS(status) == 4 ? "an error that does not say what is wrong"
                                                                   : "another exception, or a sanitizer report");
}

ImageDataset tiny_dataset() {
  ImageDataset ds{4, 1, 2, 2, std::vector<uint8_t>(16, 7), {0, 1, 2, 3}, 10};
  return ds;
}

}  // namespace

TEST(Misuse, UndefinedTensorIsAnError) {
  expect_error_in_child([] { Tensor().backward(); }, "undefined tensor");
  expect_error_in_child([] { add(Tensor(), Tensor()); }, "undefined tensor");
  expect_error_in_child([] { mul(ones({2}), Tensor()); }, "undefined tensor");
  expect_error_in_child([] { (void)Tensor().numel(); }, "undefined tensor");
  expect_error_in_child([] { (void)Tensor().shape(); }, "undefined tensor");
  expect_error_in_child([] { (void)Tensor().item(); }, "undefined tensor");
  expect_error_in_child([] { (void)Tensor().data_ptr(); }, "undefined tensor");
  expect_error_in_child([] { Tensor().requires_grad_(); }, "undefined tensor");
  expect_error_in_child([] { sum(Tensor()); }, "undefined tensor");
  expect_error_in_child([] { matmul(ones({2, 2}), Tensor()); }, "undefined tensor");
  expect_error_in_child([] { Tensor().to(DType::Float16); }, "undefined tensor");
  expect_error_in_child([] { Tensor().view({1}); }, "undefined tensor");
  expect_error_in_child([] { Tensor().clone(); }, "undefined tensor");
  expect_error_in_child([] { Tensor().select(0, 0); }, "undefined tensor");
  expect_error_in_child([] { Tensor().detach(); }, "undefined tensor");
  expect_error_in_child([] { Tensor().grad(); }, "undefined tensor");
  expect_error_in_child([] { ones({2}).copy_(Tensor()); }, "undefined tensor");
  expect_error_in_child([] { Tensor().fill_(1); }, "undefined tensor");
  expect_error_in_child([] { relu(Tensor()); }, "undefined tensor");
  expect_error_in_child([] { add(Tensor(), 1.0); }, "undefined tensor");
}

TEST(Misuse, FactoryShapesThatOverflowAreErrors) {
  expect_error_in_child([] { zeros({4, (int64_t{1} << 62) + 1}); }, "too large");
  expect_error_in_child([] { zeros({int64_t{1} << 40, int64_t{1} << 40}); }, "too large");
  expect_error_in_child([] { ones({int64_t{1} << 61, 2}, DType::Float64); }, "too large");
  expect_error_in_child([] { zeros({0, int64_t{1} << 40, int64_t{1} << 40}); }, "too large");  // strides overflow
  expect_error_in_child([] { empty({3, -2}); }, "negative size");
  expect_error_in_child([] { tensor(std::vector<double>{1.0}, {int64_t{1} << 32, int64_t{1} << 32}); }, "int64");
}

// Memory the system cannot give is a castor::Error naming the size, the dtype and the op (PyTorch: "can't allocate
// memory: you tried to allocate N bytes"), not a bare std::bad_alloc.
TEST(Misuse, AllocationFailureNamesTheSizeAndTheOp) {
  expect_error_in_child([] { empty({int64_t{1} << 50}, DType::Float32); },
                        "out of memory: cannot allocate 4503599627370496 bytes (4.0 PiB) of float32 for a new tensor");
  expect_error_in_child(
      [] {
        const Tensor a = ones({1, 1}).expand({int64_t{1} << 25, int64_t{1} << 25});
        add(a, ones({1}));
      },
      "cannot allocate 4503599627370496 bytes (4.0 PiB) of float32 for add");
  expect_error_in_child(
      [] {
        ones({3}).to(DType::Float64).expand({int64_t{1} << 47, 3}).contiguous();
      },
      "bytes (3.0 PiB) of float64");
}

TEST(Misuse, DataLoaderChecksTheDatasetsBuffers) {
  expect_error_in_child(
      [] {
        ImageDataset ds = tiny_dataset();
        ds.n = 1000;  // declares more images than its buffers hold
        data::DataLoader loader(ds, {.batch_size = 2});
        loader.make_batch(0, 400);
      },
      "holds 16 image bytes");
  expect_error_in_child(
      [] {
        ImageDataset ds = tiny_dataset();
        ds.images.resize(3);
        data::DataLoader loader(ds, {.batch_size = 2});
      },
      "holds 3 image bytes");
  expect_error_in_child(
      [] {
        ImageDataset ds = tiny_dataset();
        ds.labels[2] = 200;
        data::DataLoader loader(ds, {.batch_size = 2});
      },
      "label 200");
  expect_error_in_child(
      [] {
        ImageDataset ds = tiny_dataset();
        ds.height = int64_t{1} << 40;
        ds.width = int64_t{1} << 40;
        data::DataLoader loader(ds, {.batch_size = 2});
      },
      "overflows int64");
}

TEST(Misuse, AmpInitializeTwiceRaises) {
  expect_error_in_child(
      [] {
        auto model = std::make_shared<nn::Linear>(4, 2);
        optim::SGD opt(model->parameters(), {.lr = 0.1});
        auto first = amp::initialize(*model, {&opt}, amp::OptLevel::O2, DType::Float16);
        auto second = amp::initialize(*model, {&opt}, amp::OptLevel::O2, DType::Float16);
      },
      "already initialized");
  expect_error_in_child(
      [] {
        auto model = std::make_shared<nn::Linear>(4, 2);
        optim::SGD a(model->parameters(), {.lr = 0.1}), b(model->parameters(), {.lr = 0.1});
        auto first = amp::initialize(*model, {&a}, amp::OptLevel::O1, DType::BFloat16);
        auto second = amp::initialize(*model, {&b}, amp::OptLevel::O1, DType::BFloat16);
      },
      "the model was already initialized");
}

TEST(Misuse, RestoredStateIsValidated) {
  expect_error_in_child([] { default_generator().set_state(Generator::State{}); }, "all zero");
  expect_error_in_child(
      [] {
        auto model = std::make_shared<nn::Linear>(4, 2);
        optim::SGD opt(model->parameters(), {.lr = 0.1});
        StateDict sd = opt.state_dict();
        sd.at("group.0.lr") = scalar_tensor(-5, DType::Float64);
        opt.load_state_dict(sd);
      },
      "group.0.lr\" is -5");
}

}  // namespace castor
