// Every difference between the libtorch versions metaload builds against (Debian's 1.13 here,
// pip's 2.x elsewhere) lives here, behind TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR checks.
#pragma once

#include <torch/version.h>

#define METALOAD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ---- c10::Allocator ------------------------------------------------------------------------------
// 2.x made allocate() non-const and added a pure copy_data(). An allocator written as
//   struct A final : c10::Allocator { c10::DataPtr allocate(size_t n) METALOAD_ALLOCATE_CONST override;
//                                     METALOAD_ALLOCATOR_COPY_DATA ... };
// compiles on both.
#if METALOAD_TORCH_AT_LEAST(2, 0)
#define METALOAD_ALLOCATE_CONST
#define METALOAD_ALLOCATOR_COPY_DATA                                              \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                          \
  }
#else
#define METALOAD_ALLOCATE_CONST const
#define METALOAD_ALLOCATOR_COPY_DATA
#endif

// ---- CPU kernels that changed after 1.13 (kernels/meta_reductions.cc, kernels/meta_linalg.cc) -
// The Meta kernels follow the CPU kernel of the libtorch they run on. Each entry names a
// difference seen between Debian's 1.13 and PyPI's 2.11 (the 2.x release that made it is not
// pinned).

// rrelu_with_noise's `noise` became a mutable argument (Tensor(b!)): its C++ type in a kernel.
#if METALOAD_TORCH_AT_LEAST(2, 0)
#define METALOAD_RRELU_NOISE_ARG at::Tensor&
#else
#define METALOAD_RRELU_NOISE_ARG const at::Tensor&
#endif

namespace metaload::compat {
// rrelu_with_noise rejects a noise tensor whose shape is not self's.
inline constexpr bool kRreluChecksNoiseShape = METALOAD_TORCH_AT_LEAST(2, 0);
// multi_margin_loss rejects a weight that does not hold one entry per class.
inline constexpr bool kMultiMarginLossChecksWeight = METALOAD_TORCH_AT_LEAST(2, 0);
// segment_reduce accepts "amax" and "amin" as reductions.
inline constexpr bool kSegmentReduceTakesAmaxAmin = METALOAD_TORCH_AT_LEAST(2, 0);
// segment_reduce accepts data with no elements.
inline constexpr bool kSegmentReduceTakesEmptyData = METALOAD_TORCH_AT_LEAST(2, 0);
// ormqr requires one reflector per column it can apply:
// tau.shape[-1] == min(other.shape[side], input.shape[-1]).
inline constexpr bool kOrmqrChecksTauLength = METALOAD_TORCH_AT_LEAST(2, 0);
// linalg_matrix_exp of matrices larger than 1x1 returns a contiguous tensor (1.13: empty_like of
// its (-1, n, n) view).
inline constexpr bool kMatrixExpIsContiguous = METALOAD_TORCH_AT_LEAST(2, 0);
}  // namespace metaload::compat
