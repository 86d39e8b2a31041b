// Quantization schemes as config.json's "quantization_config" names them, parsed into one struct,
// and the presets `estimate` takes (each a quantization_config with the library's defaults).
// Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/format/safetensors.h"
#include "loader/errors.h"

namespace metaload {

enum class QuantKind {
  kBnb4,      // bitsandbytes NF4 / FP4 (Linear4bit): packed weight, absmax, quant_map, blob
  kBnb8,      // bitsandbytes LLM.int8 (Linear8bitLt): I8 weight, SCB
  kGptq,      // GPTQ: qweight packed along the input dim, qzeros, scales, g_idx
  kAwq,       // AWQ GEMM: qweight packed along the output dim, qzeros, scales
  kFp8Block,  // FP8 E4M3 weight with block scales weight_scale_inv (DeepSeek / transformers)
  kCtPacked,  // compressed-tensors pack-quantized int: weight_packed, weight_scale, weight_shape
  kCtNvfp4,   // compressed-tensors nvfp4-pack-quantized
};

// "bnb-4bit", "bnb-int8", "gptq", "awq", "fp8-block", "ct-pack-quantized", "ct-nvfp4".
const char* quant_kind_name(QuantKind k);

struct QuantConfig {
  QuantKind kind = QuantKind::kGptq;
  std::string method;  // quant_method as written ("bitsandbytes", "gptq", "compressed-tensors")
  int bits = 4;        // weight bits
  // Group of input elements sharing a scale (GPTQ, AWQ, compressed-tensors group strategy);
  // 0 = one group per row (GPTQ group_size -1, compressed-tensors channel strategy).
  int64_t group_size = 0;
  // bitsandbytes 4-bit: quant type ("nf4" | "fp4"), double quantization, the storage dtype of
  // the packed weight (uint8 by default), and the block sizes it uses (64; nested 256).
  std::string quant_type;
  bool quant_type_stated = false;  // bnb_4bit_quant_type given (else "fp4", transformers' default)
  bool double_quant = false;
  DType storage = DType::U8;
  int64_t blocksize = 64;
  int64_t nested_blocksize = 256;
  // FP8: the weight block [rows, cols] one scale covers (128 x 128).
  int64_t block_rows = 0, block_cols = 0;
  // Zero points stored (AWQ zero_point, GPTQ always, compressed-tensors asymmetric).
  bool zero_point = true;
  // compressed-tensors: the dtype of weight_scale when it is not the model's (NVFP4: F8_E4M3);
  // nullopt = the model's dtype.
  std::optional<DType> scale_dtype;
  // compressed-tensors NVFP4 W4A4: an input_global_scale per module (activations quantized).
  bool input_scale = false;
  // Modules left unquantized by name: exact module names, suffixes after a '.', or "re:<regex>"
  // (compressed-tensors' ignore), from modules_to_not_convert / llm_int8_skip_modules / ignore.
  std::vector<std::string> skip_modules;
  // GPTQ / AWQ quantize only the linear layers inside the repeated blocks (model.layers.N...).
  bool blocks_only = false;
  // GPTQ checkpoint_format "gptq_v2" (zero points stored as they are; "gptq" stores z - 1).
  bool gptq_v2 = false;
  // Read off the tensors (infer_quant_config, loader/format/quant_layout.h), not from a quantization_config.
  bool inferred = false;
  nlohmann::json source;  // the quantization_config as given
};

// Parses a quantization_config object. `file` names where it came from (config.json's path, or
// "estimate" for a scheme argument). Throws QuantSchemeError: "unknown-scheme" (a quant_method or
// compressed-tensors format metaload does not know, listing the known ones), "unsupported-scheme"
// (a known method in a variant it cannot size: AWQ GEMV, FP8 without weight_block_size, ...),
// "invalid-field" (a field of the wrong type or value, named).
QuantConfig parse_quant_config(const nlohmann::json& qc, const std::string& file);

// The quantization_config of config.json when it has one (also nested under "text_config").
std::optional<nlohmann::json> find_quant_config(const nlohmann::json& config);

// The presets estimate() accepts by name, each with its library's defaults:
//   bnb-nf4, bnb-nf4-dq, bnb-fp4, bnb-fp4-dq, bnb-int8 (transformers' BitsAndBytesConfig),
//   gptq-int4, gptq-int8 (group 128, desc_act false, sym), awq-int4 (GEMM, group 128, zero point),
//   fp8-block (E4M3, 128 x 128 blocks), ct-w4a16 (compressed-tensors pack-quantized int4, group
//   128, symmetric), ct-w4a16-asym (with zero points), ct-w8a16 (int8, group 128), ct-nvfp4
//   (W4A4: input_global_scale too), ct-nvfp4a16.
struct QuantPreset {
  const char* name;
  const char* table_name;  // the old per-dtype table's name for it (identity/dtypes.h)
  const char* config;      // the quantization_config JSON
};
const std::vector<QuantPreset>& quant_presets();

// A preset by name, or the config a JSON object text names. QuantSchemeError("estimate", "",
// "unknown-scheme") listing the presets for any other name.
QuantConfig resolve_quant_scheme(const std::string& name_or_json, std::string* table_name);

}  // namespace metaload
