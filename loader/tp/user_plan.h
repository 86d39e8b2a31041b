// A user's tensor-parallel plan (load_into's tp_plan): module names and the style each is split
// in, as transformers' tp plans write them. The one place its styles and its name rule live: the
// Python package asks here for the dims of a module's state names (torch.ops.metaload
// tp_plan_dims, tp_plan_styles) and hands them to the load. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loader/tp/shard.h"

namespace metaload {

// {module name pattern, style}, in the order given (the first match wins). A pattern names a
// module exactly, with its layer numbers as "*" ("model.layers.*.mlp.up_proj"), or as a suffix of
// the name ("layers.*.mlp.up_proj", "mlp.up_proj").
using UserTpPlan = std::vector<std::pair<std::string, std::string>>;

// The styles a plan may use: "colwise" (weight and bias split on dim 0), "rowwise" (weight on
// dim 1, bias whole), "experts" (every tensor of a fused experts module [E, ...] on its expert
// dim: whole experts per rank). Sorted.
const std::vector<std::string>& user_tp_styles();

// Throws PlanError naming the first entry whose style is not one of user_tp_styles().
void check_user_tp_plan(const UserTpPlan& plan);

// The dim `plan` splits the state tensor `name` ("model.layers.0.mlp.up_proj.weight") on, or -1
// (whole).
int user_tp_dim(const UserTpPlan& plan, const std::string& name);

// The dims `plan` splits each of `names` on (user_tp_dim); checks the plan first.
std::vector<int64_t> user_tp_dims(const UserTpPlan& plan, const std::vector<std::string>& names);

// Per target name, the rank's even shard of the dim given for it (-1 or absent: whole;
// SliceError when the dim does not divide).
std::function<TpShard(const std::string&, const std::vector<int64_t>&, int, int)> even_tp_shards(
    const std::vector<std::string>& names, const std::vector<int64_t>& dims);

}  // namespace metaload
