#include "standard_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>

#include "common/mask.hpp"

namespace tileattn::tools {
namespace {

// Runs body(row) for rows [0, n) on `threads` threads; the softmax passes are row-parallel.
template <class F>
void parallel_rows(std::int64_t n, int threads, F&& body) {
  const int t = static_cast<int>(std::clamp<std::int64_t>(n, 1, std::max(threads, 1)));
  std::vector<std::thread> pool;
  for (int w = 0; w < t; ++w)
    pool.emplace_back([&, w] {
      for (std::int64_t r = n * w / t; r < n * (w + 1) / t; ++r) body(r);
    });
  for (auto& th : pool) th.join();
}

}  // namespace

StandardAttention::StandardAttention(const StandardShape& shape, int threads)
    : s_(shape), threads_(threads) {
  openblas_set_num_threads(threads);
  const std::size_t n = static_cast<std::size_t>(s_.batch) * s_.heads * plane();
  S_.assign(n, 0.f);
  P_.assign(n, 0.f);
}

std::size_t StandardAttention::plane() const {
  return static_cast<std::size_t>(s_.seqlen_q) * s_.seqlen_k;
}

void StandardAttention::forward(const float* q, const float* k, const float* v, float* out) {
  const int H = s_.heads, Hk = s_.heads_kv, d = s_.hdim, sq = s_.seqlen_q, sk = s_.seqlen_k;
  const int group = H / Hk;
  const std::size_t qs = std::size_t(sq) * H * d, ks = std::size_t(sk) * Hk * d;
  for (int b = 0; b < s_.batch; ++b)
    for (int h = 0; h < H; ++h)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, sq, sk, d, s_.scale,
                  q + b * qs + h * d, H * d, k + b * ks + (h / group) * d, Hk * d, 0.f,
                  S_.data() + (std::size_t(b) * H + h) * plane(), sk);

  const Mask mask(sq, sk, true, -1, s_.causal ? 0 : -1);
  parallel_rows(std::int64_t(s_.batch) * H * sq, threads_, [&](std::int64_t r) {
    const int i = static_cast<int>(r % sq);
    const float* srow = S_.data() + r * sk;
    float* prow = P_.data() + r * sk;
    const int j0 = mask.key_begin(i), j1 = std::max(j0, mask.key_end(i));
    std::fill(prow, prow + j0, 0.f);
    std::fill(prow + j1, prow + sk, 0.f);
    if (j0 == j1) return;
    const float mx = *std::max_element(srow + j0, srow + j1);
    float sum = 0.f;
    for (int j = j0; j < j1; ++j) {
      prow[j] = std::exp(srow[j] - mx);
      sum += prow[j];
    }
    const float inv = 1.f / sum;
    for (int j = j0; j < j1; ++j) prow[j] *= inv;
  });

  for (int b = 0; b < s_.batch; ++b)
    for (int h = 0; h < H; ++h)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sq, d, sk, 1.f,
                  P_.data() + (std::size_t(b) * H + h) * plane(), sk,
                  v + b * ks + (h / group) * d, Hk * d, 0.f, out + b * qs + h * d, H * d);
}

void StandardAttention::backward(const float* q, const float* k, const float* v, const float* out,
                                 const float* dout, float* dq, float* dk, float* dv) {
  const int H = s_.heads, Hk = s_.heads_kv, d = s_.hdim, sq = s_.seqlen_q, sk = s_.seqlen_k;
  const int group = H / Hk;
  const std::size_t qs = std::size_t(sq) * H * d, ks = std::size_t(sk) * Hk * d;
  std::fill(dk, dk + s_.batch * ks, 0.f);
  std::fill(dv, dv + s_.batch * ks, 0.f);
  for (int b = 0; b < s_.batch; ++b)
    for (int h = 0; h < H; ++h) {
      const float* P = P_.data() + (std::size_t(b) * H + h) * plane();
      float* dS = S_.data() + (std::size_t(b) * H + h) * plane();  // dP, then dS, in place of S
      const float* qbh = q + b * qs + h * d;
      const float* obh = out + b * qs + h * d;
      const float* dobh = dout + b * qs + h * d;
      const std::size_t kv = b * ks + (h / group) * d;
      // dV += P^T dO; dP = dO V^T
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, sk, d, sq, 1.f, P, sk, dobh, H * d, 1.f,
                  dv + kv, Hk * d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, sq, sk, d, 1.f, dobh, H * d, v + kv,
                  Hk * d, 0.f, dS, sk);
      // dS = P * (dP - rowsum(dO * O))
      parallel_rows(sq, threads_, [&](std::int64_t i) {
        float D = 0.f;
        for (int c = 0; c < d; ++c) D += dobh[i * H * d + c] * obh[i * H * d + c];
        float* row = dS + i * sk;
        const float* prow = P + i * sk;
        for (int j = 0; j < sk; ++j) row[j] = prow[j] * (row[j] - D);
      });
      // dQ = scale * dS K; dK += scale * dS^T Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sq, d, sk, s_.scale, dS, sk, k + kv,
                  Hk * d, 0.f, dq + b * qs + h * d, H * d);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, sk, d, sq, s_.scale, dS, sk, qbh, H * d,
                  1.f, dk + kv, Hk * d);
    }
}

}  // namespace tileattn::tools
