// TransformersModel's dispatch (the weights into the skeleton) and the real runs that need it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>
#include <unordered_set>

#include "base/text.h"
#include "c10_ext/meta_mode.h"
#include "fake_mode/fake_tensor.h"
#include "loader/load/slots_torch.h"
#include "loader/load/swap.h"
#include "model/family_load.h"
#include "model/transformers_model.h"

namespace metaload {

bool TransformersModel::dispatched() const {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return dispatched_;
}

std::optional<LoadReport> TransformersModel::load_report() const {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return report_;
}

void TransformersModel::check_runnable(const char* what) const {
  if (options_.tp_size > 1 && !group_)
    throw ModelError(fmt::format(
        "{}: rank {} of a tensor-parallel split holds shards of the weights and cannot run the "
        "model alone: give it the ranks' process group (ModelOptions::process_group; in Python "
        "torch.distributed's, the default group when process_group=None), or scan it",
        what, options_.tp_rank));
}

LoadReport TransformersModel::dispatch() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return dispatch_locked();
}

LoadReport TransformersModel::dispatch_locked() {
  if (dispatched_) return report_.value_or(LoadReport{});
  if (load_ref_.empty())
    throw ModelError(fmt::format("{} has no checkpoint to dispatch from", reference_));
  LoadOptions lo = options_;  // the model's options are the loader's
  lo.names = family_name_mapping(module_->config());
  lo.dtype.reset();     // the skeleton already has the dtype: each target keeps its own
  lo.revision.reset();  // load_ref_ is the resolved snapshot, pinned at construction
  // A tensor-parallel rank's skeleton takes the shard shapes first (undone if the load fails).
  ShardShapes shards(*module_, options_.tp_rank, options_.tp_size, reference_);
  LoadReport report;
  try {
    RealGuard real;  // the slots and buffers are real even inside a user's metaload.meta()
    report = metaload::load(*module_, load_ref_, lo);
  } catch (...) {
    shards.undo();
    throw;
  }
  {
    RealGuard real;
    module_->init_nonpersistent_buffers(options_.device);
  }
  report_ = report;
  dispatched_ = true;
  if (report.mapped_bytes > 0) remember_mappings_locked();
  return report;
}

namespace {

std::string shape_text(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace

void TransformersModel::dispatch_from(const std::vector<std::string>& names,
                                      const std::vector<at::Tensor>& tensors, bool check_only) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  if (names.size() != tensors.size())
    throw ModelError(
        fmt::format("dispatch_from: {} names but {} tensors", names.size(), tensors.size()));
  if (dispatched_)
    throw ModelError(fmt::format("{} is already dispatched: its weights are loaded", reference_));
  std::vector<MismatchItem> missing, unexpected, mismatched;
  std::unordered_map<std::string, at::Tensor> given;
  for (size_t i = 0; i < names.size(); ++i)
    if (!given.emplace(names[i], tensors[i]).second)
      mismatched.push_back({names[i], ": given twice"});
  // The shard shapes this rank holds (undone unless the swap happens).
  ShardShapes shards(*module_, options_.tp_rank, options_.tp_size, reference_);
  // A tied group is one tensor under several names: one target, its source under any name.
  std::vector<std::pair<at::Tensor, std::vector<std::string>>> groups;
  std::unordered_map<const void*, size_t> group_of;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    auto [it, fresh] = group_of.emplace(impl, groups.size());
    if (fresh) groups.push_back({item.value(), {}});
    groups[it->second].second.push_back(item.key());
  }
  std::unordered_set<std::string> used;
  std::vector<at::Tensor> targets, sources;
  std::vector<std::string> target_names;
  for (const auto& [target, group_names] : groups) {
    const at::Tensor* source = nullptr;
    for (const std::string& n : group_names) {
      auto it = given.find(n);
      if (it == given.end()) continue;
      used.insert(n);
      if (source == nullptr) source = &it->second;
    }
    const std::string& name = group_names.front();
    if (source == nullptr) {
      missing.push_back({name, " " + shape_text(target.sizes())});
    } else if (!source->defined() || source->is_meta()) {
      mismatched.push_back({name, ": holds no data (undefined or meta)"});
    } else if (source->sizes() != target.sizes()) {
      mismatched.push_back({name, fmt::format(": shape {} given, rank {} of {} holds {}",
                                              shape_text(source->sizes()), options_.tp_rank,
                                              options_.tp_size, shape_text(target.sizes()))});
    } else if (source->is_floating_point() != target.is_floating_point()) {
      mismatched.push_back({name, fmt::format(": dtype {} given, the model's is {}",
                                              c10::toString(source->scalar_type()),
                                              c10::toString(target.scalar_type()))});
    } else {
      targets.push_back(target);
      sources.push_back(*source);
      target_names.push_back(name);
    }
  }
  for (const std::string& n : names)
    if (!used.count(n)) unexpected.push_back({n, ""});
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    shards.undo();
    const size_t n = missing.size() + unexpected.size() + mismatched.size();
    throw MismatchError(fmt::format("the tensors given do not fit {} (rank {} of {}): {} problems",
                                    escape_path(reference_), options_.tp_rank, options_.tp_size, n),
                        std::move(missing), std::move(unexpected), std::move(mismatched));
  }
  if (check_only) {
    shards.undo();
    return;
  }
  LoadReport report;
  try {
    RealGuard real;
    for (size_t i = 0; i < sources.size(); ++i) {
      sources[i] = sources[i].to(options_.device, targets[i].scalar_type()).contiguous();
      report.slot_bytes += sources[i].nbytes();
    }
    swap_in(targets, sources, target_names);
  } catch (...) {
    shards.undo();
    throw;
  }
  {
    RealGuard real;
    module_->init_nonpersistent_buffers(options_.device);
  }
  report.engine = "given";
  report_ = report;
  dispatched_ = true;
}

void TransformersModel::remember_mappings_locked() {
  std::vector<at::Tensor> tensors;
  for (const auto& item : module_->named_parameters(/*recurse=*/true))
    tensors.push_back(item.value());
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) tensors.push_back(item.value());
  for (const auto& m : mappings_of(tensors)) mapped_.push_back(m);
}

void TransformersModel::check_mapped_locked() const {
  for (const auto& w : mapped_)
    if (std::shared_ptr<FileMapping> m = w.lock()) m->check();
}

at::Tensor TransformersModel::forward(const at::Tensor& ids) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  if (!ids.defined()) throw ModelError("forward: the input ids are undefined");
  if (ids.is_meta() || is_fake(ids)) return scan_locked({ids}, std::nullopt).logits;
  check_runnable("forward");
  dispatch_locked();
  check_mapped_locked();
  install_observer({});
  run_tensor_parallel_locked();
  RealGuard real;
  at::NoGradGuard no_grad;
  at::Tensor logits = module_->forward(ids);
  check_mapped_locked();  // a file changed during the forward: the logits may mix two versions
  return logits;
}

at::Tensor TransformersModel::generate(const at::Tensor& ids, int64_t n) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  if (!ids.defined()) throw ModelError("generate: the input ids are undefined");
  if (ids.is_meta() || is_fake(ids))
    throw ModelError(
        "generate: the ids are meta or fake tensors; choosing tokens needs values (a scan "
        "has none): pass real ids");
  check_runnable("generate");
  dispatch_locked();
  check_mapped_locked();
  install_observer({});
  run_tensor_parallel_locked();
  RealGuard real;
  at::Tensor out = module_->generate(ids, n);
  check_mapped_locked();
  return out;
}

}  // namespace metaload
