// Recognising a quantized checkpoint from its safetensors headers and its quantization_config:
// which modules are quantized, their logical (unpacked) shapes, the exact bytes of each part, and
// the largest tensor-parallel degree whose slices fall on pack and group boundaries.
// Torch-free. The layouts, as the libraries store them (Linear weight [out, in]):
//   bitsandbytes 4-bit  <m>.weight U8 [ceil(out*in/2), 1], <m>.weight.absmax F32 [ceil(n/64)]
//                       (U8 with double quant, plus nested_absmax F32 [ceil(blocks/256)] and
//                       nested_quant_map F32 [256]), <m>.weight.quant_map F32 [16],
//                       <m>.weight.quant_state.bitsandbytes__{nf4,fp4} U8 [json bytes]
//   bitsandbytes int8   <m>.weight I8 [out, in], <m>.SCB F32 [out], <m>.weight_format U8 []
//   GPTQ                <m>.qweight I32 [in*bits/32, out], qzeros I32 [G, out*bits/32],
//                       scales F16 [G, out], g_idx I32 [in]; G = ceil(in/group_size)
//   AWQ GEMM            <m>.qweight I32 [in, out*bits/32], qzeros I32 [G, out*bits/32],
//                       scales F16 [G, out]
//   FP8 block           <m>.weight F8_E4M3 [out, in], <m>.weight_scale_inv F32
//                       [ceil(out/128), ceil(in/128)]
//   compressed-tensors  <m>.weight_packed I32 [out, ceil(in*bits/32)], weight_scale [out, G]
//   pack-quantized      (the model's dtype), weight_shape I64 [2] = [out, in], asymmetric:
//                       weight_zero_point I32 [ceil(out*bits/32), G]
//   compressed-tensors  <m>.weight_packed U8 [out, in/2], weight_scale F8_E4M3 [out, in/16],
//   NVFP4               weight_global_scale F32 [1], input_global_scale F32 [1] (W4A4 only)
// Biases, norms, embeddings and the layers a quantizer leaves alone are stored as they were.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/format/checkpoint.h"
#include "loader/format/quant_scheme.h"

namespace metaload {

// One quantized linear layer.
struct QuantModule {
  std::string name;           // module path, e.g. "model.layers.0.self_attn.q_proj"
  int64_t out = 0, in = 0;    // the logical weight shape [out, in]
  uint64_t n_params = 0;      // out x in: the weight's logical elements
  uint64_t weight_bytes = 0;  // the packed / quantized weight itself
  uint64_t aux_bytes = 0;     // scales, zero points, absmax, quant maps, blobs, shapes, g_idx
  std::vector<std::string> aux_tensors;  // their names
  std::string weight_tensor;             // the packed weight's name

  // What a dequantizing load reads (recognise_quantized fills it; estimate leaves it empty).
  // The tensors a kernel uses, by role: "q" (the packed / quantized weight), "scales" (scales,
  // absmax, SCB, weight_scale_inv, weight_scale), "zeros" (qzeros, weight_zero_point), "g_idx",
  // "code" (quant_map), "nested_scales", "nested_code", "global" (NVFP4 weight_global_scale),
  // and those read at plan time only: "state" (quant_state blob), "format" (weight_format),
  // "shape" (weight_shape).
  std::map<std::string, std::string> parts;
  int64_t groups = 0;        // GPTQ / AWQ: rows of scales; compressed-tensors: their columns
  int64_t block = 0;         // bitsandbytes 4-bit: the blob's blocksize
  int64_t nested_block = 0;  // bitsandbytes double quantization: blocks per nested absmax
  float nested_offset = 0;   // bitsandbytes double quantization: the blob's nested_offset
  bool nested = false;
};

struct QuantLayout {
  QuantConfig config;
  std::vector<QuantModule> modules;  // by name
  uint64_t weight_bytes = 0, aux_bytes = 0, n_quantized_params = 0;
};

// Reads a small tensor's bytes (a quant_state blob, weight_shape). The default reads the file;
// fuzzers and tests give the bytes directly.
using TensorBytes = std::function<std::string(const SafetensorsHeader&, const TensorInfo&)>;
std::string read_tensor_bytes(const SafetensorsHeader& file, const TensorInfo& t);

// The largest blob metaload reads (a quant_state is ~200 bytes).
inline constexpr uint64_t kMaxQuantStateBytes = 64 * 1024;

// Recognises the quantized modules of `c` under `config` and checks every rule of the layouts
// above: QuantLayoutError(file, tensor, rule) with rules "missing-tensor", "wrong-dtype",
// "packed-shape" (a packed weight that does not match the logical shape), "scale-shape",
// "zeros-shape", "g-idx-shape", "absmax-shape", "quant-map-shape", "quant-state-blob" (malformed
// blob), "quant-state-mismatch" (blob contradicts config.json or its tensors), "foreign-tensor"
// (a tensor of another scheme), "no-quantized-tensors" (file = config_path; only with
// `require_modules`). The one parser of these layouts: describe, estimate's checks and the
// dequantizing load (loader/load/dequant_load.h) all use it.
QuantLayout recognise_quantized(const Checkpoint& c, const QuantConfig& config,
                                const std::string& config_path,
                                const TensorBytes& bytes = read_tensor_bytes,
                                bool require_modules = true);

// The scheme of a checkpoint without a quantization_config, read off its tensors (the first
// module's, in name order): GPTQ or AWQ by whether qweight packs the input or the output dim,
// their bits from the zero points' packing and group size from the scales' rows; bitsandbytes
// 4-bit (quant type from the blob's name, double quantization from nested_absmax) and int8; FP8
// with 128 x 128 blocks; compressed-tensors NVFP4. nullopt when no tensor is quantized (and for
// compressed-tensors pack-quantized, whose bits only its config says). method is "" and inferred
// true; recognise_quantized checks every module against it as against a config.
std::optional<QuantConfig> infer_quant_config(const Checkpoint& c);

// Names of the tensors that are not parameters (aux tensors of every module).
std::set<std::string> aux_tensor_names(const QuantLayout& layout);

// The layout as JSON: {"scheme", "quant_method", "bits", "group_size", ..., "modules": [{"module",
// "shape", "n_params", "weight_bytes", "aux_bytes"}], "weight_bytes", "aux_bytes",
// "n_quantized_params", "n_modules"}.
nlohmann::json to_json(const QuantLayout& layout);
nlohmann::json config_json(const QuantConfig& c);

}  // namespace metaload
