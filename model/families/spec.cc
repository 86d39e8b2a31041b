#include "model/families/spec.h"

#include <regex>

#include <fmt/format.h>

#include "base/checked.h"

namespace metaload {
namespace {

using Shape = std::vector<int64_t>;

// Elements of a parameter; its bytes (at most 8 per element) must fit torch's int64 sizes too.
int64_t numel(const std::string& name, const Shape& shape) {
  checked_product<int64_t>(shape, 8, "bytes of parameter " + name);
  return checked_product<int64_t>(shape, 1, "elements of parameter " + name);
}

}  // namespace

std::vector<ParamSpec> parameter_specs(const FamilyConfig& config) {
  return family_parameters(config);
}

std::vector<BufferSpec> buffer_specs(const FamilyConfig& config) {
  std::vector<BufferSpec> out;
  if (config.arch == Arch::kGPT2) {
    const int64_t p = config.max_position_embeddings;
    for (int64_t i = 0; i < config.num_layers; ++i) {
      out.push_back({fmt::format("transformer.h.{}.attn.bias", i), {1, 1, p, p}, "bool", false});
      out.push_back({fmt::format("transformer.h.{}.attn.masked_bias", i), {}, "float32", false});
    }
  } else {
    out.push_back({"model.rotary_emb.inv_freq", {config.head_dim / 2}, "float32", false});
  }
  return out;
}

int64_t parameter_count(const FamilyConfig& config) {
  int64_t total = 0;
  for (const auto& p : parameter_specs(config))
    if (p.tied_to.empty())
      total = checked_add(total, numel(p.name, p.shape), "parameter count of the config");
  return total;
}

std::vector<std::vector<std::string>> tied_parameter_groups(const FamilyConfig& config) {
  std::vector<std::vector<std::string>> groups;
  for (const auto& p : parameter_specs(config)) {
    if (p.tied_to.empty()) continue;
    bool placed = false;
    for (auto& g : groups)
      if (g.front() == p.tied_to) {
        g.push_back(p.name);
        placed = true;
      }
    if (!placed) groups.push_back({p.tied_to, p.name});
  }
  return groups;
}

std::optional<std::string> map_checkpoint_name(const FamilyConfig& config,
                                               const std::string& name) {
  // The buffers transformers itself ignores on load (_keys_to_ignore_on_load_unexpected).
  static const std::regex kGPT2Ignored(R"(^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$)");
  static const std::regex kLlamaIgnored(
      R"(^(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$)");
  const bool gpt2 = config.arch == Arch::kGPT2;
  if (std::regex_match(name, gpt2 ? kGPT2Ignored : kLlamaIgnored)) return std::nullopt;
  const std::string prefix = std::string(base_model_prefix(config)) + ".";
  if (name.rfind(prefix, 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
  // A checkpoint of the base model (e.g. the published gpt2 model.safetensors): its names are
  // relative to the base model, whose children are these.
  static const std::vector<std::string> kGPT2Children = {"wte.", "wpe.", "h.", "ln_f."};
  static const std::vector<std::string> kLlamaChildren = {"embed_tokens.", "layers.", "norm."};
  for (const auto& child : gpt2 ? kGPT2Children : kLlamaChildren)
    if (name.rfind(child, 0) == 0) return prefix + name;
  return name;
}

std::vector<TPRule> tp_plan(const FamilyConfig& config) {
  FamilyTpSizes s;
  s.gpt2 = config.arch == Arch::kGPT2;
  s.vocab = config.vocab_size;
  s.hidden = config.hidden_size;
  s.heads = config.num_heads;
  s.kv_heads = config.num_kv_heads;
  s.q_width = q_width(config);
  s.kv_width = kv_width(config);
  s.intermediate = config.intermediate_size;
  s.tied = config.tie_word_embeddings;
  return family_tp_plan(s);
}

}  // namespace metaload
