#include "loader/format/quant_scheme.h"

#include <algorithm>
#include <cctype>

#include "base/text.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

[[noreturn]] void bad_field(const std::string& file, const std::string& field,
                            const std::string& why) {
  throw QuantSchemeError(file, "", "invalid-field",
                         "quantization_config field " + quote_text(field) + " " + why);
}

// Optional fields: absent or null gives `fallback`. An integer past int64 (JSON allows any) is
// refused, never wrapped: 2^64 - 1 would read as -1.
int64_t int_field(const nlohmann::json& o, const char* key, int64_t fallback,
                  const std::string& file, const std::string& where = "") {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  if (!it->is_number_integer())
    bad_field(file, where + key, "is " + it->dump() + ", not an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX})
    bad_field(file, where + key, "is " + it->dump() + ", past the largest integer (2^63 - 1)");
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

// Enum-like strings the libraries lower-case before they compare (transformers' GPTQ format and
// AWQ version, compressed-tensors' type and strategy).
std::string lower_field(const nlohmann::json& o, const char* key, const std::string& fallback,
                        const std::string& file, const std::string& where = "") {
  std::string v = str_field(o, key, fallback, file, where);
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return v;
}

// `key` when the config has it (not null), else `alias` (transformers' legacy names).
const char* key_or_alias(const nlohmann::json& o, const char* key, const char* alias) {
  auto it = o.find(key);
  return it != o.end() && !it->is_null() ? key : alias;
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

// The bits field, checked against the values the library stores before it is narrowed to int.
int bits_field(const nlohmann::json& o, const char* key, int64_t fallback,
               std::initializer_list<int> allowed, const std::string& file, const char* method,
               const std::string& where = "") {
  const int64_t bits = int_field(o, key, fallback, file, where);
  if (std::find(allowed.begin(), allowed.end(), bits) == allowed.end()) {
    std::string list;
    for (int b : allowed) list += (list.empty() ? "" : ", ") + std::to_string(b);
    bad_field(file, where + key,
              "is " + std::to_string(bits) + "; " + method + " stores " + list + " bits");
  }
  return static_cast<int>(bits);
}

// GPTQ and AWQ group_size (transformers' GPTQConfig: "greater than 0 or equal to -1"; -1 is
// per-channel: one group spanning the row, stored here as 0).
int64_t group_field(const nlohmann::json& o, const char* key, const std::string& file) {
  const int64_t g = int_field(o, key, 128, file);
  if (g == 0 || g < -1) {
    bad_field(file, key,
              "is " + std::to_string(g) + "; it must be positive or -1 (one group per row)");
  }
  return g == -1 ? 0 : g;
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
  // transformers' BitsAndBytesConfig list, by torch name (the dtype is the format table's).
  static const char* const kStorage[] = {"uint8",    "int8",    "float16",
                                         "bfloat16", "float32", "float64"};
  auto it = std::find(std::begin(kStorage), std::end(kStorage), storage);
  if (it == std::end(kStorage)) {
    bad_field(
        file, "bnb_4bit_quant_storage",
        "is " + quote_text(storage) + ", not uint8, int8, float16, bfloat16, float32 or float64");
  }
  c.storage = *dtype_from_torch_attr(*it);
}

void parse_gptq(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  c.kind = QuantKind::kGptq;
  c.bits = bits_field(qc, "bits", 4, {2, 3, 4, 8}, file, "gptq");
  c.group_size = group_field(qc, "group_size", file);
  bool_field(qc, "desc_act", false, file);  // g_idx says the order; the type is still checked
  bool_field(qc, "sym", true, file);        // qzeros are stored either way
  // transformers reads "format" (default gptq), then the legacy "checkpoint_format" over it.
  const std::string key = key_or_alias(qc, "checkpoint_format", "format");
  const std::string fmt = lower_field(qc, key.c_str(), "gptq", file);
  if (fmt != "gptq" && fmt != "gptq_v2") {
    throw QuantSchemeError(
        file, "", "unsupported-scheme",
        "GPTQ " + key + " " + quote_text(fmt) + " is not supported (gptq, gptq_v2)");
  }
  c.gptq_v2 = fmt == "gptq_v2";
  c.blocks_only = true;
  add_names(qc, "modules_to_not_convert", file, c.skip_modules);
}

void parse_awq(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  c.kind = QuantKind::kAwq;
  c.bits = bits_field(qc, key_or_alias(qc, "bits", "w_bit"), 4, {4}, file, "awq");
  c.group_size = group_field(qc, key_or_alias(qc, "group_size", "q_group_size"), file);
  // transformers reads "format" (default gemm), then the legacy "version" over it.
  const std::string key = key_or_alias(qc, "version", "format");
  const std::string version = lower_field(qc, key.c_str(), "gemm", file);
  if (version != "gemm") {
    const bool known = version == "gemv" || version == "gemv_fast" || version == "llm-awq";
    if (!known) {
      bad_field(file, key, "is " + quote_text(version) + ", not gemm, gemv, gemv_fast or llm-awq");
    }
    throw QuantSchemeError(file, "", "unsupported-scheme",
                           "AWQ " + key + " " + quote_text(version) +
                               " is not supported (gemm: qweight packed along the output dim)");
  }
  c.zero_point = bool_field(qc, "zero_point", true, file);
  c.blocks_only = true;
  add_names(qc, "modules_to_not_convert", file, c.skip_modules);
}

void parse_fp8(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  c.kind = QuantKind::kFp8Block;
  c.bits = 8;
  c.zero_point = false;
  const std::string fmt = str_field(qc, "fmt", "e4m3", file);
  if (fmt != "e4m3") bad_field(file, "fmt", "is " + quote_text(fmt) + ", not e4m3");
  const std::string act = lower_field(qc, "activation_scheme", "dynamic", file);
  if (act != "dynamic" && act != "static") {
    bad_field(file, "activation_scheme", "is " + quote_text(act) + ", not dynamic or static");
  }
  const std::string scale_fmt = str_field(qc, "scale_fmt", "float", file);
  if (scale_fmt == "ue8m0") {
    throw QuantSchemeError(file, "", "unsupported-scheme",
                           "FP8 scale_fmt \"ue8m0\" (float8_e8m0fnu block scales) is not "
                           "supported; \"float\" is");
  }
  if (scale_fmt != "float") {
    bad_field(file, "scale_fmt", "is " + quote_text(scale_fmt) + ", not float or ue8m0");
  }
  // Absent: FineGrainedFP8Config's default [128, 128]; null: per-tensor scales.
  auto b = qc.find("weight_block_size");
  if (b == qc.end()) {
    c.block_rows = c.block_cols = 128;
  } else if (b->is_null()) {
    throw QuantSchemeError(file, "", "unsupported-scheme",
                           "FP8 with weight_block_size null (per-tensor scales) is not "
                           "supported; block-wise FP8 ([128, 128]) is");
  } else {
    if (!b->is_array() || b->size() != 2) {
      bad_field(file, "weight_block_size", "is " + b->dump() + ", not two positive integers");
    }
    int64_t dims[2];
    for (int i = 0; i < 2; ++i) {
      const nlohmann::json& d = (*b)[i];
      const bool fits = d.is_number_integer() &&
                        !(d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{INT64_MAX});
      dims[i] = fits ? d.get<int64_t>() : 0;
      if (dims[i] <= 0) {
        bad_field(file, "weight_block_size", "is " + b->dump() + ", not two positive integers");
      }
    }
    c.block_rows = dims[0];
    c.block_cols = dims[1];
  }
  add_names(qc, "modules_to_not_convert", file, c.skip_modules);
}

// compressed-tensors' QuantizationArgs rules for the weights' strategy and group_size: a strategy
// left out follows from group_size (none: tensor, > 0: group, -1: channel); group and
// tensor_group need a positive group_size, and a positive one needs one of them.
std::string ct_strategy(const nlohmann::json& w, const std::string& file, const std::string& where,
                        int64_t* group_size) {
  const bool stated = w.contains("group_size") && !w["group_size"].is_null();
  const int64_t g = int_field(w, "group_size", 0, file, where);
  const bool strategy_stated = w.contains("strategy") && !w["strategy"].is_null();
  if (stated && (g < -1 || (g == 0 && !strategy_stated))) {
    bad_field(file, where + "group_size",
              "is " + std::to_string(g) +
                  "; it must be positive (strategy group) or -1 (strategy channel)");
  }
  std::string s = lower_field(w, "strategy", "", file, where);
  if (s.empty()) s = !stated ? "tensor" : g > 0 ? "group" : "channel";
  static const char* kKnown[] = {"tensor", "channel",      "group",    "block",
                                 "token",  "tensor_group", "attn_head"};
  if (std::find(std::begin(kKnown), std::end(kKnown), s) == std::end(kKnown)) {
    bad_field(file, where + "strategy",
              "is " + quote_text(s) +
                  ", not tensor, channel, group, block, token, tensor_group or attn_head");
  }
  const bool grouped = s == "group" || s == "tensor_group";
  if (grouped && g <= 0) {
    bad_field(file, where + "group_size",
              (stated ? "is " + std::to_string(g) : std::string("is missing")) + "; strategy " + s +
                  " needs a positive group_size");
  }
  if (!grouped && g > 0) {
    bad_field(file, where + "group_size",
              "is " + std::to_string(g) + ", but strategy " + s +
                  " has no groups (a positive group_size needs strategy group)");
  }
  *group_size = grouped ? g : 0;
  return s;
}

// The one weight scheme of config_groups (several groups must agree on it) and the format the
// groups name; c.input_scale when activations are quantized per tensor group (NVFP4 W4A4).
const nlohmann::json& ct_weights(const nlohmann::json& qc, const std::string& file, QuantConfig& c,
                                 std::string* group_format) {
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty()) {
    bad_field(file, "config_groups", "is missing or empty");
  }
  const nlohmann::json* weights = nullptr;
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
      c.input_scale =
          lower_field(*a, "strategy", "", file, "config_groups." + name + ".input_activations.") ==
          "tensor_group";
    }
    *group_format = str_field(g, "format", "", file, "config_groups." + name + ".");
  }
  if (!weights) bad_field(file, "config_groups", "quantizes no weights");
  return *weights;
}

