#include "kernels/convert.h"

#include <cstring>

#include "kernels/convert_bits.h"

namespace metaload {

#ifdef METALOAD_WITH_CUDA
namespace cuda_detail {
// convert.cu; returns nullptr or the CUDA error string.
const char* convert_2d(const void* src, size_t src_pitch, int from, void* dst, size_t dst_pitch,
                       int to, size_t rows, size_t cols, void* stream);
}  // namespace cuda_detail
#endif

const char* float_format_name(FloatFormat f) {
  switch (f) {
    case FloatFormat::kF32:
      return "F32";
    case FloatFormat::kF16:
      return "F16";
    case FloatFormat::kBF16:
      return "BF16";
  }
  return "?";
}

bool parse_float_format(const std::string& name, FloatFormat* out) {
  if (name == "F32") {
    *out = FloatFormat::kF32;
  } else if (name == "F16") {
    *out = FloatFormat::kF16;
  } else if (name == "BF16") {
    *out = FloatFormat::kBF16;
  } else {
    return false;
  }
  return true;
}

namespace {

// Each loop is branch-free per element so the compiler vectorizes it; on x86-64 an AVX2 clone is
// picked at load time (ifunc) when the CPU has it, since the default build targets plain SSE2.
#if defined(__x86_64__) && !defined(__clang_analyzer__)
#define METALOAD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define METALOAD_CLONES
#endif

// memcpy keeps the loads and stores free of alignment and aliasing assumptions; compilers turn it
// into plain moves.
template <class T>
inline T load(const unsigned char* p, size_t i) {
  T v;
  memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
inline void store(unsigned char* p, size_t i, T v) {
  memcpy(p + i * sizeof(T), &v, sizeof(T));
}

METALOAD_CLONES void f32_to_bf16_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) store<uint16_t>(d, i, bits::f32_to_bf16(load<uint32_t>(s, i)));
}
METALOAD_CLONES void f32_to_f16_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) store<uint16_t>(d, i, bits::f32_to_f16(load<uint32_t>(s, i)));
}
METALOAD_CLONES void bf16_to_f32_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) store<uint32_t>(d, i, bits::bf16_to_f32(load<uint16_t>(s, i)));
}
METALOAD_CLONES void f16_to_f32_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) store<uint32_t>(d, i, bits::f16_to_f32(load<uint16_t>(s, i)));
}
METALOAD_CLONES void bf16_to_f16_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    store<uint16_t>(d, i, bits::f32_to_f16(bits::bf16_to_f32(load<uint16_t>(s, i))));
  }
}
METALOAD_CLONES void f16_to_bf16_loop(const unsigned char* s, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    store<uint16_t>(d, i, bits::f32_to_bf16_scalar(bits::f16_to_f32(load<uint16_t>(s, i))));
  }
}

using Loop = void (*)(const unsigned char*, unsigned char*, size_t);

Loop loop_for(FloatFormat from, FloatFormat to) {
  using F = FloatFormat;
  if (from == F::kF32 && to == F::kBF16) return f32_to_bf16_loop;
  if (from == F::kF32 && to == F::kF16) return f32_to_f16_loop;
  if (from == F::kBF16 && to == F::kF32) return bf16_to_f32_loop;
  if (from == F::kF16 && to == F::kF32) return f16_to_f32_loop;
  if (from == F::kBF16 && to == F::kF16) return bf16_to_f16_loop;
  if (from == F::kF16 && to == F::kBF16) return f16_to_bf16_loop;
  throw ConversionError(std::string("no conversion from ") + float_format_name(from) + " to " +
                        float_format_name(to));
}

}  // namespace

void convert_cpu(const void* src, FloatFormat from, void* dst, FloatFormat to, size_t n) {
  if (from == to) {
    memcpy(dst, src, n * float_format_size(from));
    return;
  }
  loop_for(from, to)(static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst), n);
}

void convert_cpu_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst,
                    size_t dst_pitch, FloatFormat to, size_t rows, size_t cols) {
  auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  if (from == to) {
    const size_t width = cols * float_format_size(from);
    for (size_t r = 0; r < rows; ++r) memcpy(d + r * dst_pitch, s + r * src_pitch, width);
    return;
  }
  const Loop loop = loop_for(from, to);
  for (size_t r = 0; r < rows; ++r) loop(s + r * src_pitch, d + r * dst_pitch, cols);
}

bool convert_cuda_compiled() {
#ifdef METALOAD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void convert_cuda_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst,
                     size_t dst_pitch, FloatFormat to, size_t rows, size_t cols, void* stream) {
#ifdef METALOAD_WITH_CUDA
  const char* err = cuda_detail::convert_2d(src, src_pitch, static_cast<int>(from), dst, dst_pitch,
                                            static_cast<int>(to), rows, cols, stream);
  if (err != nullptr) {
    throw ConversionError(std::string("CUDA conversion ") + float_format_name(from) + " -> " +
                          float_format_name(to) + " of " + std::to_string(rows) + "x" +
                          std::to_string(cols) + " elements failed: " + err);
  }
#else
  (void)src, (void)src_pitch, (void)dst, (void)dst_pitch, (void)rows, (void)cols, (void)stream;
  throw ConversionError(std::string("CUDA conversion ") + float_format_name(from) + " -> " +
                        float_format_name(to) +
                        " requested, but this build has no CUDA kernels (nvcc was not found)");
#endif
}

}  // namespace metaload
