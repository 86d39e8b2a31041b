// The common interface of the causal-LM families: a torch::nn module tree whose named_parameters()
// are exactly the Hugging Face state_dict keys, a forward with an optional KV cache, greedy
// generation, and the metadata (spec.h) the loader and the model layer need.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "fake_mode/scan.h"
#include "model/families/config.h"
#include "model/families/spec.h"

namespace metaload {

struct BuildOptions {
  at::ScalarType dtype = at::kFloat;
  // at::kMeta builds a skeleton with no weight memory even without MetaMode; under MetaMode every
  // device lands on meta anyway.
  at::Device device = at::kCPU;
  // transformers' _init_weights (normal(0, initializer_range), zero biases, unit norms); off when
  // every weight will be loaded anyway. Never done on meta tensors.
  bool init_weights = true;
  // Deterministic init from a private CPU generator; the global generator when absent.
  std::optional<uint64_t> seed;
};

// Keys and values of every layer, [batch, kv_heads, capacity, head_dim] in the model's dtype and
// device; preallocated by CausalLM::new_cache and grown (doubling) when a forward needs more.
struct KVCache {
  std::vector<at::Tensor> keys, values;
  int64_t length = 0;  // positions filled
  // 0 while empty or not yet allocated (an empty KVCache is sized by the first forward).
  int64_t batch() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(0); }
  int64_t capacity() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  void clear() { length = 0; }
};

// A family's tree reports to a ModuleObserver (fake_mode/scan.h: the one observer type, so a
// scan's own observer attaches directly) during a forward: the module's dotted path
// ("transformer.h.3.attn"; "" for the whole model, whose output is the logits) and its output.
// For modules that return several tensors in transformers, the first (the hidden states);
// attn_dropout's is the attention probabilities [B, heads, S, T]. Every module with a forward
// reports, in execution order, except the ModuleList containers. A module whose output is a tuple
// (rotary_emb's (cos, sin), each [B, S, head_dim]) reports each element under "<path>.<i>":
// "model.rotary_emb.0" is cos, ".1" sin.

// Tensor parallelism inside a forward (Megatron / vLLM): the rank's place in the group and the two
// collectives the layout needs. A rank whose parameters hold its TP shards (model/family_load.h)
// runs column-parallel projections locally, all-reduces after the row-parallel ones (their bias
// added once, after the sum), looks the vocabulary-parallel embedding up in its rows only and
// all-reduces the partial lookups, and all-gathers the LM head's vocabulary slices. The model layer
// supplies the collectives (dist/: a c10d process group; for scans, shape-only stand-ins); the
// families know nothing of process groups.
struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  // Sums the tensor over the ranks, in place.
  std::function<void(at::Tensor&)> all_reduce;
  // Every rank's tensor concatenated along the last dimension, in rank order.
  std::function<at::Tensor(const at::Tensor&)> all_gather_last;
};
// Shared by every module of a tree (like the observer): set once, seen by all.
using TensorParallelSlot = std::shared_ptr<std::shared_ptr<const TensorParallel>>;

// How many tensors the module's forward returns when that is a tuple reported element by element
// (see above); 0 for a module with one output (or none).
int64_t output_elements(const torch::nn::Module& module);

class CausalLM : public torch::nn::Module {
 public:
  const FamilyConfig& config() const { return config_; }

  // Logits [B, S, vocab] in the model's dtype for ids [B, S] (any integer dtype, any device: moved
  // to the model's). With a cache, the ids continue the cached sequence (positions start at
  // cache->length) and the cache is extended. last_only: logits of the last position only
  // ([B, 1, vocab]), what generation needs.
  virtual at::Tensor forward(const at::Tensor& ids, KVCache* cache = nullptr,
                             bool last_only = false) = 0;

  // Greedy decoding of `n` new tokens: returns [B, S + n] (the prompt then the new tokens).
  // use_cache=false recomputes the whole sequence at every step (same tokens, for tests).
  at::Tensor generate(const at::Tensor& ids, int64_t n, bool use_cache = true);

  // An empty cache with room for `capacity` positions.
  KVCache new_cache(int64_t batch, int64_t capacity) const;

