// Building blocks shared by the family implementations (internal to model/families). Each is a
// torch::nn::Module named after its transformers class, holding its tensors under the transformers
// attribute names (weight, bias).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "model/families/family.h"

namespace metaload {
namespace families {

// A module that reports its output to the model's observer under its dotted path (both set by
// CausalLM::attach_observer once the tree is built).
class Observed : public torch::nn::Module {
 public:
  // elements > 0: the forward returns that many tensors (a tuple), reported one by one.
  explicit Observed(const std::string& class_name, int64_t elements = 0)
      : torch::nn::Module(class_name), elements_(elements) {}
  int64_t output_elements() const { return elements_; }
  void attach(std::string path, std::shared_ptr<ModuleObserver> observer, TensorParallelSlot tp) {
    path_ = std::move(path);
    observer_ = std::move(observer);
    tp_ = std::move(tp);
  }
  // The tree's tensor parallelism, or nullptr when the forward runs the whole model.
  const TensorParallel* tensor_parallel() const {
    return tp_ && *tp_ && (*tp_)->size > 1 ? tp_->get() : nullptr;
  }
  bool observing() const { return observer_ && *observer_; }
  const at::Tensor& emit(const at::Tensor& output) const {
    if (observing()) (*observer_)(path_, output);
    return output;
  }
  // Element i of a tuple output, reported as "<path>.<i>" (a path no module has: tuple outputs
  // are recorded element by element, each like a module's single output).
  void emit_element(int64_t i, const at::Tensor& output) const {
    if (observing()) (*observer_)(path_ + "." + std::to_string(i), output);
  }

 private:
  std::string path_;
  std::shared_ptr<ModuleObserver> observer_;
  TensorParallelSlot tp_;
  int64_t elements_ = 0;
};

// How a projection takes part in tensor parallelism (spec.h's TPStyle for the module's weight).
enum class Parallel {
  kLocal,  // replicated or column-parallel: the rank computes its own output features
  kRow,    // row-parallel: partial sums all-reduced, then the (replicated) bias added once
  kVocab,  // the LM head: the rank's vocabulary slice, all-gathered and cut to the vocabulary
};

// The TP epilogue of a projection computed without its bias: all-reduce + bias (row), all-gather
// + cut to `vocab` (vocabulary), or the bias alone.
inline at::Tensor parallel_output(const TensorParallel* tp, Parallel parallel, at::Tensor y,
                                  const at::Tensor& bias, int64_t vocab) {
  if (parallel == Parallel::kRow) {
    tp->all_reduce(y);
    return bias.defined() ? y + bias : y;
  }
  if (bias.defined()) y = y + bias;
  return tp->all_gather_last(y).narrow(-1, 0, vocab);  // the padding rows' logits go
}

// Makes parameter tensors with the build options and, unless told not to or on meta, fills them
// as transformers' _init_weights does.
class ParamInit {
 public:
  explicit ParamInit(const BuildOptions& options);
  at::Tensor normal(at::IntArrayRef shape, double std);
  at::Tensor zeros(at::IntArrayRef shape);
  at::Tensor ones(at::IntArrayRef shape);
  const at::TensorOptions& options() const { return options_; }

