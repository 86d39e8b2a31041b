// TransformersModel: construction (a reference resolved by resolve_reference, config.json, the meta
// skeleton) and the module tree's paths. Scan, dispatch, captures and keys have their own files
// (transformers_model_*.cc).
#include "model/transformers_model.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <torch/nn/module.h>

#include "base/text.h"
#include "loader/format/checkpoint.h"
#include "loader/format/file_io.h"
#include "loader/format/hf_cache.h"
#include "identity/reference.h"
#include "model/transformers_model_impl.h"

namespace metaload {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Up to `n` names closest to `wanted` by edit distance (ties in the given order).
std::string closest(const std::string& wanted, const std::vector<std::string>& names, size_t n) {
  std::vector<std::pair<size_t, size_t>> scored;  // distance, index
  for (size_t i = 0; i < names.size(); ++i) scored.emplace_back(edit_distance(wanted, names[i]), i);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (size_t i = 0; i < std::min(n, scored.size()); ++i)
    out += (i ? ", " : "") + (names[scored[i].second].empty() ? std::string("\"\" (the model)")
                                                              : names[scored[i].second]);
  return out;
}

void check_options(ModelOptions& o) {
  if (o.process_group) {
    // -1: the process's rank in the group. tp_size and tp_rank are checked against the group by
    // the handshake, on every rank at once (a rank that refused alone would leave the others
    // waiting for it).
    if (o.tp_rank == -1) o.tp_rank = o.process_group->getRank();
  } else if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    throw ModelError(
        fmt::format("tensor-parallel rank {} of {} does not exist", o.tp_rank, o.tp_size));
  if (o.threads < 0 || o.threads > kMaxLoaderThreads)
    throw ModelError(fmt::format("threads must be 0 (one per core) or from 1 to {}, got {}",
                                 kMaxLoaderThreads, o.threads));
}

// The canonical path, or the path as given when it cannot be resolved.
std::string real_or_given(const std::string& path) {
  const std::string real = fileio::real_path(path);
  return real.empty() ? path : real;
}

}  // namespace

TransformersModel::TransformersModel(const std::string& ref, ModelOptions options)
    : options_(std::move(options)), reference_(ref) {
  const auto t0 = std::chrono::steady_clock::now();
  options_.device = model_detail::normalized(options_.device);
  check_options(options_);
  if (is_model_key_reference(ref)) {
    // A model key: its repo id (and revision) name the checkpoint; the class is checked first.
    const ModelKey key = metaload::from_model_key(ref, options_.keys);
    check_transformers_model_key(key);
    init(resolve_reference(key, options_.revision, options_.keys), t0);
  } else {
    init(resolve_reference(ref, options_.revision, options_.keys), t0);
  }
}

TransformersModel::TransformersModel(const ModelKey& key, ModelOptions options)
    : options_(std::move(options)) {
  const auto t0 = std::chrono::steady_clock::now();
  options_.device = model_detail::normalized(options_.device);
  check_options(options_);
  reference_ = metaload::to_model_key(key, options_.keys);  // checks the key's repo id
  check_transformers_model_key(key);
  init(resolve_reference(key, options_.revision, options_.keys), t0);
}

void TransformersModel::init(const ModelReference& ref, std::chrono::steady_clock::time_point t0) {
  const CheckpointReference& c = ref.checkpoint;
  revision_ = ref.revision;
  repo_id_ = c.repo_id;
  commit_ = c.commit;
  // Dispatch loads this snapshot even if the branch moves meanwhile; a local path canonically.
  load_ref_ = c.kind == ReferenceKind::kRepoId ? c.path : real_or_given(c.path);
  const std::string dir = c.kind == ReferenceKind::kRepoId ? c.dir : real_or_given(c.dir);
  config_path_ = dir + "/config.json";
  if (!fileio::exists(config_path_))
    throw ResolveError(
        fmt::format("{} has no config.json: the model's architecture and sizes come from it", dir));
  // In a hub snapshot config.json must lead into the repo's blob store (read_config_json refuses
  // a FIFO, directory or link loop in its place).
  if (c.snapshot_of) check_snapshot_file(config_path_, dir, *c.snapshot_of);
  // config.json is all that is read: no safetensors header, no weight byte.
  const FamilyConfig config = parse_family_config(read_config_json(config_path_), config_path_);
  BuildOptions build;
  build.dtype = options_.dtype.value_or(at::kFloat);
  build.device = at::kMeta;
  build.init_weights = false;
  module_ = build_causal_lm(config, build);
  build_seconds_ = model_detail::seconds_since(t0);
  if (options_.process_group) join_group();
  if (options_.dispatch) dispatch();
}

TransformersModel::TransformersModel(std::shared_ptr<CausalLM> module, ModelOptions options)
    : options_(std::move(options)), module_(std::move(module)) {
  if (!module_) throw ModelError("the module is null");
  for (const auto& p : module_->parameters())
    if (p.is_meta())
      throw ModelError(
          "the module is a skeleton (meta parameters) and no checkpoint was named: construct "
          "the model from a checkpoint reference instead");
  options_.device = module_->parameters().front().device();
  reference_ = fmt::format("<{} module>", module_->name());
  dispatched_ = true;
}

TransformersModel::~TransformersModel() {
  // The observer points at this object; the module may outlive it (module_ptr()).
  if (module_) module_->set_output_observer({});
}

std::vector<std::string> TransformersModel::module_paths() const {
  std::vector<std::string> out;
  for (const auto& item : module_->named_modules("", /*include_self=*/true))
    out.push_back(item.key());
  return out;
}

void TransformersModel::throw_unknown_path(const std::string& path, const char* what) const {
  throw ModulePathError(fmt::format(
      "{}: no module {} in {} ({}); closest: {}", what, quote_text(path, '\''), module_->name(),
      escape_path(module_->config().source), closest(path, module_paths(), 5)));
}

std::shared_ptr<torch::nn::Module> TransformersModel::at(const std::string& path) const {
  for (const auto& item : module_->named_modules("", /*include_self=*/true))
    if (item.key() == path) return item.value();
  throw_unknown_path(path, "at");
}

at::Tensor TransformersModel::parameter(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.key() == name) return item.value();
    names.push_back(item.key());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (item.key() == name) return item.value();
    names.push_back(item.key());
  }
  throw ModulePathError(fmt::format("parameter: no parameter or buffer {} in {}; closest: {}",
                                    quote_text(name, '\''), module_->name(),
                                    closest(name, names, 5)));
}

}  // namespace metaload
