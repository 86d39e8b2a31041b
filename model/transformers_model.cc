#include "model/transformers_model.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "base/checked.h"
#include "base/text.h"
#include "c10_ext/meta_mode.h"
#include "fake_mode/fake_tensor.h"
#include "fake_mode/scan.h"
#include "loader/checkpoint.h"
#include "loader/file_io.h"
#include "loader/hf_cache.h"
#include "loader/plan.h"
#include "loader/slots_torch.h"
#include "model/registry.h"

namespace metaload {

struct Capture::State {
  explicit State(std::string p) : path(std::move(p)) {}
  const std::string path;
  mutable std::mutex mu;
  at::Tensor value;
  int64_t count = 0;
};

const std::string& Capture::path() const {
  return state_->path;
}

bool Capture::has_value() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->value.defined();
}

at::Tensor Capture::value() const {
  std::lock_guard<std::mutex> g(state_->mu);
  if (!state_->value.defined())
    throw ModelError(
        fmt::format("no output of {} captured yet: the module has not run since the capture began",
                    quote_text(state_->path, '\'')));
  return state_->value;
}

int64_t Capture::count() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->count;
}

void Capture::reset() {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->value = at::Tensor();
}

std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

uint64_t ModuleShape::bytes() const {
  return checked_product<uint64_t>(sizes, c10::elementSize(dtype),
                                   path.empty()
                                       ? std::string("output bytes of the model")
                                       : "output bytes of module " + quote_text(path, '\''));
}

const ModuleShape* ModelScan::find(const std::string& path) const {
  for (const ModuleShape& m : modules)
    if (m.path == path) return &m;
  return nullptr;
}

uint64_t ModelScan::total_bytes() const {
  uint64_t total = 0;
  const std::string what =
      "total output bytes of the scan (" + std::to_string(modules.size()) + " modules)";
  for (const ModuleShape& m : modules) total = checked_add(total, m.bytes(), what);
  return total;
}

std::string ModelScan::modules_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const ModuleShape& m : modules) {
    out.push_back({{"path", m.path},
                   {"class", m.class_name},
                   {"shape", m.sizes},
                   {"dtype", torch_dtype_name(m.dtype)},
                   {"device", m.device.str()},
                   {"calls", m.calls},
                   {"bytes", m.bytes()}});
  }
  return out.dump();
}

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "cuda" means cuda:0, as metaload.fake and torch's default device do.
at::Device normalized(at::Device d) {
  if (d.is_cuda() && !d.has_index()) return at::Device(at::kCUDA, 0);
  return d;
}

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

// The family's names as the loader wants them.
NameMapping name_mapping(const FamilyConfig& config) {
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
    const TPShard s = tp_shard(tp_rule_for(plan, name), shape, rank, size);
    TpShard out;
    out.dim = s.dim;
    out.ranges = s.ranges;
    out.shape = s.shape;
    return out;
  };
  return names;
}

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr;
}

// The checkpoint a model key names (its repo id); the key's revision joins `revision` (they must
// agree when both are given).
std::string key_target(const ModelKey& key, std::optional<std::string>& revision) {
  if (canonical_model_class(key.class_path) != kTransformersModel)
    throw ModelKeyError(fmt::format("the key's class {} is not {}", quote_text(key.class_path),
                                    kTransformersModel));
  if (!key.extra.empty())
    throw ModelKeyError(
        fmt::format("model key field {} is not supported: {} builds causal language models from "
                    "repo_id and revision only",
                    quote_text(key.extra.front().first), kTransformersModel));
  if (key.revision && revision && *revision != *key.revision)
    throw ModelKeyError(fmt::format("the key pins revision {} but the options ask for {}",
                                    quote_text(*key.revision), quote_text(*revision)));
  if (key.revision) revision = key.revision;
  return key.repo_id;
}

std::shared_ptr<TransformersModel> factory(const ModelKey& key, const ModelOptions& options) {
  return std::make_shared<TransformersModel>(key, options);
}

[[maybe_unused]] const bool kFactoryRegistered = [] {
  set_model_factory(kTransformersModel, ModelFactory(&factory));
  return true;
}();

}  // namespace

namespace {

void check_options(const ModelOptions& o) {
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    throw ModelError(
        fmt::format("tensor-parallel rank {} of {} does not exist", o.tp_rank, o.tp_size));
  if (o.threads < 0 || o.threads > kMaxLoaderThreads)
    throw ModelError(fmt::format("threads must be 0 (one per core) or from 1 to {}, got {}",
                                 kMaxLoaderThreads, o.threads));
}

}  // namespace

