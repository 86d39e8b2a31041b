// TransformersModel across processes: joining the ranks' process group (the handshake) and the
// collectives a tensor-parallel forward runs on (family.h's TensorParallel over dist/).
#include <fmt/format.h>

#include "distributed/handshake.h"
#include "loader/errors.h"
#include "model/families/spec.h"
#include "model/sha256.h"
#include "model/transformers_model.h"

namespace metaload {
namespace {

// Whether the family's TP plan splits every parameter of `config` into n ranks (heads, kv heads
// -- replicated when n is a multiple of them, as vLLM does --, features; the padded vocabulary
// always splits). Divisibility does not depend on the rank: rank 0 stands for all.
bool splits_into(const FamilyConfig& config, int64_t n) {
  const std::vector<TPRule> plan = tp_plan(config);
  for (const ParamSpec& p : parameter_specs(config)) {
    if (!p.tied_to.empty()) continue;
    try {
      tp_shard(tp_rule_for(plan, p.name), p.shape, 0, n);
    } catch (const SliceError&) {
      return false;
    }
  }
  return true;
}

}  // namespace

void TransformersModel::join_group() {
  group_ = std::make_shared<Collectives>(options_.process_group, options_.collective_timeout);
  if (options_.device.is_cuda()) group_->set_scratch_device(options_.device);
  // The model as the ranks must agree on it: class, config (its canonical JSON) and dtype.
  const std::string model = fmt::format("{} config sha256 {} dtype {}", module_->name(),
                                        sha256_hex(config().raw.dump()).substr(0, 16),
                                        torch_dtype_name(options_.dtype.value_or(at::kFloat)));
  check_tp_agreement(*group_, TpIdentity{options_.tp_size, options_.tp_rank, model});
  // The ranks agree on the model and tp_size now: a split that cannot work fails on all of them
  // alike.
  if (options_.tp_size > 1 && !splits_into(config(), options_.tp_size)) {
    std::string works;
    for (int64_t d = 1; d <= config().num_heads; ++d)
      if (splits_into(config(), d)) works += (works.empty() ? "" : ", ") + std::to_string(d);
    throw TPError(fmt::format(
        "{} ({} heads, {} key/value heads, intermediate size {}) cannot be split into {} "
        "tensor-parallel ranks; degrees that work: {}",
        module_->name(), config().num_heads, config().num_kv_heads, config().intermediate_size,
        options_.tp_size, works));
  }
  auto tp = std::make_shared<TensorParallel>();
  tp->rank = group_->rank();
  tp->size = group_->size();
  std::weak_ptr<Collectives> weak = group_;
  auto collectives = [weak] {
    std::shared_ptr<Collectives> g = weak.lock();
    if (!g) throw DistributedError("the model holding the process group is gone");
    return g;
  };
  tp->all_reduce = [collectives](at::Tensor& t) { collectives()->all_reduce(t); };
  tp->all_gather_last = [collectives](const at::Tensor& t) {
    return at::cat(collectives()->all_gather(t), -1);
  };
  tp_ = std::move(tp);
}

void TransformersModel::run_tensor_parallel_locked() {
  // A scan in between may have put shape-only collectives in place.
  module_->set_tensor_parallel(group_ && options_.tp_size > 1 ? tp_ : nullptr);
}

}  // namespace metaload
