#include "identity/checkpoint_shapes.h"

#include <string>

#include "base/checked.h"
#include "base/text.h"
#include "identity/errors.h"

namespace metaload {
namespace {

int64_t need(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    throw FormatError("config.json", "", "unsupported-config",
                      std::string("field \"") + key + "\" is missing or not a positive integer");
  }
  return it->get<int64_t>();
}

// A layer count, at most kMaxConfigLayers (model/errors.h): one list entry per layer tensor.
int64_t layer_count(const nlohmann::json& c, const char* key) {
  const int64_t n = need(c, key);
  if (n > kMaxConfigLayers) {
    throw FormatError("config.json", "", "unsupported-config",
                      std::string("field \"") + key + "\" is " + std::to_string(n) +
                          ", more layers than metaload lists (at most " +
                          std::to_string(kMaxConfigLayers) + ")");
  }
  return n;
}

int64_t get_or(const nlohmann::json& c, const char* key, int64_t fallback) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  return need(c, key);
}

bool flag(const nlohmann::json& c, const char* key, bool fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

void gpt2(const nlohmann::json& c, DType dt, bool buffers, std::vector<TensorSpec>& out) {
  const int64_t e = need(c, "n_embd"), layers = layer_count(c, "n_layer"),
                vocab = need(c, "vocab_size");
  const int64_t pos = need(c, "n_positions");
  const int64_t inner = c.contains("n_inner") && !c["n_inner"].is_null()
                            ? need(c, "n_inner")
                            : checked_mul<int64_t>(4, e, "default n_inner 4 x n_embd");
  const int64_t fused = checked_mul<int64_t>(3, e, "the fused q, k, v width 3 x n_embd");
  out.push_back({"wte.weight", dt, {vocab, e}});
  out.push_back({"wpe.weight", dt, {pos, e}});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    out.push_back({p + "ln_1.weight", dt, {e}});
    out.push_back({p + "ln_1.bias", dt, {e}});
    if (buffers) out.push_back({p + "attn.bias", dt, {1, 1, pos, pos}});
    // Conv1D stores [in, out].
    out.push_back({p + "attn.c_attn.weight", dt, {e, fused}});
    out.push_back({p + "attn.c_attn.bias", dt, {fused}});
    out.push_back({p + "attn.c_proj.weight", dt, {e, e}});
    out.push_back({p + "attn.c_proj.bias", dt, {e}});
    out.push_back({p + "ln_2.weight", dt, {e}});
    out.push_back({p + "ln_2.bias", dt, {e}});
    out.push_back({p + "mlp.c_fc.weight", dt, {e, inner}});
    out.push_back({p + "mlp.c_fc.bias", dt, {inner}});
    out.push_back({p + "mlp.c_proj.weight", dt, {inner, e}});
    out.push_back({p + "mlp.c_proj.bias", dt, {e}});
  }
  out.push_back({"ln_f.weight", dt, {e}});
  out.push_back({"ln_f.bias", dt, {e}});
  // GPT-2 ties its head by default; an untied variant stores it (named as in the full model).
  if (!flag(c, "tie_word_embeddings", true)) out.push_back({"lm_head.weight", dt, {vocab, e}});
}

void llama(const nlohmann::json& c, DType dt, bool buffers, bool qkv_bias,
           std::vector<TensorSpec>& out) {
  const int64_t h = need(c, "hidden_size"), layers = layer_count(c, "num_hidden_layers");
  const int64_t vocab = need(c, "vocab_size"), inter = need(c, "intermediate_size");
  const int64_t heads = need(c, "num_attention_heads"),
                kv = get_or(c, "num_key_value_heads", heads);
  const int64_t hd = get_or(c, "head_dim", h / heads);
  const int64_t q = checked_mul(heads, hd, "the q width num_attention_heads x head_dim");
  const int64_t kvw = checked_mul(kv, hd, "the k, v width num_key_value_heads x head_dim");
  const bool attn_bias = qkv_bias || flag(c, "attention_bias", false);
  const bool mlp_bias = flag(c, "mlp_bias", false);
  out.push_back({"model.embed_tokens.weight", dt, {vocab, h}});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", dt, {h}});
    out.push_back({p + "self_attn.q_proj.weight", dt, {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", dt, {kvw, h}});
    out.push_back({p + "self_attn.v_proj.weight", dt, {kvw, h}});
    if (attn_bias) {
      out.push_back({p + "self_attn.q_proj.bias", dt, {q}});
      out.push_back({p + "self_attn.k_proj.bias", dt, {kvw}});
      out.push_back({p + "self_attn.v_proj.bias", dt, {kvw}});
    }
    out.push_back({p + "self_attn.o_proj.weight", dt, {h, q}});
    // Llama's attention_bias covers o_proj too; Qwen2's q/k/v bias does not.
    if (attn_bias && !qkv_bias) out.push_back({p + "self_attn.o_proj.bias", dt, {h}});
    if (buffers) out.push_back({p + "self_attn.rotary_emb.inv_freq", DType::F32, {hd / 2}});
    out.push_back({p + "post_attention_layernorm.weight", dt, {h}});
    out.push_back({p + "mlp.gate_proj.weight", dt, {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", dt, {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", dt, {h, inter}});
    if (mlp_bias) {
      out.push_back({p + "mlp.gate_proj.bias", dt, {inter}});
      out.push_back({p + "mlp.up_proj.bias", dt, {inter}});
      out.push_back({p + "mlp.down_proj.bias", dt, {h}});
    }
  }
  out.push_back({"model.norm.weight", dt, {h}});
  if (!flag(c, "tie_word_embeddings", false)) out.push_back({"lm_head.weight", dt, {vocab, h}});
}

}  // namespace

std::vector<TensorSpec> checkpoint_tensor_specs(const nlohmann::json& config, DType dtype,
                                                bool with_buffers) {
  std::vector<TensorSpec> out;
  auto mt = config.find("model_type");
  std::string type = mt != config.end() && mt->is_string() ? mt->get<std::string>() : "";
  if (type == "gpt2") {
    gpt2(config, dtype, with_buffers, out);
  } else if (type == "llama" || type == "mistral") {
    llama(config, dtype, with_buffers, false, out);
  } else if (type == "qwen2") {
    llama(config, dtype, with_buffers, true, out);
  } else {
    throw FormatError("config.json", "", "unsupported-config",
                      "model_type " + quote_text(type) +
                          " has no known checkpoint layout (gpt2, llama, mistral, qwen2)");
  }
  return out;
}

}  // namespace metaload
