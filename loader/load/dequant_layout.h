// Quantized checkpoints as the quantizing libraries store them, recognised for dequantizing loads
// (load_into(..., dequantize=...)): which tensors make up each quantized weight, its logical
// [out, in] shape, the scheme's parameters, and every rule its parts must keep. Reads headers,
// config.json and the small bitsandbytes quant_state blobs; no weight data.
//
//   scheme  tensors of a weight "P.weight" (P: the module)            config.json quant_method
//   GPTQ    P.qweight I32, P.qzeros I32, P.scales, [P.g_idx I32]         "gptq" (bits, group_size,
//                                                                         checkpoint_format)
//   AWQ     P.qweight I32, P.qzeros I32, P.scales (GEMM layout)          "awq" (version "gemm")
//   NF4/FP4 P.weight U8, P.weight.absmax, P.weight.quant_map,             "bitsandbytes"
//           [P.weight.nested_absmax, P.weight.nested_quant_map],
//           P.weight.quant_state.bitsandbytes__nf4|__fp4 (U8 JSON blob)
//   int8    P.weight I8, P.SCB F32, [P.weight_format U8]                  "bitsandbytes"
//   FP8     P.weight F8_E4M3, P.weight_scale_inv (block scales)          "fp8" (weight_block_size)
//
// GPTQ and AWQ are told apart by config.json, else by shapes (GPTQ's qweight has out columns,
// AWQ's out / 8). A config.json whose quant_method has no kernels here, or whose scheme the
// tensors contradict, is a DequantError (rules below), as is every malformed part.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dequant_bits.h"  // QuantScheme, QuantView
#include "loader/errors.h"         // DequantError
#include "loader/format/checkpoint.h"
#include "loader/format/tp_shard.h"

namespace metaload {

// One stored tensor of a quantized weight.
struct QuantPart {
  std::string name;  // in the checkpoint
  const TensorInfo* info = nullptr;
  size_t file = 0;  // index into Checkpoint::files
};

// One quantized weight. Parts by role: "q" (qweight / packed codes / int8 / fp8 weight), "zeros",
// "scales" (scales / absmax / SCB / weight_scale_inv), "g_idx", "code" (quant_map),
// "nested_scales", "nested_code", "state" (the quant_state blob), "format" (weight_format).
struct QuantWeight {
  std::string weight;  // the logical weight's checkpoint name, "P.weight"
  QuantScheme scheme = QuantScheme::kGptq;
  int64_t out = 0, in = 0;
  int bits = 4;
  int64_t group_size = 0;  // GPTQ / AWQ: input rows per group; BNB4: blocksize; FP8: block rows
  int64_t block_in = 0;    // FP8: block columns
  int64_t groups = 0;      // GPTQ / AWQ: rows of scales
  int zero_offset = 0;     // GPTQ: 1 for checkpoint format "gptq" (v1)
  int64_t nested_block = 0;
  float offset = 0;
  bool nested = false;  // BNB4 double quantization
  std::map<std::string, QuantPart> parts;

  const QuantPart& part(const std::string& role) const { return parts.at(role); }
  bool has(const std::string& role) const { return parts.count(role) != 0; }
  // The file holding the main part, for errors.
  std::string file_of(const Checkpoint& ckpt) const;
};

struct QuantLayout {
  std::string method;  // config.json's quant_method, or "" without one
  std::vector<QuantWeight> weights;
};

// Every quantized weight of `ckpt`, checked (shapes, dtypes, blobs, config agreement). A
// checkpoint without quantized tensors gives none. Throws DequantError with rules:
//   "unknown-scheme"       config.json's quant_method is not gptq, awq, bitsandbytes or fp8
//   "config-contradiction" the tensors are another scheme than config.json's, or its bits /
//                          group_size / block size disagree with the shapes
//   "missing-part"         a part the scheme needs is absent
//   "dtype"                a part of the wrong dtype
//   "packed-shape"         packed data that does not hold the logical shape
//   "scale-shape"          scales / absmax / SCB / weight_scale_inv / quant_map of the wrong shape
//   "zeros-shape", "g_idx-shape"
//   "quant-state"          a bitsandbytes quant_state blob that is not the JSON bitsandbytes
//                          writes (keys, types, values)
//   "unsupported"          a variant without kernels (GPTQ 3-bit, AWQ GEMV, AWQ without zero
//                          points, FP8 e5m2, int8 weight_format other than row)
QuantLayout find_quant_layout(const Checkpoint& ckpt);

// Parses one quant_state blob (tests, fuzzing): fills w's shape, blocksize and nested fields.
// `quant_type` is the name's suffix ("nf4" / "fp4"). Throws DequantError rule "quant-state".
void parse_quant_state(const std::string& blob, const std::string& quant_type,
                       const std::string& file, const std::string& tensor, QuantWeight& w);

// Where a tensor-parallel rank's shard falls on the logical weight: rows [row0, row0 + rows) and
// columns [col0, col0 + cols).
struct DequantWindow {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// The window of `shard` (dim -1 or absent: all of it), which must start and end on the scheme's
// pack, group and block boundaries (GPTQ: out on packs of 32 / bits, in on groups; AWQ: out on
// packs of 8, in on groups; NF4/FP4: on blocksize elements of the flattened weight; FP8: on blocks;
// int8: anywhere). Throws DequantError rule "tp-boundary" naming the constraint and the degrees
// (up to 1024) that split that dim on boundaries.
DequantWindow dequant_window(const Checkpoint& ckpt, const QuantWeight& w, const TpShard* shard,
                             int tp_size);

// The view over the parts' bytes (`data[role]`: each part's first byte, host or device) for the
// kernels (kernels/dequant.h).
QuantView quant_view(const QuantWeight& w, const std::map<std::string, const void*>& data);

}  // namespace metaload
