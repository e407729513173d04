// Host tensors for tests and tools: storage in the tensor's dtype, logical values as doubles.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tileattn/tensor.hpp"

namespace tileattn::test {

class HostTensor {
 public:
  HostTensor() = default;
  // storage_order: the logical dims from outermost to innermost in memory (a permutation ending
  // with the last dim); empty = row-major. {0, 2, 1, 3} stores a [b, s, h, d] tensor as BHSD.
  HostTensor(DType dtype, std::vector<std::int64_t> shape, std::vector<int> storage_order = {});

  TensorView view() const;
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  void* data() { return bytes_.data() + shift_; }

  // Logical row-major index <-> value; set rounds to the dtype.
  double get(std::int64_t i) const;
  void set(std::int64_t i, double v);
  std::vector<double> to_f64() const;
  void from_f64(const std::vector<double>& v);

  void fill_normal(std::mt19937_64& rng, double stddev = 1.0);
  void fill(double v);
  void poison();  // NaN everywhere (i32: a large negative value, u8: 0xa5)

 private:
  std::int64_t offset(std::int64_t logical) const;

  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_, stride_;
  std::int64_t numel_ = 0;
  std::vector<unsigned char> bytes_;
  std::size_t shift_ = 0;  // to the first 64-byte boundary, where PyTorch's allocator puts tensors
};

HostTensor int_tensor(const std::vector<std::int32_t>& values);

// Rounds each value to the dtype and back.
double round_to(DType t, double v);
// One unit in the last place of dtype t at the largest finite magnitude in v.
double ulp_at_max(DType t, const std::vector<double>& v);

// ||x - ref|| / max(||ref||, tiny); infinity if x has a NaN or Inf where ref is finite.
double rel_error(const std::vector<double>& x, const std::vector<double>& ref);
double max_abs_error(const std::vector<double>& x, const std::vector<double>& ref);
bool all_finite(const std::vector<double>& x);

// The DESIGN.md rule: x passes when its error against the oracle is at most 2x the error of a
// same-precision standard implementation (baseline) against the oracle, plus an absolute floor.
struct RuleResult {
  bool ok;
  std::string message;
};
RuleResult check_rule(const std::vector<double>& x, const std::vector<double>& baseline,
                      const std::vector<double>& oracle, double floor);

// A seed from the OS, so every run draws fresh inputs; tests print it on failure.
std::uint64_t fresh_seed();

}  // namespace tileattn::test
