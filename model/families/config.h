// Typed configuration of the causal-LM families (GPT-2; Llama, which also serves Mistral and
// Qwen2), parsed from a Hugging Face config.json. Torch-free: the loader and describe use it
// without libtorch. Defaults for optional fields are those of the transformers config classes, so a
// config.json that transformers accepts builds the same architecture here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "identity/family_shape.h"
#include "model/errors.h"

namespace metaload {

struct RopeScaling {
  // "default" (none), "linear" or "llama3": the types whose inv_freq transformers computes without
  // a sequence length; the others (dynamic, yarn, longrope) are rejected by the parser.
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

// The shape (identity/family_shape.h: model type, sizes, ties, biases) and what the modules need
// beyond it.
struct FamilyConfig : FamilyShape {
  double norm_eps = 1e-5;  // gpt2: layer_norm_epsilon; llama: rms_norm_eps
  std::string hidden_act;  // gpt2: activation_function; llama: hidden_act
  double initializer_range = 0.02;

  // GPT-2 only.
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;

  // Llama family only.
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // The attention window per layer (0 = full causal attention): Mistral's sliding_window applies to
  // every layer; Qwen2's only when use_sliding_window, from layer max_window_layers on (or as
  // layer_types says).
  std::vector<int64_t> sliding_window;

  std::string torch_dtype;  // as published ("float16", "bfloat16", ...); empty when absent
  nlohmann::json raw;       // the whole config.json, for whoever needs more fields
};

// Parses a config.json document through identity's one reader (config_fields.h): ConfigError by
// its rules. `source` names it in error messages.
FamilyConfig parse_family_config(const nlohmann::json& config, const std::string& source);
FamilyConfig parse_family_config_text(const std::string& text, const std::string& source);
// Reads PATH, or PATH/config.json when PATH is a directory.
FamilyConfig load_family_config(const std::string& path);

// Built-in configs: the real published gpt2, llama-2-7b, llama-2-70b, llama-3.2-1b, qwen2.5-0.5b,
// mistral-7b-v0.1 configs and tiny ones for tests (gpt2-tiny, llama-tiny, llama-tiny-tied,
// qwen2-tiny, mistral-tiny).
const std::vector<std::string>& builtin_config_names();
bool is_builtin_config(const std::string& name);
// The config.json text of a built-in config; ConfigError listing the names when unknown.
const std::string& builtin_config_json(const std::string& name);
FamilyConfig builtin_config(const std::string& name);
// A built-in name, else a config.json path or a directory holding one.
FamilyConfig resolve_family_config(const std::string& name_or_path);

}  // namespace metaload
