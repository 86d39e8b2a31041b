// The tensor-parallel plans of the families metaload builds itself (GPT-2; Llama, which also
// serves Mistral and Qwen2), as vLLM and SGLang shard them: fused q|k|v split per head, key/value
// heads replicated when the degree exceeds them, the vocabulary padded. The families' part of the
// tree's shard rules (loader/tp/README.md): model/families/spec.h hands a config's sizes here, and
// the family load, TransformersModel's forward and the distributed load ask it. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/tp/shard.h"

namespace metaload {

enum class TPStyle {
  kReplicated,  // every rank holds the whole tensor
  kColumn,      // output features split across ranks (ColumnParallelLinear / QKVParallelLinear)
  kRow,         // input features split across ranks (RowParallelLinear; outputs all-reduced)
  kVocab,  // vocabulary rows split, padded to a multiple of lcm(64, tp) (VocabParallelEmbedding,
           // ParallelLMHead)
};
const char* tp_style_name(TPStyle style);

// One part of the split dimension that is sharded on its own: a fused tensor (GPT-2's c_attn,
// [q|k|v]) has several; each rank takes its share of each part and concatenates them.
struct TPSection {
  int64_t size = 0;   // length along the split dimension
  int64_t heads = 0;  // attention heads in the part (split on head boundaries), 0 = plain split
  // For key/value heads: when the TP size exceeds the heads, ranks share (replicate) a head, as
  // vLLM does (kv head = rank / (tp / heads)).
  bool replicate_heads = false;
};

struct TPRule {
  std::string pattern;  // the parameter name, "*" standing for the layer index
  TPStyle style = TPStyle::kReplicated;
  // The dimension of the STORED tensor that is split (-1 when replicated). GPT-2's Conv1D stores
  // [in, out], so its column split is dim 1 and its row split dim 0; Linear stores [out, in].
  int split_dim = -1;
  std::vector<TPSection> sections;
  std::string note;  // layout remarks (fused q|k|v, bias added once after the all-reduce, ...)
};

// What a family's plan depends on: the layout and the sizes of its config.
struct FamilyTpSizes {
  bool gpt2 = false;  // GPT-2's names and Conv1D [in, out] weights; else Llama's, [out, in]
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t q_width = 0;   // heads x head_dim (GPT-2: hidden)
  int64_t kv_width = 0;  // kv heads x head_dim
  int64_t intermediate = 0;
  bool tied = true;  // lm_head shares the input embedding's tensor
};

// The rules of a family, one per parameter name pattern; every parameter matches exactly one.
std::vector<TPRule> family_tp_plan(const FamilyTpSizes& sizes);
// The rule whose pattern matches `name`; PlanError when none does.
const TPRule& tp_rule_for(const std::vector<TPRule>& plan, const std::string& name);

// What rank `rank` of `size` holds of a tensor stored with `shape` (shard.h). SliceError when the
// shape does not fit the rule or `size` does not divide what must be divided (heads, features;
// the padded vocabulary always divides).
TpShard tp_shard(const TPRule& rule, const std::vector<int64_t>& shape, int64_t rank, int64_t size);

}  // namespace metaload
