// Every error kind of the loader, in one place: the format layer's (FormatError, ShardError,
// ResolveError), the engines' (LoadError and its subclasses) and the planner's (MismatchError).
// Torch-free. Each derives from metaload::Error (base/error.h); python/metaload/_lib.py mirrors
// the tree class for class.
//
// FormatError and its subclass ShardError carry the file, the tensor (may be empty) and a short
// stable rule identifier ("size-mismatch", "missing-shard", ...) so tests and callers can tell
// rejections apart without parsing messages. The message reads
//   "<file>: tensor '<name>': <detail> (rule <rule>)".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/text.h"

namespace metaload {

// A malformed safetensors file or index, or a header that contradicts itself or the file. file(),
// tensor() (may be empty), rule() and detail() are in the error's record too (base/error.h).
class FormatError : public Error {
 public:
  FormatError(const std::string& file, const std::string& tensor, const std::string& rule,
              const std::string& detail)
      : FormatError("FormatError", file, tensor, rule, detail) {}

  const std::string& file() const noexcept { return file_; }
  const std::string& tensor() const noexcept { return tensor_; }
  const std::string& rule() const noexcept { return rule_; }
  // The message's detail alone (without file, tensor and rule).
  const std::string& detail() const noexcept { return detail_; }

 protected:
  FormatError(const char* kind, const std::string& file, const std::string& tensor,
              const std::string& rule, const std::string& detail)
      : Error(kind, compose(file, tensor, rule, detail)),
        file_(file),
        tensor_(tensor),
        rule_(rule),
        detail_(detail) {
    record_field("file", file);
    record_field("tensor", tensor);
    record_field("rule", rule);
    record_field("detail", detail);
  }

 private:
  static std::string compose(const std::string& file, const std::string& tensor,
                             const std::string& rule, const std::string& detail) {
    // File and tensor names come from users and from files: escaped and capped (base/text.h).
    std::string m = file.empty() ? std::string("<memory>") : escape_path(file);
    m += ": ";
    if (!tensor.empty()) m += "tensor " + quote_text(tensor, '\'') + ": ";
    m += detail + " (rule " + rule + ")";
    return m;
  }

  std::string file_, tensor_, rule_, detail_;
};

// A sharded checkpoint's index (model.safetensors.index.json) is wrong, or disagrees with its
// shards, or names a shard that is missing or lies outside the checkpoint directory.
class ShardError : public FormatError {
 public:
  ShardError(const std::string& file, const std::string& tensor, const std::string& rule,
             const std::string& detail)
      : FormatError("ShardError", file, tensor, rule, detail) {}
};

// A model reference (directory, file, HF repo id) could not be resolved; the message lists every
// place that was looked at.
METALOAD_DEFINE_ERROR(ResolveError, Error);

// ---- the engines (engine/) ----------------------------------------------------------------------

// Base of the engines' errors.
METALOAD_DEFINE_ERROR(LoadError, Error);
// A read failed, a file is shorter than its tensors need, or a file changed during the load.
METALOAD_DEFINE_ERROR(ReadError, LoadError);
// The load was cancelled through EngineOptions::cancel.
METALOAD_DEFINE_ERROR(LoadCancelled, LoadError);
// The CUDA runtime failed, or there is no CUDA device / no CUDA in this build.
METALOAD_DEFINE_ERROR(DeviceError, LoadError);
// A slot was not completely filled, or a check before the swap failed.
METALOAD_DEFINE_ERROR(VerifyError, LoadError);
// A job or an option is malformed (a bug in the caller, named precisely).
METALOAD_DEFINE_ERROR(PlanError, LoadError);
// A file mapped zero-copy was truncated or written in place while tensors map it: the weights
// may have changed under the model. The message names the file and what changed
// (engine/file_mapping.h).
METALOAD_DEFINE_ERROR(FileChangedError, ReadError);
// The rank's slice does not exist: the dim is out of range, or n does not divide it, or the rank
// is not in [0, n) (engine/tp.h).
METALOAD_DEFINE_ERROR(SliceError, LoadError);

// ---- loading into tensors (load/) ---------------------------------------------------------------

// A pair cannot be swapped (shape differs, the target is not a plain dense tensor, an integer
// dtype for a tensor that requires grad, one target given twice with different sources, ...)
// (load/swap.h).
METALOAD_DEFINE_ERROR(SwapError, LoadError);

// One problem of a MismatchError: the tensor's name as given (the module's name; the checkpoint's
// for an unexpected tensor) and the rest of its line, already escaped (" [2, 3]", " in a.st",
// ": shape [2] in the module but ...").
struct MismatchItem {
  std::string name;
  std::string detail;
};

// The checkpoint does not fit the targets (load/plan.h). The message is `summary`, then every
// missing, unexpected and mismatched tensor one per line ("  missing: <name> [2, 3]"), names
// escaped and at most kListMaxItems (base/text.h) of each kind, then "  ... and N more missing".
// The accessors hold every name in full; so does the error's record, and through it Python's
// MismatchError.
class MismatchError : public LoadError {
 public:
  MismatchError(const std::string& summary, std::vector<MismatchItem> missing,
                std::vector<MismatchItem> unexpected, std::vector<MismatchItem> mismatched);
  const std::vector<std::string>& missing() const { return missing_; }
  const std::vector<std::string>& unexpected() const { return unexpected_; }
  const std::vector<std::string>& mismatched() const { return mismatched_; }

 private:
  std::vector<std::string> missing_, unexpected_, mismatched_;
};

// {"missing": [...], "unexpected": [...], "mismatched": [...]} of a recent MismatchError whose
// message() is `message`, from its record (base/error.h: error_data_json), or nullopt.
std::optional<std::string> mismatch_names_json(const std::string& message);

// ---- quantized checkpoints (format/quant_layout.h, format/quant_scheme.h, load/dequant_load.h) ----
// One family:
//   FormatError
//     QuantLayoutError      a checkpoint whose tensors contradict its quantization_config or each
//                           other (describe, estimate, and every parse of a layout)
//       QuantSchemeError    a scheme metaload does not know or cannot size
//       DequantError        whatever a dequantizing load rejects: the layout errors above met
//                           during a load, and the load's own rules (tp-boundary, g_idx-range,
//                           unsupported-scheme: a layout with no kernels)
// All carry the file, the tensor (may be empty) and a stable rule identifier, and read
// "<file>: tensor '<name>': <detail> (rule <rule>)". python/metaload/_lib.py mirrors them.

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
