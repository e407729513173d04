// Uses only the installed headers and library: one query row over two keys, checked by hand.
#include <tileattn/tileattn.hpp>

#include <cmath>
#include <cstdio>

int main() {
  constexpr int d = 8;
  float q[d] = {}, k[2 * d] = {}, v[2 * d] = {}, out[d] = {}, lse = 0;
  q[0] = 1.f;
  k[0] = 2.f;  // key 0 scores 2 * scale, key 1 scores 0
  for (int c = 0; c < d; ++c) v[c] = 1.f, v[d + c] = -1.f;
  tileattn::ForwardArgs a;
  a.q = tileattn::view(q, tileattn::DType::f32, {1, 1, 1, d});
  a.k = tileattn::view(k, tileattn::DType::f32, {1, 2, 1, d});
  a.v = tileattn::view(v, tileattn::DType::f32, {1, 2, 1, d});
  a.out = tileattn::view(out, tileattn::DType::f32, {1, 1, 1, d});
  a.lse = tileattn::view(&lse, tileattn::DType::f32, {1, 1, 1});
  a.options.scale = 0.5f;
  a.options.backend = tileattn::Backend::cpu_reference;  // this test is about packaging
  tileattn::forward(a);
  const double p0 = 1 / (1 + std::exp(-1.0)), want_out = 2 * p0 - 1, want_lse = std::log(std::exp(1.0) + 1);
  const bool ok = std::fabs(out[0] - want_out) < 1e-5 && std::fabs(lse - want_lse) < 1e-5;
  std::printf("installed tileattn %s: out %.6f (want %.6f), lse %.6f (want %.6f): %s\n", tileattn::version_string,
              out[0], want_out, lse, want_lse, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
