#include "loader/tp/family_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "base/checked.h"
#include "base/text.h"
#include "loader/errors.h"

namespace metaload {
namespace {

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

std::vector<TPRule> gpt2_plan(const FamilyTpSizes& c) {
  const int64_t n = c.hidden, heads = c.heads, inner = c.intermediate;
  const TPSection qkv{n, heads, false};
  const std::string p = "transformer.h.*.";
  std::vector<TPRule> plan = {
      rule("transformer.wte.weight", TPStyle::kVocab, 0, {{c.vocab, 0, false}},
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
      rule("lm_head.weight", TPStyle::kVocab, 0, {{c.vocab, 0, false}},
           c.tied ? "parallel LM head, the tensor of transformer.wte.weight" : "parallel LM head"),
  };
  return plan;
}

std::vector<TPRule> llama_plan(const FamilyTpSizes& c) {
  const int64_t q = c.q_width, kv = c.kv_width, inter = c.intermediate;
  const std::string p = "model.layers.*.";
  const TPSection qs{q, c.heads, false}, kvs{kv, c.kv_heads, true}, mlp{inter, 0, false};
  const char* kv_note =
      "Linear [out, in]; kv heads replicated when the TP size exceeds num_key_value_heads";
  std::vector<TPRule> plan = {
      rule("model.embed_tokens.weight", TPStyle::kVocab, 0, {{c.vocab, 0, false}},
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
      rule("lm_head.weight", TPStyle::kVocab, 0, {{c.vocab, 0, false}},
           c.tied ? "parallel LM head, the tensor of model.embed_tokens.weight"
                  : "parallel LM head"),
  };
  return plan;
}

}  // namespace

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

std::vector<TPRule> family_tp_plan(const FamilyTpSizes& sizes) {
  return sizes.gpt2 ? gpt2_plan(sizes) : llama_plan(sizes);
}

const TPRule& tp_rule_for(const std::vector<TPRule>& plan, const std::string& name) {
  for (const auto& r : plan)
    if (glob_match(r.pattern, name)) return r;
  throw PlanError(fmt::format("no tensor-parallel rule for parameter '{}'", name));
}

TpShard tp_shard(const TPRule& rule, const std::vector<int64_t>& shape, int64_t rank,
                 int64_t size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw SliceError(fmt::format("{}: invalid TP rank {} of size {}", rule.pattern, rank, size));
  TpShard shard;
  shard.shape = shape;
  if (rule.style == TPStyle::kReplicated) return shard;  // dim -1: the whole tensor
  const int dim = rule.split_dim;
  if (dim < 0 || dim >= static_cast<int>(shape.size()))
    throw SliceError(fmt::format("{}: split dimension {} does not exist in a tensor of shape {}",
                                 rule.pattern, dim, shape_str(shape)));
  int64_t total = 0;
  for (const auto& s : rule.sections) total += s.size;
  if (total != shape[dim])
    throw SliceError(fmt::format("{}: tensor of shape {} has {} along dim {}, the plan expects {}",
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
        throw SliceError(
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
        throw SliceError(fmt::format("{}: TP size {} does not divide the {} heads{}", rule.pattern,
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
