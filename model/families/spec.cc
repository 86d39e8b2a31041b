#include "model/families/spec.h"

#include <algorithm>
#include <numeric>
#include <regex>

#include <fmt/format.h>

#include "base/checked.h"
#include "base/text.h"

namespace metaload {
namespace {

using Shape = std::vector<int64_t>;

// Elements of a parameter; its bytes (at most 8 per element) must fit torch's int64 sizes too.
int64_t numel(const std::string& name, const Shape& shape) {
  checked_product<int64_t>(shape, 8, "bytes of parameter " + name);
  return checked_product<int64_t>(shape, 1, "elements of parameter " + name);
}

// Matches `name` against a pattern whose "*" stands for one dot-free, non-empty component part.
bool glob_match(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '*') {
      size_t start = n;
      while (n < name.size() && name[n] != '.') ++n;
      if (n == start) return false;
      ++p;
    } else {
      if (n >= name.size() || name[n] != pattern[p]) return false;
      ++p;
      ++n;
    }
  }
  return n == name.size();
}

TPRule rule(std::string pattern, TPStyle style, int dim, std::vector<TPSection> sections,
            std::string note = "") {
  return TPRule{std::move(pattern), style, dim, std::move(sections), std::move(note)};
}
TPRule replicated(std::string pattern, std::string note = "") {
  return rule(std::move(pattern), TPStyle::kReplicated, -1, {}, std::move(note));
}

const char* kRowBias = "row-parallel bias: replicated, added once after the all-reduce";

std::vector<TPRule> gpt2_plan(const FamilyConfig& c) {
  const int64_t n = c.hidden_size, heads = c.num_heads, inner = c.intermediate_size;
  const TPSection qkv{n, heads, false};
  const std::string p = "transformer.h.*.";
  std::vector<TPRule> plan = {
      rule("transformer.wte.weight", TPStyle::kVocab, 0, {{c.vocab_size, 0, false}},
           "vocab-parallel embedding; tied to lm_head"),
      replicated("transformer.wpe.weight", "position embedding: replicated as in vLLM"),
      replicated(p + "ln_1.weight"),
      replicated(p + "ln_1.bias"),
      rule(p + "attn.c_attn.weight", TPStyle::kColumn, 1, {qkv, qkv, qkv},
           "Conv1D [in, out]: output columns are dim 1, fused [q|k|v]: each rank takes its heads "
           "of q, of k and of v"),
      rule(p + "attn.c_attn.bias", TPStyle::kColumn, 0, {qkv, qkv, qkv}, "fused [q|k|v]"),
      rule(p + "attn.c_proj.weight", TPStyle::kRow, 0, {{n, heads, false}},
           "Conv1D [in, out]: input rows are dim 0"),
      replicated(p + "attn.c_proj.bias", kRowBias),
      replicated(p + "ln_2.weight"),
      replicated(p + "ln_2.bias"),
      rule(p + "mlp.c_fc.weight", TPStyle::kColumn, 1, {{inner, 0, false}},
           "Conv1D [in, out]: output columns are dim 1"),
      rule(p + "mlp.c_fc.bias", TPStyle::kColumn, 0, {{inner, 0, false}}),
      rule(p + "mlp.c_proj.weight", TPStyle::kRow, 0, {{inner, 0, false}},
           "Conv1D [in, out]: input rows are dim 0"),
      replicated(p + "mlp.c_proj.bias", kRowBias),
      replicated("transformer.ln_f.weight"),
      replicated("transformer.ln_f.bias"),
      rule("lm_head.weight", TPStyle::kVocab, 0, {{c.vocab_size, 0, false}},
           c.tie_word_embeddings ? "parallel LM head, the tensor of transformer.wte.weight"
                                 : "parallel LM head"),
  };
  return plan;
}

