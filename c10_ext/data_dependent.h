// The ops whose output depends on tensor values (item, nonzero, unique, ...): on meta or fake
// tensors they raise DataDependentError naming the op (data_dependent.cc).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace metaload {

// Whether `name` is one of them (aten::item, aten::_local_scalar_dense, aten::nonzero, ...).
bool is_data_dependent_op(const c10::OperatorName& name);

// Throws DataDependentError for `op` called with `stack`, naming the op and its tensor arguments.
[[noreturn]] void raise_data_dependent(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace metaload
