// Reading operator schemas: shared by the MetaMode and FakeMode fallbacks.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/jit_type.h>

#include <unordered_map>

namespace metaload {

// Whether an argument's type is Device or Device? (so `device` arguments of other types, e.g. a
// str named `device` in some operator, are left alone).
inline bool is_device_type(const c10::Type& t) {
  if (t.kind() == c10::TypeKind::DeviceObjType) return true;
  if (t.kind() != c10::TypeKind::OptionalType) return false;
  return t.expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::DeviceObjType;
}

}  // namespace metaload

namespace metaload {

// metaload's own operators (torch.ops.metaload.*) run as they are inside every mode: their device
// arguments are instructions to metaload, not tensors to redirect.
inline bool is_own_op(const c10::FunctionSchema& schema) {
  return schema.name().rfind("metaload::", 0) == 0;
}

}  // namespace metaload

namespace metaload {

// What a fallback needs to know about an operator, computed once per operator and thread by
// `Classify` (one cache per thread: no lock on the hot path; schemas live as long as the process).
template <typename Info, Info (*Classify)(const c10::FunctionSchema&)>
const Info& cached_op_info(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, Info> cache;
  const c10::FunctionSchema* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, Classify(*key)).first;
  return it->second;
}

}  // namespace metaload
