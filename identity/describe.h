// describe_checkpoint: what a checkpoint is, from its headers and config.json alone. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "loader/format/checkpoint.h"
#include "identity/reference.h"

namespace metaload {

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
  // For a checkpoint whose config.json has a quantization_config (loader/format/quant_layout.h): the scheme,
  // the per-module breakdown, and what limits the TP degree. size_bytes is then the exact stored
  // bytes (packed weights, scales, zero points, blobs, unquantized tensors) and n_params counts
  // packed weights by their logical elements and leaves the scales etc. out.
  std::optional<nlohmann::json> quantization;
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

// The fields as JSON ({"size_bytes": .., "n_params": .., "config": .., "revision": .., ...});
// unknown fields are null.
nlohmann::json to_json(const CheckpointInfo& info);

}  // namespace metaload
