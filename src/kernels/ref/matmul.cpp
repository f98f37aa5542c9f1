// The reference matrix product: plain loops, float32 accumulation (double for float64), one rounding.
#include "kernels/kernels.h"
#include "kernels/ref/loops.h"

namespace castor::kernels {

void matmul_ref(const Tensor& a3, const Tensor& b3, const Tensor& dst, const Tensor& bias) {
  const Tensor a = a3.dim() == 2 ? a3.detach().unsqueeze(0) : a3, b = b3.dim() == 2 ? b3.detach().unsqueeze(0) : b3;
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  with_compute_type(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor x = empty(a.shape(), dtype_of<T>()), y = empty(b.shape(), dtype_of<T>());
    Tensor z = empty({B, M, N}, dtype_of<T>());
    Tensor c = bias.defined() ? empty(bias.shape(), dtype_of<T>()) : Tensor();
    copy(a, x);
    copy(b, y);
    if (c.defined()) copy(bias, c);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* zp = static_cast<T*>(z.data_ptr());
    const T* cp = c.defined() ? static_cast<const T*>(c.data_ptr()) : nullptr;
#pragma omp parallel for collapse(2) if (B * M * N * K > (1 << 20))
    for (int64_t bi = 0; bi < B; ++bi) {
      for (int64_t i = 0; i < M; ++i) {
        T* row = zp + (bi * M + i) * N;
        std::fill(row, row + N, T(0));
        for (int64_t k = 0; k < K; ++k) {
          const T av = xp[(bi * M + i) * K + k];
          const T* yr = yp + (bi * K + k) * N;
          for (int64_t j = 0; j < N; ++j) row[j] += av * yr[j];
        }
        if (cp)
          for (int64_t j = 0; j < N; ++j) row[j] += cp[j];
      }
    }
    copy(z.view(dst.shape()), dst);
  });
}

}  // namespace castor::kernels
