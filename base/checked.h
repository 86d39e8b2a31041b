// Sizes (element counts, bytes, offsets) multiplied or added with a check, in one place: a result
// that does not fit its type is a SizeOverflowError naming the quantity, never a value wrapped
// modulo 2^64 (a scan total smaller than one of its modules) or undefined behaviour.
// Torch-free, header-only.
//
//   uint64_t bytes = checked_mul(numel, item_size, "bytes of tensor \"w\"");
//   std::optional<uint64_t> n = mul_or_none(a, b);  // for callers that raise their own error kind
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace metaload {

// SizeOverflowError: base/error.h.

// The largest value of T in words a user reads: "2^63-1", "2^64-1", "2^31-1".
template <typename T>
std::string max_in_words() {
  static_assert(std::is_integral_v<T>);
  const int bits = std::numeric_limits<T>::digits;  // 63 for int64_t, 64 for uint64_t
  return "2^" + std::to_string(bits) + "-1";
}

template <typename T>
std::optional<T> mul_or_none(T a, T b) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

template <typename T>
std::optional<T> add_or_none(T a, T b) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b; SizeOverflowError "<what>: a x b overflows (more than 2^64-1)" when it does not fit.
template <typename T>
T checked_mul(T a, T b, std::string_view what) {
  if (auto r = mul_or_none(a, b)) return *r;
  throw SizeOverflowError(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                          " overflows (more than " + max_in_words<T>() + ")");
}

// a + b; SizeOverflowError "<what>: a + b overflows (more than 2^64-1)" when it does not fit.
template <typename T>
T checked_add(T a, T b, std::string_view what) {
  if (auto r = add_or_none(a, b)) return *r;
  throw SizeOverflowError(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                          " overflows (more than " + max_in_words<T>() + ")");
}

// The product of `dims` (a shape) times `factor`, or nullopt when a dim is negative or the product
// does not fit in T.
template <typename T = uint64_t>
std::optional<T> product_or_none(const std::vector<int64_t>& dims, T factor = 1) {
  T n = factor;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto next = mul_or_none<T>(n, static_cast<T>(d));
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

// The product of `dims` times `factor` (elements x element size: bytes); SizeOverflowError
// "<what>: [d0, d1, ...] x factor overflows (more than 2^64-1)" when it does not fit.
template <typename T = uint64_t>
T checked_product(const std::vector<int64_t>& dims, T factor, std::string_view what) {
  if (auto n = product_or_none<T>(dims, factor)) return *n;
  std::string shape = "[";
  for (size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
  shape += "]";
  for (int64_t d : dims) {
    if (d < 0)
      throw SizeOverflowError(std::string(what) + ": shape " + shape + " has a negative size");
  }
  throw SizeOverflowError(std::string(what) + ": " + shape + " x " + std::to_string(factor) +
                          " overflows (more than " + max_in_words<T>() + ")");
}

}  // namespace metaload
