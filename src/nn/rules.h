// Backward rules of the layer kernels that live in src/nn (called from the one switch in autograd/backward.cpp).
#pragma once
#include <vector>

#include "autograd/node.h"

namespace castor::nn_rules {

std::vector<Tensor> conv2d(const Node& node, const Tensor& grad);
std::vector<Tensor> batch_norm(const Node& node, const Tensor& grad);
std::vector<Tensor> max_pool2d(const Node& node, const Tensor& grad);
std::vector<Tensor> avg_pool2d(const Node& node, const Tensor& grad);

}  // namespace castor::nn_rules
