// GPT2LMHeadModel with transformers' module tree and names: transformer.{wte, wpe, h.N.{ln_1,
// attn.{c_attn, c_proj}, ln_2, mlp.{c_fc, c_proj}}, ln_f}, lm_head (tied to wte by default).
#include <cmath>

#include <fmt/format.h>

#include "model/families/layers.h"

namespace metaload {
namespace families {
namespace {

// The causal-mask buffers of every attention layer: transformers registers h.N.attn.bias
// ([1, 1, P, P] lower-triangular bool) and h.N.attn.masked_bias (-1e4) as non-persistent buffers.
// All layers share one tensor of each here (the values are identical), so the mask costs P*P bytes
// once rather than per layer.
struct MaskBuffers {
  at::Tensor bias, masked_bias;
};

MaskBuffers compute_masks(int64_t positions, const at::Device& device) {
  const auto bool_opts = at::TensorOptions().dtype(at::kBool).device(device);
  const auto float_opts = at::TensorOptions().dtype(at::kFloat).device(device);
  if (builds_meta(device))
    return {at::empty({1, 1, positions, positions}, bool_opts), at::empty({}, float_opts)};
  // positions^2 bytes: a long context's mask is the one buffer an allocator may refuse.
  at::Tensor bias = make_buffer("transformer.h.*.attn.bias", {1, 1, positions, positions},
                                at::kBool, device, [&] {
                                  return at::ones({positions, positions}, bool_opts)
                                      .tril()
                                      .view({1, 1, positions, positions});
                                });
  return {bias, at::full({}, -1e4, float_opts)};
}

class GPT2Attention : public Observed {
 public:
  GPT2Attention(const FamilyConfig& c, int64_t layer, ParamInit& init, const MaskBuffers& masks)
      : Observed("GPT2Attention"), layer_(layer), dim_(c.head_dim) {
    const int64_t n = c.hidden_size;
    // transformers scales the output projections' init by 1/sqrt(2 * n_layer).
    const double proj_std = c.initializer_range / std::sqrt(2.0 * c.num_layers);
    bias = register_buffer("bias", masks.bias);
    masked_bias = register_buffer("masked_bias", masks.masked_bias);
    c_attn = register_module("c_attn",
                             std::make_shared<Conv1D>(init.normal({n, 3 * n}, c.initializer_range),
                                                      init.zeros({3 * n})));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(init.normal({n, n}, proj_std),
                                                                init.zeros({n}), Parallel::kRow));
    attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>());
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>());
    scale_ = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(dim_)) : 1.0;
    if (c.scale_attn_by_inverse_layer_idx) scale_ /= static_cast<double>(layer + 1);
  }

  at::Tensor forward(const at::Tensor& x, KVCache* cache, int64_t past) {
    const int64_t B = x.size(0), S = x.size(1);
    // [q|k|v], each of this rank's heads (all of them without TP: the TP plan gives each rank its
    // heads of q, of k and of v).
    const int64_t width = c_attn->weight.size(1) / 3, heads = width / dim_;
    std::vector<at::Tensor> qkv = c_attn->forward(x).split(width, -1);
    at::Tensor q = qkv[0].view({B, S, heads, dim_});
    at::Tensor k = qkv[1].view({B, S, heads, dim_});
    at::Tensor v = qkv[2].view({B, S, heads, dim_});
    at::Tensor keys, values;
    if (cache) {
      std::tie(keys, values) = cache_append(*cache, layer_, k, v, 0);
    } else {
      keys = k.transpose(1, 2);
      values = v.transpose(1, 2);
    }
    // Rows past..past+S of the lower-triangular mask, as transformers slices self.bias. A single
    // new token sees every key: no mask needed.
    at::Tensor blocked;
    if (S > 1) blocked = bias[0][0].narrow(0, past, S).narrow(1, 0, past + S).eq(false);
    at::Tensor out = attend(q, keys, values, blocked, scale_, attn_dropout.get());
    return emit(resid_dropout->forward(c_proj->forward(out)));
  }

  std::shared_ptr<Conv1D> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
  at::Tensor bias, masked_bias;

 private:
  int64_t layer_, dim_;
  double scale_;
};

class GPT2MLP : public Observed {
 public:
  GPT2MLP(const FamilyConfig& c, ParamInit& init) : Observed("GPT2MLP") {
    const int64_t n = c.hidden_size, inner = c.intermediate_size;
    const double proj_std = c.initializer_range / std::sqrt(2.0 * c.num_layers);
    c_fc = register_module("c_fc",
                           std::make_shared<Conv1D>(init.normal({n, inner}, c.initializer_range),
                                                    init.zeros({inner})));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(init.normal({inner, n}, proj_std),
                                                                init.zeros({n}), Parallel::kRow));
    act = register_module("act", std::make_shared<Activation>(c.hidden_act));
    dropout = register_module("dropout", std::make_shared<Dropout>());
  }
  at::Tensor forward(const at::Tensor& x) const {
    return emit(dropout->forward(c_proj->forward(act->forward(c_fc->forward(x)))));
  }
  std::shared_ptr<Conv1D> c_fc, c_proj;
  std::shared_ptr<Activation> act;
  std::shared_ptr<Dropout> dropout;
};

