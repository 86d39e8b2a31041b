// A user's tp_plan (loader/tp/user_plan.h): which dim each state tensor splits on, the styles it
// may name, and the rank's even shard.
#include "loader/tp/user_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loader/errors.h"

namespace metaload {
namespace {

TEST(UserTpPlan, ModulesMatchByNameLayerPatternOrSuffix) {
  const UserTpPlan plan = {{"model.layers.*.self_attn.q_proj", "colwise"},
                           {"layers.*.self_attn.o_proj", "rowwise"},
                           {"mlp.experts", "experts"}};
  EXPECT_EQ(user_tp_dim(plan, "model.layers.0.self_attn.q_proj.weight"), 0);
  EXPECT_EQ(user_tp_dim(plan, "model.layers.17.self_attn.q_proj.bias"), 0);
  EXPECT_EQ(user_tp_dim(plan, "model.layers.3.self_attn.o_proj.weight"), 1);
  EXPECT_EQ(user_tp_dim(plan, "model.layers.3.self_attn.o_proj.bias"), -1);  // rowwise: whole
  EXPECT_EQ(user_tp_dim(plan, "model.layers.1.mlp.experts.gate_up_proj"), 0);
  EXPECT_EQ(user_tp_dim(plan, "model.layers.1.mlp.experts.down_proj"), 0);
  EXPECT_EQ(user_tp_dim(plan, "model.layers.1.self_attn.k_proj.weight"), -1);  // not in the plan
  EXPECT_EQ(user_tp_dim(plan, "model.embed_tokens.weight"), -1);
  EXPECT_EQ(user_tp_dim(plan, "weight"), -1);  // a top-level tensor has no module
  // A suffix is a whole component: "xmlp.experts" is not "mlp.experts".
  EXPECT_EQ(user_tp_dim(plan, "model.layers.1.xmlp.experts.down_proj"), -1);
  // The exact module name, with its number.
  EXPECT_EQ(user_tp_dim({{"h.2.mlp.c_fc", "colwise"}}, "h.2.mlp.c_fc.weight"), 0);
  EXPECT_EQ(user_tp_dim({{"h.2.mlp.c_fc", "colwise"}}, "h.3.mlp.c_fc.weight"), -1);
  // The first entry that names the module decides.
  EXPECT_EQ(user_tp_dim({{"q_proj", "rowwise"}, {"layers.*.q_proj", "colwise"}},
                        "layers.0.q_proj.weight"),
            1);
}

TEST(UserTpPlan, StylesAreTheOneListAndAnUnknownOneIsAPlanError) {
  EXPECT_EQ(user_tp_styles(), (std::vector<std::string>{"colwise", "experts", "rowwise"}));
  EXPECT_NO_THROW(check_user_tp_plan({{"a", "colwise"}, {"b", "rowwise"}, {"c", "experts"}}));
  try {
    user_tp_dims({{"a", "colwise"}, {"mlp.up", "sequence"}}, {"mlp.up.weight"});
    FAIL() << "an unknown style was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("tp_plan style 'sequence' of 'mlp.up' is not one of "
                                         "['colwise', 'experts', 'rowwise']"),
              std::string::npos)
        << e.what();
  }
}

TEST(UserTpPlan, EvenShardsSplitTheGivenDimOrRefuse) {
  const auto shard = even_tp_shards({"a.weight", "b.weight", "c"}, {0, 1, -1});
  const TpShard a = shard("a.weight", {8, 4}, 1, 4);
  EXPECT_EQ(a.dim, 0);
  EXPECT_EQ(a.ranges, (std::vector<std::pair<int64_t, int64_t>>{{2, 4}}));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 4}));
  const TpShard b = shard("b.weight", {8, 4}, 3, 4);
  EXPECT_EQ(b.dim, 1);
  EXPECT_EQ(b.ranges, (std::vector<std::pair<int64_t, int64_t>>{{3, 4}}));
  EXPECT_EQ(shard("c", {8, 4}, 0, 4).dim, -1);
  EXPECT_EQ(shard("unknown", {8, 4}, 0, 4).dim, -1);
  EXPECT_THROW(shard("a.weight", {6, 4}, 0, 4), SliceError);  // 6 rows into 4 ranks
  EXPECT_THROW(shard("b.weight", {8}, 0, 2), SliceError);     // no dim 1
  EXPECT_THROW(even_tp_shards({"a"}, {0, 1}), PlanError);
}

}  // namespace
}  // namespace metaload