void parse_ct(const nlohmann::json& qc, const std::string& file, QuantConfig& c) {
  const std::string format = str_field(qc, "format", "", file);
  add_names(qc, "ignore", file, c.skip_modules);
  std::string group_format;
  const nlohmann::json& weights = ct_weights(qc, file, c, &group_format);
  const std::string f = !group_format.empty() ? group_format : format;
  const std::string where = "config_groups.*.weights.";
  const int64_t bits = int_field(weights, "num_bits", 8, file, where);
  const std::string type = lower_field(weights, "type", "int", file, where);
  if (type != "int" && type != "float") {
    bad_field(file, where + "type", "is " + quote_text(type) + ", not int or float");
  }
  const bool symmetric = bool_field(weights, "symmetric", true, file, where);
  const std::string strategy = ct_strategy(weights, file, where, &c.group_size);
  if (f == "pack-quantized") {
    c.kind = QuantKind::kCtPacked;
    if (type != "int") bad_field(file, where + "type", "is " + quote_text(type) + ", not int");
    if (bits < 1 || bits > 8) {
      bad_field(file, where + "num_bits",
                "is " + std::to_string(bits) + "; pack-quantized packs 1 to 8 bits");
    }
    if (strategy != "group" && strategy != "channel") {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "compressed-tensors pack-quantized with strategy " +
                                 quote_text(strategy) + " (group and channel are supported)");
    }
    c.zero_point = !symmetric;
  } else if (f == "nvfp4-pack-quantized") {
    c.kind = QuantKind::kCtNvfp4;
    if (type != "float" || bits != 4) {
      bad_field(file, where + "type", "must be float with num_bits 4 for nvfp4-pack-quantized");
    }
    if (strategy != "tensor_group" && strategy != "group") {
      bad_field(file, where + "strategy",
                "is " + quote_text(strategy) + "; NVFP4 scales groups (tensor_group)");
    }
    if (!symmetric) {
      throw QuantSchemeError(file, "", "unsupported-scheme",
                             "compressed-tensors nvfp4-pack-quantized with symmetric false (NVFP4 "
                             "stores no zero points)");
    }
    c.zero_point = false;
    c.scale_dtype = DType::F8_E4M3;
  } else {
    throw QuantSchemeError(file, "", "unknown-scheme",
                           "compressed-tensors format " + quote_text(f) +
                               " is not known (pack-quantized, nvfp4-pack-quantized)");
  }
  c.bits = static_cast<int>(bits);
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
    parse_gptq(qc, file, c);
  } else if (method == "awq") {
    parse_awq(qc, file, c);
  } else if (method == "fp8") {
    parse_fp8(qc, file, c);
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
