// Index kernels along the middle dim of (outer, n, inner) views: gather, and its adjoint scatter-add.
#include <cstring>

#include "castor/check.h"
#include "kernels/kernels.h"

namespace castor::kernels {

void gather_dim(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t m, int64_t inner,
                const Tensor& dst) {
  const int64_t* ip = index.data<int64_t>();
  const size_t es = src.element_size();
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * m + j) * inner + i, v = ip[k];
        CASTOR_CHECK(v >= 0 && v < n, "gather: index ", v, " out of range for a dim of size ", n);
        std::memcpy(d + k * es, s + ((o * n + v) * inner + i) * es, es);
      }
}

void scatter_add_dim(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t m, int64_t inner,
                     const Tensor& dst) {
  // Sums in double, rounded once into dst's dtype.
  Tensor s64 = empty(src.shape(), DType::Float64), acc = empty(dst.shape(), DType::Float64);
  copy(src, s64);
  fill(acc, 0.0);
  const int64_t* ip = index.data<int64_t>();
  const double* s = s64.data<double>();
  double* a = acc.data<double>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * m + j) * inner + i;
        a[(o * n + ip[k]) * inner + i] += s[k];
      }
  copy(acc, dst);
}

}  // namespace castor::kernels
