#include "model/family_load.h"

#include <unordered_set>

#include <fmt/format.h>

#include "base/text.h"
#include "base/torch_library.h"
#include "c10_ext/meta_mode.h"
#include "loader/errors.h"
#include "loader/load/open_checkpoints.h"
#include "model/families/spec.h"

namespace metaload {

NameMapping family_name_mapping(const FamilyConfig& config) {
  NameMapping names;
  names.checkpoint_to_module = [config](const std::string& n) {
    return map_checkpoint_name(config, n);
  };
  names.tied = tied_parameter_groups(config);
  std::unordered_set<std::string> computed;
  for (const BufferSpec& b : buffer_specs(config))
    if (!b.persistent) computed.insert(b.name);
  names.skip = [computed](const std::string& n) { return computed.count(n) > 0; };
  names.tp_shard = [plan = tp_plan(config)](const std::string& name,
                                            const std::vector<int64_t>& shape, int rank, int size) {
    return tp_shard(tp_rule_for(plan, name), shape, rank, size);
  };
  return names;
}

namespace {

// load_into's name_mapping="family" (loader/load/plan.h) and family_buffers: the family of the
// checkpoint's own config.json.
FamilyConfig checkpoint_family_config(const Checkpoint& c) {
  if (!c.config_path) {
    throw PlanError(escape_path(c.ref) +
                    ": a tensor-parallel load needs the model family's TP plan (GPT-2, Llama, "
                    "Mistral, Qwen2), read from the config.json beside the weights, and there is "
                    "none (give tp_plan= for another module)");
  }
  try {
    return load_family_config(*c.config_path);
  } catch (const ConfigError& e) {
    if (e.rule() != "config-unsupported") throw;  // a family's config that is broken stays so
    throw PlanError(escape_path(c.ref) +
                    ": a tensor-parallel load without tp_plan= takes the model family's TP plan "
                    "(GPT-2, Llama, Mistral, Qwen2), and this is another model: " +
                    e.message() +
                    "; give tp_plan= (a transformers model's config.base_model_tp_plan, for one)");
  }
}

NameMapping checkpoint_family_mapping(const Checkpoint& c) {
  return family_name_mapping(checkpoint_family_config(c));
}

[[maybe_unused]] const bool family_mapping_registered =
    (register_name_mapping_source("family", &checkpoint_family_mapping), true);

std::tuple<std::vector<std::string>, std::vector<at::Tensor>> family_buffers_op(int64_t handle,
                                                                                at::Device device) {
  const Checkpoint& c = *held_checkpoint(handle);
  std::vector<std::string> names;
  std::vector<at::Tensor> values;
  for (auto& [name, t] : family_buffers(checkpoint_family_config(c), device)) {
    names.push_back(name);
    values.push_back(t);
  }
  return {std::move(names), std::move(values)};
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> family_buffers(const FamilyConfig& config,
                                                               at::Device device) {
  BuildOptions skeleton;
  skeleton.device = at::kMeta;
  skeleton.init_weights = false;
  std::shared_ptr<CausalLM> module = build_causal_lm(config, skeleton);
  RealGuard real;  // real even inside a user's metaload.meta()
  CausalLM::apply_buffers(module->compute_nonpersistent_buffers(device));
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module->named_buffers(/*recurse=*/true))
    out.emplace_back(item.key(), item.value());
  return out;
}

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("family_buffers(int checkpoint, Device device) -> (str[], Tensor[])", &family_buffers_op);
}

ShardShapes::ShardShapes(CausalLM& module, int rank, int size, const std::string& reference) {
  if (size <= 1) return;
  const std::vector<TPRule> plan = tp_plan(module.config());
  std::unordered_set<const void*> seen;  // a tied tensor once
  std::vector<MismatchItem> problems;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    try {
      const TpShard s = tp_shard(tp_rule_for(plan, item.key()), t.sizes().vec(), rank, size);
      if (s.dim >= 0 && s.shape != t.sizes().vec()) {
        whole_.emplace_back(t, t.sizes().vec());
        t.set_data(at::empty(s.shape, t.options()));
      }
    } catch (const SliceError& e) {  // a size that does not divide
      problems.push_back({item.key(), ": " + escape_text(e.message())});
    }
  }
  if (problems.empty()) return;
  undo();
  const std::string summary =
      fmt::format("{} cannot be split into {} tensor-parallel ranks: {} problems",
                  escape_path(reference), size, problems.size());
  throw MismatchError(summary, {}, {}, std::move(problems));
}

void ShardShapes::undo() {
  for (auto& [t, shape] : whole_) t.set_data(at::empty(shape, t.options()));
  whole_.clear();
}

}  // namespace metaload
