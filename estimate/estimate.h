// estimate: the exact bytes a real quantization of an unquantized checkpoint (or of a config
// alone) would store, following each library's defaults for what it leaves alone (embeddings,
// lm_head, norms, biases; GPTQ and AWQ quantize the repeated blocks' linear layers only) and its
// group / block sizes (loader/format/quant_layout.h has the layouts). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/format/writer.h"
#include "identity/reference.h"
#include "loader/format/quant_layout.h"

namespace metaload {

struct QuantEstimate {
  std::string scheme;                  // the preset name, or "custom" for a quantization_config
  std::string table_name;              // the old per-dtype table's name for it ("nf4", "int4", ...)
  QuantLayout layout;                  // the modules that would be quantized, with their bytes
  uint64_t size_bytes = 0;             // every byte the quantized checkpoint would store
  uint64_t n_params = 0;               // logical parameters (unchanged by quantization)
  uint64_t unquantized_bytes = 0;      // tensors stored as they are
  uint64_t source_bytes = 0;           // the unquantized checkpoint's parameter bytes
  uint64_t table_bytes = 0;            // n_params x the old table's bytes per element
  std::optional<int64_t> max_tp_size;  // from the config, on quantization boundaries
  std::optional<int64_t> max_tp_size_unquantized;
  std::string tp_limited_by;
  std::string source;  // "checkpoint" (headers) or "config" (shapes from config.json)
};

// The estimate for parameter tensors (non-parameter buffers already left out) with their stored
// dtypes. `model_config` (config.json, may be null) gives the TP degree and GPT-2's Conv1D
// orientation. Throws QuantSchemeError(file, tensor, "not-quantizable") for a layer the library
// would refuse (AWQ / compressed-tensors group sizes that do not divide the input dim, GPTQ
// packs that do not fit, ...).
QuantEstimate estimate_tensors(const std::vector<TensorSpec>& tensors,
                               const nlohmann::json& model_config, const QuantConfig& config,
                               const std::string& file);

// estimate(ref, scheme): `ref` is a checkpoint reference or model key (resolve_reference), or a
// config.json file (or a directory holding config.json and no weights; shapes then come from
// checkpoint_tensor_specs and the dtype from torch_dtype). `scheme` is a preset name
// (quant_presets()) or a quantization_config JSON object. Reads headers and config.json only.
QuantEstimate estimate_quantized(const std::string& ref, const std::string& scheme,
                                 const std::optional<std::string>& revision = std::nullopt,
                                 const KeyOptions& keys = {});

nlohmann::json to_json(const QuantEstimate& e);

}  // namespace metaload
