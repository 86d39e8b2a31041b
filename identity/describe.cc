#include "identity/describe.h"

#include <cmath>
#include <map>
#include <set>

#include "base/checked.h"
#include "base/text.h"
#include "identity/dtypes.h"
#include "identity/reference.h"
#include "identity/tp_degree.h"
#include "loader/format/quant_layout.h"

namespace metaload {
namespace {

std::string last_component(const std::string& name) {
  size_t dot = name.find_last_of('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The breakdown of a quantized checkpoint, and its TP degree on group boundaries.
void add_quantization(const QuantLayout& layout, uint64_t param_bytes, CheckpointInfo& info) {
  nlohmann::json q = to_json(layout);
  std::string limited_by;
  q["max_tp_size_unquantized"] =
      info.max_tp_size ? nlohmann::json(*info.max_tp_size) : nlohmann::json();
  info.max_tp_size = quant_max_tp_size(layout, info.max_tp_size, &limited_by);
  q["tp_limited_by"] = limited_by;
  q["unquantized_bytes"] = param_bytes - layout.weight_bytes - layout.aux_bytes;
  info.quantization = std::move(q);
}

}  // namespace

bool is_non_parameter_buffer(const TensorInfo& t) {
  const std::string leaf = last_component(t.name);
  const auto& s = t.shape;
  if (leaf == "bias" && s.size() == 4 && s[0] == 1 && s[1] == 1 && s[2] == s[3]) return true;
  if (leaf == "masked_bias" && s.empty()) return true;
  if (ends_with(t.name, "rotary_emb.inv_freq") && s.size() == 1) return true;
  return false;
}

CheckpointInfo describe_checkpoint(const Checkpoint& c, const std::optional<std::string>& dtype) {
  CheckpointInfo info;
  info.revision = c.revision;
  info.repo_id = c.repo_id;
  info.dir = c.dir;
  info.n_files = c.files.size();
  if (c.config_path) info.config = read_config_json(*c.config_path);
  // A quantized checkpoint: its layout decides which tensors are parameters and how many
  // logical elements a packed weight holds.
  std::optional<QuantLayout> layout;
  std::set<std::string> aux;
  std::map<std::string, uint64_t> logical;
  if (info.config) {
    if (auto qc = find_quant_config(*info.config)) {
      layout = recognise_quantized(c, parse_quant_config(*qc, *c.config_path), *c.config_path);
      aux = aux_tensor_names(*layout);
      for (const auto& m : layout->modules) logical[m.weight_tensor] = m.n_params;
    }
  }
  uint64_t n_params = 0, param_bytes = 0;
  std::optional<DType> stored;
  bool mixed = false;
  // Sums over every file of a checkpoint: each term is bounded by its file, the sums are not.
  for (const auto& f : c.files) {
    for (const auto& t : f.tensors) {
      ++info.n_tensors;
      info.stored_bytes =
          checked_add<uint64_t>(info.stored_bytes, t.nbytes(), "stored bytes of the checkpoint");
      if (is_non_parameter_buffer(t)) {
        info.n_buffer_elements =
            checked_add<uint64_t>(info.n_buffer_elements, static_cast<uint64_t>(t.numel()),
                                  "buffer elements of the checkpoint");
        continue;
      }
      // Scales, zero points, absmax, quant maps and blobs are stored bytes, not parameters.
      param_bytes =
          checked_add<uint64_t>(param_bytes, t.nbytes(), "parameter bytes of the checkpoint");
      if (aux.count(t.name)) continue;
      auto packed = logical.find(t.name);
      const uint64_t elements =
          packed != logical.end() ? packed->second : static_cast<uint64_t>(t.numel());
      n_params = checked_add<uint64_t>(n_params, elements, "parameter count of the checkpoint");
      if (stored && *stored != t.dtype) mixed = true;
      stored = t.dtype;
    }
  }
  info.n_params = n_params;
  if (dtype) {
    const DTypeEntry& e = resolve_dtype_name(*dtype);
    // Every table entry is a whole number of bits per element, so the ceiling is exact integer
    // math.
    const uint64_t bits = static_cast<uint64_t>(std::llround(e.bytes_per_element * 8));
    const std::string what =
        "size in bytes of " + std::to_string(n_params) + " parameters as " + quote_text(*dtype);
    const uint64_t whole = checked_mul<uint64_t>(n_params / 8, bits, what);
    info.size_bytes = checked_add<uint64_t>(whole, (n_params % 8 * bits + 7) / 8, what);
    info.dtype = *dtype;
  } else {
    info.size_bytes = param_bytes;
    info.dtype = layout   ? quant_kind_name(layout->config.kind)
                 : mixed  ? "mixed"
                 : stored ? dtype_name(*stored)
                          : "none";
  }
  if (info.config && info.config->is_object()) {
    try {
      info.max_tp_size = max_tp_size(*info.config);
    } catch (const Error&) {
      // An odd config field leaves the TP degree unknown; describe still succeeds.
    }
  }
  if (layout) add_quantization(*layout, param_bytes, info);
  return info;
}

CheckpointInfo describe_checkpoint(const std::string& ref_or_key,
                                   const std::optional<std::string>& dtype,
                                   const std::optional<std::string>& revision,
                                   const KeyOptions& keys) {
  // Validate the dtype before touching any file, so a typo fails fast.
  if (dtype) resolve_dtype_name(*dtype);
  return describe_checkpoint(
      open_checkpoint(resolve_reference(ref_or_key, revision, keys).checkpoint), dtype);
}

nlohmann::json to_json(const CheckpointInfo& i) {
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(); };
  return {{"size_bytes", opt(i.size_bytes)},
          {"n_params", opt(i.n_params)},
          {"config", i.config ? *i.config : nlohmann::json()},
          {"revision", opt(i.revision)},
          {"dtype", i.dtype},
          {"repo_id", opt(i.repo_id)},
          {"dir", i.dir},
          {"n_files", i.n_files},
          {"n_tensors", i.n_tensors},
          {"n_buffer_elements", i.n_buffer_elements},
          {"stored_bytes", i.stored_bytes},
          {"max_tp_size", opt(i.max_tp_size)},
          {"quantization", i.quantization ? *i.quantization : nlohmann::json()}};
}

}  // namespace metaload
