// A state dict: named tensors in a fixed order (scalars as 0-dim tensors), as saved in checkpoints.
#pragma once
#include <map>
#include <string>

#include "castor/tensor.h"

namespace castor {

using StateDict = std::map<std::string, Tensor>;

}  // namespace castor
