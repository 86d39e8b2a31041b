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
