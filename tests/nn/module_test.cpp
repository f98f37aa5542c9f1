// nn::Module mechanics against hand-worked expectations: naming, registration, state dicts, modes, dtype casts.
#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/models.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor::nn {
namespace {

// conv (Conv2d 2->4, 3x3), bn (BatchNorm2d 4), head (Sequential: Linear 4->3, ReLU, Linear 3->2 without bias).
struct Toy : Module {
  Toy() {
    conv = register_module("conv", std::make_shared<Conv2d>(2, 4, /*kernel_size=*/3));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
    head = register_module("head", std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
                                       std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(),
                                       std::make_shared<Linear>(3, 2, /*bias=*/false)}));
    scale = register_parameter("scale", ones({1}));
    step = register_buffer("step", zeros({}, DType::Int64));
  }
  Tensor forward(const Tensor& input) override { return input; }
  std::string type_name() const override { return "Toy"; }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Sequential> head;
  Tensor scale, step;
};

std::vector<std::string> names(const NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

TEST(Module, HierarchicalNamesInPyTorchOrder) {
  Toy toy;
  // PyTorch: a module's own entries first, then each child's in registration order.
  EXPECT_EQ(names(toy.named_parameters()),
            (std::vector<std::string>{"scale", "conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.0.weight",
                                      "head.0.bias", "head.2.weight"}));
  EXPECT_EQ(names(toy.named_buffers()),
            (std::vector<std::string>{"step", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(names(toy.named_parameters(/*recurse=*/false)), (std::vector<std::string>{"scale"}));
  EXPECT_EQ(toy.parameters().size(), 8u);
  EXPECT_EQ(toy.children().size(), 3u);
  EXPECT_EQ(toy.named_children()[2].first, "head");
  EXPECT_EQ(toy.state_dict().size(), 12u);
  EXPECT_EQ(toy.conv->weight.shape(), (Shape{4, 2, 3, 3}));
  EXPECT_EQ(toy.bn->num_batches_tracked.dtype(), DType::Int64);
  EXPECT_EQ(toy.bn->num_batches_tracked.dim(), 0);
  for (const Tensor& p : toy.parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  EXPECT_FALSE(toy.bn->running_mean.requires_grad());
  // The state dict shares storage with the module and records no history.
  Tensor w = toy.state_dict().at("conv.weight");
  EXPECT_FALSE(w.requires_grad());
  EXPECT_EQ(w.data_ptr(), toy.conv->weight.data_ptr());
}

TEST(Module, RegistrationRejectsBadNames) {
  Toy toy;
  EXPECT_THROW(toy.register_parameter("scale", ones({1})), Error);
  EXPECT_THROW(toy.register_buffer("conv", ones({1})), Error);
  EXPECT_THROW(toy.register_module("a.b", std::make_shared<ReLU>()), Error);
  EXPECT_THROW(toy.register_parameter("", ones({1})), Error);
  EXPECT_THROW(toy.register_parameter("ints", zeros({2}, DType::Int64)), Error);
}

TEST(Module, LoadStateDictStrictNamesEveryProblemAndCopiesNothing) {
  Toy toy;
  StateDict sd = Toy().state_dict();
  const std::vector<float> before = toy.conv->weight.to_vector<float>();
  sd.erase("conv.bias");
  sd.erase("bn.running_var");
  sd["extra.weight"] = ones({2});
  sd["head.0.weight"] = zeros({3, 5});
  sd["bn.num_batches_tracked"] = zeros({}, DType::Float32);
  // PyTorch's multi-line message, one line per problem.
  const std::string msg = test::error_of([&] { toy.load_state_dict(sd); });
  EXPECT_NE(msg.find("Error(s) in loading state_dict for Toy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Missing key(s) in state_dict: \"conv.bias\", \"bn.running_var\"."), std::string::npos) << msg;
  EXPECT_NE(msg.find("Unexpected key(s) in state_dict: \"extra.weight\"."), std::string::npos) << msg;
  EXPECT_NE(msg.find("size mismatch for head.0.weight: copying a param with shape [3, 5] from checkpoint, the "
                     "shape in current model is [3, 4]."),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("dtype mismatch for bn.num_batches_tracked"), std::string::npos) << msg;
  EXPECT_EQ(toy.conv->weight.to_vector<float>(), before);

  // Non-strict: missing and unexpected keys are reported, the rest is copied; shape mismatches still raise.
  sd["head.0.weight"] = zeros({3, 4});
  sd["bn.num_batches_tracked"] = full({}, 7, DType::Int64);
  LoadResult r = toy.load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"conv.bias", "bn.running_var"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"extra.weight"}));
  EXPECT_EQ(toy.head->operator[](0)->state_dict().at("weight").to_vector<float>(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(toy.bn->num_batches_tracked.item(), 7);
  sd["head.0.weight"] = zeros({4, 3});
  EXPECT_THROW(toy.load_state_dict(sd, /*strict=*/false), Error);
}

TEST(Module, LoadStateDictCopiesIntoTheExistingTensorsConverting) {
  Toy toy, source;
  source.to(DType::BFloat16);
  Tensor held = toy.conv->weight;  // as an optimizer would hold it
  const void* data = held.data_ptr();
  toy.load_state_dict(source.state_dict());
  EXPECT_EQ(held.dtype(), DType::Float32);
  EXPECT_EQ(held.data_ptr(), data);
  EXPECT_TRUE(test::bit_equal(held, source.conv->weight.to(DType::Float32)));
  EXPECT_TRUE(held.requires_grad());
}

TEST(Module, ToCastsFloatingTensorsInPlaceAndKeepsBatchNormFp32OnRequest) {
  auto model = models::resnet18(/*in_channels=*/3, /*num_classes=*/10);
  Tensor held = model->conv1->weight;
  const Tensor original = held.detach().clone();
  held.set_grad(ones(held.shape()));
  model->to(DType::BFloat16);
  EXPECT_EQ(held.dtype(), DType::BFloat16);  // the handle sees the cast, like PyTorch's param.data
  EXPECT_TRUE(test::bit_equal(held, original.to(DType::BFloat16)));
  EXPECT_EQ(held.grad().dtype(), DType::BFloat16);
  EXPECT_TRUE(held.requires_grad() && held.is_leaf());
  for (const auto& [name, t] : model->state_dict())
    EXPECT_EQ(t.dtype(), name.ends_with("num_batches_tracked") ? DType::Int64 : DType::BFloat16) << name;

  auto o2 = models::resnet18(/*in_channels=*/3, /*num_classes=*/10);
  o2->to(DType::BFloat16, /*keep_batchnorm_fp32=*/true);
  int batchnorm_entries = 0;
  for (const auto& [name, t] : o2->state_dict()) {
    const bool bn = name.find("bn") != std::string::npos || name.find("downsample.1") != std::string::npos;
    batchnorm_entries += bn;
    if (name.ends_with("num_batches_tracked"))
      EXPECT_EQ(t.dtype(), DType::Int64) << name;
    else
      EXPECT_EQ(t.dtype(), bn ? DType::Float32 : DType::BFloat16) << name;
  }
  EXPECT_EQ(batchnorm_entries, 20 * 5);  // bn1, two per block, three downsamples: 20 BatchNorm2d of 5 entries
}

// Under SkipInitGuard (nested too) the layers draw nothing, but the default generator ends where their init leaves it:
// Toy's uniform draws, and an Embedding's odd count of normals that leaves a cached one. Constants stay set.
TEST(Module, SkipInitGuardAdvancesTheDefaultGeneratorAsTheInitWould) {
  auto build = [] {
    auto toy = std::make_shared<Toy>();
    Embedding embedding(3, 5);
    return toy;
  };
  manual_seed(8);
  build();
  const Generator::State initialised = default_generator().state();
  manual_seed(8);
  std::shared_ptr<Toy> skipped;
  {
    SkipInitGuard outer;
    { SkipInitGuard inner; }
    skipped = build();
  }
  EXPECT_EQ(default_generator().state(), initialised);
  EXPECT_EQ(skipped->bn->weight.to_vector<float>(), std::vector<float>(4, 1.0f));
  manual_seed(8);
  const Linear drawn(4, 3);
  manual_seed(8);
  { SkipInitGuard gone; }
  EXPECT_TRUE(test::bit_equal(Linear(4, 3).weight, drawn.weight));  // initialised again once the guards are gone
}

TEST(Module, TrainEvalApplyAndZeroGrad) {
  Toy toy;
  EXPECT_TRUE(toy.is_training());
  toy.eval();
  EXPECT_FALSE(toy.is_training() || toy.bn->is_training() || toy.head->operator[](1)->is_training());
  toy.train();
  EXPECT_TRUE(toy.head->operator[](2)->is_training());

  std::vector<std::string> order;
  toy.apply([&](Module& m) { order.push_back(m.type_name()); });
  EXPECT_EQ(order,
            (std::vector<std::string>{"Conv2d", "BatchNorm2d", "Linear", "ReLU", "Linear", "Sequential", "Toy"}));

  for (const Tensor& p : toy.parameters()) p.set_grad(full(p.shape(), 3.0));
  toy.zero_grad();
  for (const Tensor& p : toy.parameters()) EXPECT_EQ(sum(abs(p.grad())).item(), 0.0);
  toy.zero_grad(/*set_to_none=*/true);
  for (const Tensor& p : toy.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Module, DropoutFollowsTheMode) {
  Dropout dropout(/*p=*/0.25);
  const Tensor x = full({100000}, 2.0);
  const std::vector<float> y = dropout(x).to_vector<float>();
  int64_t zeros = 0;
  for (float v : y) {
    zeros += v == 0.0f;
    if (v != 0.0f) {
      ASSERT_EQ(v, 2.0f / 0.75f);  // survivors scaled by 1/(1-p)
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / y.size(), 0.25, 0.01);
  dropout.eval();
  EXPECT_TRUE(test::bit_equal(dropout(x), x));
}

TEST(Module, ModelFactory) {
  EXPECT_EQ(models::make_model("simplecnn", 1, 28, 28, 10)->type_name(), "SimpleCNN");
  EXPECT_EQ(models::make_model("resnet18", 3, 32, 32, 10)->type_name(), "ResNet");
  EXPECT_EQ(models::make_model("resnet9", 3, 32, 32, 10)->type_name(), "ResNet9");
  test::expect_error([] { models::make_model("vgg16", 3, 32, 32, 10); }, {"unknown model \"vgg16\""});
}

}  // namespace
}  // namespace castor::nn
