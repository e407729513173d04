// Outputs must own their memory: validation rejects an output that aliases itself, another output
// or an input, and accepts the layouts that only look close (packed dq/dk/dv, packed qkv inputs).
#include <gtest/gtest.h>

#include <vector>

#include "core/overlap.hpp"
#include "support/expect_rejected.hpp"
#include "support/host_tensor.hpp"
#include "support/seeded_test.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

class ValidateOverlap : public test::SeededTest {};

TEST_F(ValidateOverlap, ViewsOverlapIsExactOnPackedLayouts) {
  std::vector<float> buf(2 * 3 * 3 * 4 * 8);
  // [b=2, s=3, 3, h=4, d=8]: the q, k, v slices interleave but never share an element.
  auto slice = [&](int which, std::int64_t d = 8) {
    return view(buf.data() + which * 4 * 8, DType::f32, {2, 3, 4, d}, {3 * 3 * 4 * 8, 3 * 4 * 8, 8, 1});
  };
  EXPECT_FALSE(views_overlap(slice(0), slice(1)));
  EXPECT_FALSE(views_overlap(slice(0), slice(2)));
  EXPECT_TRUE(views_overlap(slice(1), slice(1)));
  EXPECT_TRUE(views_overlap(slice(0, 9), slice(1)));  // one element too wide reaches the next slice
  // Same storage, viewed BSHD and BHSD: they overlap.
  const TensorView bshd = view(buf.data(), DType::f32, {2, 3, 4, 8});
  const TensorView bhsd = view(buf.data(), DType::f32, {2, 3, 4, 8}, {96, 8, 24, 1});
  EXPECT_TRUE(views_overlap(bshd, bhsd));
  // Adjacent halves of one buffer, and a view past its end.
  EXPECT_FALSE(views_overlap(view(buf.data(), DType::f32, {10}), view(buf.data() + 10, DType::f32, {10})));
  EXPECT_TRUE(views_overlap(view(buf.data(), DType::f32, {11}), view(buf.data() + 10, DType::f32, {10})));
  // A bf16 view over half of an f32 element.
  EXPECT_TRUE(views_overlap(view(buf.data(), DType::f32, {1}),
                            view(reinterpret_cast<char*>(buf.data()) + 2, DType::bf16, {1})));
  EXPECT_FALSE(views_overlap(view(buf.data(), DType::f32, {1}),
                             view(reinterpret_cast<char*>(buf.data()) + 4, DType::bf16, {1})));
  // Empty views overlap nothing.
  EXPECT_FALSE(views_overlap(view(buf.data(), DType::f32, {0}), bshd));
}

TEST_F(ValidateOverlap, SelfOverlap) {
  float x[64];
  EXPECT_FALSE(view_self_overlaps(view(x, DType::f32, {2, 4, 8})));
  EXPECT_FALSE(view_self_overlaps(view(x, DType::f32, {2, 4, 8}, {8, 16, 1})));
  EXPECT_TRUE(view_self_overlaps(view(x, DType::f32, {2, 4, 8}, {0, 8, 1})));   // broadcast
  EXPECT_TRUE(view_self_overlaps(view(x, DType::f32, {2, 4, 8}, {32, 4, 1})));  // rows overlap
  EXPECT_FALSE(view_self_overlaps(view(x, DType::f32, {1, 4, 8}, {0, 8, 1})));  // size-1 dims don't matter
}

struct Fwd {
  HostTensor q{DType::f32, {2, 3, 2, 8}}, k{DType::f32, {2, 4, 2, 8}}, v{DType::f32, {2, 4, 2, 8}};
  HostTensor out{DType::f32, {2, 3, 2, 8}}, lse{DType::f32, {2, 2, 3}};
  ForwardArgs args() {
    q.fill(0.5);
    out.poison();
    lse.poison();
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options.backend = Backend::cpu_reference;
    return a;
  }
};

