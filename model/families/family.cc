#include "model/families/family.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/families/layers.h"

namespace metaload {
namespace {

// Fake and meta tensors have no data to check (and must not be read: reading is a data-dependent
// op during a scan); CUDA ids would need a sync. Only real CPU data is range-checked.
bool has_real_cpu_data(const at::Tensor& t) {
  try {
    return t.device().is_cpu() && !t.is_meta() && t.has_storage() && t.storage().data() != nullptr;
  } catch (const c10::Error&) {
    return false;  // a tensor subclass that forbids storage access
  } catch (const Error&) {
    return false;  // a fake tensor on cpu (a scan): DataDependentError
  }
}

}  // namespace

namespace families {

ParamInit::ParamInit(const BuildOptions& options)
    : options_(at::TensorOptions().dtype(options.dtype).device(options.device)),
      init_(options.init_weights) {
  if (options.seed) generator_ = at::make_generator<at::CPUGeneratorImpl>(*options.seed);
}

at::Tensor ParamInit::normal(at::IntArrayRef shape, double std) {
  at::Tensor t = at::empty(shape, options_);
  if (!init_ || t.is_meta()) return t;
  if (generator_ && !t.is_cpu()) {
    // A CPU generator cannot fill device memory: draw on the CPU, then copy.
    t.copy_(at::empty(shape, options_.device(at::kCPU)).normal_(0.0, std, generator_));
  } else {
    t.normal_(0.0, std, generator_);
  }
  return t;
}

at::Tensor ParamInit::fill(at::IntArrayRef shape, double value) {
  at::Tensor t = at::empty(shape, options_);
  if (init_ && !t.is_meta()) t.fill_(value);
  return t;
}
at::Tensor ParamInit::zeros(at::IntArrayRef shape) {
  return fill(shape, 0.0);
}
at::Tensor ParamInit::ones(at::IntArrayRef shape) {
  return fill(shape, 1.0);
}

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "silu" || name == "swish") return at::silu(x);
  // gelu_new (GPT-2's) is the tanh approximation, the same formula as gelu_pytorch_tanh.
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "gelu") return at::gelu(x);
  if (name == "relu") return at::relu(x);
  throw FamilyError(fmt::format("unsupported activation '{}'", name));
}

Activation::Activation(const std::string& name)
    : Observed([&] {
        if (name == "gelu_new") return "NewGELUActivation";
        if (name == "gelu_pytorch_tanh") return "PytorchGELUTanh";
        if (name == "gelu") return "GELUActivation";
        if (name == "relu") return "ReLU";
        return "SiLU";
      }()),
      name_(name) {}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& blocked, double scale, const Observed* probs_site) {
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), T = k.size(2), G = H / KV;
  // Grouped-query attention: the G query heads of one kv head become G*S rows of one batched
  // matmul against that head's keys, so keys are never repeated in memory.
  at::Tensor qg =
      (q * scale).view({B, S, KV, G, D}).permute({0, 2, 3, 1, 4}).reshape({B, KV, G * S, D});
  at::Tensor scores = at::matmul(qg, k.transpose(-1, -2));  // [B, KV, G*S, T]
  if (blocked.defined())
    scores = scores.view({B, KV, G, S, T})
                 .masked_fill(blocked, -std::numeric_limits<double>::infinity())
                 .view({B, KV, G * S, T});
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  at::Tensor probs =
      half ? at::softmax(scores, -1, at::kFloat).to(q.scalar_type()) : at::softmax(scores, -1);
  if (probs_site && probs_site->observing()) probs_site->emit(probs.view({B, H, S, T}));
  at::Tensor out = at::matmul(probs, v);  // [B, KV, G*S, D]
  return out.view({B, KV, G, S, D}).permute({0, 3, 1, 2, 4}).reshape({B, S, H * D});
}

