#include "core/overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>
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

// The bytes a view or a plain range covers: base + sum z_k * stride_k, z_k in [0, n_k). Validation
// has kept every view below address 2^57, so all sums below fit in int64.
struct Span {
  const char* base;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // stride in bytes, count
};

Span span_of(const TensorView& v) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(v.dtype));
  Span s{static_cast<const char*>(v.data), {}};
  for (int d = 0; d < v.ndim; ++d) s.dims.emplace_back(v.stride[d] * es, v.shape[d]);
  s.dims.emplace_back(1, es);
  return s;
}

// Adds the terms of a span. sign -1 for the span on the other side of the equation.
void add_terms(std::vector<Term>& terms, const Span& s, int sign) {
  for (const auto& [stride, n] : s.dims) {
    if (n <= 1 || stride == 0) continue;
    std::int64_t lo = 0, hi = n - 1;
    if ((stride < 0) != (sign < 0)) {
      lo = -(n - 1);
      hi = 0;
    }
    terms.push_back({std::abs(stride), lo, hi});
  }
}

bool spans_overlap(const Span& a, const Span& b) {
  // base_a + offset_a == base_b + offset_b  <=>  offset_a - offset_b == base_b - base_a. Bases more
  // than 2^63 bytes apart cannot meet (validated spans lie below 2^57).
  const auto ua = reinterpret_cast<std::uintptr_t>(a.base), ub = reinterpret_cast<std::uintptr_t>(b.base);
  const std::uintptr_t gap = ub >= ua ? ub - ua : ua - ub;
  if (gap > static_cast<std::uintptr_t>(INT64_MAX)) return false;
  const std::int64_t delta = ub >= ua ? static_cast<std::int64_t>(gap) : -static_cast<std::int64_t>(gap);
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
  if (delta < min_rest[0] + (terms.empty() ? 0 : terms[0].lo * terms[0].stride) ||
      delta > max_rest[0] + (terms.empty() ? 0 : terms[0].hi * terms[0].stride))
    return false;  // the byte spans are disjoint
  int budget = 1 << 14;
  return solvable(terms, min_rest, max_rest, 0, delta, budget);
}

// The first and one-past-last byte a view reaches, as addresses.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView& v) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(v.dtype));
  std::int64_t below = 0, above = es;
  for (int d = 0; d < v.ndim; ++d) {
    const std::int64_t span = (v.shape[d] - 1) * v.stride[d] * es;
    (span < 0 ? below : above) += span < 0 ? -span : span;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(v.data);
  return {base - static_cast<std::uintptr_t>(below), base + static_cast<std::uintptr_t>(above)};
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  if (a.device.type != b.device.type || a.device.index != b.device.index) return false;
  // Buffers apart from each other (the common case) need no more than their byte ranges.
  const auto ra = byte_range(a), rb = byte_range(b);
  if (ra.second <= rb.first || rb.second <= ra.first) return false;
  return spans_overlap(span_of(a), span_of(b));
}

bool range_overlaps(const void* data, std::size_t bytes, const TensorView& v) {
  if (bytes == 0 || v.numel() == 0) return false;
  return spans_overlap(Span{static_cast<const char*>(data), {{1, static_cast<std::int64_t>(bytes)}}}, span_of(v));
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