TransformersModel::TransformersModel(const std::string& ref, ModelOptions options)
    : options_(std::move(options)), reference_(ref) {
  const auto t0 = std::chrono::steady_clock::now();
  options_.device = normalized(options_.device);
  check_options(options_);
  if (ref.empty()) throw ResolveError("empty model reference");
  // stat() and realpath() would read the path only up to a NUL: refuse rather than build another.
  if (ref.find('\0') != std::string::npos)
    throw ResolveError("model reference " + quote_text(ref) + " contains a NUL byte");
  struct stat st;
  if (::stat(ref.c_str(), &st) != 0 && ref.find(':') != std::string::npos) {
    // A model key: its repo id (and revision) name the checkpoint.
    std::optional<std::string> revision = options_.revision;
    const std::string target = key_target(metaload::from_model_key(ref, options_.keys), revision);
    init(target, revision, /*from_key=*/true, t0);
  } else {
    init(ref, options_.revision, /*from_key=*/false, t0);
  }
}

TransformersModel::TransformersModel(const ModelKey& key, ModelOptions options)
    : options_(std::move(options)) {
  const auto t0 = std::chrono::steady_clock::now();
  options_.device = normalized(options_.device);
  check_options(options_);
  reference_ = metaload::to_model_key(key, options_.keys);  // checks the key's repo id
  std::optional<std::string> revision = options_.revision;
  const std::string target = key_target(key, revision);
  init(target, revision, /*from_key=*/true, t0);
}

void TransformersModel::init(const std::string& target, std::optional<std::string> revision,
                             bool from_key, std::chrono::steady_clock::time_point t0) {
  struct stat st;
  // A key names a Hub repo, never a path (not even one relative to the working directory),
  // unless the caller allows keys to name local paths.
  bool exists = (!from_key || options_.keys.allow_local_paths) && ::stat(target.c_str(), &st) == 0;
  revision_ = revision;
  std::string dir;
  if (exists) {
    if (revision)
      throw ResolveError(fmt::format(
          "revision {} given for the local path {}: revisions are for Hugging Face repo ids",
          quote_text(*revision), escape_text(target)));
    char resolved[PATH_MAX];
    load_ref_ = ::realpath(target.c_str(), resolved) ? std::string(resolved) : target;
    if (S_ISDIR(st.st_mode)) {
      dir = load_ref_;
    } else {
      const size_t slash = load_ref_.find_last_of('/');
      dir = slash == std::string::npos ? "." : load_ref_.substr(0, slash);
    }
  } else if (looks_like_repo_id(target)) {
    const HubSnapshot snap = resolve_hf_snapshot(target, revision);  // ResolveError if absent
    repo_id_ = target;
    commit_ = snap.commit;
    // Dispatch loads this snapshot even if the branch moves meanwhile.
    load_ref_ = snap.snapshot_dir;
    dir = snap.snapshot_dir;
  } else {
    throw ResolveError(fmt::format(
        "{} is neither an existing file or directory, a Hugging Face repo id (ORG/NAME) nor a "
        "model key (CLASS:JSON)",
        quote_text(target, '\'')));
  }
  config_path_ = dir + "/config.json";
  if (!fileio::exists(config_path_))
    throw ResolveError(
        fmt::format("{} has no config.json: the model's architecture and sizes come from it", dir));
  // In a hub snapshot config.json must lead into the repo's blob store (read_config_json refuses
  // a FIFO, directory or link loop in its place).
  if (const auto repo = hf_repo_of_snapshot(fileio::real_path(dir)))
    check_snapshot_file(config_path_, dir, *repo);
  // config.json is all that is read: no safetensors header, no weight byte.
  const FamilyConfig config = parse_family_config(read_config_json(config_path_), config_path_);
  BuildOptions build;
  build.dtype = options_.dtype.value_or(at::kFloat);
  build.device = at::kMeta;
  build.init_weights = false;
  module_ = build_causal_lm(config, build);
  build_seconds_ = since(t0);
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

std::shared_ptr<TransformersModel> TransformersModel::from_model_key(std::string_view key,
                                                                     ModelOptions options) {
  const ModelKey parsed = metaload::from_model_key(key, options.keys);
  const std::string canonical = canonical_model_class(parsed.class_path);
  const auto make = model_factory<ModelFactory>(canonical);
  if (!make)
    throw ModelKeyError(
        fmt::format("no factory builds class {} (key {})", canonical, std::string(key)));
  return (*make)(parsed, options);
}

std::string TransformersModel::to_model_key() const {
  return to_model_key(options_.keys);
}

std::string TransformersModel::to_model_key(const KeyOptions& keys) const {
  if (load_ref_.empty())
    throw ModelError(
        fmt::format("{} was built from a module: it has no repo id for a key", reference_));
  return metaload::to_model_key(
      ModelKey{kTransformersModel, repo_id_ ? *repo_id_ : load_ref_, revision_, {}}, keys);
}

bool TransformersModel::dispatched() const {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return dispatched_;
}

std::optional<LoadReport> TransformersModel::load_report() const {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return report_;
}

void TransformersModel::install_observer(const OutputObserver& extra) {
  captures_.erase(
      std::remove_if(captures_.begin(), captures_.end(), [](const auto& w) { return w.expired(); }),
      captures_.end());
  if (captures_.empty() && !extra) {
    module_->set_output_observer({});  // nothing observed: the forward pays nothing
    return;
  }
  module_->set_output_observer([this, extra](const std::string& path, const at::Tensor& out) {
    if (extra) extra(path, out);
    deliver(path, out);
  });
}

void TransformersModel::deliver(const std::string& path, const at::Tensor& output) {
  for (const auto& w : captures_) {
    std::shared_ptr<Capture::State> s = w.lock();
    if (!s || s->path != path) continue;
    std::lock_guard<std::mutex> g(s->mu);
    s->value = output;
    ++s->count;
  }
}

void TransformersModel::check_runnable(const char* what) const {
  if (options_.tp_size > 1)
    throw ModelError(fmt::format(
        "{}: rank {} of a tensor-parallel split holds shards of the weights and cannot run the "
        "model alone (metaload has no collectives); scan the whole model, or dispatch with "
        "tp_size 1",
        what, options_.tp_rank));
}

ModelScan TransformersModel::scan(const std::vector<at::Tensor>& inputs,
                                  std::optional<at::Device> device) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return scan_locked(inputs, device);
}

