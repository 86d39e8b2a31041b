// metaload::TransformersModel: the meta policy for the causal-LM families. Name a model (a
// checkpoint directory, a Hugging Face repo id in the local cache, or a model key) and get its
// module tree at once, with no weight memory; scan it for every module's output shape; and have
// the real weights stream into the very same tree on dispatch() or on the first real forward.
//
//   metaload::TransformersModel model("openai-community/gpt2");       // config.json only, ~ms
//   auto shapes = model.scan(/*batch=*/2, /*seq=*/16);                // never loads weights
//   at::Tensor w = model.parameter("transformer.h.0.attn.c_attn.weight");  // meta for now
//   auto h = model.capture("transformer.h.3");
//   at::Tensor logits = model.forward(ids);   // dispatches first: w now holds the weights
//   h.value();                                // transformer.h.3's output of that forward
//
// Key class path "metaload.TransformersModel" (registered as the registry's factory for it, so
// metaload::from_model_key(key) keys build one). Thread-safe: one forward / scan / dispatch runs
// at a time per model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "distributed/collectives.h"
#include "fake_mode/scan.h"
#include "loader/engine/engine.h"
#include "loader/engine/file_mapping.h"
#include "loader/load/plan.h"
#include "model/errors.h"
#include "model/families/family.h"
#include "identity/model_key.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace metaload {

struct ModelReference;  // identity/reference.h

// The loader's options are the model's (LoadOptions, loader/load/plan.h): dispatch() hands them to
// metaload::load, with the family's names in place of `names`. Their meaning here:
//  - device: accepted at construction, ignored by the meta build (which allocates nothing
//    anywhere), applied by dispatch();
//  - dtype: the parameters' dtype (the skeleton has it too, so scans report the real activation
//    dtypes). Default float32, as transformers; float16 / bfloat16 checkpoints are converted on
//    load;
//  - revision: for repo ids, a branch, tag or commit (a model key's own revision must agree);
//  - tp_rank / tp_size, threads (0: the machine's cores), staging_bytes (0: the engine's
//    default), map_files, strict, progress and engine (progress bar, hooks, chunk sizes): as
//    metaload::load takes them.
struct ModelOptions : LoadOptions {
  // Tensor parallelism across processes: the c10d group the ranks' collectives run on (gloo,
  // NCCL; the caller made it). With a group, tp_size must be the group's size on every rank and
  // tp_rank this process's rank in it (-1: take it from the group); construction runs a handshake
  // (dist/handshake.h) so ranks that disagree fail at once, and forward / generate run the
  // Megatron layout (family.h's TensorParallel). Without one a rank of tp_size > 1 can scan and
  // dispatch its shard but not run.
  ProcessGroupPtr process_group;
  // Every collective's wait (the handshake's too): a rank that died or hangs gives the others a
  // DistributedError after this long at most.
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  // The key policy for a reference that is a model key, and for to_model_key(): by default a
  // key's repo_id is a Hub repo id resolved in the hub cache only (model_key.h).
  KeyOptions keys;
  // Load at construction instead of on first use.
  bool dispatch = false;
};

// One module's output seen by a scan.
struct ModuleShape {
  std::string path;        // dotted path; "" is the whole model (the logits)
  std::string class_name;  // transformers' class name ("GPT2Attention", "Linear", ...)
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  int64_t calls = 0;  // outputs the module produced in the scan
  // Bytes of the output: elements x element size.
  uint64_t bytes() const;
};

struct ModelScan {
  // Built from fake_mode's scan result: its modules in the order they first produced output, each
  // with its class name (`class_of`: "" when unknown), the logits its first output.
  // SizeOverflowError when the total output bytes pass 2^64-1.
  static ModelScan from_result(const ScanResult& result, c10::Device device,
                               const std::function<std::string(const std::string&)>& class_of);

  c10::Device device = c10::Device(c10::kCPU);
  std::vector<ModuleShape> modules;  // in the order the modules first produced output
  at::Tensor logits;                 // a fake tensor claiming `device`
  double seconds = 0;
  // The tensor-parallel rank scanned: its modules' outputs are that rank's (column-parallel
  // projections hold its features; row-parallel outputs, embeddings and logits are whole).
  int64_t tp_size = 1, tp_rank = 0;
  // Bytes of the parameters one rank holds (its shards and the replicated tensors; tied tensors
  // once), in the model's dtype. Set by TransformersModel::scan.
  uint64_t weight_bytes = 0;
  // The module at `path`, or nullptr.
  const ModuleShape* find(const std::string& path) const;
  // Bytes of every module's output, summed (each module once).
  uint64_t total_bytes() const;
  // The modules as a JSON array of {path, class, shape, dtype, device, calls, bytes} (Python and
  // the CLI print it).
  std::string modules_json() const;
};

