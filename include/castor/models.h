// Ready-made image classifiers (SimpleCNN, CIFAR ResNet-18, DAWNBench ResNet-9) with PyTorch's state-dict names.
#pragma once
#include <memory>
#include <string>

#include "castor/nn.h"

namespace castor::models {

// conv1 (3x3, 32, pad 1) -> max_pool 2 -> relu -> conv2 (3x3, 64, pad 1) -> max_pool 2 -> relu -> flatten
// -> fc1 (64*(H/4)*(W/4) -> 128) -> relu -> fc2 (128 -> num_classes). Input (N, C, H, W).
class SimpleCNN : public nn::Module {
 public:
  SimpleCNN(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SimpleCNN"; }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// torchvision's resnet18 in its CIFAR form: a 3x3 stride-1 stem conv (64) and no max-pool, then layer1..4 of
// two BasicBlocks each (64/128/256/512 planes, strides 1/2/2/2), adaptive average pool to 1x1, fc. Conv
// weights are re-drawn as torchvision does: kaiming_normal_(mode="fan_out", nonlinearity="relu").
class ResNet18 : public nn::Module {
 public:
  ResNet18(int64_t in_channels, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet"; }
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::Linear> fc;
};

// The DAWNBench ResNet-9 (Myrtle.ai): each stage is conv3x3 (no bias) -> BatchNorm -> relu, as a Sequential.
// prep (64); layer1 (128) + max_pool 2, plus residual res1 (two 128 stages); layer2 (256) + max_pool 2;
// layer3 (512) + max_pool 2, plus residual res3 (two 512 stages); adaptive max pool to 1x1; fc (512 ->
// num_classes, no bias); logits scaled by 0.125.
class ResNet9 : public nn::Module {
 public:
  ResNet9(int64_t in_channels, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet9"; }
  std::shared_ptr<nn::Sequential> prep, layer1, res1, layer2, layer3, res3;
  std::shared_ptr<nn::Linear> fc;
};

std::shared_ptr<SimpleCNN> simple_cnn(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes = 10);
std::shared_ptr<ResNet18> resnet18(int64_t in_channels = 3, int64_t num_classes = 10);
std::shared_ptr<ResNet9> resnet9(int64_t in_channels = 3, int64_t num_classes = 10);

// "simplecnn", "resnet18" or "resnet9"; other names raise a castor::Error listing these.
nn::ModulePtr make_model(const std::string& name, int64_t in_channels, int64_t height, int64_t width,
                         int64_t num_classes);

}  // namespace castor::models