  // A non-persistent buffer and the tensor it is to become (compute_nonpersistent_buffers).
  struct FreshBuffer {
    std::string name;  // its state_dict name (`*` for every layer's shared buffer), for errors
    at::Tensor buffer, value;
  };
  // The non-persistent buffers (rotary inv_freq, causal masks) computed on `device` (default: the
  // parameters' device), without changing the model: a dispatch computes them before its first
  // swap, so a buffer that cannot be made (a causal mask of 40 GB) fails it with nothing changed.
  // FamilyError naming the buffer, its shape, dtype and bytes when one cannot be allocated.
  virtual std::vector<FreshBuffer> compute_nonpersistent_buffers(
      std::optional<at::Device> device = std::nullopt) = 0;
  // Puts computed buffers into the existing buffer tensors (same TensorImpl, so references stay
  // valid). Cannot fail.
  static void apply_buffers(const std::vector<FreshBuffer>& fresh);
  // Both at once. After a meta build the model layer calls it in a real window: the values then
  // equal an eager real build's exactly. On meta it only sets shapes.
  void init_nonpersistent_buffers(std::optional<at::Device> device = std::nullopt) {
    apply_buffers(compute_nonpersistent_buffers(device));
  }

  // Sets (or, with an empty function, clears) the observer of module outputs. The model layer's
  // scan records shapes with it, capture keeps the tensors. Costs nothing when unset.
  void set_output_observer(ModuleObserver observer) { *observer_ = std::move(observer); }

  // Runs the forward as tensor-parallel rank tp->rank of tp->size over tp's collectives (the
  // parameters must hold that rank's shards); nullptr (or size 1) runs the whole model.
  void set_tensor_parallel(std::shared_ptr<const TensorParallel> tp) { *tp_ = std::move(tp); }
  const TensorParallel* tensor_parallel() const {
    return *tp_ && (*tp_)->size > 1 ? tp_->get() : nullptr;
  }
  // Key/value heads this rank holds: all of them without TP; with TP of size n, kv_heads / n, or 1
  // when n is a multiple of kv_heads (vLLM's replication; spec.h's plan).
  int64_t local_kv_heads() const;

  // The longest sequence the model accepts (GPT-2: n_positions); 0 when unbounded (RoPE).
  virtual int64_t max_length() const { return 0; }

  // Elements of all parameters, tensors shared by several names counted once.
  int64_t num_parameters() const;

  // spec.h for this model's config.
  std::vector<ParamSpec> parameter_specs() const { return metaload::parameter_specs(config_); }
  std::vector<BufferSpec> buffer_specs() const { return metaload::buffer_specs(config_); }
  std::vector<std::vector<std::string>> tied_parameter_groups() const {
    return metaload::tied_parameter_groups(config_);
  }
  std::optional<std::string> map_checkpoint_name(const std::string& name) const {
    return metaload::map_checkpoint_name(config_, name);
  }
  std::vector<TPRule> tp_plan() const { return metaload::tp_plan(config_); }

 protected:
  CausalLM(const std::string& class_name, FamilyConfig config)
      : torch::nn::Module(class_name), config_(std::move(config)) {}

  // Validates input ids ([B, S] integers, and in range when they are real CPU data) and returns
  // them as int64 on `device` (left on their own device when `device` is meta: a skeleton being
  // scanned). `what` names the caller in messages.
  at::Tensor check_ids(const at::Tensor& ids, const at::Device& device, const char* what) const;
  // Sizes an empty cache for this model and checks a used one against the model and the batch.
  void prepare_cache(KVCache& cache, int64_t batch, const char* what) const;

  // Reports the whole model's output (path "") to the observer; returns it.
  at::Tensor emit(const at::Tensor& logits) const {
    if (*observer_) (*observer_)("", logits);
    return logits;
  }

  FamilyConfig config_;
  // Shared with every submodule (set by build_causal_lm), so setting the observer reaches them all.
  std::shared_ptr<ModuleObserver> observer_ = std::make_shared<ModuleObserver>();
  TensorParallelSlot tp_ = std::make_shared<std::shared_ptr<const TensorParallel>>();

 private:
  friend std::shared_ptr<CausalLM> build_causal_lm(const FamilyConfig&, const BuildOptions&);
  // Gives every submodule its dotted path and the shared observer.
  void attach_observer();
};

// Builds the family's module tree for `config` (GPT2LMHeadModel or LlamaForCausalLM, which serves
// Mistral and Qwen2 too).
std::shared_ptr<CausalLM> build_causal_lm(const FamilyConfig& config,
                                          const BuildOptions& options = {});

}  // namespace metaload
