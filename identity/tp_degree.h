// Tensor-parallel degrees a model's config allows. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "identity/errors.h"

namespace metaload {

// The largest TP degree: gcd of num_attention_heads, num_key_value_heads and intermediate_size
// (also under the names GPT-2 and others use: n_head, num_heads, num_kv_heads, n_inner, ffn_dim)
// and, for a mixture of experts, each expert's intermediate size where the config gives it apart
// (moe_intermediate_size: Qwen2/3-MoE, DeepSeek-V2/V3, GLM-4-MoE; shared_expert_intermediate_size:
// Qwen2-MoE), every expert's slice falling on whole rows; read from "text_config" when the config
// has one, else from the top level. Missing or null fields are skipped, zero expert sizes too. With
// expert parallelism the expert count (num_local_experts, num_experts or n_routed_experts) joins
// the gcd. nullopt when no field is present or the gcd is 1. The fields are read by
// config_fields.h's one reader: heads, kv heads and the dense intermediate size must be positive
// integers when present, the expert fields non-negative (0: none); ConfigError by its rules
// otherwise, naming `file`.
std::optional<int64_t> max_tp_size(const nlohmann::json& config, bool expert_parallel = false,
                                   const std::string& file = "config.json");

// The mixture-of-experts fields of a config (text_config first, as max_tp_size); 0 where absent.
struct MoeConfig {
  int64_t routed_experts = 0;     // num_local_experts, num_experts or n_routed_experts
  const char* routed_field = "";  // which of them
  int64_t experts_per_token = 0;  // num_experts_per_tok or experts_per_token
  int64_t shared_experts = 0;     // n_shared_experts
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's one shared expert
};
// ConfigError for a field that is not a non-negative integer.
MoeConfig moe_config(const nlohmann::json& config, const std::string& file = "config.json");

// The divisors of n >= 1, ascending.
std::vector<int64_t> divisors(int64_t n);

// Every degree that works (the divisors of max_tp_size), ascending; empty when none does.
std::vector<int64_t> tp_degrees(const nlohmann::json& config, bool expert_parallel = false);

// The smallest working degree >= n. Throws TPError listing the degrees that work when none is
// >= n, when the model cannot be split at all, or when n < 1.
int64_t tp_degree_for(const nlohmann::json& config, int64_t n, bool expert_parallel = false);

}  // namespace metaload
