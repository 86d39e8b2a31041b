// The AVX2 + F16C CPU dequantization kernels (dequant_avx2.cc, the one translation unit compiled
// with -mavx2 -mf16c), chosen at run time by dequant.cc where the CPU has both. Internal to
// kernels/. Every kernel writes the bits the portable kernels in dequant.cc write (the same
// dequant_bits.h formulas: a multiply and an add still round twice, there is no -mfma).
#pragma once

#include <cstdint>

#include "kernels/dequant_bits.h"

namespace metaload {
namespace dq_avx2 {

using RowsFn = void (*)(const QuantView&, const DequantDst&, int64_t, int64_t);

// True when this CPU runs AVX2 and F16C (asked once with __builtin_cpu_supports).
bool cpu_supported();

// The AVX2 kernel for rows [r0, r1) of the window of `v` (g_idx already checked), or nullptr
// where there is none (the scheme or bit width has no vector kernel; the caller then runs the
// portable one). Does not look at the CPU: callers ask cpu_supported() first.
RowsFn pick(const QuantView& v, const DequantDst& d);

// Tests: the output-format conversion alone (n floats -> format `fmt` at `out`), against
// convert_bits.h's scalar rounding.
void flush_for_test(int fmt, void* out, const float* in, int64_t n);

}  // namespace dq_avx2
}  // namespace metaload
