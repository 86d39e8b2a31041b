// A user's tp_plan (loader/tp/user_plan.h): which dim each state tensor splits on, the styles it
// may name, and the rank's even shard.
#include "loader/tp/user_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loader/errors.h"

namespace metaload {
namespace {

UserTpSplit split(const UserTpPlan& plan, const std::string& name, int ndim = 2) {
  return user_tp_split(plan, name, ndim);
}
constexpr UserTpSplit kWhole{-1, 1};
UserTpSplit on(int dim, int packs = 1) {
  return {dim, packs};
}

TEST(UserTpPlan, ModulesMatchByNameLayerPatternOrSuffix) {
  const UserTpPlan plan = {{"model.layers.*.self_attn.q_proj", "colwise"},
                           {"layers.*.self_attn.o_proj", "rowwise"},
                           {"mlp.experts", "experts"}};
  EXPECT_EQ(split(plan, "model.layers.0.self_attn.q_proj.weight"), on(0));
  EXPECT_EQ(split(plan, "model.layers.17.self_attn.q_proj.bias", 1), on(0));
  EXPECT_EQ(split(plan, "model.layers.3.self_attn.o_proj.weight"), on(1));
  EXPECT_EQ(split(plan, "model.layers.3.self_attn.o_proj.bias", 1), kWhole);  // rowwise: whole
  EXPECT_EQ(split(plan, "model.layers.1.mlp.experts.gate_up_proj", 3), on(0));
  EXPECT_EQ(split(plan, "model.layers.1.mlp.experts.down_proj", 3), on(0));
  EXPECT_EQ(split(plan, "model.layers.1.self_attn.k_proj.weight"), kWhole);  // not in the plan
  EXPECT_EQ(split(plan, "model.embed_tokens.weight"), kWhole);
  EXPECT_EQ(split(plan, "weight"), kWhole);  // a top-level tensor has no module
  // A suffix is a whole component: "xmlp.experts" is not "mlp.experts".
  EXPECT_EQ(split(plan, "model.layers.1.xmlp.experts.down_proj", 3), kWhole);
  // The exact module name, with its number.
  EXPECT_EQ(split({{"h.2.mlp.c_fc", "colwise"}}, "h.2.mlp.c_fc.weight"), on(0));
  EXPECT_EQ(split({{"h.2.mlp.c_fc", "colwise"}}, "h.3.mlp.c_fc.weight"), kWhole);
  // The first entry that names the module decides.
  EXPECT_EQ(
      split({{"q_proj", "rowwise"}, {"layers.*.q_proj", "colwise"}}, "layers.0.q_proj.weight"),
      on(1));
}

// transformers' own plan for Mixtral / Qwen3-MoE (config.base_model_tp_plan) as it is: fused
// experts' parameters named themselves, packed gate|up, and forward-only styles that split nothing.
TEST(UserTpPlan, TransformersMoePlansSplitFusedExpertsAsTransformersDoes) {
  const UserTpPlan plan = {{"layers.*.self_attn.q_proj", "colwise"},
                           {"layers.*.self_attn.o_proj", "rowwise"},
                           {"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                           {"layers.*.mlp.experts", "moe_tp_experts"},  // before: still loses
                           {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"},
                           {"layers.*.mlp.experts.down_proj", "rowwise"},
                           {"layers.*.mlp.gate_up_proj", "packed_colwise"},
                           {"layers.*.mlp.up_proj", "packed_rowwise"}};
  EXPECT_EQ(split(plan, "model.layers.0.mlp.experts.gate_up_proj", 3), on(1, 2));  // [E, 2I, H]
  EXPECT_EQ(split(plan, "model.layers.0.mlp.experts.down_proj", 3), on(2));        // [E, H, I]
  EXPECT_EQ(split(plan, "model.layers.0.mlp.experts.gate_up_proj_bias", 2), kWhole);
  EXPECT_EQ(split(plan, "model.layers.0.self_attn.q_norm.weight", 1), kWhole);
  EXPECT_EQ(split(plan, "model.layers.0.mlp.gate_up_proj.weight"), on(0, 2));  // [2I, H]
  EXPECT_EQ(split(plan, "model.layers.0.mlp.gate_up_proj.bias", 1), on(0, 2));
  EXPECT_EQ(split(plan, "model.layers.0.mlp.up_proj.weight"), on(1, 2));
  EXPECT_EQ(split(plan, "model.layers.0.mlp.up_proj.bias", 1), kWhole);
  EXPECT_EQ(split({{"embed_tokens", "embedding_rowwise"}}, "model.embed_tokens.weight"), on(0));
  EXPECT_EQ(split({{"mlp.experts", "grouped_gemm"}}, "l.0.mlp.experts.down_proj", 3), on(0));
}

TEST(UserTpPlan, StylesAreTheOneListAndAnUnknownOneIsAPlanError) {
  const std::vector<std::string>& styles = user_tp_styles();
  EXPECT_TRUE(std::is_sorted(styles.begin(), styles.end()));
  for (const char* s : {"colwise", "rowwise", "packed_colwise", "experts", "moe_tp_experts"}) {
    EXPECT_NE(std::find(styles.begin(), styles.end(), s), styles.end()) << s;
  }
  EXPECT_NO_THROW(check_user_tp_plan({{"a", "colwise"}, {"b", "rowwise"}, {"c", "experts"}}));
  try {
    user_tp_shards({{"a", "colwise"}, {"mlp.up", "sequence"}});
    FAIL() << "an unknown style was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("tp_plan style 'sequence' of 'mlp.up' is not one of "
                                         "['all_reduce', 'colwise'"),
              std::string::npos)
        << e.what();
  }
}

TEST(UserTpPlan, ShardsSplitTheStylesDimOrRefuse) {
  const auto shard = user_tp_shards({{"a", "colwise"},
                                     {"b", "rowwise"},
                                     {"experts.gate_up_proj", "packed_colwise"},
                                     {"experts.down_proj", "rowwise"}});
  const TpShard a = shard("a.weight", {8, 4}, 1, 4);
  EXPECT_EQ(a.dim, 0);
  EXPECT_EQ(a.ranges, (std::vector<std::pair<int64_t, int64_t>>{{2, 4}}));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 4}));
  const TpShard b = shard("b.weight", {8, 4}, 3, 4);
  EXPECT_EQ(b.dim, 1);
  EXPECT_EQ(b.ranges, (std::vector<std::pair<int64_t, int64_t>>{{3, 4}}));
  EXPECT_EQ(shard("b.bias", {8}, 0, 4).dim, -1);
  EXPECT_EQ(shard("unknown.weight", {8, 4}, 0, 4).dim, -1);
  // Fused experts [E=3, 2I=8, H=5] on 2 ranks: rank 1 has gate rows 2..3 and up rows 6..7 of
  // every expert; down_proj [3, 5, I=4] its inputs 2..3.
  const TpShard gu = shard("m.experts.gate_up_proj", {3, 8, 5}, 1, 2);
  EXPECT_EQ(gu.dim, 1);
  EXPECT_EQ(gu.ranges, (std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {6, 8}}));
  EXPECT_EQ(gu.shape, (std::vector<int64_t>{3, 4, 5}));
  const TpShard down = shard("m.experts.down_proj", {3, 5, 4}, 1, 2);
  EXPECT_EQ(down.dim, 2);
  EXPECT_EQ(down.ranges, (std::vector<std::pair<int64_t, int64_t>>{{2, 4}}));
  EXPECT_THROW(shard("a.weight", {6, 4}, 0, 4), SliceError);  // 6 rows into 4 ranks
  try {
    shard("m.experts.gate_up_proj", {3, 6, 5}, 0, 2);  // halves of 3 rows: not into 2
    FAIL() << "an uneven packed split was accepted";
  } catch (const SliceError& e) {
    EXPECT_NE(std::string(e.what()).find("m.experts.gate_up_proj: cannot split dim 1 of [3, 6, "
                                         "5] into 2 equal parts of each of its 2 packed parts"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace metaload