// A module's output, kept while the handle lives: real tensors during real forwards, fake ones
// during scans. Copies share the state; the model stops capturing when the last copy is gone.
class Capture {
 public:
  const std::string& path() const;
  bool has_value() const;
  // The latest output; ModelError when the module has produced none since the capture began.
  at::Tensor value() const;
  // Outputs seen so far (a generation step produces one per step).
  int64_t count() const;
  // Forgets the value (capturing goes on).
  void reset();

  struct State;

 private:
  friend class TransformersModel;
  explicit Capture(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class TransformersModel {
 public:
  // `ref`: a checkpoint directory (with config.json), a .safetensors / index file, a Hugging Face
  // repo id in the local hub cache (at options.revision), or a model key "<class>:<json>" (its
  // repo id under the key policy, options.keys). Reads config.json and nothing else (no
  // safetensors header, no weight byte); builds the skeleton. Throws ResolveError (nothing
  // found), FormatError / ConfigError (bad config.json: unknown model_type, missing field),
  // ModelKeyError (bad key; RepoIdError for a repo id the policy refuses); with
  // options.dispatch, whatever loading throws.
  explicit TransformersModel(const std::string& ref, ModelOptions options = {});
  // From a parsed key: its repo id in the hub cache only (a path only with
  // options.keys.allow_local_paths).
  explicit TransformersModel(const ModelKey& key, ModelOptions options = {});
  // A ready module (real weights): dispatched from the start; there is nothing to load.
  explicit TransformersModel(std::shared_ptr<CausalLM> module, ModelOptions options = {});
  ~TransformersModel();
  TransformersModel(const TransformersModel&) = delete;
  TransformersModel& operator=(const TransformersModel&) = delete;

  // From a model key (the registry's factory for metaload.TransformersModel and its nnsight
  // aliases): a model in meta state.
  static std::shared_ptr<TransformersModel> from_model_key(std::string_view key,
                                                           ModelOptions options = {});
  // "metaload.TransformersModel:{"repo_id": ..., "revision": ...}": the repo id of a hub
  // reference, the revision as given (null: unpinned). A local checkpoint's key names its
  // absolute directory, which the key policy refuses (RepoIdError) unless it allows local paths
  // (`keys`; by default options().keys). ModelError for a model built from a module.
  std::string to_model_key() const;
  std::string to_model_key(const KeyOptions& keys) const;

  const FamilyConfig& config() const { return module_->config(); }
  CausalLM& module() const { return *module_; }
  std::shared_ptr<CausalLM> module_ptr() const { return module_; }
  const ModelOptions& options() const { return options_; }
  bool dispatched() const;
  // The reference as given; the resolved checkpoint (directory, file or hub snapshot) that
  // dispatch loads; the hub repo id and commit when it came from the cache.
  const std::string& reference() const { return reference_; }
  const std::string& checkpoint() const { return load_ref_; }
  const std::string& config_path() const { return config_path_; }
  const std::optional<std::string>& repo_id() const { return repo_id_; }
  const std::optional<std::string>& revision() const { return revision_; }
  const std::optional<std::string>& commit() const { return commit_; }
  // Seconds the construction took (config read + skeleton build).
  double build_seconds() const { return build_seconds_; }

  // Runs the model on fake input ids (real, meta or fake tensors of shape [batch, seq]) claiming
  // `device` (default: where the weights are or will be) and records every module's output shape
  // and dtype. Never loads weights; captures see the fake outputs.
  // tp_size: scan rank tp_rank of that tensor-parallel split (no process group needed: the
  // collectives only keep shapes); by default the split the weights are in (the model's tp_size
  // once dispatched as a shard, else 1). ModelError for a rank that does not exist or a split
  // other than a dispatched shard's; MismatchError (as dispatch) for a size the model cannot be
  // split into.
  ModelScan scan(const std::vector<at::Tensor>& inputs,
                 std::optional<at::Device> device = std::nullopt,
                 std::optional<int64_t> tp_size = std::nullopt, int64_t tp_rank = 0);
  ModelScan scan(int64_t batch, int64_t seq, std::optional<at::Device> device = std::nullopt,
                 std::optional<int64_t> tp_size = std::nullopt, int64_t tp_rank = 0);

  // The collectives of the model's process group (nullptr without one).
  std::shared_ptr<Collectives> collectives() const { return group_; }

  // Loads the weights through metaload::load with the family's names (renames, ties, computed
  // buffers skipped, the TP shards of options.tp_rank / tp_size) into the same Parameter objects,
  // then computes the non-persistent buffers on the device. Idempotent: later calls return the
  // first report and do nothing. On failure (MismatchError listing every problem, ResolveError,
  // ReadError, DeviceError, ...) the model is exactly as before: meta, usable, and dispatch may be
  // tried again.
  LoadReport dispatch();
  std::optional<LoadReport> load_report() const;
  // Dispatches from `tensors` (names[i] -> tensors[i]) instead of the checkpoint: this rank's
  // shard of every parameter, as dispatch() would load it (a tied group under any of its names),
  // e.g. received over the process group from the rank that read the checkpoint (Python's
  // TransformersModel(..., source_rank=)). Tensors are converted to the model's dtype and device
  // where they differ. The same Parameter objects take them, all or nothing; then the
  // non-persistent buffers are computed, and the model is dispatched (load_report(): no bytes
  // read). check_only: the checks alone, nothing changes. MismatchError listing every missing,
  // unexpected and misshapen name (nothing changes); ModelError when already dispatched.
  void dispatch_from(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors,
                     bool check_only = false);

  // Logits [B, S, vocab] of ids [B, S]. Real ids: dispatches first (once), then a real forward.
  // Fake or meta ids: a scan (nothing loaded); the logits are fake. Weights loaded zero-copy are
  // checked before and after the forward (loader/engine/file_mapping.h): FileChangedError names a
  // file truncated or written in place since it was mapped, and the model refuses to run from then
  // on (load it again).
  at::Tensor forward(const at::Tensor& ids);
  // Greedy generation of n tokens with a KV cache (dispatches first): [B, S + n]. Checks mapped
  // files as forward does.
  at::Tensor generate(const at::Tensor& ids, int64_t n);

  // The module at a dotted path ("" the whole model). ModulePathError lists the closest paths.
  std::shared_ptr<torch::nn::Module> at(const std::string& path) const;
  // Every module path, in named_modules() order ("" first).
  std::vector<std::string> module_paths() const;
  // A parameter or buffer by its name; the same tensor object before and after dispatch.
  at::Tensor parameter(const std::string& name) const;

  // Keeps `path`'s output from now on (ModulePathError for an unknown path, ModelError for a
  // container such as model.layers that produces none). A module with a tuple output is captured
  // element by element: "model.rotary_emb.0" (cos), "model.rotary_emb.1" (sin); ModelError names
  // them for "model.rotary_emb" itself.
  Capture capture(const std::string& path);

 private:
  void init(const ModelReference& ref, std::chrono::steady_clock::time_point t0);
  void install_observer(const ModuleObserver& extra);
  void deliver(const std::string& path, const at::Tensor& output);
  ModelScan scan_locked(const std::vector<at::Tensor>& inputs, std::optional<at::Device> device,
                        std::optional<int64_t> tp_size = std::nullopt, int64_t tp_rank = 0);
  void join_group();
  void run_tensor_parallel_locked();
  at::Device scan_device_locked(const at::Tensor& ids, std::optional<at::Device> device) const;
  LoadReport dispatch_locked();
  // With tensor parallelism over a group: every rank's outcome of its part of the dispatch
  // ("" when it succeeded); DistributedError on every rank unless all succeeded.
  void vote_on_dispatch_locked(const std::string& my_failure);
  void remember_mappings_locked();
  void check_runnable(const char* what) const;
  void check_mapped_locked() const;
  [[noreturn]] void throw_unknown_path(const std::string& path, const char* what) const;

  ModelOptions options_;
  std::string reference_, load_ref_, config_path_;
  std::optional<std::string> repo_id_, revision_, commit_;
  std::shared_ptr<CausalLM> module_;
  double build_seconds_ = 0;
  std::shared_ptr<Collectives> group_;
  std::shared_ptr<const TensorParallel> tp_;  // the real collectives over group_

  mutable std::recursive_mutex mu_;
  bool dispatched_ = false;
  std::optional<LoadReport> report_;
  // The files the weights map (a zero-copy dispatch), held weakly: a tensor replaced by the user
  // lets its mapping go.
  std::vector<std::weak_ptr<FileMapping>> mapped_;
  std::vector<std::weak_ptr<Capture::State>> captures_;
  // Module path -> class name, with the element paths of tuple outputs ("model.rotary_emb.0") as
  // well; built once, under mu_ (the tree never changes).
  const std::unordered_map<std::string, std::string>& classes_locked();
  std::unordered_map<std::string, std::string> classes_;
};

// torch's Python spelling of a dtype ("float32", "bfloat16", "int64"), for tables and JSON.
std::string torch_dtype_name(at::ScalarType t);

// What the registry holds for metaload.TransformersModel (registry.h: model_factory<ModelFactory>).
using ModelFactory =
    std::function<std::shared_ptr<TransformersModel>(const ModelKey&, const ModelOptions&)>;

}  // namespace metaload