class GPT2Block : public Observed {
 public:
  GPT2Block(const FamilyConfig& c, int64_t layer, ParamInit& init, const MaskBuffers& masks)
      : Observed("GPT2Block") {
    const int64_t n = c.hidden_size;
    ln_1 = register_module(
        "ln_1", std::make_shared<LayerNorm>(init.ones({n}), init.zeros({n}), c.norm_eps));
    attn = register_module("attn", std::make_shared<GPT2Attention>(c, layer, init, masks));
    ln_2 = register_module(
        "ln_2", std::make_shared<LayerNorm>(init.ones({n}), init.zeros({n}), c.norm_eps));
    mlp = register_module("mlp", std::make_shared<GPT2MLP>(c, init));
  }
  at::Tensor forward(at::Tensor h, KVCache* cache, int64_t past) {
    h = h + attn->forward(ln_1->forward(h), cache, past);
    return emit(h + mlp->forward(ln_2->forward(h)));
  }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<GPT2Attention> attn;
  std::shared_ptr<GPT2MLP> mlp;
};

class GPT2Model : public Observed {
 public:
  GPT2Model(const FamilyConfig& c, ParamInit& init) : Observed("GPT2Model") {
    const int64_t n = c.hidden_size;
    masks = compute_masks(c.max_position_embeddings, init.options().device());
    wte = register_module(
        "wte", std::make_shared<Embedding>(init.normal({c.vocab_size, n}, c.initializer_range),
                                           /*vocab_parallel=*/true));
    wpe = register_module("wpe", std::make_shared<Embedding>(init.normal(
                                     {c.max_position_embeddings, n}, c.initializer_range)));
    drop = register_module("drop", std::make_shared<Dropout>());
    auto list = torch::nn::ModuleList();
    for (int64_t i = 0; i < c.num_layers; ++i) {
      blocks.push_back(std::make_shared<GPT2Block>(c, i, init, masks));
      list->push_back(blocks.back());
    }
    h = register_module("h", list);
    ln_f = register_module(
        "ln_f", std::make_shared<LayerNorm>(init.ones({n}), init.zeros({n}), c.norm_eps));
  }
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  torch::nn::ModuleList h;
  std::vector<std::shared_ptr<GPT2Block>> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  MaskBuffers masks;
};

class GPT2LMHeadModel : public CausalLM {
 public:
  GPT2LMHeadModel(const FamilyConfig& c, const BuildOptions& options)
      : CausalLM("GPT2LMHeadModel", c) {
    ParamInit init(options);
    transformer = register_module("transformer", std::make_shared<GPT2Model>(c, init));
    at::Tensor head = c.tie_word_embeddings
                          ? transformer->wte->weight
                          : init.normal({c.vocab_size, c.hidden_size}, c.initializer_range);
    lm_head = register_module(
        "lm_head", std::make_shared<Linear>(head, at::Tensor(), Parallel::kVocab, c.vocab_size));
  }

  int64_t max_length() const override { return config_.max_position_embeddings; }

  at::Tensor forward(const at::Tensor& input, KVCache* cache, bool last_only) override {
    const char* what = "GPT2LMHeadModel.forward";
    const at::Tensor ids = check_ids(input, transformer->wte->weight.device(), what);
    const int64_t B = ids.size(0), S = ids.size(1);
    if (cache) prepare_cache(*cache, B, what);
    const int64_t past = cache ? cache->length : 0;
    if (past + S > config_.max_position_embeddings)
      throw FamilyError(fmt::format("{}: positions up to {} exceed n_positions ({}) of {}", what,
                                    past + S, config_.max_position_embeddings, config_.source));
    const at::Tensor positions = at::arange(past, past + S, ids.options());
    at::Tensor h = transformer->drop->forward(transformer->wte->forward(ids) +
                                              transformer->wpe->forward(positions));
    for (auto& block : transformer->blocks) h = block->forward(h, cache, past);
    h = transformer->emit(transformer->ln_f->forward(h));
    if (last_only) h = h.narrow(1, S - 1, 1);
    if (cache) cache->length = past + S;
    return emit(lm_head->forward(h));
  }

  std::vector<FreshBuffer> compute_nonpersistent_buffers(
      std::optional<at::Device> device) override {
    const at::Device where = device ? *device : transformer->wte->weight.device();
    const MaskBuffers fresh = compute_masks(config_.max_position_embeddings, where);
    // One replacement per shared tensor reaches every layer's buffer.
    return {
        {"transformer.h.*.attn.bias", transformer->masks.bias, fresh.bias},
        {"transformer.h.*.attn.masked_bias", transformer->masks.masked_bias, fresh.masked_bias}};
  }

  std::shared_ptr<GPT2Model> transformer;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace

std::shared_ptr<CausalLM> build_gpt2(const FamilyConfig& config, const BuildOptions& options) {
  return std::make_shared<GPT2LMHeadModel>(config, options);
}

}  // namespace families
}  // namespace metaload
