#include "core/check_tensor.hpp"

#include <limits>

#include "core/checked.hpp"
#include "core/fail.hpp"

namespace tileattn {
namespace {

const char* device_str(const Device& d) { return d.type == DeviceType::cpu ? "cpu" : "cuda"; }

}  // namespace

void check_dtype(const char* fn, const char* name, const TensorView& t, DType want) {
  if (t.dtype != want)
    fail(fn, name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(want));
}

void check_same_device(const char* fn, const char* name, const TensorView& t, const Device& dev,
                       const char* ref_name) {
  if (t.device.type != dev.type || (dev.type == DeviceType::cuda && t.device.index != dev.index))
    fail(fn, name, " is on ", device_str(t.device), ":", t.device.index, " but ", ref_name, " is on ",
         device_str(dev), ":", dev.index);
}

void check_tensor(const char* fn, const char* name, const TensorView& t, int ndim, bool any_strides) {
  if (!t.present()) fail(fn, name, " is required but absent");
  if (t.ndim < 1 || t.ndim > kMaxDims) fail(fn, name, " has rank ", t.ndim, ", outside [1, ", kMaxDims, "]");
  if (t.ndim != ndim)
    fail(fn, name, " must have ", ndim, " dimensions, got ", t.ndim, " (shape ", shape_str(t), ")");
  if (static_cast<unsigned>(t.dtype) > static_cast<unsigned>(DType::u8))
    fail(fn, name, ".dtype = ", static_cast<unsigned>(t.dtype), " is not a tileattn::DType");
  if (static_cast<unsigned>(t.device.type) > static_cast<unsigned>(DeviceType::cuda))
    fail(fn, name, ".device.type = ", static_cast<unsigned>(t.device.type), " is not a tileattn::DeviceType");
  if (t.device.index < 0) fail(fn, name, ".device.index = ", t.device.index, " is negative");
  for (int d = 0; d < ndim; ++d)
    if (t.shape[d] < 0) fail(fn, name, ".shape[", d, "] = ", t.shape[d], " is negative");
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    const auto m = checked_mul(n, t.shape[d]);
    if (!m) fail(fn, name, " with shape ", shape_str(t), " has more elements than fit in int64");
    n = *m;
  }
  if (n > 0 && t.data == nullptr) fail(fn, name, " has ", n, " elements but a null data pointer");
  if (!any_strides && t.shape[ndim - 1] > 1 && t.stride[ndim - 1] != 1)
    fail(fn, name, ".stride[", ndim - 1, "] = ", t.stride[ndim - 1], ", the last dimension must be contiguous (stride 1)");
  if (n == 0) return;
  // Bytes below and above the data pointer that the view reaches.
  std::int64_t below = 0, above = static_cast<std::int64_t>(dtype_size(t.dtype));
  bool ok = true;
  for (int d = 0; d < ndim && ok; ++d) {
    if (t.shape[d] <= 1 || t.stride[d] == 0) continue;
    const auto step = checked_mul(t.stride[d], static_cast<std::int64_t>(dtype_size(t.dtype)));
    auto span = step ? checked_mul(t.shape[d] - 1, *step) : std::nullopt;
    if (span && *span == std::numeric_limits<std::int64_t>::min()) span.reset();  // no magnitude in int64
    const auto sum = span ? checked_add(*span > 0 ? above : below, *span > 0 ? *span : -*span) : std::nullopt;
    ok = sum && *sum <= kMaxExtentBytes;
    if (ok) (*span > 0 ? above : below) = *sum;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  if (!ok || addr < static_cast<std::uintptr_t>(below) ||
      addr - static_cast<std::uintptr_t>(below) > static_cast<std::uintptr_t>(kMaxExtentBytes - above))
    fail(fn, name, " with shape ", shape_str(t), " and strides ", dims_str(t, t.stride), " from ", t.data,
         " reaches outside the 2^57-byte address space");
}

}  // namespace tileattn
