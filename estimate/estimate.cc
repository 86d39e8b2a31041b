#include "estimate/estimate.h"

#include <cmath>
#include <regex>

#include "base/checked.h"
#include "base/text.h"
#include "identity/checkpoint_shapes.h"
#include "identity/config_fields.h"
#include "identity/describe.h"
#include "identity/dtypes.h"
#include "identity/tp_degree.h"
#include "loader/format/file_io.h"
#include "loader/tp/quant_split.h"

namespace metaload {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

uint64_t bytes_of(DType d) {
  return static_cast<uint64_t>(dtype_bits(d) / 8);
}

// The torch name bitsandbytes writes into its quant_state blob ("bfloat16").
const char* torch_name(DType d) {
  switch (d) {
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "bfloat16";
    case DType::F64:
      return "float64";
    default:
      return "float32";
  }
}

std::string leaf_of(const std::string& module) {
  const size_t dot = module.find_last_of('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

// Matches a skip entry against a module name as the libraries do: the name itself, a dotted
// component run of it ("lm_head", "mlp.gate"), or "re:<regex>" matched from the start
// (compressed-tensors' ignore).
bool skip_matches(const std::string& entry, const std::string& module) {
  if (entry.rfind("re:", 0) == 0) {
    try {
      return std::regex_search(module, std::regex(entry.substr(3)),
                               std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;
    }
  }
  const std::string m = "." + module + ".";
  return m.find("." + entry + ".") != std::string::npos;
}

// Whether a layer index is in the module path (model.layers.3.mlp.up_proj): the repeated blocks
// GPTQ and AWQ quantize.
bool in_repeated_block(const std::string& module) {
  size_t start = 0;
  while (start < module.size()) {
    size_t dot = module.find('.', start);
    std::string part =
        module.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos &&
        dot != std::string::npos) {
      return true;
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return false;
}

bool is_linear_weight(const TensorSpec& t, const QuantConfig& cfg) {
  if (!ends_with(t.name, ".weight") || t.shape.size() != 2) return false;
  const std::string module = t.name.substr(0, t.name.size() - 7);
  const std::string leaf = leaf_of(module);
  // Embeddings and the output head are no quantizer's linear layers by default.
  if (leaf.find("embed") != std::string::npos || leaf == "wte" || leaf == "wpe" ||
      leaf == "lm_head" || leaf == "embed_out") {
    return false;
  }
  for (const auto& s : cfg.skip_modules) {
    if (skip_matches(s, module)) return false;
  }
  if (cfg.blocks_only && !in_repeated_block(module)) return false;
  return true;
}

// The blob bitsandbytes stores: json.dumps of its quant_state. The only field whose length
// varies is nested_offset (a float's repr; 19 characters typical, e.g. 0.05210280418395996).
uint64_t bnb_blob_bytes(const QuantConfig& cfg, DType source, int64_t out, int64_t in) {
  std::string s = "{\"quant_type\": \"" + cfg.quant_type +
                  "\", \"blocksize\": " + std::to_string(cfg.blocksize) + ", \"dtype\": \"" +
                  torch_name(source) + "\", \"shape\": [" + std::to_string(out) + ", " +
                  std::to_string(in) + "]";
  if (cfg.double_quant) {
    s += ", \"nested_blocksize\": " + std::to_string(cfg.nested_blocksize) +
         ", \"nested_dtype\": \"float32\", \"nested_offset\": 0.05210280418395996";
  }
  return s.size() + 1;
}

[[noreturn]] void refuse(const std::string& file, const std::string& tensor,
                         const std::string& why) {
  throw QuantSchemeError(file, tensor, "not-quantizable", why);
}

// Fills m's weight and aux bytes for a [out, in] weight stored as `source`. Every product is
// checked: shapes may come from a hostile config.json.
void size_module(const QuantConfig& cfg, DType source, const std::string& file,
                 const std::string& tensor, QuantModule& m) {
  const std::string what = "estimated bytes of " + tensor;
  auto mul = [&](uint64_t a, uint64_t b) { return checked_mul(a, b, what); };
  auto aux = [&](uint64_t b) { m.aux_bytes = checked_add(m.aux_bytes, b, what); };
  const uint64_t out = static_cast<uint64_t>(m.out), in = static_cast<uint64_t>(m.in);
  const uint64_t n = mul(out, in);
  const uint64_t bits = static_cast<uint64_t>(cfg.bits);
  const uint64_t g = cfg.group_size > 0 ? ceil_div(in, cfg.group_size) : 1;
  auto need_group = [&] {
    if (cfg.group_size > 0 && in % cfg.group_size != 0) {
      refuse(file, tensor,
             std::to_string(in) + " inputs are not a multiple of the group size " +
                 std::to_string(cfg.group_size));
    }
  };
  auto need_out_pack = [&] {
    if (mul(out, bits) % 32 != 0) {
      refuse(file, tensor, std::to_string(out) + " outputs do not pack into int32 columns");
    }
  };
  switch (cfg.kind) {
    case QuantKind::kBnb4: {
      const uint64_t per_elem = 2 * bytes_of(cfg.storage);
      m.weight_bytes = mul(ceil_div(n, per_elem), bytes_of(cfg.storage));
      const uint64_t blocks = ceil_div(n, cfg.blocksize);
      if (cfg.double_quant) {
        aux(blocks);  // absmax, 8-bit
        aux(mul(4, ceil_div(blocks, cfg.nested_blocksize)) + 4 * 256);
      } else {
        aux(mul(4, blocks));
      }
      aux(4 * 16 + bnb_blob_bytes(cfg, source, m.out, m.in));
      return;
    }
    case QuantKind::kBnb8:
      m.weight_bytes = n;
      aux(mul(4, out) + 1);  // SCB, weight_format
      return;
    case QuantKind::kGptq:
      if (mul(in, bits) % 32 != 0) {
        refuse(file, tensor,
               std::to_string(in) + " inputs do not pack into int32 rows of " +
                   std::to_string(bits) + "-bit values");
      }
      need_out_pack();
      m.weight_bytes = mul(mul(in * bits / 32, out), 4);
      aux(mul(mul(g, out * bits / 32), 4));  // qzeros
      aux(mul(mul(g, out), 2));              // scales, F16
      aux(mul(in, 4));                       // g_idx
      return;
    case QuantKind::kAwq:
      need_group();
      need_out_pack();
      m.weight_bytes = mul(mul(in, out * bits / 32), 4);
      aux(mul(mul(g, out * bits / 32), 4));  // qzeros
      aux(mul(mul(g, out), 2));              // scales, F16
      return;
    case QuantKind::kFp8Block:
      m.weight_bytes = n;
      aux(mul(mul(ceil_div(out, cfg.block_rows), ceil_div(in, cfg.block_cols)), 4));
      return;
    case QuantKind::kCtPacked:
      need_group();
      m.weight_bytes = mul(mul(out, ceil_div(mul(in, bits), 32)), 4);
      aux(mul(mul(out, g), bytes_of(source)) + 16);  // weight_scale (model dtype), weight_shape
      if (cfg.zero_point) aux(mul(mul(ceil_div(mul(out, bits), 32), g), 4));
      return;
    case QuantKind::kCtNvfp4:
      need_group();
      m.weight_bytes = n / 2;
      aux(mul(out, g) + 4 + (cfg.input_scale ? 4 : 0));  // scales, global scales
      return;
  }
}

}  // namespace

QuantEstimate estimate_tensors(const std::vector<TensorSpec>& tensors,
                               const nlohmann::json& model_config, const QuantConfig& cfg,
                               const std::string& file) {
  QuantEstimate e;
  e.layout.config = cfg;
  const bool conv1d = config_model_type(model_config) == "gpt2";
  for (const auto& t : tensors) {
    const uint64_t numel = static_cast<uint64_t>(TensorInfo{t.name, t.dtype, t.shape}.numel());
    e.n_params = checked_add(e.n_params, numel, "parameters");
    const uint64_t bytes = t.nbytes();
    e.source_bytes = checked_add(e.source_bytes, bytes, "source bytes");
    if (!is_linear_weight(t, cfg)) {
      e.unquantized_bytes = checked_add(e.unquantized_bytes, bytes, "unquantized bytes");
      continue;
    }
    QuantModule m;
    m.name = t.name.substr(0, t.name.size() - 7);
    m.weight_tensor = t.name;
    // GPT-2's Conv1D stores [in, out]; Linear stores [out, in].
    m.out = conv1d ? t.shape[1] : t.shape[0];
    m.in = conv1d ? t.shape[0] : t.shape[1];
    m.n_params = numel;
    size_module(cfg, t.dtype, file, t.name, m);
    e.layout.weight_bytes = checked_add(e.layout.weight_bytes, m.weight_bytes, "weight bytes");
    e.layout.aux_bytes = checked_add(e.layout.aux_bytes, m.aux_bytes, "aux bytes");
    e.layout.n_quantized_params = checked_add(e.layout.n_quantized_params, numel, "parameters");
    e.layout.modules.push_back(std::move(m));
  }
  e.size_bytes = checked_add(e.unquantized_bytes,
                             checked_add(e.layout.weight_bytes, e.layout.aux_bytes, "bytes"),
                             "estimated bytes");
  if (model_config.is_object()) {
    try {
      e.max_tp_size_unquantized = max_tp_size(model_config);
    } catch (const ConfigError&) {
      // An odd config field leaves the TP degree unknown, as in describe.
    }
    e.max_tp_size = quant_max_tp_size(e.layout, e.max_tp_size_unquantized, &e.tp_limited_by);
  }
  return e;
}

QuantEstimate estimate_quantized(const std::string& ref, const std::string& scheme,
                                 const std::optional<std::string>& revision,
                                 const KeyOptions& keys) {
  std::string table;
  // The scheme first: a typo fails before any file is read.
  const QuantConfig cfg = resolve_quant_scheme(scheme, &table);
  std::vector<TensorSpec> tensors;
  nlohmann::json config;
  std::string file, source;
  const bool config_file =
      fileio::is_file(ref) && ends_with(ref, ".json") && !ends_with(ref, ".index.json");
  const bool config_dir = fileio::is_dir(ref) && fileio::is_file(ref + "/config.json") &&
                          !fileio::exists(ref + "/model.safetensors") &&
                          !fileio::exists(ref + "/model.safetensors.index.json");
  if (config_file || config_dir) {
    file = config_file ? ref : ref + "/config.json";
    config = read_config_json(file);
    // transformers >= 4.56 writes "dtype", older versions "torch_dtype".
    const ConfigFields fields(config, file);
    const std::string dt = fields.string_or("torch_dtype", fields.string_or("dtype", "float32"));
    const DTypeEntry& entry = resolve_dtype_name(dt);
    if (!entry.file_dtype) {
      throw QuantSchemeError(file, "", "invalid-field",
                             "torch_dtype " + quote_text(dt) + " is no dtype a checkpoint stores");
    }
    tensors = checkpoint_tensor_specs(config, *entry.file_dtype, false, file);
    source = "config";
  } else {
    const Checkpoint c = open_checkpoint(resolve_reference(ref, revision, keys).checkpoint);
    if (c.config_path) config = read_config_json(*c.config_path);
    if (auto qc = find_quant_config(config)) {
      throw QuantSchemeError(c.config_path ? *c.config_path : ref, "", "already-quantized",
                             "the checkpoint is already quantized (quant_method " +
                                 qc->value("quant_method", std::string("?")) +
                                 "); describe it for its exact size");
    }
    file = c.files.empty() ? c.dir : c.files.front().path;
    for (const auto& f : c.files) {
      for (const auto& t : f.tensors) {
        if (is_non_parameter_buffer(t)) continue;
        tensors.push_back({t.name, t.dtype, t.shape});
      }
    }
    source = "checkpoint";
  }
  QuantEstimate e = estimate_tensors(tensors, config, cfg, file);
  e.scheme = scheme.find('{') == std::string::npos ? scheme : "custom";
  e.table_name = table;
  e.source = source;
  const DTypeEntry& t = resolve_dtype_name(table);
  const uint64_t bits = static_cast<uint64_t>(std::llround(t.bytes_per_element * 8));
  e.table_bytes = checked_add(checked_mul<uint64_t>(e.n_params / 8, bits, "table bytes"),
                              (e.n_params % 8 * bits + 7) / 8, "table bytes");
  return e;
}

nlohmann::json to_json(const QuantEstimate& e) {
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(); };
  nlohmann::json layout = to_json(e.layout);
  const double exact = static_cast<double>(e.size_bytes);
  return {{"scheme", e.scheme},
          {"size_bytes", e.size_bytes},
          {"n_params", e.n_params},
          {"unquantized_bytes", e.unquantized_bytes},
          {"source_bytes", e.source_bytes},
          {"table_name", e.table_name},
          {"table_bytes", e.table_bytes},
          {"table_error", exact > 0 ? (static_cast<double>(e.table_bytes) - exact) / exact : 0.0},
          {"max_tp_size", opt(e.max_tp_size)},
          {"max_tp_size_unquantized", opt(e.max_tp_size_unquantized)},
          {"tp_limited_by", e.tp_limited_by},
          {"source", e.source},
          {"quantization", layout}};
}

}  // namespace metaload