ModelScan TransformersModel::scan(int64_t batch, int64_t seq, std::optional<at::Device> device) {
  if (batch < 1 || seq < 1)
    throw ModelError(
        fmt::format("scan: batch ({}) and sequence length ({}) must be >= 1", batch, seq));
  checked_product<int64_t>({batch, seq}, sizeof(int64_t), "bytes of the token ids [batch, seq]");
  const at::Tensor ids =
      at::zeros({batch, seq}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  std::lock_guard<std::recursive_mutex> g(mu_);
  return scan_locked({ids}, device);
}

ModelScan TransformersModel::scan_locked(const std::vector<at::Tensor>& inputs,
                                         std::optional<at::Device> device) {
  const auto t0 = std::chrono::steady_clock::now();
  if (dispatched_) check_runnable("scan");
  if (inputs.size() != 1)
    throw ModelError(
        fmt::format("scan takes one input, the token ids [batch, seq]; got {}", inputs.size()));
  at::Device where = options_.device;
  if (device) {
    where = normalized(*device);
  } else if (dispatched_) {
    where = module_->parameters().front().device();
  } else if (inputs[0].defined() && is_fake(inputs[0])) {
    where = claimed_device(inputs[0]);
  }
  ModelScan out;
  out.device = where;
  const auto& classes = classes_locked();
  std::unordered_map<std::string, size_t> index;
  size_t last = SIZE_MAX;  // the latest module to report (named if a later one fails)
  auto record = [&](const std::string& path, const at::Tensor& t) {
    auto [it, fresh] = index.emplace(path, out.modules.size());
    if (fresh) {
      const auto cls = classes.find(path);
      out.modules.push_back(ModuleShape{
          path, cls == classes.end() ? std::string() : cls->second, {}, at::kFloat, where, 0});
    }
    ModuleShape& m = out.modules[it->second];
    m.sizes = t.sizes().vec();  // the last output wins (a module called twice reports twice)
    m.dtype = t.scalar_type();
    m.device = claimed_device(t);
    ++m.calls;
    last = it->second;
  };
  auto attach = [&](ModuleObserver observer) {
    if (!observer) {
      install_observer({});
      return;
    }
    // Recorded here, in execution order with class names; ScanResult::modules stays unused.
    install_observer(record);
  };
  ScanResult r;
  try {
    r = metaload::scan(
        [this](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{module_->forward(in[0])};
        },
        inputs, where, attach);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // An activation too large for torch's sizes (int64 bytes): torch's own check, typed here
    // (batch x seq x vocab and the attention scores grow first). It comes as a c10::Error, or,
    // where a meta kernel is written in Python (torch 2.x in a Python process), as the Python
    // error's C++ carrier. Other errors pass unchanged.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    const std::string torch_msg = c10_error ? c10_error->what_without_backtrace() : e.what();
    if (torch_msg.find("overflow") == std::string::npos) throw;
    const std::string after = last == SIZE_MAX
                                  ? std::string("in the model's first module")
                                  : "after module " + quote_text(out.modules[last].path);
    throw SizeOverflowError(fmt::format(
        "bytes of an activation in the scan of ids [{}], {}: overflows (more than 2^63-1): {}",
        fmt::join(inputs[0].sizes(), ", "), after,
        escape_text(torch_msg.substr(0, torch_msg.find('\n')))));
  }
  out.logits = r.outputs.at(0);
  out.total_bytes();  // a total past 2^64-1 is an error now, not a wrapped number later
  out.seconds = since(t0);
  return out;
}

LoadReport TransformersModel::dispatch() {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return dispatch_locked();
}

LoadReport TransformersModel::dispatch_locked() {
  if (dispatched_) return report_.value_or(LoadReport{});
  if (load_ref_.empty())
    throw ModelError(fmt::format("{} has no checkpoint to dispatch from", reference_));
  const FamilyConfig& config = module_->config();
  LoadOptions lo;
  lo.device = options_.device;
  lo.tp_rank = options_.tp_rank;
  lo.tp_size = options_.tp_size;
  lo.threads = options_.threads;
  lo.staging_bytes = options_.staging_bytes;
  lo.engine = options_.engine;
  lo.names = name_mapping(config);

  // A tensor-parallel rank holds shards: its skeleton takes the shard shapes first (undone if the
  // load fails), so the loader's shape checks compare like with like.
  std::vector<std::pair<at::Tensor, std::vector<int64_t>>> reshaped;
  auto undo = [&] {
    for (auto& [t, shape] : reshaped) t.set_data(at::empty(shape, t.options()));
  };
  if (options_.tp_size > 1) {
    const std::vector<TPRule> plan = tp_plan(config);
    std::unordered_set<const void*> seen;
    std::vector<MismatchItem> problems;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      at::Tensor t = item.value();
      if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
      try {
        const TPShard s = tp_shard(tp_rule_for(plan, item.key()), t.sizes().vec(), options_.tp_rank,
                                   options_.tp_size);
        if (s.dim >= 0 && s.shape != t.sizes().vec()) {
          reshaped.emplace_back(t, t.sizes().vec());
          t.set_data(at::empty(s.shape, t.options()));
        }
      } catch (const FamilyError& e) {
        problems.push_back({item.key(), ": " + escape_text(e.message())});
      }
    }
    if (!problems.empty()) {
      undo();
      const std::string summary =
          fmt::format("{} cannot be split into {} tensor-parallel ranks: {} problems",
                      escape_path(reference_), options_.tp_size, problems.size());
      throw MismatchError(summary, {}, {}, std::move(problems));
    }
  }
  LoadReport report;
  try {
    RealGuard real;  // the slots and buffers are real even inside a user's metaload.meta()
    report = metaload::load(*module_, load_ref_, lo);
  } catch (...) {
    undo();
    throw;
  }
  {
    RealGuard real;
    module_->init_nonpersistent_buffers(options_.device);
  }
  report_ = report;
  dispatched_ = true;
  if (report.mapped_bytes > 0) {
    std::vector<at::Tensor> tensors;
    for (const auto& item : module_->named_parameters(/*recurse=*/true))
      tensors.push_back(item.value());
    for (const auto& item : module_->named_buffers(/*recurse=*/true))
      tensors.push_back(item.value());
    for (const auto& m : mappings_of(tensors)) mapped_.push_back(m);
  }
  return report;
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
  RealGuard real;
  at::Tensor out = module_->generate(ids, n);
  check_mapped_locked();
  return out;
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

const std::unordered_map<std::string, std::string>& TransformersModel::classes_locked() {
  if (classes_.empty()) {
    for (const auto& item : module_->named_modules("", /*include_self=*/true)) {
      classes_[item.key()] = item.value()->name();
      const int64_t n = output_elements(*item.value());
      for (int64_t i = 0; i < n; ++i)
        classes_[fmt::format("{}.{}", item.key(), i)] = item.value()->name();
    }
  }
  return classes_;
}

Capture TransformersModel::capture(const std::string& path) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  // An element of a tuple output ("model.rotary_emb.0") is no module but is reported like one.
  const auto& classes = classes_locked();
  std::shared_ptr<torch::nn::Module> m;
  for (const auto& item : module_->named_modules("", /*include_self=*/true))
    if (item.key() == path) m = item.value();
  if (!m && classes.count(path) == 0) at(path);  // ModulePathError for a wrong path
  if (m) {
    if (is_container(*m)) {
      throw ModelError(fmt::format(
          "capture: '{}' is a container ({}): it produces no output of its own; capture one of "
          "its entries, e.g. '{}.0'",
          path, m->name(), path));
    }
    if (const int64_t n = output_elements(*m); n > 0) {
      throw ModelError(fmt::format(
          "capture: '{}' ({}) returns a tuple of {} tensors; capture its elements '{}.0' to "
          "'{}.{}' (rotary_emb: .0 is cos, .1 is sin)",
          path, m->name(), n, path, path, n - 1));
    }
  }
  auto state = std::make_shared<Capture::State>(path);
  captures_.push_back(state);
  install_observer({});
  return Capture(state);
}

}  // namespace metaload
