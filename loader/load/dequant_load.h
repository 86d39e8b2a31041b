// Dequantizing loads (LoadOptions::dequantize): the quantized weights of a checkpoint
// (dequant_layout.h) go into the module's ordinary weight tensors as float32 / float16 / bfloat16.
// load_tensors (plan.h) plans them beside the plain tensors, loads their parts (on the CPU, mapped
// from the files where they are aligned), runs the kernels (kernels/dequant.h; CUDA where the load
// goes to a GPU) into fresh slots of the target's shape -- a tensor-parallel rank's window only --
// and swaps them in with the rest, all or nothing.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "loader/load/dequant_layout.h"
#include "loader/load/plan.h"

namespace metaload {

struct DequantTarget {
  size_t target = 0;  // index into the load's targets
  size_t weight = 0;  // index into DequantPlan::layout.weights
  DequantWindow window;
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
// stay in `rest` (unexpected under strict). Throws DequantError (dequant_layout.h rules) and
// MismatchError for targets whose shape is not the (windowed) logical shape.
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
