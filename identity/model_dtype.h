// The torch ScalarType of a dtype a model runs in: the one mapping from the dtype table
// (identity/dtypes.h) to torch, used by TransformersModel's Python constructor and the CLI's --dtype.
#pragma once

#include <string_view>

#include <c10/core/ScalarType.h>

#include "identity/dtypes.h"

namespace metaload {

// One case per MODEL_DTYPES entry; DTypeError (from resolve_model_dtype) for any other name.
inline c10::ScalarType model_scalar_type(std::string_view name) {
  const std::string_view t = resolve_model_dtype(name).torch_name;
  if (t == "float32") return c10::kFloat;
  if (t == "float16") return c10::kHalf;
  if (t == "bfloat16") return c10::kBFloat16;
  if (t == "float64") return c10::kDouble;
  throw DTypeError("MODEL_DTYPES lists " + std::string(t) + " but model_scalar_type has no case");
}

}  // namespace metaload
