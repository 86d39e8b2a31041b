#include "model/families/config.h"

#include <filesystem>

#include <fmt/format.h>

#include "base/checked.h"
#include "base/text.h"
#include "identity/config_fields.h"
#include "loader/errors.h"
#include "loader/format/file_io.h"
#include "loader/format/json_util.h"
#include "model/families/spec.h"

namespace metaload {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

using Fields = ConfigFields;

const std::vector<std::string> kGPT2Activations = {
    "gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu", "swish"};
const std::vector<std::string> kLlamaActivations = {
    "silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"};

void parse_common_tail(const Fields& f, FamilyConfig& c) {
  c.initializer_range = f.positive_number_or("initializer_range", 0.02);
  // transformers >= 4.56 writes "dtype", older versions "torch_dtype".
  c.torch_dtype = f.string_or("torch_dtype", f.string_or("dtype", ""));
}

// Beyond the shape (identity/family_shape.cc).
void parse_gpt2(const Fields& f, FamilyConfig& c) {
  c.norm_eps = f.positive_number_or("layer_norm_epsilon", 1e-5);
  c.hidden_act = f.one_of("activation_function", "gelu_new", kGPT2Activations);
  c.scale_attn_weights = f.bool_or("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = f.bool_or("scale_attn_by_inverse_layer_idx", false);
  parse_common_tail(f, c);
}

// The rotary settings as transformers 5 reads them (PreTrainedConfig.convert_rope_params_to_dict):
// one object, `rope_scaling` when it is a non-empty object (configs older than transformers 5),
// else `rope_parameters` (what transformers 5 writes: rope_theta inside it); rope_theta from that
// object, else the top-level field, else 10000; partial_rotary_factor likewise. Per-layer-type
// objects (keyed by "full_attention", ...) and the scaling types that need a sequence length
// (dynamic, yarn, longrope, ...) are refused naming the field.
void parse_rope(const Fields& top, FamilyConfig& c) {
  const char* key = nullptr;
  if (top.has("rope_scaling") &&
      !(top.at("rope_scaling").is_object() && top.at("rope_scaling").empty()))
    key = "rope_scaling";
  else if (top.has("rope_parameters"))
    key = "rope_parameters";
  c.rope_theta = top.positive_number_or("rope_theta", 10000.0);
  RopeScaling& r = c.rope_scaling;
  r = RopeScaling{};
  const bool partial_inside = key != nullptr && top.at(key).is_object() &&
                              top.at(key).contains("partial_rotary_factor") &&
                              !top.at(key).at("partial_rotary_factor").is_null();
  if (!partial_inside && top.positive_number_or("partial_rotary_factor", 1.0) != 1.0)
    top.fail("partial_rotary_factor", "config-unsupported",
             "other than 1.0 is not supported by the llama family");
  if (key != nullptr) {
    const json& obj = top.at(key);
    if (!obj.is_object())
      top.fail(key, "config-not-object",
               fmt::format("must be an object or null, got {}", config_excerpt(obj)));
    const Fields f = top.object(key);
    for (const char* layer_type : {"full_attention", "sliding_attention"})
      if (f.contains(layer_type))
        f.fail(layer_type, "config-unsupported",
               "is there: rotary parameters per layer type are not supported by the "
               "llama family");
    c.rope_theta = f.positive_number_or("rope_theta", c.rope_theta);
    // The object's partial_rotary_factor wins over the top-level one, as in transformers.
    if (partial_inside && f.positive_number("partial_rotary_factor") != 1.0)
      f.fail("partial_rotary_factor", "config-unsupported",
             "other than 1.0 is not supported by the llama family");
    // transformers >= 4.45 writes "rope_type"; older configs "type".
    const char* type_key = f.has("rope_type") ? "rope_type" : "type";
    r.type = f.one_of(type_key, "default", {"default", "linear", "llama3"});
    if (r.type == "linear") {
      r.factor = f.positive_number("factor");
    } else if (r.type == "llama3") {
      r.factor = f.positive_number("factor");
      r.low_freq_factor = f.positive_number("low_freq_factor");
      r.high_freq_factor = f.positive_number("high_freq_factor");
      // Absent: transformers takes max_position_embeddings (standardize_rope_params).
      r.original_max_position_embeddings =
          f.positive_int_or("original_max_position_embeddings", c.max_position_embeddings);
      if (!(r.high_freq_factor > r.low_freq_factor))
        f.fail("high_freq_factor", "config-inconsistent",
               fmt::format("({}) must be greater than low_freq_factor ({})", r.high_freq_factor,
                           r.low_freq_factor));
    }
  }
}

// The attention window of each layer.
void parse_sliding_window(const Fields& f, FamilyConfig& c) {
  const bool mistral = c.model_type == "mistral", qwen2 = c.model_type == "qwen2";
  c.sliding_window.assign(c.num_layers, 0);
  if (mistral) {
    // MistralConfig's default window is 4096; null turns it off.
    const int64_t window = !f.contains("sliding_window") ? 4096
                           : f.has("sliding_window")     ? f.positive_int("sliding_window")
                                                         : 0;
    for (auto& w : c.sliding_window) w = window;
  } else if (qwen2) {
    // Qwen2Config: sliding_window (default 4096) only with use_sliding_window; null is no window
    // (Qwen2Config then makes every layer full_attention; transformers' forward fails on a
    // layer_types that still names sliding_attention: here those layers attend fully).
    const bool use = f.bool_or("use_sliding_window", false);
    const int64_t window = !f.contains("sliding_window") ? 4096
                           : f.has("sliding_window")     ? f.positive_int("sliding_window")
                                                         : 0;
    if (use && window > 0) {
      if (f.has("layer_types")) {
        const json& types = f.at("layer_types");
        if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_layers)
          f.fail("layer_types", "config-inconsistent",
                 fmt::format("must be a list of {} layer types, got {}", c.num_layers,
                             config_excerpt(types)));
        for (int64_t i = 0; i < c.num_layers; ++i) {
          const json& t = types[i];
          if (t == "sliding_attention")
            c.sliding_window[i] = window;
          else if (t != "full_attention")
            f.fail("layer_types", "config-unsupported",
                   fmt::format("[{}] must be \"full_attention\" or \"sliding_attention\", got {}",
                               i, config_excerpt(t)));
        }
      } else {
        const int64_t from = f.positive_int_or("max_window_layers", 28);
        for (int64_t i = from; i < c.num_layers; ++i) c.sliding_window[i] = window;
      }
    }
  }
}

// Beyond the shape (identity/family_shape.cc).
void parse_llama(const Fields& f, FamilyConfig& c) {
  if (c.head_dim % 2 != 0)
    f.fail("head_dim", "config-inconsistent",
           fmt::format("({}) must be even for rotary embeddings", c.head_dim));
  c.norm_eps = f.positive_number_or("rms_norm_eps", 1e-6);
  c.hidden_act = f.one_of("hidden_act", "silu", kLlamaActivations);
  parse_rope(f, c);
  parse_sliding_window(f, c);
  parse_common_tail(f, c);
}

// Without blocking on a FIFO, refusing anything but a regular file (saying what it is).
std::string read_file(const std::string& path) {
  try {
    return fileio::read_small_file(path, 64ull << 20, "config.json");
  } catch (const FormatError& e) {
    throw ConfigError(path, "", e.rule(), "cannot read the config file: " + e.detail());
  }
}

}  // namespace

