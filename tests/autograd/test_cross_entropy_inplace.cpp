// The cross-entropy backward writes the logits' gradient over the logits when
// nothing else holds them. The gradient must equal the out-of-place one.
#include <gtest/gtest.h>

#include "autograd/ops.h"

using namespace kiln;

namespace {

std::vector<double> grad_of_x(bool keep_logits_alive) {
  Generator gen(5);
  Tensor x = ops::randn({6, 9}, gen);
  x.set_requires_grad(true);
  Tensor w = ops::randn({7, 9}, gen);
  Tensor t = ops::from_vector(std::vector<std::int32_t>{0, 3, -100, 6, 2, 1}, {6});
  Tensor logits = ag::linear(x, w);  // (6, 7), produced inside the graph
  Tensor loss = ag::cross_entropy(logits, t, -100);
  Tensor keep = keep_logits_alive ? logits : Tensor();
  logits = Tensor();
  backward(loss);
  return x.grad().to_double_vector();
}

}  // namespace

TEST(CrossEntropyInPlace, SameGradientAsOutOfPlace) {
  auto in_place = grad_of_x(false);      // only the node holds the logits
  auto out_of_place = grad_of_x(true);   // a second handle forces a copy
  ASSERT_EQ(in_place.size(), out_of_place.size());
  for (std::size_t i = 0; i < in_place.size(); ++i) EXPECT_EQ(in_place[i], out_of_place[i]) << i;
  double sum = 0;
  for (double v : in_place) sum += v * v;
  EXPECT_GT(sum, 0.0);
}
