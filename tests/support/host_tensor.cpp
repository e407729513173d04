#include "support/host_tensor.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/half.hpp"

namespace tileattn::test {

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, std::vector<int> order)
    : dtype_(dtype), shape_(std::move(shape)) {
  const int nd = static_cast<int>(shape_.size());
  if (order.empty()) {
    order.resize(nd);
    std::iota(order.begin(), order.end(), 0);
  }
  stride_.assign(nd, 0);
  std::int64_t s = 1;
  for (int k = nd - 1; k >= 0; --k) {
    stride_[order[k]] = s;
    s *= shape_[order[k]];
  }
  numel_ = s;
  bytes_.assign(static_cast<std::size_t>(numel_ * dtype_size(dtype_)) + 64, 0);
  shift_ = (64 - reinterpret_cast<std::uintptr_t>(bytes_.data()) % 64) % 64;
}

TensorView HostTensor::view() const {
  TensorView t;
  t.data = const_cast<unsigned char*>(bytes_.data()) + shift_;
  t.dtype = dtype_;
  t.ndim = static_cast<int>(shape_.size());
  for (int d = 0; d < t.ndim; ++d) {
    t.shape[d] = shape_[d];
    t.stride[d] = stride_[d];
  }
  return t;
}

std::int64_t HostTensor::offset(std::int64_t i) const {
  std::int64_t off = 0;
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    off += (i % shape_[d]) * stride_[d];
    i /= shape_[d];
  }
  return off;
}

double HostTensor::get(std::int64_t i) const {
  const unsigned char* p = bytes_.data() + shift_ + offset(i) * dtype_size(dtype_);
  std::uint16_t h;
  switch (dtype_) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::i32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f16: std::memcpy(&h, p, 2); return f16_to_f32(h);
    case DType::bf16: std::memcpy(&h, p, 2); return bf16_to_f32(h);
    case DType::u8: return *p;
  }
  return 0;
}

void HostTensor::set(std::int64_t i, double v) {
  unsigned char* p = bytes_.data() + shift_ + offset(i) * dtype_size(dtype_);
  std::uint16_t h;
  switch (dtype_) {
    case DType::f32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::i32: {
      std::int32_t x = static_cast<std::int32_t>(v);
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::f16: h = f32_to_f16(static_cast<float>(v)); break;
    case DType::bf16: h = f32_to_bf16(static_cast<float>(v)); break;
    case DType::u8: *p = static_cast<unsigned char>(v); return;
  }
  std::memcpy(p, &h, 2);
}

std::vector<double> HostTensor::to_f64() const {
  std::vector<double> v(numel_);
  for (std::int64_t i = 0; i < numel_; ++i) v[i] = get(i);
  return v;
}

void HostTensor::from_f64(const std::vector<double>& v) {
  for (std::int64_t i = 0; i < numel_; ++i) set(i, v[i]);
}

void HostTensor::fill_normal(std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> n(0.0, stddev);
  for (std::int64_t i = 0; i < numel_; ++i) set(i, n(rng));
}

void HostTensor::fill(double v) {
  for (std::int64_t i = 0; i < numel_; ++i) set(i, v);
}

void HostTensor::poison() {
  fill(dtype_ == DType::i32 ? -0x7ffffff : dtype_ == DType::u8 ? 0xa5 : std::numeric_limits<double>::quiet_NaN());
}

HostTensor int_tensor(const std::vector<std::int32_t>& values) {
  HostTensor t(DType::i32, {static_cast<std::int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
  return t;
}

double round_to(DType t, double v) {
  switch (t) {
    case DType::f16: return f16_to_f32(f32_to_f16(static_cast<float>(v)));
    case DType::bf16: return bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
    case DType::f32: return static_cast<float>(v);
    case DType::i32: return static_cast<std::int32_t>(v);
    case DType::u8: return static_cast<unsigned char>(v);
  }
  return v;
}

double ulp_at_max(DType t, const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  if (m == 0) return 0;
  const int bits = t == DType::f16 ? 10 : t == DType::bf16 ? 7 : t == DType::f32 ? 23 : 52;
  return std::ldexp(1.0, std::ilogb(m) - bits);
}

double rel_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(ref[i])) {
      if (!std::isfinite(x[i])) return std::numeric_limits<double>::infinity();
      num += (x[i] - ref[i]) * (x[i] - ref[i]);
      den += ref[i] * ref[i];
    } else if (x[i] != ref[i]) {  // both must be the same infinity (masked LSE = -inf)
      return std::numeric_limits<double>::infinity();
    }
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double max_abs_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(ref[i])) {
      if (x[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(x[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::abs(x[i] - ref[i]));
  }
  return m;
}

bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

RuleResult check_rule(const std::vector<double>& x, const std::vector<double>& baseline,
                      const std::vector<double>& oracle, double floor) {
  const double e = max_abs_error(x, oracle), eb = max_abs_error(baseline, oracle);
  const double bound = 2.0 * eb + floor;
  std::ostringstream os;
  os << "max abs error " << e << " vs bound " << bound << " (2 x baseline " << eb << " + floor "
     << floor << "), rel l2 " << rel_error(x, oracle);
  return {e <= bound, os.str()};
}

std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace tileattn::test
