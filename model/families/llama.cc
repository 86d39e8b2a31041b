// LlamaForCausalLM (also MistralForCausalLM and Qwen2ForCausalLM: same module tree and names):
// model.{embed_tokens, layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
// input_layernorm, post_attention_layernorm}, norm, rotary_emb}, lm_head.
#include <cmath>

#include <fmt/format.h>

#include "model/families/layers.h"

namespace metaload {
namespace families {
namespace {

// transformers' rotary inv_freq, op for op in float32 (modeling_rope_utils: the default
// computation, then the linear or llama3 adjustment), so an eager build matches it bit for bit.
at::Tensor compute_inv_freq(const FamilyConfig& c, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t dim = c.head_dim;
  if (builds_meta(device)) return at::empty({dim / 2}, opts);
  at::Tensor exponent =
      at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat) /
      static_cast<double>(dim);
  at::Tensor inv_freq = at::pow(c.rope_theta, exponent).reciprocal();
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") return inv_freq / r.factor;
  if (r.type != "llama3") return inv_freq;
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  // Wavelengths longer than the original context: divided by factor; shorter than
  // high_freq_wavelen: kept; in between: interpolated.
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  at::Tensor smooth = (wavelen.reciprocal() * old_context - r.low_freq_factor) /
                      (r.high_freq_factor - r.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  at::Tensor medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

class RotaryEmbedding : public Observed {
 public:
  RotaryEmbedding(const std::string& prefix, const FamilyConfig& c, const at::Device& device)
      : Observed(prefix + "RotaryEmbedding", /*elements=*/2) {
    inv_freq = register_buffer("inv_freq", compute_inv_freq(c, device));
  }
  // cos and sin [S, D] of positions past..past+S, computed in float32 then cast, as transformers.
  // Observers see them as transformers returns them, [B, S, D] ("<path>.0" cos, "<path>.1" sin;
  // views of the same rows, no copy).
  std::pair<at::Tensor, at::Tensor> forward(int64_t past, int64_t B, int64_t S,
                                            at::ScalarType dtype) const {
    at::Tensor positions = at::arange(past, past + S, inv_freq.options());
    at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    at::Tensor cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);
    if (observing()) {
      emit_element(0, cos.unsqueeze(0).expand({B, S, cos.size(1)}));
      emit_element(1, sin.unsqueeze(0).expand({B, S, sin.size(1)}));
    }
    return {cos, sin};
  }
  at::Tensor inv_freq;
};

// x [B, S, heads, D]; cos, sin [S, D]. The half-split rotation of transformers' rotate_half.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(3) / 2;
  at::Tensor rotated = at::cat({-x.narrow(3, half, half), x.narrow(3, 0, half)}, 3);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [S, 1, D]
  return x * c + rotated * s;
}

class Attention : public Observed {
 public:
  Attention(const std::string& prefix, const FamilyConfig& c, int64_t layer, ParamInit& init)
      : Observed(prefix + "Attention"),
        layer_(layer),
        heads_(c.num_heads),
        kv_heads_(c.num_kv_heads),
        dim_(c.head_dim),
        window_(c.sliding_window.empty() ? 0 : c.sliding_window[layer]) {
    const int64_t h = c.hidden_size, q = heads_ * dim_, kv = kv_heads_ * dim_;
    const double std = c.initializer_range;
    auto linear = [&](const char* name, int64_t out, int64_t in, bool bias,
                      Parallel parallel = Parallel::kLocal) {
      return register_module(
          name, std::make_shared<Linear>(init.normal({out, in}, std),
                                         bias ? init.zeros({out}) : at::Tensor(), parallel));
    };
    q_proj = linear("q_proj", q, h, c.qkv_bias);
    k_proj = linear("k_proj", kv, h, c.qkv_bias);
    v_proj = linear("v_proj", kv, h, c.qkv_bias);
    o_proj = linear("o_proj", h, q, c.o_bias, Parallel::kRow);
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     KVCache* cache, int64_t past) {
    const int64_t B = x.size(0), S = x.size(1);
    // This rank's heads (all of them without TP): its query heads and the kv heads they use, one
    // replicated kv head when the TP size is a multiple of the kv heads (spec.h's plan).
    const int64_t heads = q_proj->weight.size(0) / dim_, kv_heads = k_proj->weight.size(0) / dim_;
    at::Tensor q = apply_rope(q_proj->forward(x).view({B, S, heads, dim_}), cos, sin);
    at::Tensor k = apply_rope(k_proj->forward(x).view({B, S, kv_heads, dim_}), cos, sin);
    at::Tensor v = v_proj->forward(x).view({B, S, kv_heads, dim_});
    // With a sliding window the first query (position past) sees keys from past - window + 1 on:
    // older cached keys are not read at all.
    const int64_t from = window_ > 0 ? std::max<int64_t>(0, past - window_ + 1) : 0;
    at::Tensor keys, values;
    if (cache) {
      std::tie(keys, values) = cache_append(*cache, layer_, k, v, from);
    } else {
      keys = k.transpose(1, 2);
      values = v.transpose(1, 2);
    }
    // Query at position i sees key j when j <= i and, with a window W, i - j < W (transformers'
    // sliding_window_overlay: kv_idx > q_idx - W). A single new token after the trim sees all.
    at::Tensor blocked;
    if (S > 1) {
      const auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
      at::Tensor distance = at::arange(past, past + S, opts).unsqueeze(1) -
                            at::arange(from, past + S, opts).unsqueeze(0);  // i - j, [S, T]
      blocked = distance < 0;
      if (window_ > 0) blocked = blocked.bitwise_or(distance >= window_);
    }
    return emit(o_proj->forward(attend(q, keys, values, blocked, 1.0 / std::sqrt(double(dim_)))));
  }

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  int64_t layer_, heads_, kv_heads_, dim_, window_;
};

class MLP : public Observed {
 public:
  MLP(const std::string& prefix, const FamilyConfig& c, ParamInit& init)
      : Observed(prefix + "MLP") {
    const int64_t h = c.hidden_size, inter = c.intermediate_size;
    const double std = c.initializer_range;
    auto linear = [&](const char* name, int64_t out, int64_t in, Parallel parallel) {
      return register_module(
          name, std::make_shared<Linear>(init.normal({out, in}, std),
                                         c.mlp_bias ? init.zeros({out}) : at::Tensor(), parallel));
    };
    gate_proj = linear("gate_proj", inter, h, Parallel::kLocal);
    up_proj = linear("up_proj", inter, h, Parallel::kLocal);
    down_proj = linear("down_proj", h, inter, Parallel::kRow);
    act_fn = register_module("act_fn", std::make_shared<Activation>(c.hidden_act));
  }
  at::Tensor forward(const at::Tensor& x) const {
    return emit(down_proj->forward(act_fn->forward(gate_proj->forward(x)) * up_proj->forward(x)));
  }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::shared_ptr<Activation> act_fn;
};

class DecoderLayer : public Observed {
 public:
  DecoderLayer(const std::string& prefix, const FamilyConfig& c, int64_t layer, ParamInit& init)
      : Observed(prefix + "DecoderLayer") {
    self_attn = register_module("self_attn", std::make_shared<Attention>(prefix, c, layer, init));
    mlp = register_module("mlp", std::make_shared<MLP>(prefix, c, init));
    input_layernorm = register_module(
        "input_layernorm",
        std::make_shared<RMSNorm>(prefix + "RMSNorm", init.ones({c.hidden_size}), c.norm_eps));
    post_attention_layernorm = register_module(
        "post_attention_layernorm",
        std::make_shared<RMSNorm>(prefix + "RMSNorm", init.ones({c.hidden_size}), c.norm_eps));
  }
  at::Tensor forward(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin, KVCache* cache,
                     int64_t past) {
    h = h + self_attn->forward(input_layernorm->forward(h), cos, sin, cache, past);
    return emit(h + mlp->forward(post_attention_layernorm->forward(h)));
  }
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<MLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class Model : public Observed {
 public:
  Model(const std::string& prefix, const FamilyConfig& c, ParamInit& init)
      : Observed(prefix + "Model") {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(init.normal({c.vocab_size, c.hidden_size}, c.initializer_range),
                                    /*vocab_parallel=*/true));
    auto list = torch::nn::ModuleList();
    for (int64_t i = 0; i < c.num_layers; ++i) {
      decoder_layers.push_back(std::make_shared<DecoderLayer>(prefix, c, i, init));
      list->push_back(decoder_layers.back());
    }
    layers = register_module("layers", list);
    norm = register_module("norm", std::make_shared<RMSNorm>(
                                       prefix + "RMSNorm", init.ones({c.hidden_size}), c.norm_eps));
    rotary_emb = register_module(
        "rotary_emb", std::make_shared<RotaryEmbedding>(prefix, c, init.options().device()));
  }
  std::shared_ptr<Embedding> embed_tokens;
  torch::nn::ModuleList layers;
  std::vector<std::shared_ptr<DecoderLayer>> decoder_layers;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<RotaryEmbedding> rotary_emb;
};

// "LlamaForCausalLM" -> "Llama": the class-name prefix of the submodules, as in transformers.
std::string class_prefix(const FamilyConfig& c) {
  const std::string& a = c.architecture;
  const size_t at = a.find("For");
  if (at != std::string::npos && at > 0) return a.substr(0, at);
  return c.model_type == "mistral" ? "Mistral" : c.model_type == "qwen2" ? "Qwen2" : "Llama";
}

class ForCausalLM : public CausalLM {
 public:
  ForCausalLM(const FamilyConfig& c, const BuildOptions& options)
      : CausalLM(class_prefix(c) + "ForCausalLM", c) {
    ParamInit init(options);
    model = register_module("model", std::make_shared<Model>(class_prefix(c), c, init));
    at::Tensor head = c.tie_word_embeddings
                          ? model->embed_tokens->weight
                          : init.normal({c.vocab_size, c.hidden_size}, c.initializer_range);
    lm_head = register_module(
        "lm_head", std::make_shared<Linear>(head, at::Tensor(), Parallel::kVocab, c.vocab_size));
  }

