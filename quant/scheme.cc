#include "quant/scheme.h"

#include <algorithm>

#include "base/text.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

[[noreturn]] void bad_field(const std::string& file, const std::string& field,
                            const std::string& why) {
  throw QuantSchemeError(file, "", "invalid-field",
                         "quantization_config field " + quote_text(field) + " " + why);
}

// Optional fields: absent or null gives `fallback`.
int64_t int_field(const nlohmann::json& o, const char* key, int64_t fallback,
                  const std::string& file, const std::string& where = "") {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  if (!it->is_number_integer())
    bad_field(file, where + key, "is " + it->dump() + ", not an integer");
  return it->get<int64_t>();
}

bool bool_field(const nlohmann::json& o, const char* key, bool fallback, const std::string& file,
                const std::string& where = "") {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad_field(file, where + key, "is " + it->dump() + ", not true or false");
  return it->get<bool>();
}

std::string str_field(const nlohmann::json& o, const char* key, const std::string& fallback,
                      const std::string& file, const std::string& where = "") {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  if (!it->is_string()) bad_field(file, where + key, "is " + it->dump() + ", not a string");
  return it->get<std::string>();
}

void add_names(const nlohmann::json& o, const char* key, const std::string& file,
               std::vector<std::string>& out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return;
  if (!it->is_array()) bad_field(file, key, "is " + it->dump() + ", not a list of module names");
  for (const auto& v : *it) {
    if (!v.is_string()) bad_field(file, key, "holds " + v.dump() + ", not a module name");
    out.push_back(v.get<std::string>());
  }
}

void check_bits(const QuantConfig& c, std::initializer_list<int> allowed, const std::string& file,
                const char* field) {
  if (std::find(allowed.begin(), allowed.end(), c.bits) == allowed.end()) {
    std::string list;
    for (int b : allowed) list += (list.empty() ? "" : ", ") + std::to_string(b);
    bad_field(file, field,
              "is " + std::to_string(c.bits) + "; " + c.method + " stores " + list + " bits");
  }
}

void check_group(const QuantConfig& c, const std::string& file, const char* field) {
  if (c.group_size < 0) bad_field(file, field, "must be positive or -1 (one group per row)");
}

void parse_bnb(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  const bool four =
      bool_field(qc, "load_in_4bit", false, file) || bool_field(qc, "_load_in_4bit", false, file);
  const bool eight =
      bool_field(qc, "load_in_8bit", false, file) || bool_field(qc, "_load_in_8bit", false, file);
  if (four == eight) {
    throw QuantSchemeError(file, "", "invalid-field",
                           "bitsandbytes quantization_config must set exactly one of "
                           "load_in_4bit and load_in_8bit");
  }
  add_names(qc, "llm_int8_skip_modules", file, c.skip_modules);
  if (eight) {
    c.kind = QuantKind::kBnb8;
    c.bits = 8;
    c.zero_point = false;
    return;
  }
  c.kind = QuantKind::kBnb4;
  c.bits = 4;
  c.zero_point = false;
  c.quant_type = str_field(qc, "bnb_4bit_quant_type", "fp4", file);
  c.quant_type_stated = qc.contains("bnb_4bit_quant_type") && !qc["bnb_4bit_quant_type"].is_null();
  if (c.quant_type != "nf4" && c.quant_type != "fp4") {
    bad_field(file, "bnb_4bit_quant_type", "is " + quote_text(c.quant_type) + ", not nf4 or fp4");
  }
  c.double_quant = bool_field(qc, "bnb_4bit_use_double_quant", false, file);
  const std::string storage = str_field(qc, "bnb_4bit_quant_storage", "uint8", file);
  static const std::pair<const char*, DType> kStorage[] = {
      {"uint8", DType::U8},      {"int8", DType::I8},     {"float16", DType::F16},
      {"bfloat16", DType::BF16}, {"float32", DType::F32},
  };
  auto it = std::find_if(std::begin(kStorage), std::end(kStorage),
                         [&](const auto& p) { return storage == p.first; });
  if (it == std::end(kStorage)) {
    bad_field(file, "bnb_4bit_quant_storage",
              "is " + quote_text(storage) + ", not uint8, int8, float16, bfloat16 or float32");
  }
  c.storage = it->second;
}

