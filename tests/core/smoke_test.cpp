// A first end-to-end check of tensors, ops and autograd on values worked out by hand.
#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {

TEST(Smoke, AddMulBackwardByHand) {
  Tensor x = tensor({1, 2, 3}).requires_grad_();
  Tensor y = tensor({4, 5, 6}).requires_grad_();
  Tensor loss = sum(x * y + x);
  EXPECT_EQ(loss.item(), 1 * 4 + 2 * 5 + 3 * 6 + 6);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(y.grad().to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

}  // namespace castor

namespace castor {

TEST(Smoke, GradcheckComposite) {
  Generator gen(7);
  Tensor a = randn({3, 4}, DType::Float64, &gen).requires_grad_();
  Tensor b = randn({4, 5}, DType::Float64, &gen).requires_grad_();
  EXPECT_TRUE(test::gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor h = tanh(matmul(in[0], in[1]));
        return log_softmax(h * sigmoid(h) + sum(exp(h), {1}, true), 1);
      },
      {a, b}));
}

TEST(Smoke, ViewsAndBf16) {
  Tensor x = arange(24, DType::Float32).view({2, 3, 4});
  Tensor y = x.permute({2, 0, 1}).contiguous();
  EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(y.select(0, 1).to_vector<float>(), (std::vector<float>{1, 5, 9, 13, 17, 21}));
  Tensor z = x.bfloat16().slice(2, 1, 4, 2);
  EXPECT_EQ(z.to(DType::Float32).reshape({-1}).to_vector<float>(),
            (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  Tensor m = matmul(x.bfloat16(), x.bfloat16().transpose(1, 2));
  EXPECT_EQ(m.dtype(), DType::BFloat16);
  EXPECT_EQ(m.shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(m.to_vector<float>()[0], 0 * 0 + 1 * 1 + 2 * 2 + 3 * 3);
}

}  // namespace castor