std::pair<at::Tensor, at::Tensor> cache_append(KVCache& cache, int64_t layer, const at::Tensor& k,
                                               const at::Tensor& v, int64_t from) {
  const int64_t B = k.size(0), S = k.size(1), KV = k.size(2), D = k.size(3);
  const int64_t end = cache.length + S;
  at::Tensor& K = cache.keys[layer];
  at::Tensor& V = cache.values[layer];
  if (!K.defined() || K.size(2) < end) {
    const int64_t old = K.defined() ? K.size(2) : 0;
    const int64_t capacity = std::max(end, 2 * old);
    at::Tensor nk = at::empty({B, KV, capacity, D}, k.options());
    at::Tensor nv = at::empty({B, KV, capacity, D}, v.options());
    if (cache.length > 0) {
      nk.narrow(2, 0, cache.length).copy_(K.narrow(2, 0, cache.length));
      nv.narrow(2, 0, cache.length).copy_(V.narrow(2, 0, cache.length));
    }
    K = nk;
    V = nv;
  }
  K.narrow(2, cache.length, S).copy_(k.transpose(1, 2));
  V.narrow(2, cache.length, S).copy_(v.transpose(1, 2));
  return {K.narrow(2, from, end - from), V.narrow(2, from, end - from)};
}

void replace_buffer(const at::Tensor& buffer, const at::Tensor& fresh) {
  // Tensor::set_data refuses meta -> real; the TensorImpl-level copy of metadata and storage is
  // what set_data does after its check, and keeps the buffer object (and references to it).
  buffer.unsafeGetTensorImpl()->shallow_copy_from(fresh.getIntrusivePtr());
}

at::Tensor make_buffer(const std::string& name, at::IntArrayRef sizes, at::ScalarType dtype,
                       const at::Device& device, const std::function<at::Tensor()>& make) {
  std::string why;
  try {
    return make();
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const std::bad_alloc&) {
    why = "out of memory";
  }
  uint64_t bytes = c10::elementSize(dtype);
  for (int64_t d : sizes) bytes *= static_cast<uint64_t>(d);
  const std::string first_line = why.substr(0, why.find('\n'));
  throw FamilyError(fmt::format(
      "the non-persistent buffer '{}' [{}] {} ({} bytes, {:.1f} GiB) cannot be made on {}: {}",
      name, fmt::join(sizes, ", "), c10::toString(dtype), bytes,
      static_cast<double>(bytes) / (1ull << 30), device.str(), first_line));
}

bool builds_meta(const at::Device& device) {
  return at::empty({0}, at::TensorOptions().device(device)).is_meta();
}

}  // namespace families

void CausalLM::apply_buffers(const std::vector<FreshBuffer>& fresh) {
  for (const FreshBuffer& b : fresh) families::replace_buffer(b.buffer, b.value);
}

int64_t output_elements(const torch::nn::Module& module) {
  const auto* observed = dynamic_cast<const families::Observed*>(&module);
  return observed ? observed->output_elements() : 0;
}

void CausalLM::attach_observer() {
  for (const auto& item : named_modules("", /*include_self=*/false))
    if (auto* observed = dynamic_cast<families::Observed*>(item.value().get()))
      observed->attach(item.key(), observer_, tp_);
}

int64_t CausalLM::num_parameters() const {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (seen.insert(t.unsafeGetTensorImpl()).second) total += t.numel();
  }
  return total;
}

at::Tensor CausalLM::check_ids(const at::Tensor& ids, const at::Device& device,
                               const char* what) const {
  if (!ids.defined()) throw FamilyError(fmt::format("{}: the input ids are undefined", what));
  if (ids.dim() != 2 || ids.size(0) == 0 || ids.size(1) == 0)
    throw FamilyError(fmt::format(
        "{}: the input ids must be a [batch, sequence] tensor with both sizes > 0, got shape {}",
        what, c10::str(ids.sizes())));
  if (!at::isIntegralType(ids.scalar_type(), /*includeBool=*/false))
    throw FamilyError(fmt::format("{}: the input ids must be integers, got dtype {}", what,
                                  c10::toString(ids.scalar_type())));
  if (has_real_cpu_data(ids)) {
    at::Tensor flat = ids.to(at::kLong).contiguous();
    const int64_t* p = flat.data_ptr<int64_t>();
    const int64_t seq = ids.size(1);
    for (int64_t i = 0; i < flat.numel(); ++i)
      if (p[i] < 0 || p[i] >= config_.vocab_size)
        throw FamilyError(
            fmt::format("{}: token id {} at [{}, {}] is outside the vocabulary [0, {}) "
                        "of {}",
                        what, p[i], i / seq, i % seq, config_.vocab_size, config_.source));
  }
  // A skeleton (meta weights) keeps the ids where they are: during a scan they are fake tensors
  // claiming the target device, which moving them to meta would lose.
  if (device.is_meta()) return ids.to(at::kLong);
  return ids.to(device, at::kLong);
}

