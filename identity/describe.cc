#include "identity/describe.h"

#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "base/checked.h"
#include "base/text.h"
#include "identity/dtypes.h"
#include "identity/errors.h"
#include "identity/reference.h"
#include "identity/tp_degree.h"
#include "loader/errors.h"
#include "loader/format/quant_layout.h"
#include "loader/tp/quant_split.h"

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

// Where an expert tensor belongs: its MoE layer (the name up to ".experts") and, in the
// per-expert layout, its expert's index (absent for a fused tensor, whose dimension 0 is the
// experts).
struct ExpertName {
  std::string layer;
  std::optional<int64_t> index;
};

// The digits of `s` from `at` as an index, when they run to the next '.' (at most 9 of them).
std::optional<int64_t> index_at(const std::string& s, size_t at) {
  size_t e = at;
  while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
  if (e == at || e - at > 9 || e >= s.size() || s[e] != '.') return std::nullopt;
  return std::stoll(s.substr(at, e - at));
}

std::optional<ExpertName> expert_name(const std::string& name) {
  static const std::string kExperts = ".experts.";
  const size_t at = name.find(kExperts);
  if (at != std::string::npos) {
    const std::string layer = name.substr(0, at + kExperts.size() - 1);
    const size_t rest = at + kExperts.size();
    if (auto i = index_at(name, rest)) return ExpertName{layer, i};
    // Switch-style "experts.expert_3.wi.weight".
    if (name.compare(rest, 7, "expert_") == 0) {
      if (auto i = index_at(name, rest + 7)) return ExpertName{layer, i};
    }
    if (rest < name.size() && std::isdigit(static_cast<unsigned char>(name[rest])))
      return std::nullopt;
    return ExpertName{layer, std::nullopt};
  }
  // Granite-MoE stores its experts fused under other names.
  for (const char* fused :
       {".block_sparse_moe.input_linear.", ".block_sparse_moe.output_linear."}) {
    const size_t f = name.find(fused);
    if (f != std::string::npos)
      return ExpertName{name.substr(0, f + std::string(".block_sparse_moe").size()), std::nullopt};
  }
  return std::nullopt;
}

bool is_shared_expert(const std::string& name) {
  return name.find(".shared_expert.") != std::string::npos ||
         name.find(".shared_experts.") != std::string::npos;
}

// Collects the expert tensors of a checkpoint's headers, then checks them against config.json.
class MoeScan {
 public:
  // `params`: the tensor's logical parameters (0 for scales, zero points and other aux tensors).
  void add(const std::string& file, const TensorInfo& t, uint64_t params) {
    if (is_shared_expert(t.name)) {
      shared_seen_ = true;
      shared_params_ = checked_add<uint64_t>(shared_params_, params, "shared expert parameters");
    }
    auto e = expert_name(t.name);
    if (!e) return;
    Layer& l = layers_[e->layer];
    l.params = checked_add<uint64_t>(l.params, params, "expert parameters");
    l.bytes = checked_add<uint64_t>(l.bytes, t.nbytes(), "expert bytes");
    if (e->index) {
      l.indices.insert(*e->index);
    } else if (!t.shape.empty()) {
      if (l.fused_experts >= 0 && l.fused_experts != t.shape[0]) {
        throw FormatError(file, t.name, "moe-expert-count",
                          "fused expert tensor of shape " + shape_str(t.shape) + " holds " +
                              std::to_string(t.shape[0]) + " experts, " +
                              quote_text(l.fused_tensor) + " of the same layer " +
                              std::to_string(l.fused_experts));
      }
      l.fused_experts = t.shape[0];
      l.fused_tensor = t.name;
    }
  }

  // A config field moe_config cannot read leaves the counts to the headers, recorded in
  // `problem` (when it holds none yet).
  std::optional<MoeInfo> finish(const std::optional<nlohmann::json>& config,
                                const std::string& config_file, uint64_t n_params,
                                std::optional<ConfigProblem>& problem) const;

 private:
  struct Layer {
    std::set<int64_t> indices;   // per-expert layout
    int64_t fused_experts = -1;  // fused layout: dimension 0
    std::string fused_tensor;
    uint64_t params = 0, bytes = 0;
  };
  // The routed experts one layer's headers hold; checks the indices run 0..E-1.
  static int64_t experts_of(const std::string& name, const Layer& l, const std::string& file);