void parse_ct(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  const std::string format = str_field(qc, "format", "", file);
  add_names(qc, "ignore", file, c.skip_modules);
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty()) {
    bad_field(file, "config_groups", "is missing or empty");
  }
  // One weight scheme for the whole model: several groups must agree on it.
  const nlohmann::json* weights = nullptr;
  std::string group_format;
  for (const auto& [name, g] : groups->items()) {
    if (!g.is_object()) bad_field(file, "config_groups." + name, "is not an object");
    auto w = g.find("weights");
    if (w == g.end() || w->is_null()) continue;
    if (!w->is_object()) bad_field(file, "config_groups." + name + ".weights", "is not an object");
    if (weights && *weights != *w) {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "compressed-tensors config_groups with different weight schemes "
                             "are not supported (group " +
                                 quote_text(name) + " differs)");
    }
    weights = &*w;
    auto a = g.find("input_activations");
    if (a != g.end() && a->is_object()) {
      c.input_scale = str_field(*a, "strategy", "", file,
                                "config_groups." + name + ".input_activations.") == "tensor_group";
    }
    group_format = str_field(g, "format", "", file, "config_groups." + name + ".");
  }
  if (!weights) bad_field(file, "config_groups", "quantizes no weights");
  const std::string f = !group_format.empty() ? group_format : format;
  const std::string where = "config_groups.*.weights.";
  c.bits = static_cast<int>(int_field(*weights, "num_bits", 8, file, where));
  const std::string type = str_field(*weights, "type", "int", file, where);
  const std::string strategy = str_field(*weights, "strategy", "tensor", file, where);
  const bool symmetric = bool_field(*weights, "symmetric", true, file, where);
  c.group_size = int_field(*weights, "group_size", 0, file, where);
  if (f == "pack-quantized") {
    c.kind = QuantKind::kCtPacked;
    if (type != "int") bad_field(file, where + "type", "is " + quote_text(type) + ", not int");
    if (c.bits < 1 || c.bits > 8) bad_field(file, where + "num_bits", "must be 1 to 8");
    if (strategy == "channel") {
      c.group_size = 0;
    } else if (strategy == "group") {
      if (c.group_size <= 0) bad_field(file, where + "group_size", "must be positive");
    } else {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "compressed-tensors pack-quantized with strategy " +
                                 quote_text(strategy) + " (group and channel are supported)");
    }
    c.zero_point = !symmetric;
  } else if (f == "nvfp4-pack-quantized") {
    c.kind = QuantKind::kCtNvfp4;
    if (type != "float" || c.bits != 4) {
      bad_field(file, where + "type", "must be float with num_bits 4 for nvfp4-pack-quantized");
    }
    if (c.group_size <= 0) c.group_size = 16;
    c.zero_point = false;
    c.scale_dtype = DType::F8_E4M3;
  } else {
    throw QuantSchemeError(file, "", "unknown-scheme",
                           "compressed-tensors format " + quote_text(f) +
                               " is not known (pack-quantized, nvfp4-pack-quantized)");
  }
}

}  // namespace

const char* quant_kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::kBnb4:
      return "bnb-4bit";
    case QuantKind::kBnb8:
      return "bnb-int8";
    case QuantKind::kGptq:
      return "gptq";
    case QuantKind::kAwq:
      return "awq";
    case QuantKind::kFp8Block:
      return "fp8-block";
    case QuantKind::kCtPacked:
      return "ct-pack-quantized";
    case QuantKind::kCtNvfp4:
      return "ct-nvfp4";
  }
  return "?";
}

