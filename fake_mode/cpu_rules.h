// What a real CPU kernel refuses or accepts that the op's Meta kernel judges otherwise, for ops
// computed on fake cpu tensors. A Meta kernel names no device: torch's and metaload's follow the
// CUDA kernel where the two differ (histc counts integers, _grouped_mm takes bfloat16 only), so
// FakeMode's fallback asks here first when the result is on cpu. Python's fake() checks nothing of
// its own for these ops: this is their one owner, with or without its TorchFunctionMode.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace metaload {

// Which rule an operator has here, from its schema (once per operator, FakeMode's OpInfo).
enum class CpuRule : int8_t { kNone, kHistc, kGroupedMm };
CpuRule cpu_rule_for(const c10::FunctionSchema& schema);

// Applies `rule` to the op's arguments (the last n_args of `stack`), whose result is on cpu.
// Throws ShapeError where the CPU kernel would refuse them; returns true when it replaced the
// arguments by the result (a fake cpu tensor), false when the Meta kernel answers as the CPU
// kernel would.
bool apply_cpu_rule(CpuRule rule, torch::jit::Stack* stack, size_t n_args);

}  // namespace metaload
