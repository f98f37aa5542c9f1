// Backward rules of the layer ops (conv2d, batch_norm, pooling), beside the others: called from the one switch in backward.cpp.
#pragma once
#include <vector>

#include "autograd/node.h"

namespace castor::layer_rules {

std::vector<Tensor> conv2d(const Node& node, const Tensor& grad);
std::vector<Tensor> conv2d_max_pool2d_relu(const Node& node, Tensor grad);  // frees grad once pooling is through
std::vector<Tensor> batch_norm(const Node& node, const Tensor& grad);
std::vector<Tensor> max_pool2d(const Node& node, const Tensor& grad);
std::vector<Tensor> avg_pool2d(const Node& node, const Tensor& grad);

}  // namespace castor::layer_rules