 private:
  at::Tensor fill(at::IntArrayRef shape, double value);
  at::TensorOptions options_;
  bool init_;
  c10::optional<at::Generator> generator_;
};

// x @ w + bias for w stored [in, out] (bias may be undefined). A single row (a decode step at batch
// 1) goes through gemv: this build's sgemm costs ~10x more than gemv for one row (measured here:
// 768x3072 in 3.3 ms vs 0.2 ms), and decoding is mostly such products.
inline at::Tensor matmul_in_out(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const int64_t in = w.size(0), out = w.size(1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = out;
  if (x.numel() == in) {
    const at::Tensor row = x.reshape({in});
    return (bias.defined() ? at::addmv(bias, w.t(), row) : at::mv(w.t(), row)).view(out_shape);
  }
  const at::Tensor rows = x.reshape({-1, in});
  return (bias.defined() ? at::addmm(bias, rows, w) : at::mm(rows, w)).view(out_shape);
}

// nn.Linear: weight [out, in]; bias may be undefined (no bias). `parallel`: its TP role
// (`vocab`: the vocabulary size, for kVocab).
class Linear : public Observed {
 public:
  Linear(at::Tensor w, at::Tensor b, Parallel parallel = Parallel::kLocal, int64_t vocab = 0)
      : Observed("Linear"), parallel_(parallel), vocab_(vocab) {
    weight = register_parameter("weight", std::move(w));
    if (b.defined()) bias = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) const {
    const TensorParallel* tp = parallel_ == Parallel::kLocal ? nullptr : tensor_parallel();
    if (tp) return emit(parallel_output(tp, parallel_, project(x, at::Tensor()), bias, vocab_));
    return emit(project(x, bias));
  }
  at::Tensor weight, bias;

 private:
  at::Tensor project(const at::Tensor& x, const at::Tensor& b) const {
    if (x.numel() == weight.size(1)) return matmul_in_out(x, weight.t(), b);  // gemv
    return at::linear(x, weight, b);
  }
  Parallel parallel_;
  int64_t vocab_;
};

// transformers' Conv1D (GPT-2): a linear layer whose weight is stored [in, out].
class Conv1D : public Observed {
 public:
  Conv1D(at::Tensor w, at::Tensor b, Parallel parallel = Parallel::kLocal)
      : Observed("Conv1D"), parallel_(parallel) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) const {
    const TensorParallel* tp = parallel_ == Parallel::kRow ? tensor_parallel() : nullptr;
    if (tp) return emit(parallel_output(tp, parallel_, matmul_in_out(x, weight, {}), bias, 0));
    return emit(matmul_in_out(x, weight, bias));
  }
  at::Tensor weight, bias;

 private:
  Parallel parallel_;
};

// nn.Embedding. vocab_parallel: under TP the rank holds rows [rank * n, (rank + 1) * n) of the
// (padded) vocabulary; ids outside them look up zeros, and the partial lookups are all-reduced.
class Embedding : public Observed {
 public:
  explicit Embedding(at::Tensor w, bool vocab_parallel = false)
      : Observed("Embedding"), vocab_parallel_(vocab_parallel) {
    weight = register_parameter("weight", std::move(w));
  }
  at::Tensor forward(const at::Tensor& ids) const {
    const TensorParallel* tp = vocab_parallel_ ? tensor_parallel() : nullptr;
    if (!tp) return emit(at::embedding(weight, ids));
    const int64_t rows = weight.size(0);
    const at::Tensor local = ids - tp->rank * rows;
    const at::Tensor outside = local.lt(0).logical_or(local.ge(rows));
    at::Tensor out =
        at::embedding(weight, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
    tp->all_reduce(out);
    return emit(out);
  }
  at::Tensor weight;

 private:
  bool vocab_parallel_;
};

class LayerNorm : public Observed {
 public:
  LayerNorm(at::Tensor w, at::Tensor b, double eps) : Observed("LayerNorm"), eps(eps) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) const {
    return emit(at::layer_norm(x, {weight.size(0)}, weight, bias, eps));
  }
  at::Tensor weight, bias;
  double eps;
};

// LlamaRMSNorm (and Mistral/Qwen2's): normalises in float32, scales in the input dtype.
class RMSNorm : public Observed {
 public:
  RMSNorm(const std::string& class_name, at::Tensor w, double eps)
      : Observed(class_name), eps(eps) {
    weight = register_parameter("weight", std::move(w));
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
    return emit(weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type()));
  }
  at::Tensor weight;
  double eps;
};

// The activation named by hidden_act / activation_function (names validated by the parser).
at::Tensor activation(const std::string& name, const at::Tensor& x);

// transformers' activation modules (GPT2MLP.act, LlamaMLP.act_fn), named after their classes.
class Activation : public Observed {
 public:
  explicit Activation(const std::string& name);
  at::Tensor forward(const at::Tensor& x) const { return emit(activation(name_, x)); }

 private:
  std::string name_;
};

// nn.Dropout in inference: the identity (these models are for inference; training is out of scope).
class Dropout : public Observed {
 public:
  Dropout() : Observed("Dropout") {}
  at::Tensor forward(const at::Tensor& x) const { return emit(x); }
};

// Scaled dot-product attention with grouped-query heads, without materialising repeated keys.
// q [B, S, H, D]; k, v [B, KV, T, D] with H a multiple of KV (query head h uses kv head
// h / (H / KV), as transformers' repeat_kv); blocked: undefined (attend to all T keys) or bool
// [S, T], true where query s must not see key t. Softmax in float32 for half types.
// probs_site: a module (GPT-2's attn_dropout) that reports the probabilities [B, H, S, T].
// Returns [B, S, H*D].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& blocked, double scale, const Observed* probs_site = nullptr);

// Appends k, v ([B, S, KV, D]) to layer `layer` of the cache at position cache.length (growing it
// when needed) and returns the cached keys and values [B, KV, T, D] for positions [from,
// cache.length + S).
std::pair<at::Tensor, at::Tensor> cache_append(KVCache& cache, int64_t layer, const at::Tensor& k,
                                               const at::Tensor& v, int64_t from);

// Puts `fresh` into the buffer `buffer` in place (TensorImpl-level): every reference to the buffer
// sees the new values, device and shape, even when it was a meta tensor.
void replace_buffer(const at::Tensor& buffer, const at::Tensor& fresh);

// make() of a buffer [sizes] of `dtype` on `device`; an allocation it cannot get is a FamilyError
// naming `name`, the shape, dtype and bytes (instead of the allocator's untyped message).
at::Tensor make_buffer(const std::string& name, at::IntArrayRef sizes, at::ScalarType dtype,
                       const at::Device& device, const std::function<at::Tensor()>& make);

// True when `device` (after MetaMode's forcing, if active) makes meta tensors: probes a factory.
bool builds_meta(const at::Device& device);

std::shared_ptr<CausalLM> build_gpt2(const FamilyConfig& config, const BuildOptions& options);
std::shared_ptr<CausalLM> build_llama(const FamilyConfig& config, const BuildOptions& options);

}  // namespace families
}  // namespace metaload
