// Loading a checkpoint into existing tensors: the planner (module names <-> checkpoint tensors,
// with a family's renames, ties and TP shards; every problem in one error), and the public load
// built from plan -> load_slots (slots_torch.h) -> swap_in (swap.h).
//
//   metaload::load(module, "path/or/org/repo", LoadOptions{...}) -> LoadReport
//
// All or nothing: the module's tensors change only after every slot is filled and checked; on any
// error they are exactly as before (still on meta, or the previous weights) and every slot is
// freed.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"
#include "loader/errors.h"  // MismatchError
#include "loader/format/checkpoint.h"
#include "loader/load/assembly.h"
#include "loader/load/slots_torch.h"
#include "loader/tp/slice.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace metaload {

// How a model family names and splits its tensors; the model layer fills it from the family's
// spec (map_checkpoint_name, tied_parameter_groups, buffer_specs, tp_plan). Every member is
// optional: the defaults fit a plain module saved from itself.
struct NameMapping {
  // Checkpoint name -> module name; nullopt: a tensor the family ignores. Default: the same name.
  std::function<std::optional<std::string>(const std::string&)> checkpoint_to_module;
  // Groups of module names that are one tensor; the checkpoint stores one of them.
  std::vector<std::vector<std::string>> tied;
  // Module tensors that are not in checkpoints (computed buffers); default: none.
  std::function<bool(const std::string&)> skip;
  // The shard of a module tensor (stored with `shape`) that rank `rank` of `size` holds. Needed
  // when tp_size > 1; may throw (its message becomes a mismatch line).
  std::function<TpShard(const std::string& name, const std::vector<int64_t>& shape, int rank,
                        int size)>
      tp_shard;
  // Targets assembled from several checkpoint tensors (fused experts: assembly.h); their
  // checkpoint tensors are theirs alone (no target takes them by name).
  std::vector<Assembly> assemblies;
};

// Name mappings a caller names instead of building them (load_into's `name_mapping`): a higher
// layer registers one under a name at load time ("family": the model layer's, from the
// checkpoint's config.json: model/family_load.h) so that the load operator, which cannot see
// that layer, applies it. Registering a name again replaces it.
using NameMappingSource = NameMapping (*)(const Checkpoint& checkpoint);
void register_name_mapping_source(const std::string& name, NameMappingSource source);
// The mapping `name` gives for `checkpoint`; PlanError listing the registered names when none is
// registered under it.
NameMapping name_mapping_from(const std::string& name, const Checkpoint& checkpoint);

struct LoadOptions {
  at::Device device = at::kCPU;
  // Floating-point tensors load as this dtype (the targets take it); default: each target's own
  // dtype. Conversions exist among float32, float16 and bfloat16.
  std::optional<at::ScalarType> dtype;
  int tp_rank = 0;
  int tp_size = 1;
  int threads = 0;             // 0: the machine's cores
  uint64_t staging_bytes = 0;  // 0: the engine's default
  std::function<void(const Progress&)> progress;
  bool strict = true;                   // checkpoint tensors the module has no place for are errors
  std::optional<std::string> revision;  // for Hugging Face repo ids
  // Zero-copy CPU load (EngineOptions::map_files): tensors stored as loaded point into
  // copy-on-write mappings of the files. Default (nullopt): on when every file is a Hugging Face
  // cache blob (content-addressed, never rewritten in place; however the checkpoint was named),
  // off for plain files, which someone may overwrite while the model lives.
  std::optional<bool> map_files;
  // Quantized weights (GPTQ, AWQ, bitsandbytes NF4/FP4 and int8, FP8 with block scales,
  // compressed-tensors pack-quantized and NVFP4; loader/format/quant_layout.h, load/dequant_load.h)
  // load dequantized into their ordinary weight targets as this dtype (float32, float16 or
  // bfloat16), in the same all-or-nothing load; LoadReport::dequantized names them. Unset: every
  // tensor loads as stored, by name.
  std::optional<at::ScalarType> dequantize;
  NameMapping names;
  EngineOptions engine;  // the rest of the engine's knobs (hooks, cancel, chunk and ring sizes)
  DeviceOps* staged = nullptr;  // the staged engine on this device instead (tests: the CPU twin)
};

struct LoadTarget {
  std::string name;
  at::Tensor tensor;
  // A computed tensor (a non-persistent buffer, which checkpoints never hold): not matched to a
  // checkpoint tensor (one of its name is unexpected); it takes `values` instead (any device; made
  // a fresh copy on the load's device, in the target's own dtype: `dtype` converts checkpoint
  // tensors only) in the same all-or-nothing swap. Undefined values: unknown, a missing tensor.
  bool computed = false;
  at::Tensor values;
};

struct LoadPlan {
  std::vector<SlotSpec> specs;
  std::vector<int> spec_of_target;  // -1: skipped (not loaded)
  std::vector<size_t> computed;     // the computed targets, which take their values
  std::vector<std::string> files;
  // strict=false: the targets the checkpoint has no tensor for (left as they are: module names),
  // and the checkpoint tensors no target takes (not read: checkpoint names). Under strict both
  // are part of the MismatchError instead.
  std::vector<std::string> missing, unexpected;
};

// Matches every target to a checkpoint tensor. Throws MismatchError listing every problem.
LoadPlan plan_load(const std::vector<LoadTarget>& targets, const Checkpoint& checkpoint,
                   const LoadOptions& options);

// Loads `ref` into the targets (same tensors afterwards, new data). Each file is opened once:
// its header and its data are read through one descriptor (Checkpoint::keep_files).
LoadReport load_tensors(const std::vector<LoadTarget>& targets, const std::string& ref,
                        const LoadOptions& options = {});
// The same from a checkpoint already open (opened with keep_files, its files are not opened again).
LoadReport load_tensors(const std::vector<LoadTarget>& targets, const Checkpoint& checkpoint,
                        const LoadOptions& options = {});

// Every parameter and buffer of `module` by its dotted name.
LoadReport load(torch::nn::Module& module, const std::string& ref, const LoadOptions& options = {});

// The torch dtype of a safetensors dtype; nullopt where this libtorch has none.
std::optional<at::ScalarType> torch_dtype_of(DType d);
// (torch_shape_of, the torch shape of a stored tensor, is the format layer's: safetensors.h.)

}  // namespace metaload