std::vector<TPRule> llama_plan(const FamilyConfig& c) {
  const int64_t q = q_width(c), kv = kv_width(c);
  const int64_t inter = c.intermediate_size;
  const std::string p = "model.layers.*.";
  const TPSection qs{q, c.num_heads, false}, kvs{kv, c.num_kv_heads, true}, mlp{inter, 0, false};
  const char* kv_note =
      "Linear [out, in]; kv heads replicated when the TP size exceeds num_key_value_heads";
  std::vector<TPRule> plan = {
      rule("model.embed_tokens.weight", TPStyle::kVocab, 0, {{c.vocab_size, 0, false}},
           "vocab-parallel embedding"),
      rule(p + "self_attn.q_proj.weight", TPStyle::kColumn, 0, {qs}, "Linear [out, in]"),
      rule(p + "self_attn.q_proj.bias", TPStyle::kColumn, 0, {qs}),
      rule(p + "self_attn.k_proj.weight", TPStyle::kColumn, 0, {kvs}, kv_note),
      rule(p + "self_attn.k_proj.bias", TPStyle::kColumn, 0, {kvs}, kv_note),
      rule(p + "self_attn.v_proj.weight", TPStyle::kColumn, 0, {kvs}, kv_note),
      rule(p + "self_attn.v_proj.bias", TPStyle::kColumn, 0, {kvs}, kv_note),
      rule(p + "self_attn.o_proj.weight", TPStyle::kRow, 1, {qs}, "Linear [out, in]: dim 1"),
      replicated(p + "self_attn.o_proj.bias", kRowBias),
      rule(p + "mlp.gate_proj.weight", TPStyle::kColumn, 0, {mlp}),
      rule(p + "mlp.gate_proj.bias", TPStyle::kColumn, 0, {mlp}),
      rule(p + "mlp.up_proj.weight", TPStyle::kColumn, 0, {mlp}),
      rule(p + "mlp.up_proj.bias", TPStyle::kColumn, 0, {mlp}),
      rule(p + "mlp.down_proj.weight", TPStyle::kRow, 1, {mlp}, "Linear [out, in]: dim 1"),
      replicated(p + "mlp.down_proj.bias", kRowBias),
      replicated(p + "input_layernorm.weight"),
      replicated(p + "post_attention_layernorm.weight"),
      replicated("model.norm.weight"),
      rule("lm_head.weight", TPStyle::kVocab, 0, {{c.vocab_size, 0, false}},
           c.tie_word_embeddings ? "parallel LM head, the tensor of model.embed_tokens.weight"
                                 : "parallel LM head"),
  };
  return plan;
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

const char* tp_style_name(TPStyle style) {
  switch (style) {
    case TPStyle::kReplicated:
      return "replicated";
    case TPStyle::kColumn:
      return "column";
    case TPStyle::kRow:
      return "row";
    case TPStyle::kVocab:
      return "vocab";
  }
  return "?";
}

std::vector<TPRule> tp_plan(const FamilyConfig& config) {
  return config.arch == Arch::kGPT2 ? gpt2_plan(config) : llama_plan(config);
}

const TPRule& tp_rule_for(const std::vector<TPRule>& plan, const std::string& name) {
  for (const auto& r : plan)
    if (glob_match(r.pattern, name)) return r;
  throw FamilyError(fmt::format("no tensor-parallel rule for parameter '{}'", name));
}

TpShard tp_shard(const TPRule& rule, const Shape& shape, int64_t rank, int64_t size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw FamilyError(fmt::format("{}: invalid TP rank {} of size {}", rule.pattern, rank, size));
  TpShard shard;
  shard.shape = shape;
  if (rule.style == TPStyle::kReplicated) return shard;  // dim -1: the whole tensor
  const int dim = rule.split_dim;
  if (dim < 0 || dim >= static_cast<int>(shape.size()))
    throw FamilyError(fmt::format("{}: split dimension {} does not exist in a tensor of shape {}",
                                  rule.pattern, dim, shape_str(shape)));
  int64_t total = 0;
  for (const auto& s : rule.sections) total += s.size;
  if (total != shape[dim])
    throw FamilyError(fmt::format("{}: tensor of shape {} has {} along dim {}, the plan expects {}",
                                  rule.pattern, shape_str(shape), shape[dim], dim, total));
  shard.dim = dim;
  if (rule.style == TPStyle::kVocab) {
    // Pad the vocabulary to a multiple of lcm(64, size), then give each rank an equal block of
    // rows. For power-of-two sizes up to 64 that is vLLM's layout (a multiple of 64); for other
    // sizes (3, 6, ... which max_tp_size allows) vLLM's 64 would not divide evenly, so the lcm
    // keeps every allowed degree loadable.
    const int64_t align = std::lcm(int64_t{64}, size);
    const int64_t padded =
        checked_add(total, align - 1, "padded vocabulary of " + rule.pattern) / align * align;
    const int64_t per = padded / size;
    const int64_t begin = std::min(rank * per, total), end = std::min((rank + 1) * per, total);
    if (begin < end) shard.ranges.push_back({begin, end});  // else: padding rows only
    shard.shape[dim] = per;
    return shard;
  }
  int64_t offset = 0, local = 0;
  for (const auto& s : rule.sections) {
    if (s.heads == 0) {
      if (s.size % size != 0)
        throw FamilyError(
            fmt::format("{}: TP size {} does not divide {} features", rule.pattern, size, s.size));
      const int64_t per = s.size / size;
      shard.ranges.push_back({offset + rank * per, offset + (rank + 1) * per});
      local += per;
    } else {
      const int64_t head = s.size / s.heads;
      if (s.heads % size == 0) {
        const int64_t per = s.size / size;
        shard.ranges.push_back({offset + rank * per, offset + (rank + 1) * per});
        local += per;
      } else if (s.replicate_heads && size % s.heads == 0) {
        const int64_t replicas = size / s.heads, h = rank / replicas;
        shard.ranges.push_back({offset + h * head, offset + (h + 1) * head});
        local += head;
      } else {
        throw FamilyError(fmt::format("{}: TP size {} does not divide the {} heads{}", rule.pattern,
                                      size, s.heads,
                                      s.replicate_heads ? " (nor is it a multiple of them)" : ""));
      }
    }
    offset += s.size;
  }
  shard.shape[dim] = local;
  return shard;
}

}  // namespace metaload
