#include "model/families/config.h"

#include <filesystem>

#include <fmt/format.h>

#include "base/checked.h"
#include "base/text.h"
#include "loader/errors.h"
#include "loader/format/file_io.h"
#include "loader/format/json_util.h"
#include "model/families/spec.h"

namespace metaload {
namespace {

using nlohmann::json;

std::string excerpt(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// Typed access to one JSON object; every error names the field (with its path inside the file,
// e.g. rope_scaling.factor) and the file.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : j_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw ConfigError(
        fmt::format("{}: field '{}{}' {}", escape_path(source_), prefix_, field, what));
  }

  // Present and not null (transformers treats null as "use the default").
  bool has(const char* field) const { return j_.contains(field) && !j_.at(field).is_null(); }
  bool contains(const char* field) const { return j_.contains(field); }
  const json& at(const char* field) const { return j_.at(field); }

  int64_t positive_int(const char* field) const {
    if (!has(field)) fail(field, "is missing (a positive integer is required)");
    return positive_int_value(field);
  }
  int64_t layer_count(const char* field) const {
    const int64_t n = positive_int(field);
    if (n > kMaxConfigLayers)
      fail(field, fmt::format("is {}, more layers than metaload builds (at most {})", n,
                              kMaxConfigLayers));
    return n;
  }
  int64_t positive_int_or(const char* field, int64_t fallback) const {
    return has(field) ? positive_int_value(field) : fallback;
  }
  double positive_number(const char* field) const {
    if (!has(field)) fail(field, "is missing (a positive number is required)");
    return positive_number_value(field);
  }
  double positive_number_or(const char* field, double fallback) const {
    return has(field) ? positive_number_value(field) : fallback;
  }
  bool bool_or(const char* field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_boolean()) fail(field, fmt::format("must be true or false, got {}", excerpt(v)));
    return v.get<bool>();
  }
  std::string string_or(const char* field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_string()) fail(field, fmt::format("must be a string, got {}", excerpt(v)));
    return v.get<std::string>();
  }
  std::string one_of(const char* field, const std::string& fallback,
                     const std::vector<std::string>& allowed) const {
    std::string value = string_or(field, fallback);
    for (const auto& a : allowed)
      if (a == value) return value;
    fail(field, fmt::format("has unsupported value {} (supported: {})", quote_text(value, '\''),
                            join(allowed)));
  }

 private:
  int64_t positive_int_value(const char* field) const {
    const json& v = j_.at(field);
    // Booleans are not numbers in nlohmann, but be explicit: sizes must be JSON integers.
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      fail(field, fmt::format("must be a positive integer, got {}", excerpt(v)));
    return v.get<int64_t>();
  }
  double positive_number_value(const char* field) const {
    const json& v = j_.at(field);
    if (!v.is_number() || !(v.get<double>() > 0))
      fail(field, fmt::format("must be a positive number, got {}", excerpt(v)));
    return v.get<double>();
  }

  const json& j_;
  std::string source_;
  std::string prefix_;
};

const std::vector<std::string> kGPT2Activations = {
    "gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu", "swish"};
const std::vector<std::string> kLlamaActivations = {
    "silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"};

void parse_common_tail(const Fields& f, FamilyConfig& c) {
  c.initializer_range = f.positive_number_or("initializer_range", 0.02);
  // transformers >= 4.56 writes "dtype", older versions "torch_dtype".
  c.torch_dtype = f.string_or("torch_dtype", f.string_or("dtype", ""));
}

