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

// {name pattern, style}, in the order given. A pattern names a module (or a parameter of fused
// experts) exactly, with its layer numbers as "*" ("model.layers.*.mlp.up_proj"), or as a suffix
// of the name ("layers.*.mlp.up_proj", "mlp.up_proj"): transformers' `base_model_tp_plan` as it
// is.
using UserTpPlan = std::vector<std::pair<std::string, std::string>>;

// The styles a plan may use, by transformers' names (its tensor-parallel styles, with the same
// dims for every rank of tensor: a Linear weight [out, in] or fused experts [E, out, in]):
//   colwise (colwise_rep, colwise_gather_output): the output dim (ndim - 2; a bias: dim 0);
//   rowwise (rowwise_rep, rowwise_split_input): the input dim (the last), a bias whole;
//   packed_colwise: as colwise over two packed halves (gate|up): the rank takes its part of each;
//   packed_rowwise: as rowwise over two packed halves of the last dim, a bias whole;
//   embedding_rowwise: an Embedding's weight on its rows (dim 0);
//   experts (grouped_gemm): every tensor on dim 0, the expert dim: whole experts per rank;
//   replicated_with_grad_allreduce, moe_tp_experts, ep_router, sequence_parallel, all_reduce,
//   moe_identity_expert: whole (they change the forward, not what a rank stores).
// Sorted.
const std::vector<std::string>& user_tp_styles();

// Throws PlanError naming the first entry whose style is not one of user_tp_styles().
void check_user_tp_plan(const UserTpPlan& plan);

// How a state tensor of `ndim` dims splits: on `dim` (-1: whole), in `packs` equal packed parts
// each split evenly (1: one even split).
struct UserTpSplit {
  int dim = -1;
  int packs = 1;
  bool operator==(const UserTpSplit& o) const { return dim == o.dim && packs == o.packs; }
};

// The split `plan` gives the state tensor `name` ("model.layers.0.mlp.up_proj.weight", or a fused
// experts parameter "model.layers.0.mlp.experts.gate_up_proj") of `ndim` dims. An entry that names
// the tensor itself wins over one that names its module; among those, the first in the plan.
UserTpSplit user_tp_split(const UserTpPlan& plan, const std::string& name, int ndim);

// Per target name, the rank's shard by `plan` (user_tp_split on the target's shape; SliceError
// when a split dim does not divide). Checks the plan first.
std::function<TpShard(const std::string&, const std::vector<int64_t>&, int, int)> user_tp_shards(
    const UserTpPlan& plan);

}  // namespace metaload