int64_t CausalLM::local_kv_heads() const {
  const TensorParallel* tp = tensor_parallel();
  const int64_t kv = config_.num_kv_heads;
  if (!tp) return kv;
  return kv % tp->size == 0 ? kv / tp->size : 1;
}

KVCache CausalLM::new_cache(int64_t batch, int64_t capacity) const {
  if (batch < 1 || capacity < 1)
    throw FamilyError(
        fmt::format("new_cache: batch ({}) and capacity ({}) must be positive", batch, capacity));
  const at::Tensor first = parameters().front();
  KVCache cache;
  const int64_t kv = local_kv_heads();
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    cache.keys.push_back(at::empty({batch, kv, capacity, config_.head_dim}, first.options()));
    cache.values.push_back(at::empty({batch, kv, capacity, config_.head_dim}, first.options()));
  }
  return cache;
}

void CausalLM::prepare_cache(KVCache& cache, int64_t batch, const char* what) const {
  if (cache.keys.empty()) {
    cache.keys.resize(config_.num_layers);  // grown by the first forward
    cache.values.resize(config_.num_layers);
    cache.length = 0;
  }
  if (static_cast<int64_t>(cache.keys.size()) != config_.num_layers ||
      cache.values.size() != cache.keys.size())
    throw FamilyError(fmt::format("{}: the KV cache has {} layers, the model {}", what,
                                  cache.keys.size(), config_.num_layers));
  if (cache.batch() != 0 && cache.batch() != batch)
    throw FamilyError(fmt::format("{}: the KV cache holds a batch of {}, the ids a batch of {}",
                                  what, cache.batch(), batch));
  if (cache.length < 0 || cache.length > cache.capacity())
    throw FamilyError(fmt::format("{}: the KV cache length {} is outside [0, {}]", what,
                                  cache.length, cache.capacity()));
}

at::Tensor CausalLM::generate(const at::Tensor& prompt, int64_t n, bool use_cache) {
  at::NoGradGuard no_grad;
  if (n < 0)
    throw FamilyError(fmt::format("generate: the number of new tokens must be >= 0, got {}", n));
  const at::Tensor ids = check_ids(prompt, parameters().front().device(), "generate");
  const int64_t batch = ids.size(0), length = ids.size(1);
  if (max_length() > 0 && length + n > max_length())
    throw FamilyError(
        fmt::format("generate: {} prompt tokens + {} new ones exceed the {} positions of {}",
                    length, n, max_length(), config_.source));
  if (n == 0) return ids;
  if (!use_cache) {
    at::Tensor seq = ids;
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor logits = forward(seq, nullptr, /*last_only=*/true);
      seq = at::cat({seq, logits.select(1, 0).argmax(-1, /*keepdim=*/true)}, 1);
    }
    return seq;
  }
  KVCache cache = new_cache(batch, length + n);
  std::vector<at::Tensor> pieces{ids};
  at::Tensor logits = forward(ids, &cache, /*last_only=*/true);
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor next = logits.select(1, 0).argmax(-1, /*keepdim=*/true);  // [B, 1]
    pieces.push_back(next);
    if (i + 1 < n) logits = forward(next, &cache, /*last_only=*/true);
  }
  return at::cat(pieces, 1);
}

std::shared_ptr<CausalLM> build_causal_lm(const FamilyConfig& config, const BuildOptions& options) {
  if (!at::isFloatingType(options.dtype))
    throw FamilyError(fmt::format("build: the model dtype must be a floating type, got {}",
                                  c10::toString(options.dtype)));
  std::shared_ptr<CausalLM> model = config.arch == Arch::kGPT2
                                        ? families::build_gpt2(config, options)
                                        : families::build_llama(config, options);
  model->attach_observer();
  return model;
}

}  // namespace metaload
