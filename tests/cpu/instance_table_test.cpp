// The kernel families' shared lookup of instantiations (src/cuda/instance_table.hpp) is plain C++:
// checked here, where CI runs, on a table shaped like a narrow build's.
#include <gtest/gtest.h>

#include "cuda/instance_table.hpp"

namespace tileattn::cuda {
namespace {

struct Entry {
  DType dtype;
  int hdim;
};

constexpr Entry kTable[] = {{DType::bf16, 256}, {DType::bf16, 64}, {DType::f16, 128}, {DType::bf16, 128}};

int picked(DType dtype, int hdim) {
  const Entry* e = smallest_instance(kTable, dtype, hdim);
  return e ? e->hdim : 0;
}

TEST(InstanceTable, TakesTheSmallestHeadDimThatHoldsTheCall) {
  EXPECT_EQ(picked(DType::bf16, 1), 64);
  EXPECT_EQ(picked(DType::bf16, 64), 64);
  EXPECT_EQ(picked(DType::bf16, 65), 128);
  EXPECT_EQ(picked(DType::bf16, 192), 256);
  EXPECT_EQ(picked(DType::bf16, 256), 256);
  EXPECT_EQ(picked(DType::f16, 40), 128);
}

TEST(InstanceTable, NoneWhereNothingBuiltHoldsTheCall) {
  EXPECT_EQ(picked(DType::bf16, 257), 0);
  EXPECT_EQ(picked(DType::f16, 129), 0);
  EXPECT_EQ(picked(DType::f32, 64), 0);
}

}  // namespace
}  // namespace tileattn::cuda
