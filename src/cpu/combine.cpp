// Merges partial attention results over disjoint key sets by their log-sum-exp.
#include <algorithm>
#include <vector>

#include "core/backends.hpp"
#include "cpu/lse_merge.hpp"
#include "cpu/parallel.hpp"
#include "cpu/tensor_io.hpp"

namespace tileattn::cpu {

void combine(const Problem& p, const CombineArgs& a) {
  const TensorView &op = a.out_partial, &lp = a.lse_partial;
  const int splits = static_cast<int>(op.shape[0]);
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  parallel_for(rows, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> w(splits), acc(p.hdim_v);
    for (std::int64_t r = begin; r < end; ++r) {
      const int h = static_cast<int>(r % p.heads_q);
      const int i = static_cast<int>(r / p.heads_q % p.seqlen_q);
      const int b = static_cast<int>(r / p.heads_q / p.seqlen_q);
      for (int s = 0; s < splits; ++s)
        w[s] = lp.ptr<const float>()[s * lp.stride[0] + b * lp.stride[1] + h * lp.stride[2] + i * lp.stride[3]];
      const float lse = lse_merge_weights(w.data(), splits);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int s = 0; s < splits; ++s) {
        if (w[s] == 0.f) continue;
        const float* src = op.ptr<const float>() + s * op.stride[0] + b * op.stride[1] + i * op.stride[2] + h * op.stride[3];
        for (int c = 0; c < p.hdim_v; ++c) acc[c] += w[s] * src[c];
      }
      for (int c = 0; c < p.hdim_v; ++c) store_f32(a.out, elem(a.out, false, b, i, h, c), acc[c]);
      if (a.lse.present())
        a.lse.ptr<float>()[b * a.lse.stride[0] + h * a.lse.stride[1] + i * a.lse.stride[2]] = lse;
    }
  });
}

}  // namespace tileattn::cpu