void parse_gpt2(const Fields& f, FamilyConfig& c) {
  c.arch = Arch::kGPT2;
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("n_embd");
  c.num_layers = f.layer_count("n_layer");
  c.num_heads = f.positive_int("n_head");
  c.max_position_embeddings = f.positive_int("n_positions");
  if (c.hidden_size % c.num_heads != 0)
    f.fail("n_head", fmt::format("({}) must divide n_embd ({})", c.num_heads, c.hidden_size));
  c.num_kv_heads = c.num_heads;
  c.head_dim = c.hidden_size / c.num_heads;
  c.intermediate_size = f.has("n_inner")
                            ? f.positive_int("n_inner")
                            : checked_mul<int64_t>(4, c.hidden_size, "default n_inner 4 x n_embd");
  c.norm_eps = f.positive_number_or("layer_norm_epsilon", 1e-5);
  c.hidden_act = f.one_of("activation_function", "gelu_new", kGPT2Activations);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", true);
  c.scale_attn_weights = f.bool_or("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = f.bool_or("scale_attn_by_inverse_layer_idx", false);
  if (f.bool_or("add_cross_attention", false))
    f.fail("add_cross_attention", "is true: cross-attention GPT-2 is not supported");
  parse_common_tail(f, c);
}

// The rotary settings as transformers 5 reads them (PreTrainedConfig.convert_rope_params_to_dict):
// one object, `rope_scaling` when it is a non-empty object (configs older than transformers 5),
// else `rope_parameters` (what transformers 5 writes: rope_theta inside it); rope_theta from that
// object, else the top-level field, else 10000; partial_rotary_factor likewise. Per-layer-type
// objects (keyed by "full_attention", ...) and the scaling types that need a sequence length
// (dynamic, yarn, longrope, ...) are refused naming the field.
void parse_rope(const Fields& top, FamilyConfig& c, const std::string& source) {
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
    top.fail("partial_rotary_factor", "other than 1.0 is not supported by the llama family");
  if (key != nullptr) {
    const json& obj = top.at(key);
    if (!obj.is_object())
      top.fail(key, fmt::format("must be an object or null, got {}", excerpt(obj)));
    const std::string prefix = std::string(key) + ".";
    Fields f(obj, source, prefix);
    for (const char* layer_type : {"full_attention", "sliding_attention"})
      if (f.contains(layer_type))
        f.fail(layer_type,
               "is there: rotary parameters per layer type are not supported by the "
               "llama family");
    c.rope_theta = f.positive_number_or("rope_theta", c.rope_theta);
    // The object's partial_rotary_factor wins over the top-level one, as in transformers.
    if (partial_inside && f.positive_number("partial_rotary_factor") != 1.0)
      f.fail("partial_rotary_factor", "other than 1.0 is not supported by the llama family");
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
        f.fail("high_freq_factor", fmt::format("({}) must be greater than low_freq_factor ({})",
                                               r.high_freq_factor, r.low_freq_factor));
    }
  }
}

void parse_llama(const Fields& f, FamilyConfig& c, const std::string& source) {
  c.arch = Arch::kLlama;
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.intermediate_size = f.positive_int("intermediate_size");
  c.num_layers = f.layer_count("num_hidden_layers");
  c.num_heads = f.positive_int("num_attention_heads");
  c.num_kv_heads = f.positive_int_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    f.fail("num_key_value_heads",
           fmt::format("({}) must divide num_attention_heads ({})", c.num_kv_heads, c.num_heads));
  if (f.has("head_dim")) {
    c.head_dim = f.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      f.fail("num_attention_heads",
             fmt::format("({}) must divide hidden_size ({}) when head_dim is absent", c.num_heads,
                         c.hidden_size));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0)
    f.fail("head_dim", fmt::format("({}) must be even for rotary embeddings", c.head_dim));
  const bool mistral = c.model_type == "mistral", qwen2 = c.model_type == "qwen2";
  // The defaults of LlamaConfig / MistralConfig / Qwen2Config.
  c.max_position_embeddings = f.positive_int_or("max_position_embeddings", mistral ? 4096 * 32
                                                                           : qwen2 ? 32768
                                                                                   : 2048);
  c.norm_eps = f.positive_number_or("rms_norm_eps", 1e-6);
  c.hidden_act = f.one_of("hidden_act", "silu", kLlamaActivations);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  parse_rope(f, c, source);
  if (qwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v have a bias, o_proj none.
    c.o_bias = false;
    c.mlp_bias = false;
  } else if (mistral) {
    c.qkv_bias = c.o_bias = c.mlp_bias = false;
  } else {
    c.qkv_bias = c.o_bias = f.bool_or("attention_bias", false);
    c.mlp_bias = f.bool_or("mlp_bias", false);
  }

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
          f.fail("layer_types", fmt::format("must be a list of {} layer types, got {}",
                                            c.num_layers, excerpt(types)));
        for (int64_t i = 0; i < c.num_layers; ++i) {
          const json& t = types[i];
          if (t == "sliding_attention")
            c.sliding_window[i] = window;
          else if (t != "full_attention")
            f.fail("layer_types", fmt::format("[{}] must be \"full_attention\" or "
                                              "\"sliding_attention\", got {}",
                                              i, excerpt(t)));
        }
      } else {
        const int64_t from = f.positive_int_or("max_window_layers", 28);
        for (int64_t i = from; i < c.num_layers; ++i) c.sliding_window[i] = window;
      }
    }
  }
  parse_common_tail(f, c);
}

