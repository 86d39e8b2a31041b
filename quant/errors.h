// Every error kind of the quantization layer (quant/), in one place. Torch-free, header-only.
// Both are FormatErrors: they carry the file, the tensor (may be empty) and a stable rule
// identifier, and read "<file>: tensor '<name>': <detail> (rule <rule>)". python/metaload/_lib.py
// mirrors them.
#pragma once

#include <string>

#include "loader/errors.h"

namespace metaload {

// A quantized checkpoint whose tensors contradict its quantization_config or each other: a
// packed shape that does not match the logical shape, scales / zero points / absmax of the wrong
// shape or dtype, a missing companion tensor, a malformed bitsandbytes quant_state blob, a tensor
// of another scheme. file() is the safetensors file (config.json for config-wide rules).
class QuantLayoutError : public FormatError {
 public:
  QuantLayoutError(const std::string& file, const std::string& tensor, const std::string& rule,
                   const std::string& detail)
      : FormatError("QuantLayoutError", file, tensor, rule, detail) {}
};

// A quantization scheme metaload does not know or cannot size: an unknown quant_method or
// format in config.json, a field of the wrong type or value, an unknown preset name given to
// estimate (file() is then "estimate").
class QuantSchemeError : public FormatError {
 public:
  QuantSchemeError(const std::string& file, const std::string& tensor, const std::string& rule,
                   const std::string& detail)
      : FormatError("QuantSchemeError", file, tensor, rule, detail) {}
};

}  // namespace metaload
