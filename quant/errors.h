// Every error kind of quantized checkpoints, in one place. Torch-free, header-only. One family:
//   FormatError
//     QuantLayoutError      a checkpoint whose tensors contradict its quantization_config or each
//                           other (describe, estimate, and every parse of a layout)
//       QuantSchemeError    a scheme metaload does not know or cannot size
//       DequantError        whatever a dequantizing load rejects: the layout errors above met
//                           during a load, and the load's own rules (tp-boundary, g_idx-range,
//                           unsupported-scheme: a layout with no kernels)
// All carry the file, the tensor (may be empty) and a stable rule identifier, and read
// "<file>: tensor '<name>': <detail> (rule <rule>)". python/metaload/_lib.py mirrors them.
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

 protected:
  QuantLayoutError(const char* kind, const std::string& file, const std::string& tensor,
                   const std::string& rule, const std::string& detail)
      : FormatError(kind, file, tensor, rule, detail) {}
};

// A quantization scheme metaload does not know or cannot size: an unknown quant_method or
// format in config.json, a field of the wrong type or value, an unknown preset name given to
// estimate (file() is then "estimate").
class QuantSchemeError : public QuantLayoutError {
 public:
  QuantSchemeError(const std::string& file, const std::string& tensor, const std::string& rule,
                   const std::string& detail)
      : QuantLayoutError("QuantSchemeError", file, tensor, rule, detail) {}
};

// A quantized checkpoint that a dequantizing load (loader/load/dequant_load.h) cannot dequantize:
// every QuantLayoutError / QuantSchemeError its layout raises (same file, tensor, rule and
// detail), a scheme variant without kernels ("unsupported-scheme"), data out of range
// ("g_idx-range"), a tensor-parallel degree that would split a pack or a group ("tp-boundary").
class DequantError : public QuantLayoutError {
 public:
  DequantError(const std::string& file, const std::string& tensor, const std::string& rule,
               const std::string& detail)
      : QuantLayoutError("DequantError", file, tensor, rule, detail) {}
  // The same rejection, raised by a load.
  explicit DequantError(const FormatError& e)
      : DequantError(e.file(), e.tensor(), e.rule(), e.detail()) {}
};

}  // namespace metaload