const char* default_architecture(const std::string& model_type) {
  if (model_type == "gpt2") return "GPT2LMHeadModel";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

std::string model_type_of_architecture(const std::string& arch) {
  if (arch.rfind("GPT2", 0) == 0) return "gpt2";
  if (arch.rfind("Llama", 0) == 0) return "llama";
  if (arch.rfind("Mistral", 0) == 0) return "mistral";
  if (arch.rfind("Qwen2", 0) == 0) return "qwen2";
  return "";
}

// Without blocking on a FIFO, refusing anything but a regular file (saying what it is).
std::string read_file(const std::string& path) {
  try {
    return fileio::read_small_file(path, 64ull << 20, "config.json");
  } catch (const FormatError& e) {
    throw ConfigError(
        fmt::format("{}: cannot read the config file: {} (rule {})", path, e.detail(), e.rule()));
  }
}

}  // namespace

const char* arch_name(Arch arch) {
  return arch == Arch::kGPT2 ? "gpt2" : "llama";
}

FamilyConfig parse_family_config(const json& config, const std::string& source) {
  if (!config.is_object())
    throw ConfigError(
        fmt::format("{}: a config.json must hold a JSON object, got {}", source, excerpt(config)));
  Fields f(config, source);
  FamilyConfig c;
  c.source = source;
  c.raw = config;
  std::string architecture;
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      f.fail("architectures", fmt::format("must be a list of class names, got {}", excerpt(a)));
    architecture = a[0].get<std::string>();
  }
  c.model_type = f.string_or("model_type", model_type_of_architecture(architecture));
  if (c.model_type.empty())
    f.fail("model_type", architecture.empty()
                             ? std::string("is missing (and there is no architectures list)")
                             : fmt::format("is missing and architecture {} is not one of the "
                                           "supported families",
                                           quote_text(architecture, '\'')));
  c.architecture = architecture.empty() ? default_architecture(c.model_type) : architecture;
  // Sizes derived by multiplication (the default n_inner, every parameter's elements and bytes)
  // must fit torch's int64 sizes: too large is a SizeOverflowError naming the file now, not an
  // error deep in a meta build.
  try {
    if (c.model_type == "gpt2") {
      parse_gpt2(f, c);
    } else if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
      parse_llama(f, c, source);
    } else {
      f.fail("model_type",
             fmt::format("{} is not supported (supported: gpt2, llama, mistral, qwen2)",
                         quote_text(c.model_type, '\'')));
    }
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
    if (e.rule() == "invalid-json")
      throw ConfigError(fmt::format("{}: invalid JSON: {}", source, e.detail()));
    throw ConfigError(fmt::format("{}: {} (rule {})", source, e.detail(), e.rule()));
  }
  return parse_family_config(config, source);
}

FamilyConfig load_family_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  if (!fileio::exists(file)) throw ConfigError(fmt::format("{}: no such config file", file));
  return parse_family_config_text(read_file(file), file);
}

FamilyConfig builtin_config(const std::string& name) {
  return parse_family_config_text(builtin_config_json(name), "builtin:" + name);
}

FamilyConfig resolve_family_config(const std::string& name_or_path) {
  if (is_builtin_config(name_or_path)) return builtin_config(name_or_path);
  std::error_code ec;
  if (std::filesystem::exists(name_or_path, ec)) return load_family_config(name_or_path);
  throw ConfigError(fmt::format(
      "{} is neither a built-in config ({}) nor a config.json file or a directory holding one",
      quote_path(name_or_path, '\''), join(builtin_config_names())));
}

}  // namespace metaload