std::optional<nlohmann::json> find_quant_config(const nlohmann::json& config) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find("quantization_config");
  if (it != config.end() && !it->is_null()) return *it;
  auto tc = config.find("text_config");
  if (tc != config.end() && tc->is_object()) {
    auto q = tc->find("quantization_config");
    if (q != tc->end() && !q->is_null()) return *q;
  }
  return std::nullopt;
}

QuantConfig parse_quant_config(const nlohmann::json& qc, const std::string& file) {
  if (!qc.is_object()) {
    throw QuantSchemeError(
        file, "", "invalid-field",
        "quantization_config is " + qc.dump().substr(0, 80) + ", not a JSON object");
  }
  QuantConfig c;
  c.source = qc;
  std::string method = str_field(qc, "quant_method", "", file);
  // Configs written before transformers named the method carry load_in_4bit / load_in_8bit only.
  if (method.empty() && (qc.contains("load_in_4bit") || qc.contains("load_in_8bit"))) {
    method = "bitsandbytes";
  }
  c.method = method;
  if (method == "bitsandbytes") {
    parse_bnb(qc, file, c);
  } else if (method == "gptq") {
    c.kind = QuantKind::kGptq;
    c.bits = static_cast<int>(int_field(qc, "bits", 4, file));
    check_bits(c, {2, 3, 4, 8}, file, "bits");
    c.group_size = int_field(qc, "group_size", 128, file);
    check_group(c, file, "group_size");
    if (c.group_size == -1) c.group_size = 0;
    const std::string fmt = str_field(qc, "checkpoint_format", "gptq", file);
    if (fmt != "gptq" && fmt != "gptq_v2") {
      throw QuantSchemeError(
          file, "", "unsupported-scheme",
          "GPTQ checkpoint_format " + quote_text(fmt) + " is not supported (gptq, gptq_v2)");
    }
    c.gptq_v2 = fmt == "gptq_v2";
    c.blocks_only = true;
    add_names(qc, "modules_to_not_convert", file, c.skip_modules);
  } else if (method == "awq") {
    c.kind = QuantKind::kAwq;
    c.bits = static_cast<int>(int_field(qc, "bits", int_field(qc, "w_bit", 4, file), file));
    check_bits(c, {4}, file, "bits");
    c.group_size = int_field(qc, "group_size", int_field(qc, "q_group_size", 128, file), file);
    check_group(c, file, "group_size");
    if (c.group_size == -1) c.group_size = 0;
    std::string version = str_field(qc, "version", "gemm", file);
    std::transform(version.begin(), version.end(), version.begin(), ::tolower);
    if (version != "gemm") {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "AWQ version " + quote_text(version) +
                                 " is not supported (gemm: qweight packed along the output dim)");
    }
    c.zero_point = bool_field(qc, "zero_point", true, file);
    c.blocks_only = true;
    add_names(qc, "modules_to_not_convert", file, c.skip_modules);
  } else if (method == "fp8") {
    c.kind = QuantKind::kFp8Block;
    c.bits = 8;
    c.zero_point = false;
    const std::string fmt = str_field(qc, "fmt", "e4m3", file);
    if (fmt != "e4m3") bad_field(file, "fmt", "is " + quote_text(fmt) + ", not e4m3");
    auto b = qc.find("weight_block_size");
    if (b == qc.end() || b->is_null()) {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "FP8 without weight_block_size (per-tensor scales) is not "
                             "supported; block-wise FP8 ([128, 128]) is");
    }
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
        !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 ||
        (*b)[1].get<int64_t>() <= 0) {
      bad_field(file, "weight_block_size", "is " + b->dump() + ", not two positive integers");
    }
    c.block_rows = (*b)[0].get<int64_t>();
    c.block_cols = (*b)[1].get<int64_t>();
    add_names(qc, "modules_to_not_convert", file, c.skip_modules);
  } else if (method == "compressed-tensors") {
    parse_ct(qc, file, c);
  } else {
    throw QuantSchemeError(file, "", "unknown-scheme",
                           "quant_method " + quote_text(method) +
                               " is not known (bitsandbytes, gptq, awq, fp8, compressed-tensors)");
  }
  return c;
}