FamilyConfig parse_family_config(const json& config, const std::string& source) {
  const Fields f(config, source);  // config-not-object
  FamilyConfig c;
  c.raw = config;
  // Sizes derived by multiplication (the default n_inner, every parameter's elements and bytes)
  // must fit torch's int64 sizes: too large is a SizeOverflowError naming the file now, not an
  // error deep in a meta build.
  try {
    static_cast<FamilyShape&>(c) = parse_family_shape(f);
    if (c.arch == Arch::kGPT2)
      parse_gpt2(f, c);
    else
      parse_llama(f, c);
    parameter_count(c);
  } catch (const SizeOverflowError& e) {
    throw SizeOverflowError(escape_path(source) + ": " + e.message());
  }
  return c;
}

FamilyConfig parse_family_config_text(const std::string& text, const std::string& source) {
  json config;
  try {
    config = parse_json(text, source);  // nesting past kMaxJsonDepth is refused
  } catch (const FormatError& e) {
    throw ConfigError(source, "", e.rule(),
                      e.rule() == "invalid-json" ? "invalid JSON: " + e.detail() : e.detail());
  }
  return parse_family_config(config, source);
}

FamilyConfig load_family_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  if (!fileio::exists(file)) throw ConfigError(file, "", "config-not-found", "no such config file");
  return parse_family_config_text(read_file(file), file);
}

FamilyConfig builtin_config(const std::string& name) {
  return parse_family_config_text(builtin_config_json(name), "builtin:" + name);
}

FamilyConfig resolve_family_config(const std::string& name_or_path) {
  if (is_builtin_config(name_or_path)) return builtin_config(name_or_path);
  std::error_code ec;
  if (std::filesystem::exists(name_or_path, ec)) return load_family_config(name_or_path);
  throw ConfigError(
      "", "", "config-not-found",
      fmt::format(
          "{} is neither a built-in config ({}) nor a config.json file or a directory holding one",
          quote_path(name_or_path, '\''), join(builtin_config_names())));
}

}  // namespace metaload
