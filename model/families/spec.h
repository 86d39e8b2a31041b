// What the loader and the model layer need to know about a family without building it: every
// parameter and buffer (Hugging Face names, shapes), which parameters share one tensor, how
// checkpoint names map onto module names, and how tensor parallelism shards each parameter.
// Torch-free, computed from the FamilyConfig alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loader/tp/shard.h"
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

// Tensor parallelism as vLLM / SGLang shard these models.
enum class TPStyle {
  kReplicated,  // every rank holds the whole tensor
  kColumn,      // output features split across ranks (ColumnParallelLinear / QKVParallelLinear)
  kRow,         // input features split across ranks (RowParallelLinear; outputs all-reduced)
  kVocab,  // vocabulary rows split, padded to a multiple of lcm(64, tp) (VocabParallelEmbedding,
           // ParallelLMHead)
};
const char* tp_style_name(TPStyle style);

// One part of the split dimension that is sharded on its own: a fused tensor (GPT-2's c_attn,
// [q|k|v]) has several; each rank takes its share of each part and concatenates them.
struct TPSection {
  int64_t size = 0;   // length along the split dimension
  int64_t heads = 0;  // attention heads in the part (split on head boundaries), 0 = plain split
  // For key/value heads: when the TP size exceeds the heads, ranks share (replicate) a head, as
  // vLLM does (kv head = rank / (tp / heads)).
  bool replicate_heads = false;
};

struct TPRule {
  std::string pattern;  // the parameter name, "*" standing for the layer index
  TPStyle style = TPStyle::kReplicated;
  // The dimension of the STORED tensor that is split (-1 when replicated). GPT-2's Conv1D stores
  // [in, out], so its column split is dim 1 and its row split dim 0; Linear stores [out, in].
  int split_dim = -1;
  std::vector<TPSection> sections;
  std::string note;  // layout remarks (fused q|k|v, bias added once after the all-reduce, ...)
};

// The rules of a family, one per parameter name pattern; every parameter matches exactly one.
std::vector<TPRule> tp_plan(const FamilyConfig& config);
// The rule whose pattern matches `name`; FamilyError when none does.
const TPRule& tp_rule_for(const std::vector<TPRule>& plan, const std::string& name);

// What rank `rank` of `size` holds of a tensor stored with `shape` (loader/tp/shard.h).
// FamilyError when the shape does not fit the rule or `size` does not divide what must be divided
// (heads, features; the padded vocabulary always divides).
TpShard tp_shard(const TPRule& rule, const std::vector<int64_t>& shape, int64_t rank, int64_t size);

}  // namespace metaload
