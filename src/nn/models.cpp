// The ready-made classifiers: SimpleCNN, CIFAR ResNet-18, DAWNBench ResNet-9, and make_model.
#include "castor/models.h"

#include <cmath>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"

namespace castor::models {

namespace {

// The models run their activations channels-last, the layout the layer kernels take without reorders; the copy is
// differentiable, and the logits and state dict are the same either way.
Tensor channels_last(const Tensor& input) {
  return input.dim() == 4 ? input.contiguous(MemoryFormat::ChannelsLast) : input;
}

}  // namespace

using nn::BasicBlock;
using nn::BatchNorm2d;
using nn::Conv2d;
using nn::Linear;
using nn::ModulePtr;
using nn::Sequential;

SimpleCNN::SimpleCNN(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes) {
  CASTOR_CHECK(height >= 4 && width >= 4, "SimpleCNN: the input must be at least 4x4, got ", height, "x", width);
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_channels, 32, /*kernel_size=*/3, /*stride=*/1,
                                                            /*padding=*/1));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1));
  fc1 = register_module("fc1", std::make_shared<Linear>(64 * (height / 4) * (width / 4), 128));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, num_classes));
}

// (N, C, H, W) -> (N, num_classes)
Tensor SimpleCNN::forward(const Tensor& input) {
  // relu(max_pool2d(conv(x))) as one op (F::conv2d_max_pool2d_relu): the convolution's output, which no backward
  // needs (max pooling saves only its argmax), is pooled a slice of the batch at a time while it is in the cache.
  Tensor x = F::conv2d_max_pool2d_relu(channels_last(input), conv1->weight, conv1->bias, /*stride=*/{1, 1},
                                       /*padding=*/{1, 1}, /*pool_kernel=*/{2, 2});  // (N, 32, H/2, W/2)
  x = F::conv2d_max_pool2d_relu(x, conv2->weight, conv2->bias, /*stride=*/{1, 1}, /*padding=*/{1, 1},
                                /*pool_kernel=*/{2, 2});  // (N, 64, H/4, W/4)
  x = F::relu(fc1->forward(F::flatten(x)));               // (N, 128)
  return fc2->forward(x);
}

namespace {

// A 3x3 convolution without bias, as torchvision's conv3x3.
std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Conv2d>(in, out, /*kernel_size=*/3, stride, /*padding=*/1, /*dilation=*/1, /*groups=*/1,
                                  /*bias=*/false);
}

std::shared_ptr<Sequential> resnet_layer(int64_t in_planes, int64_t planes, int64_t stride) {
  return std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      std::make_shared<BasicBlock>(in_planes, planes, stride), std::make_shared<BasicBlock>(planes, planes, 1)});
}

}  // namespace

ResNet18::ResNet18(int64_t in_channels, int64_t num_classes) {
  conv1 = register_module("conv1", conv3x3(in_channels, 64, /*stride=*/1));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  layer1 = register_module("layer1", resnet_layer(64, 64, /*stride=*/1));
  layer2 = register_module("layer2", resnet_layer(64, 128, /*stride=*/2));
  layer3 = register_module("layer3", resnet_layer(128, 256, /*stride=*/2));
  layer4 = register_module("layer4", resnet_layer(256, 512, /*stride=*/2));
  fc = register_module("fc", std::make_shared<Linear>(512, num_classes));
  // torchvision: kaiming_normal_(w, mode="fan_out", nonlinearity="relu"), std = sqrt(2 / fan_out).
  apply([](nn::Module& m) {
    auto* conv = dynamic_cast<Conv2d*>(&m);
    if (!conv) return;
    const Shape& s = conv->weight.shape();  // (out, in/groups, kh, kw)
    const double std = std::sqrt(2.0 / static_cast<double>(s[0] * s[2] * s[3]));
    NoGradGuard no_grad;
    conv->weight.copy_(normal(s, /*mean=*/0.0, std));
  });
}

// (N, C, H, W) -> (N, num_classes)
Tensor ResNet18::forward(const Tensor& input) {
  Tensor x = F::relu(bn1->forward(conv1->forward(channels_last(input))));     // (N, 64, H, W)
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));  // (N, 512, H/8, W/8)
  x = F::flatten(F::adaptive_avg_pool2d(x, /*output_size=*/{1, 1}));          // (N, 512)
  return fc->forward(x);
}

namespace {

// conv3x3 (no bias) -> BatchNorm2d -> relu, with a trailing max_pool 2 when `pool`.
std::shared_ptr<Sequential> conv_bn(int64_t in, int64_t out, bool pool) {
  auto s = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      conv3x3(in, out, /*stride=*/1), std::make_shared<BatchNorm2d>(out), std::make_shared<nn::ReLU>()});
  if (pool) s->push_back(std::make_shared<nn::MaxPool2d>(2));
  return s;
}

std::shared_ptr<Sequential> residual(int64_t channels) {
  return std::make_shared<Sequential>(std::initializer_list<ModulePtr>{conv_bn(channels, channels, /*pool=*/false),
                                                                       conv_bn(channels, channels, /*pool=*/false)});
}

}  // namespace

ResNet9::ResNet9(int64_t in_channels, int64_t num_classes) {
  prep = register_module("prep", conv_bn(in_channels, 64, /*pool=*/false));
  layer1 = register_module("layer1", conv_bn(64, 128, /*pool=*/true));
  res1 = register_module("res1", residual(128));
  layer2 = register_module("layer2", conv_bn(128, 256, /*pool=*/true));
  layer3 = register_module("layer3", conv_bn(256, 512, /*pool=*/true));
  res3 = register_module("res3", residual(512));
  fc = register_module("fc", std::make_shared<Linear>(512, num_classes, /*bias=*/false));
}

// (N, C, H, W) -> (N, num_classes)
Tensor ResNet9::forward(const Tensor& input) {
  Tensor x = layer1->forward(prep->forward(channels_last(input)));  // (N, 128, H/2, W/2)
  x = x + res1->forward(x);
  x = layer3->forward(layer2->forward(x));  // (N, 512, H/8, W/8)
  x = x + res3->forward(x);
  x = F::flatten(F::max_pool2d(x, /*kernel=*/{x.size(2), x.size(3)}));  // adaptive max pool to 1x1: (N, 512)
  return fc->forward(x) * 0.125;
}

std::shared_ptr<SimpleCNN> simple_cnn(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes) {
  return std::make_shared<SimpleCNN>(in_channels, height, width, num_classes);
}
std::shared_ptr<ResNet18> resnet18(int64_t in_channels, int64_t num_classes) {
  return std::make_shared<ResNet18>(in_channels, num_classes);
}
std::shared_ptr<ResNet9> resnet9(int64_t in_channels, int64_t num_classes) {
  return std::make_shared<ResNet9>(in_channels, num_classes);
}

nn::ModulePtr make_model(const std::string& name, int64_t in_channels, int64_t height, int64_t width,
                         int64_t num_classes) {
  if (name == "simplecnn") return simple_cnn(in_channels, height, width, num_classes);
  if (name == "resnet18") return resnet18(in_channels, num_classes);
  if (name == "resnet9") return resnet9(in_channels, num_classes);
  throw Error(detail::cat("make_model: unknown model \"", name, "\"; expected one of simplecnn, resnet18, resnet9"));
}

}  // namespace castor::models
