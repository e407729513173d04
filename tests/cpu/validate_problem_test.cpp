// Derived fields of the validated problem that backends rely on.
#include <gtest/gtest.h>

#include <climits>

#include "core/problem.hpp"
#include "support/host_tensor.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

// Windows wider than any sequence are unbounded, and must reach Mask as such: Mask computes
// i + diag_offset + window in int, which a window of INT_MAX would overflow.
TEST(ValidateProblem, HugeWindowsBecomeUnbounded) {
  for (auto [sq, sk] : {std::pair{3, 5}, std::pair{5, 3}}) {
    HostTensor q(DType::f32, {1, sq, 1, 8}), k(DType::f32, {1, sk, 1, 8}), out(DType::f32, {1, sq, 1, 8});
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = k.view();
    a.out = out.view();
    for (bool br : {true, false}) {
      a.options.align = br ? MaskAlign::bottom_right : MaskAlign::top_left;
      a.options.window_left = INT_MAX;
      a.options.window_right = INT_MAX;
      const Problem p = validate(a);
      const Mask m = p.mask(sq, sk);
      for (int i = 0; i < sq; ++i) {
        EXPECT_EQ(m.key_begin(i), 0) << "row " << i;
        EXPECT_EQ(m.key_end(i), sk) << "row " << i;
      }
      // The smallest window that still bounds nothing on either side stays as given.
      a.options.window_left = a.options.window_right = std::max(sq, sk) - 1;
      const Problem p2 = validate(a);
      const Mask m2 = p2.mask(sq, sk);
      for (int i = 0; i < sq; ++i) {
        EXPECT_LE(m2.key_begin(i), br ? std::max(0, i + sk - sq - (std::max(sq, sk) - 1)) : 0);
        EXPECT_GE(m2.key_end(i), std::min(sk, (br ? i + sk - sq : i) + std::max(sq, sk)));
      }
      a.options.causal = true;
      a.options.window_right = -1;
      a.options.window_left = INT_MAX;
      EXPECT_EQ(validate(a).window_right, 0);
      EXPECT_EQ(validate(a).window_left, -1);
      a.options.causal = false;
    }
  }
}

}  // namespace
}  // namespace tileattn
