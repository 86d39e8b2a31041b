// The shape of a GPT-2 / Llama-family model (Llama also serves Mistral and Qwen2) and its one
// tensor list (issue 23): parse_family_shape reads every config.json field a tensor's name or
// shape depends on, with the defaults of the transformers config classes; family_parameters lists
// the parameters from it. The families' parser (model/families/config.h: FamilyConfig derives
// from FamilyShape), their parameter specs (model/families/spec.h) and the published checkpoint
// layouts (checkpoint_shapes.h) all take them from here. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "identity/config_fields.h"

namespace metaload {

enum class Arch { kGPT2, kLlama };

const char* arch_name(Arch arch);  // "gpt2" or "llama"

struct FamilyShape {
  Arch arch = Arch::kLlama;
  std::string model_type;    // "gpt2", "llama", "mistral", "qwen2"
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", ...
  std::string source;        // the file or "builtin:NAME" it was read from (for messages)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;              // gpt2: n_embd
  int64_t num_layers = 0;               // gpt2: n_layer
  int64_t num_heads = 0;                // gpt2: n_head
  int64_t num_kv_heads = 0;             // gpt2: = num_heads
  int64_t head_dim = 0;                 // config head_dim, else hidden_size / num_heads
  int64_t intermediate_size = 0;        // gpt2: n_inner or 4 * n_embd
  int64_t max_position_embeddings = 0;  // gpt2: n_positions
  bool tie_word_embeddings = true;
  // Llama family only.
  bool qkv_bias = false;  // llama: attention_bias; qwen2: always true
  bool o_bias = false;    // llama: attention_bias; qwen2, mistral: false
  bool mlp_bias = false;

  // The number of query heads per key/value head.
  int64_t kv_groups() const { return num_heads / num_kv_heads; }
};

// Reads model_type (or the family of architectures[0]) and the shape fields; ConfigError by the
// rules of config_fields.h (config-unsupported for another model_type or GPT-2's cross-attention,
// config-inconsistent for heads that do not divide). `f` is the whole config.
FamilyShape parse_family_shape(const ConfigFields& f);

// One parameter: its module name ("model.layers.3.self_attn.q_proj.weight"), its shape as stored
// in the module and in Hugging Face checkpoints, and the parameter whose tensor it shares ("").
struct FamilyParameter {
  std::string name;
  std::vector<int64_t> shape;
  std::string tied_to;
};

// Every parameter in named_parameters() order, tied ones included (as in a state_dict). Widths
// derived by multiplication (3 x n_embd, heads x head_dim) are checked: SizeOverflowError.
std::vector<FamilyParameter> family_parameters(const FamilyShape& shape);

// The widths of the attention projections, checked (SizeOverflowError): GPT-2's fused q|k|v
// (3 x n_embd), heads x head_dim, kv heads x head_dim.
int64_t fused_qkv_width(const FamilyShape& shape);
int64_t q_width(const FamilyShape& shape);
int64_t kv_width(const FamilyShape& shape);

// "transformer" or "model".
const char* base_model_prefix(const FamilyShape& shape);

}  // namespace metaload