  at::Tensor forward(const at::Tensor& input, KVCache* cache, bool last_only) override {
    const char* what = "LlamaForCausalLM.forward";
    const at::Tensor& embed = model->embed_tokens->weight;
    const at::Tensor ids = check_ids(input, embed.device(), what);
    const int64_t B = ids.size(0), S = ids.size(1);
    if (cache) prepare_cache(*cache, B, what);
    const int64_t past = cache ? cache->length : 0;
    at::Tensor h = model->embed_tokens->forward(ids);
    at::Tensor cos, sin;
    std::tie(cos, sin) = model->rotary_emb->forward(past, B, S, embed.scalar_type());
    for (auto& layer : model->decoder_layers) h = layer->forward(h, cos, sin, cache, past);
    h = model->emit(model->norm->forward(h));
    if (last_only) h = h.narrow(1, S - 1, 1);
    if (cache) cache->length = past + S;
    return emit(lm_head->forward(h));
  }

  std::vector<FreshBuffer> compute_nonpersistent_buffers(
      std::optional<at::Device> device) override {
    const at::Device where = device ? *device : model->embed_tokens->weight.device();
    return {{"model.rotary_emb.inv_freq", model->rotary_emb->inv_freq,
             compute_inv_freq(config_, where)}};
  }

  std::shared_ptr<Model> model;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace

std::shared_ptr<CausalLM> build_llama(const FamilyConfig& config, const BuildOptions& options) {
  return std::make_shared<ForCausalLM>(config, options);
}

}  // namespace families
}  // namespace metaload
