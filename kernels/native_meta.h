// libtorch's own C++ shape kernels, callable directly for the ops whose Meta key torch's Python
// serves.
//
// torch 2.x registers Python Meta kernels (torch/_meta_registrations.py) over libtorch's C++ ones
// for ~630 aten ops (add, mm, _softmax, gelu, uniform_, ...; a dispatcher dump shows the C++ one
// as "Meta (inactive)"), and for ~500 more whose C++ Meta behaviour is their
// CompositeExplicitAutograd kernel. A Meta call then costs a trip through the interpreter (tens of
// µs; 90 µs for add), which is what made metaload's fake mode slow on 2.x. libtorch still exports
// the C++ kernels (at::meta::add, at::meta::mm, ...; at::compositeexplicitautograd::...).
//
// This table maps ops to those functions. It registers nothing: the dispatcher, torch's own
// FakeTensorMode and `torch.device("meta")` keep the Python kernels. metaload's fake fallback asks
// kernel_for() once per op and calls the C++ kernel instead of redispatching to Meta.
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <utility>
#include <vector>

namespace metaload {
namespace native_meta {

// The C++ kernel to run for `op` in place of its Meta kernel, or nullptr to redispatch to Meta.
// Non-null only when the table has the op, its C++ signature fits the op's schema, and the op's
// Meta key is served by a Python kernel standing over libtorch's C++ behaviour:
//  - an at::meta:: entry: the dispatcher holds libtorch's C++ Meta kernel, inactive;
//  - a composite entry: libtorch has no C++ Meta kernel for the op and runs its
//    CompositeExplicitAutograd kernel for Meta (the entry is that kernel, or one that computes the
//    same without dispatching).
// Everything else (C++ Meta kernels, metaload's own, another library's) keeps going through the
// dispatcher. Thread-safe; the pointer lives as long as the process.
const c10::KernelFunction* kernel_for(const c10::OperatorHandle& op);

// Every op of the table ("aten::add.Tensor"), sorted.
std::vector<std::string> table();

// The ops of the table that kernel_for() serves now, sorted.
std::vector<std::string> active();

// Ops of the table whose C++ signature does not fit this libtorch's schema, with the difference
// (never used; a test asserts there are none).
std::vector<std::pair<std::string, std::string>> unfit();

}  // namespace native_meta
}  // namespace metaload
