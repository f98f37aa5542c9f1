// Layer probe: a kernels-layer file including its own and core headers compiles (the twin of the wrong-way probe).
#include "castor/tensor.h"
#include "core/parallel.h"
#include "kernels/kernels.h"

namespace castor::kernels {
int64_t layer_probe(const Tensor& t) { return t.numel() + kBlock; }
}  // namespace castor::kernels