const std::vector<QuantPreset>& quant_presets() {
  // Each library's defaults: transformers' BitsAndBytesConfig (blocksize 64, nested 256),
  // GPTQConfig / AutoGPTQ (group 128, desc_act false, sym), AutoAWQ (GEMM, group 128, zero point),
  // FineGrainedFP8Config (128 x 128), compressed-tensors' W4A16 / W4A16_ASYM / W8A16 / NVFP4
  // presets (W8A16 is int8 in groups of 128 too) with llm-compressor's usual ignore=["lm_head"].
  static const std::vector<QuantPreset> presets = {
      {"bnb-nf4", "nf4",
       R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"})"},
      {"bnb-nf4-dq", "nf4",
       R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_use_double_quant": true})"},
      {"bnb-fp4", "fp4",
       R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "fp4"})"},
      {"bnb-fp4-dq", "fp4",
       R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "fp4",
           "bnb_4bit_use_double_quant": true})"},
      {"bnb-int8", "int8", R"({"quant_method": "bitsandbytes", "load_in_8bit": true})"},
      {"gptq-int4", "int4",
       R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true})"},
      {"gptq-int8", "int8",
       R"({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": false, "sym": true})"},
      {"awq-int4", "int4",
       R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
           "zero_point": true})"},
      {"fp8-block", "fp8",
       R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
           "weight_block_size": [128, 128]})"},
      {"ct-w4a16", "int4",
       R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4,
           "type": "int", "strategy": "group", "group_size": 128, "symmetric": true}}}})"},
      {"ct-w4a16-asym", "int4",
       R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4,
           "type": "int", "strategy": "group", "group_size": 128, "symmetric": false}}}})"},
      {"ct-w8a16", "int8",
       R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8,
           "type": "int", "strategy": "group", "group_size": 128, "symmetric": true}}}})"},
      {"ct-nvfp4", "fp4",
       R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
           "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
           "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
           "group_size": 16, "symmetric": true}, "input_activations": {"num_bits": 4,
           "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}}}})"},
      {"ct-nvfp4a16", "fp4",
       R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
           "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
           "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
           "group_size": 16, "symmetric": true}}}})"},
  };
  return presets;
}

QuantConfig resolve_quant_scheme(const std::string& name_or_json, std::string* table_name) {
  for (const auto& p : quant_presets()) {
    if (name_or_json == p.name) {
      if (table_name) *table_name = p.table_name;
      return parse_quant_config(nlohmann::json::parse(p.config), "estimate");
    }
  }
  const auto first = name_or_json.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && name_or_json[first] == '{') {
    nlohmann::json qc;
    try {
      qc = parse_json_strict(name_or_json, "estimate");
    } catch (const FormatError& e) {
      throw QuantSchemeError("estimate", "", "invalid-field",
                             "the scheme is not valid JSON: " + e.detail());
    }
    QuantConfig c = parse_quant_config(qc, "estimate");
    if (table_name) {
      *table_name = c.kind == QuantKind::kBnb4 ? c.quant_type
                    : c.kind == QuantKind::kFp8Block || c.kind == QuantKind::kBnb8
                        ? (c.kind == QuantKind::kBnb8 ? "int8" : "fp8")
                    : c.kind == QuantKind::kCtNvfp4 ? "fp4"
                    : c.bits == 8                   ? "int8"
                                                    : "int4";
    }
    return c;
  }
  std::vector<std::string> names;
  for (const auto& p : quant_presets()) names.push_back(p.name);
  throw QuantSchemeError("estimate", "", "unknown-scheme",
                         "scheme " + quote_text(name_or_json) +
                             " is not known; presets: " + capped_list(names, ", ", 100) +
                             ", or a quantization_config JSON object");
}

}  // namespace metaload
