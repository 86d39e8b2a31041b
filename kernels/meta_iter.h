// Internal to kernels/: a TensorIterator whose outputs are created (or resized, for out= tensors)
// on meta without the dispatcher, as the generated structured Meta kernels do. Pointwise parts of
// the kernels run ATen's own iterator over meta operands, so broadcasting, type checks and the
// output's stride order are exactly the CPU kernel's.
#pragma once

#include <ATen/TensorIterator.h>

#include <utility>
#include <vector>

#include "kernels/meta_common.h"

namespace metaload::meta {

class MetaIter final : public at::TensorIteratorBase {
 public:
  // Up to two outputs, all allocated by the iterator.
  MetaIter() : outs_(2) {}
  // One output: `out` (an out= tensor, resized as needed) or, undefined, allocated.
  explicit MetaIter(const Tensor& out) : outs_(2) { outs_[0] = out; }
  // `outs`: one entry per output, undefined where the iterator allocates it.
  explicit MetaIter(std::vector<Tensor> outs) : outs_(std::move(outs)) {}

  const Tensor& maybe_get_output(int64_t i) override { return outs_[i]; }

  // No strides means "this memory format" (contiguous when none is given).
  void set_output_raw_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides,
                              at::TensorOptions options, at::DimnameList names) override {
    auto& out = outs_[i];
    const auto format = options.memory_format_opt().value_or(MemoryFormat::Contiguous);
    if (!out.defined()) {
      out = strides.empty() ? new_meta(sizes, options.dtype().toScalarType(), format)
                            : new_meta(sizes, strides, options.dtype().toScalarType());
    } else {
      resize_out(out, sizes, strides.empty() ? format_strides(sizes, format) : strides);
    }
    at::TensorIteratorBase::set_output_raw_strided(i, sizes, strides, options, names);
  }

  void set_output_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides,
                          at::TensorOptions options, at::DimnameList names) override {
    set_output_raw_strided(i, sizes, strides, options, names);
  }

  const Tensor& out(size_t i = 0) const { return outs_[i]; }

  // Runs `build` (a call of one of the build_* methods, or build(config)), turning its errors
  // (shapes that do not broadcast, an out= tensor of the wrong dtype, ...) into ShapeError
  // naming the op.
  template <typename F>
  void build_checked(const char* op, F&& build) {
    try {
      build();
    } catch (const c10::Error& e) {
      fail(op, e.what_without_backtrace());
    }
  }

 private:
  std::vector<Tensor> outs_;
};

}  // namespace metaload::meta
