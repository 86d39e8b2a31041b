// Values of small meta tensors computed from constants, tracked inside MetaMode.
//
// Some constructors compute a few numbers with torch and read them back: torchvision's RegNets
// derive their stage widths with arange / round / log and tolist(); vision transformers take their
// drop rates from `torch.linspace(0, rate, depth)` and item(). Under MetaMode those tensors land on
// meta like every other, and the read would fail. So a tensor made from values (arange, range,
// linspace, logspace, scalar_tensor, torch.tensor / as_tensor) with at most kMaxValueElements
// elements keeps its values in host memory behind its meta storage: the tensor stays on meta
// (device, dispatch, printing), but its storage's data pointer is real. Every op whose meta inputs
// all carry values computes the values of its small outputs on CPU too; views share the storage and
// so its values; an in-place op writes into them. Reads (item, bool, tolist -- which converts
// through to(cpu) and then reads the data pointer) return them. Weights (empty, zeros, randn,
// module parameters) never get values, and an op that mixes a tensor with values and a meta tensor
// without drops what it cannot know (also the values of an input it writes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace metaload {

constexpr int64_t kMaxValueElements = 4096;  // enough for every constructor-time table seen

// Whether `t` is a meta tensor whose storage holds its values (covering every element it views).
bool has_values(const at::Tensor& t);

// A CPU tensor aliasing the values of `t` (same sizes, strides and offset); `has_values(t)`.
at::Tensor values_alias(const at::Tensor& t);

// Gives the fresh meta tensor `meta` values: a host buffer behind its storage, filled from the CPU
// tensor `values` (same shape). Returns false, and leaves `meta` as it was, when `meta` is not a
// small meta tensor or the shapes differ.
bool attach_values(const at::Tensor& meta, const at::Tensor& values);

// Drops the values of `t`'s storage (it was written by something whose values are unknown).
void forget_values(const at::Tensor& t);

}  // namespace metaload
