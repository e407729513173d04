#include "core/overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace tileattn {
namespace {

// One term of sum_k z_k * stride_k with the integer z_k in [lo, hi]; stride > 0, in bytes.
struct Term {
  std::int64_t stride, lo, hi;
};

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return -floor_div(-a, b); }

// Is there a choice of z_k (terms k.. onward) with sum z_k stride_k == r? Terms are sorted by
// descending stride; min_rest/max_rest bound what the terms after k can add.
bool solvable(const std::vector<Term>& t, const std::vector<std::int64_t>& min_rest,
              const std::vector<std::int64_t>& max_rest, std::size_t k, std::int64_t r, int& budget) {
  if (k == t.size()) return r == 0;
  if (--budget < 0) return true;  // undecided: say overlapping
  const std::int64_t z0 = std::max(t[k].lo, ceil_div(r - max_rest[k], t[k].stride));
  const std::int64_t z1 = std::min(t[k].hi, floor_div(r - min_rest[k], t[k].stride));
  for (std::int64_t z = z0; z <= z1; ++z)
    if (solvable(t, min_rest, max_rest, k + 1, r - z * t[k].stride, budget)) return true;
  return false;
}

// Adds the terms of a view: its element offsets, then the bytes within an element. sign -1 for the
// view on the other side of the equation.
void add_terms(std::vector<Term>& terms, const TensorView& v, int sign) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(v.dtype));
  auto add = [&](std::int64_t stride, std::int64_t n) {
    if (n <= 1 || stride == 0) return;
    std::int64_t lo = 0, hi = n - 1;
    if ((stride < 0) != (sign < 0)) {
      lo = -(n - 1);
      hi = 0;
    }
    terms.push_back({std::abs(stride), lo, hi});
  };
  for (int d = 0; d < v.ndim; ++d) add(v.stride[d] * es, v.shape[d]);
  add(1, es);
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  if (a.device.type != b.device.type || a.device.index != b.device.index) return false;
  // base_a + offset_a == base_b + offset_b  <=>  offset_a - offset_b == base_b - base_a
  std::vector<Term> raw;
  add_terms(raw, a, +1);
  add_terms(raw, b, -1);
  std::sort(raw.begin(), raw.end(), [](const Term& x, const Term& y) { return x.stride > y.stride; });
  std::vector<Term> terms;  // equal strides merged
  for (const Term& t : raw) {
    if (!terms.empty() && terms.back().stride == t.stride) {
      terms.back().lo += t.lo;
      terms.back().hi += t.hi;
    } else {
      terms.push_back(t);
    }
  }
  std::vector<std::int64_t> min_rest(terms.size() + 1, 0), max_rest(terms.size() + 1, 0);
  for (std::size_t k = terms.size(); k-- > 0;) {
    min_rest[k] = min_rest[k + 1] + (k + 1 < terms.size() ? terms[k + 1].lo * terms[k + 1].stride : 0);
    max_rest[k] = max_rest[k + 1] + (k + 1 < terms.size() ? terms[k + 1].hi * terms[k + 1].stride : 0);
  }
  const std::int64_t delta = static_cast<const char*>(b.data) - static_cast<const char*>(a.data);
  if (delta < min_rest[0] + (terms.empty() ? 0 : terms[0].lo * terms[0].stride) ||
      delta > max_rest[0] + (terms.empty() ? 0 : terms[0].hi * terms[0].stride))
    return false;  // the byte spans are disjoint
  int budget = 1 << 14;
  return solvable(terms, min_rest, max_rest, 0, delta, budget);
}

bool view_self_overlaps(const TensorView& t) {
  if (t.numel() == 0) return false;  // no elements, no two of them at one address
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // |stride|, size
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) dims.emplace_back(std::abs(t.stride[d]), t.shape[d]);
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 1;  // elements spanned by the dims so far
  for (const auto& [stride, n] : dims) {
    if (stride < extent) return true;
    extent += (n - 1) * stride;
  }
  return false;
}

}  // namespace tileattn
