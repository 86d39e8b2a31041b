// Dequantizing loads (LoadOptions::dequantize): the quantized weights of a checkpoint go into the
// module's ordinary weight tensors as float32 / float16 / bfloat16. The layouts are quant/'s (one
// parser, loader/format/quant_layout.h: config.json's quantization_config, or the scheme read off the tensors
// when there is none); this file turns each quantized module into a dequantization job: its
// parts to read, the kernel's parameters (kernels/dequant_bits.h QuantView) and, for a
// tensor-parallel rank, the window of the logical weight on pack and group boundaries.
// load_tensors (plan.h) plans them beside the plain tensors, loads their parts (on the CPU, mapped
// from the files where they are aligned), runs the kernels (kernels/dequant.h; CUDA where the load
// goes to a GPU) into fresh slots of the target's shape and swaps them in with the rest, all or
// nothing. Every rejection is a DequantError (quant/errors.h): quant/'s layout and scheme rules
// as they are, and the load's own:
//   "unsupported-scheme"  a layout quant/ knows that has no kernels here (GPTQ 3-bit, AWQ
//                         without zero points, bitsandbytes storage other than uint8, int8
//                         weight_format other than row-major, compressed-tensors weight_g_idx)
//   "unknown-scheme"      a quant_method that cannot be dequantized
//   "tp-boundary"         a TP shard off the scheme's pack / group / block boundaries, naming
//                         the constraint and the degrees that work
//   "g_idx-range"         a GPTQ g_idx naming a group that does not exist
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/dequant_bits.h"  // QuantScheme, QuantView
#include "loader/tp/shard.h"
#include "loader/load/plan.h"
#include "loader/format/quant_layout.h"

namespace metaload {

// The quantized modules of `ckpt` a dequantizing load sees: quant/'s layout under config.json's
// quantization_config (or infer_quant_config's scheme; no modules when neither finds one), with
// every QuantLayoutError / QuantSchemeError raised as a DequantError, and the variants without
// kernels refused ("unsupported-scheme").
QuantLayout dequant_layout(const Checkpoint& ckpt);

// The kernels' scheme of a layout ("gptq", "awq", "bnb4", "bnb8", "fp8", "ct-int", "nvfp4").
QuantScheme dequant_scheme(const QuantConfig& config);

// Where a tensor-parallel rank's shard falls on the logical weight: rows [row0, row0 + rows) and
// columns [col0, col0 + cols).
struct DequantWindow {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// The window of `shard` (dim -1 or absent: all of it), which must start and end on the
// boundaries quant/'s tp_unit names. DequantError "tp-boundary" naming the constraint and the
// degrees (up to 1024) that split that dim on boundaries.
DequantWindow dequant_window(const Checkpoint& ckpt, const QuantConfig& config,
                             const QuantModule& m, const TpShard* shard, int tp_size);

// The kernel's parameters for module `m` (the data pointers unset: with_data sets them).
QuantView quant_view(const Checkpoint& ckpt, const QuantConfig& config, const QuantModule& m);
// `v` over the parts' bytes (`data[role]`: host or device).
QuantView with_data(QuantView v, const std::map<std::string, const void*>& data);

struct DequantTarget {
  size_t target = 0;  // index into the load's targets
  size_t module = 0;  // index into DequantPlan::layout.modules
  DequantWindow window;
  QuantView view;                                     // without data
  std::vector<std::pair<std::string, size_t>> parts;  // role -> index into DequantPlan::parts
};

struct DequantPlan {
  QuantLayout layout;
  std::vector<DequantTarget> targets;
  std::vector<SlotSpec> parts;    // the parts to read, as raw bytes
  std::vector<bool> dequantized;  // per load target: filled here, not by the plain plan
  Checkpoint rest;                // the checkpoint without the planned weights' parts
};

// The quantized weights of `ckpt` whose target (by opt.names) is among `targets`, with their
// windows (opt.tp_rank / tp_size through opt.names.tp_shard) and parts. Weights without a target
// stay in `rest` (unexpected under strict). Throws DequantError and MismatchError for targets
// whose shape is not the (windowed) logical shape.
DequantPlan plan_dequant(const std::vector<LoadTarget>& targets, const Checkpoint& ckpt,
                         const LoadOptions& opt);

// Loads the parts and dequantizes every planned weight into a fresh tensor on opt.device in
// *opt.dequantize; one per plan.targets entry. Adds the parts' reads to `report`. The parts are
// freed before it returns; nothing survives a throw (DequantError "g_idx-range" for a GPTQ g_idx
// naming a group that does not exist).
std::vector<at::Tensor> run_dequant(const DequantPlan& plan, const std::vector<std::string>& files,
                                    const LoadOptions& opt, const EngineOptions& engine,
                                    LoadReport* report);

}  // namespace metaload