TEST_F(ValidateOverlap, ForwardOutputs) {
  Fwd t;
  ForwardArgs a = t.args();
  a.out.stride[1] = 0;  // every query row written to the same place
  test::expect_rejected([&] { forward(a); }, {"tileattn::forward", "out with shape [2, 3, 2, 8] and strides [48, 0, 8, 1]"},
                        {&t.out, &t.lse});
  a = t.args();
  a.out.data = t.q.data();  // in place over q
  test::expect_rejected([&] { forward(a); }, {"output out overlaps input q"}, {&t.q, &t.lse});
  a = t.args();
  a.lse.data = t.out.data();
  test::expect_rejected([&] { forward(a); }, {"outputs out and lse overlap"}, {&t.out});
  a = t.args();
  a.lse.stride[0] = 0;
  test::expect_rejected([&] { forward(a); }, {"lse with shape [2, 2, 3]", "maps several elements to one address"}, {&t.out, &t.lse});
}

// Packed qkv inputs and packed dq/dk/dv gradients are legal and give the same gradients as
// separate tensors.
TEST_F(ValidateOverlap, PackedGradientsAccepted) {
  const std::int64_t B = 2, S = 3, H = 2, D = 8;
  HostTensor qkv(DType::f32, {B, S, 3, H, D}), dqkv(DType::f32, {B, S, 3, H, D});
  qkv.fill_normal(rng_);
  auto slice = [&](HostTensor& t, int which) {
    return view(static_cast<float*>(t.data()) + which * H * D, DType::f32, {B, S, H, D}, {S * 3 * H * D, 3 * H * D, D, 1});
  };
  HostTensor out(DType::f32, {B, S, H, D}), lse(DType::f32, {B, H, S}), dout(DType::f32, {B, S, H, D});
  dout.fill_normal(rng_);
  ForwardArgs f;
  f.q = slice(qkv, 0);
  f.k = slice(qkv, 1);
  f.v = slice(qkv, 2);
  f.out = out.view();
  f.lse = lse.view();
  f.options.causal = true;
  f.options.backend = Backend::cpu_reference;
  forward(f);
  BackwardArgs b;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.out = out.view();
  b.dout = dout.view();
  b.lse = lse.view();
  b.options = f.options;
  b.dq = slice(dqkv, 0);
  b.dk = slice(dqkv, 1);
  b.dv = slice(dqkv, 2);
  backward(b);
  HostTensor dq(DType::f32, {B, S, H, D}), dk(DType::f32, {B, S, H, D}), dv(DType::f32, {B, S, H, D});
  b.dq = dq.view();
  b.dk = dk.view();
  b.dv = dv.view();
  backward(b);
  for (std::int64_t i = 0; i < B * S * H * D; ++i) {
    const std::int64_t row = i / (H * D), col = i % (H * D);
    ASSERT_EQ(dqkv.get(row * 3 * H * D + col), dq.get(i));
    ASSERT_EQ(dqkv.get(row * 3 * H * D + H * D + col), dk.get(i));
    ASSERT_EQ(dqkv.get(row * 3 * H * D + 2 * H * D + col), dv.get(i));
  }

  // dk and dv in one place is not.
  b.dv = b.dk;
  dk.poison();
  test::expect_rejected([&] { backward(b); }, {"tileattn::backward", "outputs dk and dv overlap"}, {&dk, &dq});
  b.dv = dv.view();
  b.dq = b.dout;
  test::expect_rejected([&] { backward(b); }, {"output dq overlaps input dout"}, {&dout, &dk});
}

TEST_F(ValidateOverlap, DecodeAndCombineOutputs) {
  HostTensor q(DType::f32, {1, 1, 2, 8}), kc(DType::f32, {1, 4, 2, 8}), vc(DType::f32, {1, 4, 2, 8});
  HostTensor out(DType::f32, {1, 1, 2, 8});
  kc.poison();
  DecodeArgs d;
  d.q = q.view();
  d.k_cache = kc.view();
  d.v_cache = vc.view();
  d.out = kc.view();
  d.out.shape[1] = 1;
  d.options.backend = Backend::cpu_reference;
  test::expect_rejected([&] { decode(d); }, {"tileattn::decode", "output out overlaps input k_cache"}, {&kc});

  HostTensor op(DType::f32, {2, 1, 1, 2, 8}), lp(DType::f32, {2, 1, 2, 1});
  op.poison();
  CombineArgs c;
  c.out_partial = op.view();
  c.lse_partial = lp.view();
  c.out = view(op.data(), DType::f32, {1, 1, 2, 8});
  test::expect_rejected([&] { combine(c); }, {"tileattn::combine", "output out overlaps input out_partial"}, {&op});
}

}  // namespace
}  // namespace tileattn
