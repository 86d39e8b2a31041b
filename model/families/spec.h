// What the loader and the model layer need to know about a family without building it: every
// parameter and buffer (Hugging Face names, shapes), which parameters share one tensor, how
// checkpoint names map onto module names, and the sizes tensor parallelism shards each parameter
// by (loader/tp/family_plan.h).
// Torch-free, computed from the FamilyConfig alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loader/tp/family_plan.h"
#include "model/families/config.h"

namespace metaload {

// A parameter: name ("model.layers.3.self_attn.q_proj.weight"), shape as stored in the module and
// in HF checkpoints, tied_to ("" or the parameter whose tensor this one shares). The one list of
// the families' tensors is identity's (identity/family_shape.h).
using ParamSpec = FamilyParameter;

struct BufferSpec {
  std::string name;  // e.g. "transformer.h.0.attn.bias", "model.rotary_emb.inv_freq"
  std::vector<int64_t> shape;
  std::string dtype;  // "bool" or "float32"
  // Always false here: these buffers are computed (init_nonpersistent_buffers), never saved to
  // or loaded from checkpoints, as in transformers (persistent=False).
  bool persistent = false;
};

// Every parameter in named_parameters() order, tied ones included (as in a state_dict):
// family_parameters (identity/family_shape.h).
std::vector<ParamSpec> parameter_specs(const FamilyConfig& config);
// Every buffer in named_buffers() order.
std::vector<BufferSpec> buffer_specs(const FamilyConfig& config);
// Elements of all parameters, each tied tensor counted once (the published "params" figure).
int64_t parameter_count(const FamilyConfig& config);

// Groups of parameter names that are one tensor. The first name is the one checkpoints store
// (transformers saves tied weights once, under the input embedding's name).
std::vector<std::vector<std::string>> tied_parameter_groups(const FamilyConfig& config);

// The module name for a checkpoint tensor name, or nullopt for tensors the family ignores
// (GPT-2's causal-mask buffers h.N.attn.bias / h.N.attn.masked_bias, old Llama checkpoints'
// rotary_emb.inv_freq). Checkpoints saved from the base model (GPT2Model, LlamaModel) lack the
// base_model_prefix ("transformer." / "model."): it is added, as transformers does. Names the
// family does not know are returned unchanged (the loader reports them as unexpected).
std::optional<std::string> map_checkpoint_name(const FamilyConfig& config, const std::string& name);
// base_model_prefix: identity/family_shape.h ("transformer" or "model").

// The family's tensor-parallel plan (loader/tp/family_plan.h, the one owner of the shard rules:
// tp_rule_for, tp_shard), from the config's sizes.
std::vector<TPRule> tp_plan(const FamilyConfig& config);

}  // namespace metaload
