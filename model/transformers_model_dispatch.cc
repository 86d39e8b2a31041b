// TransformersModel's dispatch (the weights into the skeleton) and the real runs that need it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>
#include <unordered_set>

#include "base/text.h"
#include "c10_ext/meta_mode.h"
#include "distributed/handshake.h"
#include "fake_mode/fake_tensor.h"
#include "loader/engine/engine_device.h"
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

namespace {

// Every parameter and buffer of the module, to put back as it was when a dispatch is called off.
std::vector<at::Tensor> module_tensors(CausalLM& module) {
  std::vector<at::Tensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.push_back(item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.push_back(item.value());
  return out;
}

}  // namespace

void TransformersModel::vote_on_dispatch_locked(const std::string& my_failure) {
  if (!group_ || options_.tp_size <= 1) return;
  agree_on_outcome(*group_,
                   fmt::format("the tensor-parallel dispatch of {}", escape_path(reference_)),
                   my_failure);
}

LoadReport TransformersModel::dispatch_locked() {
  if (dispatched_) return report_.value_or(LoadReport{});
  if (load_ref_.empty())
    throw ModelError(fmt::format("{} has no checkpoint to dispatch from", reference_));
  LoadOptions lo = options_;  // the model's options are the loader's
  lo.names = family_name_mapping(module_->config());
  lo.dtype.reset();     // the skeleton already has the dtype: each target keeps its own
  lo.revision.reset();  // load_ref_ is the resolved snapshot, pinned at construction
  // All or nothing: the buffers are computed before anything is swapped; with tensor
  // parallelism every rank votes before any rank keeps its weights (a failed rank, or one that
  // went silent, makes every rank raise DistributedError).
  const TensorSnapshot before(module_tensors(*module_));
  // A tensor-parallel rank's skeleton takes the shard shapes first (undone if the load fails).
  ShardShapes shards(*module_, options_.tp_rank, options_.tp_size, reference_);
  LoadReport report;
  std::exception_ptr failed;
  std::string failure;
  try {
    RealGuard real;  // the slots and buffers are real even inside a user's metaload.meta()
    // The device first, as the loader checks it (DeviceError), before buffers are made on it.
    if (options_.device.is_cuda())
      make_cuda_device_ops(options_.device.has_index() ? options_.device.index() : 0);
    const std::vector<CausalLM::FreshBuffer> buffers =
        module_->compute_nonpersistent_buffers(options_.device);
    report = metaload::load(*module_, load_ref_, lo);
    CausalLM::apply_buffers(buffers);
  } catch (const std::exception& e) {
    failed = std::current_exception();
    failure = e.what();
  }
  try {
    vote_on_dispatch_locked(failure);  // every rank takes part, whether its own part failed or not
    if (failed) std::rethrow_exception(failed);
  } catch (...) {
    before.restore();  // a failed vote undoes this rank's swap
    shards.undo();
    throw;
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

// dispatch_from's pairing of the module's parameters (in shard shapes) with the tensors given:
// each parameter once (a tied group under any of its names), and every problem.
struct GivenWeights {
  std::vector<at::Tensor> targets, sources;
  std::vector<std::string> names;
  std::vector<MismatchItem> missing, unexpected, mismatched;
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

// The check of one parameter's source; empty when it fits.
std::string misfit(const at::Tensor& source, const at::Tensor& target, int rank, int size) {
  if (!source.defined() || source.is_meta()) return ": holds no data (undefined or meta)";
  if (source.sizes() != target.sizes())
    return fmt::format(": shape {} given, rank {} of {} holds {}", shape_text(source.sizes()), rank,
                       size, shape_text(target.sizes()));
  if (source.is_floating_point() != target.is_floating_point())
    return fmt::format(": dtype {} given, the model's is {}", c10::toString(source.scalar_type()),
                       c10::toString(target.scalar_type()));
  return "";
}

GivenWeights match_given(CausalLM& module, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& tensors, int rank, int size) {
  GivenWeights out;
  std::unordered_map<std::string, at::Tensor> given;
  for (size_t i = 0; i < names.size(); ++i)
    if (!given.emplace(names[i], tensors[i]).second)
      out.mismatched.push_back({names[i], ": given twice"});
  std::vector<std::pair<at::Tensor, std::vector<std::string>>> groups;
  std::unordered_map<const void*, size_t> group_of;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    auto [it, fresh] = group_of.emplace(item.value().unsafeGetTensorImpl(), groups.size());
    if (fresh) groups.push_back({item.value(), {}});
    groups[it->second].second.push_back(item.key());
  }
  std::unordered_set<std::string> used;
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
      out.missing.push_back({name, " " + shape_text(target.sizes())});
    } else if (std::string why = misfit(*source, target, rank, size); !why.empty()) {
      out.mismatched.push_back({name, why});
    } else {
      out.targets.push_back(target);
      out.sources.push_back(*source);
      out.names.push_back(name);
    }
  }
  for (const std::string& n : names)
    if (!used.count(n)) out.unexpected.push_back({n, ""});
  return out;
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
  // The shard shapes this rank holds (undone unless the swap happens).
  ShardShapes shards(*module_, options_.tp_rank, options_.tp_size, reference_);
  GivenWeights w = match_given(*module_, names, tensors, options_.tp_rank, options_.tp_size);
  if (!w.ok()) {
    shards.undo();
    const size_t n = w.missing.size() + w.unexpected.size() + w.mismatched.size();
    throw MismatchError(fmt::format("the tensors given do not fit {} (rank {} of {}): {} problems",
                                    escape_path(reference_), options_.tp_rank, options_.tp_size, n),
                        std::move(w.missing), std::move(w.unexpected), std::move(w.mismatched));
  }
  if (check_only) {
    shards.undo();
    return;
  }
  LoadReport report;
  try {
    RealGuard real;
    for (size_t i = 0; i < w.sources.size(); ++i) {
      w.sources[i] = w.sources[i].to(options_.device, w.targets[i].scalar_type()).contiguous();
      report.slot_bytes += w.sources[i].nbytes();
    }
    const std::vector<CausalLM::FreshBuffer> buffers =
        module_->compute_nonpersistent_buffers(options_.device);
    swap_in(w.targets, w.sources, w.names);  // all or nothing itself; apply_buffers cannot fail
    CausalLM::apply_buffers(buffers);
  } catch (...) {
    shards.undo();
    throw;
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
