// describe_checkpoint: what a checkpoint is, from its headers and config.json alone. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "identity/reference.h"
#include "loader/format/checkpoint.h"

namespace metaload {

// A mixture of experts, from the headers' expert tensors and config.json. Expert tensors are
// recognised by name in both layouts: one tensor per expert "<layer>.experts.<e>.<rest>" (the
// Hub's, e.g. block_sparse_moe.experts.3.w1.weight, mlp.experts.3.gate_proj.weight and its FP8
// weight_scale_inv) and fused "<layer>.experts.<name>" with the experts as dimension 0
// (gate_up_proj [E, ..], down_proj, their biases and packed parts; Granite-MoE's
// block_sparse_moe.input_linear / output_linear.weight). Shared experts (shared_expert(s).*) and
// the router (gate) are no routed experts: every token uses them.
struct MoeInfo {
  int64_t n_experts = 0;         // routed experts per MoE layer (config and headers agree)
  int64_t n_shared_experts = 0;  // n_shared_experts, else 1 where shared_expert.* tensors exist
  std::optional<int64_t> experts_per_token;  // num_experts_per_tok / experts_per_token
  int64_t n_moe_layers = 0;                  // layers holding routed experts
  std::string layout;          // "per-expert", "fused", or "" when no expert tensor is stored
  uint64_t expert_params = 0;  // the routed experts' parameters (logical elements), all layers
  uint64_t expert_bytes = 0;   // their stored bytes, scales and zero points included
  uint64_t shared_expert_params = 0;  // shared experts' parameters (counted fully when active)
  // Parameters a token uses: n_params minus, per MoE layer, (1 - top_k / E) of its routed experts'
  // parameters. Unknown without experts_per_token or without expert tensors.
  std::optional<uint64_t> active_params;
  // Expert parallelism: the degrees that split every MoE layer's routed experts into whole experts
  // per rank (the divisors of n_experts); max_ep_size = n_experts.
  int64_t max_ep_size = 0;
  std::vector<int64_t> ep_degrees;
};

// A config.json field describe could not read (identity/config_fields.h's rules): the TP degree
// (and the MoE counts) are then unknown, or come from the headers alone; describe still succeeds.
struct ConfigProblem {
  std::string rule;     // "config-not-integer", ...
  std::string field;    // its dotted path ("text_config.num_attention_heads")
  std::string message;  // the ConfigError's message, file and rule included
};

// An empty field means "unknown", never zero.
struct CheckpointInfo {
  std::optional<uint64_t> size_bytes;    // ceil(n_params x bytes_per_element(dtype))
  std::optional<uint64_t> n_params;      // parameters (non-parameter buffers excluded)
  std::optional<nlohmann::json> config;  // config.json beside the weights
  std::optional<std::string> revision;   // resolved commit hash (HF cache)

  // Details for tools; not part of the nnsight-compatible four fields above.
  std::string
      dtype;  // the sized dtype: the name asked for, else the stored one ("BF16" or "mixed")
  std::optional<std::string> repo_id;
  std::string dir;  // where the weight files are
  uint64_t n_files = 0;
  uint64_t n_tensors = 0;              // every tensor stored, buffers included
  uint64_t n_buffer_elements = 0;      // elements of the excluded non-parameter buffers
  uint64_t stored_bytes = 0;           // bytes of tensor data on disk, buffers included
  std::optional<int64_t> max_tp_size;  // from the config, when there is one
  // For a checkpoint whose config.json has a quantization_config (loader/format/quant_layout.h):
  // the scheme, the per-module breakdown, and what limits the TP degree. size_bytes is then the
  // exact stored bytes (packed weights, scales, zero points, blobs, unquantized tensors) and
  // n_params counts packed weights by their logical elements and leaves the scales etc. out.
  std::optional<nlohmann::json> quantization;
  // For a mixture of experts (expert tensors in the headers, or routed experts in the config).
  // A checkpoint whose headers hold another number of experts than its config names (or lack an
  // expert index) is a FormatError (rule "moe-expert-count") naming both.
  std::optional<MoeInfo> moe;
  // The first config.json field that could not be read, as the ConfigError any other reader of
  // that field raises (same rule, same message).
  std::optional<ConfigProblem> config_error;
};

// True for tensors that are buffers, not parameters, although some checkpoints store them:
//   *.bias of shape [1, 1, n, n] (GPT-2/GPT-J/GPT-NeoX causal masks, e.g. h.N.attn.bias),
//   *.masked_bias of rank 0 (GPT-2), *.rotary_emb.inv_freq of rank 1 (older Llama checkpoints).
// describe counts parameters only, so GPT-2's published count (124,439,808) is reproduced from
// its real model.safetensors, which also holds 12 x 1,048,576 mask elements.
bool is_non_parameter_buffer(const TensorInfo& t);

// Describes `ref_or_key`: a checkpoint reference or a model key "<class>:<json>", resolved by
// resolve_reference (reference.h; a key's repo_id in the hub cache only unless `keys` allows
// local paths). `dtype` names the dtype or quantization to size for (see dtypes.h); without it
// the stored bytes are the size. `revision` applies to repo ids (a key's own revision must agree
// with it: ModelKeyError otherwise). Reads headers, the index and config.json only.
CheckpointInfo describe_checkpoint(const std::string& ref_or_key,
                                   const std::optional<std::string>& dtype = std::nullopt,
                                   const std::optional<std::string>& revision = std::nullopt,
                                   const KeyOptions& keys = {});

// The same for an already opened checkpoint.
CheckpointInfo describe_checkpoint(const Checkpoint& checkpoint,
                                   const std::optional<std::string>& dtype = std::nullopt);

nlohmann::json to_json(const MoeInfo& moe);

// The fields as JSON ({"size_bytes": .., "n_params": .., "config": .., "revision": .., ...});
// unknown fields are null.
nlohmann::json to_json(const CheckpointInfo& info);

}  // namespace metaload
