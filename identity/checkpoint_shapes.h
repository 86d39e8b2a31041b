// The tensors a published Hugging Face safetensors checkpoint holds for a config: names exactly
// as stored (GPT-2 without the "transformer." prefix), shapes, one dtype. Used to make sparse
// fixtures of real sizes (tests, bench/describe, make-checkpoint) without any model code.
// Torch-free.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "loader/format/writer.h"

namespace metaload {

// model_type "gpt2", "llama", "mistral" or "qwen2". `with_buffers` adds the non-parameter buffers
// older checkpoints carry (GPT-2's h.N.attn.bias causal masks, Llama's rotary_emb.inv_freq).
// Tied embeddings (tie_word_embeddings, GPT-2 always) are stored once, as transformers saves them.
// The tensors are the families' one list (identity/family_shape.h) as a checkpoint names them.
// Throws ConfigError naming `source` (config_fields.h's rules: config-unsupported for another
// model_type, config-missing-field, ...).
std::vector<TensorSpec> checkpoint_tensor_specs(const nlohmann::json& config, DType dtype,
                                                bool with_buffers = false,
                                                const std::string& source = "config.json");

}  // namespace metaload