  std::map<std::string, Layer> layers_;
  uint64_t shared_params_ = 0;
  bool shared_seen_ = false;
};

int64_t MoeScan::experts_of(const std::string& name, const Layer& l, const std::string& file) {
  if (!l.indices.empty() && l.fused_experts >= 0) {
    throw FormatError(
        file, name, "moe-expert-count",
        "the layer holds both per-expert tensors and the fused " + quote_text(l.fused_tensor));
  }
  if (l.indices.empty()) return l.fused_experts < 0 ? 0 : l.fused_experts;
  const int64_t n = *l.indices.rbegin() + 1;
  if (static_cast<int64_t>(l.indices.size()) != n) {
    int64_t missing = 0;
    while (l.indices.count(missing)) ++missing;
    throw FormatError(file, name, "moe-expert-count",
                      "the headers hold experts up to index " + std::to_string(n - 1) +
                          " but no expert " + std::to_string(missing) + " (" +
                          std::to_string(l.indices.size()) + " experts stored)");
  }
  return n;
}

std::optional<MoeInfo> MoeScan::finish(const std::optional<nlohmann::json>& config,
                                       const std::string& config_file, uint64_t n_params,
                                       std::optional<ConfigProblem>& problem) const {
  MoeConfig cfg;
  if (config) {
    try {
      cfg = moe_config(*config, config_file);
    } catch (const ConfigError& e) {
      if (!problem) problem = ConfigProblem{e.rule(), e.field(), e.message()};
    }
  }
  if (layers_.empty() && cfg.routed_experts <= 1) return std::nullopt;
  MoeInfo m;
  m.n_experts = cfg.routed_experts;
  std::string first_layer;  // the layer whose count the others must match, without a config
  std::set<std::string> layouts;
  for (const auto& [name, l] : layers_) {
    const int64_t e = experts_of(name, l, config_file);
    layouts.insert(l.indices.empty() ? "fused" : "per-expert");
    if (cfg.routed_experts > 0 && e != cfg.routed_experts) {
      throw FormatError(config_file, name, "moe-expert-count",
                        "config.json's " + std::string(cfg.routed_field) + " is " +
                            std::to_string(cfg.routed_experts) +
                            " routed experts, the headers of " + quote_text(name) + " hold " +
                            std::to_string(e));
    }
    if (m.n_experts == 0) {
      m.n_experts = e;
      first_layer = name;
    } else if (e != m.n_experts) {
      throw FormatError(config_file, name, "moe-expert-count",
                        "the headers of " + quote_text(name) + " hold " + std::to_string(e) +
                            " experts, those of " + quote_text(first_layer) + " " +
                            std::to_string(m.n_experts));
    }
    m.expert_params = checked_add<uint64_t>(m.expert_params, l.params, "expert parameters");
    m.expert_bytes = checked_add<uint64_t>(m.expert_bytes, l.bytes, "expert bytes");
  }
  m.n_moe_layers = static_cast<int64_t>(layers_.size());
  m.layout = layouts.size() == 1 ? *layouts.begin() : layouts.empty() ? "" : "mixed";
  m.n_shared_experts = cfg.shared_experts > 0 ? cfg.shared_experts : shared_seen_ ? 1 : 0;
  m.shared_expert_params = shared_params_;
  if (cfg.experts_per_token > 0) {
    if (m.n_experts > 0 && cfg.experts_per_token > m.n_experts) {
      throw FormatError(config_file, "", "moe-experts-per-token",
                        "config.json routes each token to " +
                            std::to_string(cfg.experts_per_token) + " experts of " +
                            std::to_string(m.n_experts));
    }
    m.experts_per_token = cfg.experts_per_token;
  }
  if (m.experts_per_token && !layers_.empty()) {
    // Each MoE layer's routed experts count (top_k / E): exact when its experts are alike.
    uint64_t unused = 0;
    for (const auto& [name, l] : layers_) {
      const auto used = static_cast<uint64_t>(static_cast<unsigned __int128>(l.params) *
                                              static_cast<uint64_t>(*m.experts_per_token) /
                                              static_cast<uint64_t>(m.n_experts));
      unused += l.params - used;
    }
    m.active_params = n_params - unused;
  }
  if (m.n_experts > 0) {
    m.max_ep_size = m.n_experts;
    m.ep_degrees = divisors(m.n_experts);
  }
  return m;
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

namespace {

// A quantized checkpoint's layout: which tensors are aux (scales etc.) and how many logical
// elements each packed weight holds.
struct QuantView {
  std::optional<QuantLayout> layout;
  std::set<std::string> aux;
  std::map<std::string, uint64_t> logical;
};

QuantView quant_view(const Checkpoint& c, const std::optional<nlohmann::json>& config) {
  QuantView v;
  if (!config) return v;
  if (auto qc = find_quant_config(*config)) {
    v.layout = recognise_quantized(c, parse_quant_config(*qc, *c.config_path), *c.config_path);
    v.aux = aux_tensor_names(*v.layout);
    for (const auto& m : v.layout->modules) v.logical[m.weight_tensor] = m.n_params;
  }
  return v;
}

// ceil(n_params x the dtype's bits / 8).
uint64_t size_as(const std::string& dtype, uint64_t n_params) {
  const DTypeEntry& e = resolve_dtype_name(dtype);
  // Every table entry is a whole number of bits per element, so the ceiling is exact integer
  // math.
  const uint64_t bits = static_cast<uint64_t>(std::llround(e.bytes_per_element * 8));
  const std::string what =
      "size in bytes of " + std::to_string(n_params) + " parameters as " + quote_text(dtype);
  const uint64_t whole = checked_mul<uint64_t>(n_params / 8, bits, what);
  return checked_add<uint64_t>(whole, (n_params % 8 * bits + 7) / 8, what);
}

}  // namespace

CheckpointInfo describe_checkpoint(const Checkpoint& c, const std::optional<std::string>& dtype) {
  CheckpointInfo info;
  info.revision = c.revision;
  info.repo_id = c.repo_id;
  info.dir = c.dir;
  info.n_files = c.files.size();
  if (c.config_path) info.config = read_config_json(*c.config_path);
  const QuantView q = quant_view(c, info.config);
  MoeScan moe;
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
      if (q.aux.count(t.name)) {
        moe.add(f.path, t, 0);
        continue;
      }
      auto packed = q.logical.find(t.name);
      const uint64_t elements =
          packed != q.logical.end() ? packed->second : static_cast<uint64_t>(t.numel());
      n_params = checked_add<uint64_t>(n_params, elements, "parameter count of the checkpoint");
      moe.add(f.path, t, elements);
      if (stored && *stored != t.dtype) mixed = true;
      stored = t.dtype;
    }
  }
  info.n_params = n_params;
  if (dtype) {
    info.size_bytes = size_as(*dtype, n_params);
    info.dtype = *dtype;
  } else {
    info.size_bytes = param_bytes;
    info.dtype = q.layout ? quant_kind_name(q.layout->config.kind)
                 : mixed  ? "mixed"
                 : stored ? dtype_name(*stored)
                          : "none";
  }
  const std::string config_file = c.config_path.value_or("config.json");
  if (info.config) {
    try {
      info.max_tp_size = max_tp_size(*info.config, false, config_file);
    } catch (const ConfigError& e) {
      // The TP degree stays unknown; describe still succeeds and says why.
      info.config_error = ConfigProblem{e.rule(), e.field(), e.message()};
    }
  }
  if (q.layout) add_quantization(*q.layout, param_bytes, info);
  info.moe = moe.finish(info.config, config_file, n_params, info.config_error);
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

nlohmann::json to_json(const MoeInfo& m) {
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(); };
  return {{"n_experts", m.n_experts},
          {"n_shared_experts", m.n_shared_experts},
          {"experts_per_token", opt(m.experts_per_token)},
          {"n_moe_layers", m.n_moe_layers},
          {"layout", m.layout},
          {"expert_params", m.expert_params},
          {"expert_bytes", m.expert_bytes},
          {"shared_expert_params", m.shared_expert_params},
          {"active_params", opt(m.active_params)},
          {"max_ep_size", m.max_ep_size},
          {"ep_degrees", m.ep_degrees}};
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
          {"quantization", i.quantization ? *i.quantization : nlohmann::json()},
          {"moe", i.moe ? to_json(*i.moe) : nlohmann::json()},
          {"config_error", i.config_error ? nlohmann::json{{"kind", "ConfigError"},
                                                           {"rule", i.config_error->rule},
                                                           {"field", i.config_error->field},
                                                           {"message", i.config_error->message}}
                                          : nlohmann::json()}};
}

}  // namespace metaload
