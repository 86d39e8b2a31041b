#include "identity/family_shape.h"

#include <fmt/format.h>

#include "base/checked.h"
#include "base/text.h"

namespace metaload {
namespace {

const char* default_architecture(const std::string& model_type) {
  if (model_type == "gpt2") return "GPT2LMHeadModel";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

std::string model_type_of_architecture(const std::string& arch) {
  if (arch.rfind("GPT2", 0) == 0) return "gpt2";
  if (arch.rfind("Llama", 0) == 0) return "llama";
  if (arch.rfind("Mistral", 0) == 0) return "mistral";
  if (arch.rfind("Qwen2", 0) == 0) return "qwen2";
  return "";
}

// model_type, else the family of architectures[0]; the architecture, else the family's default.
void parse_identity(const ConfigFields& f, FamilyShape& s) {
  const std::string architecture = f.first_name_of("architectures");
  s.model_type = f.string_or("model_type", model_type_of_architecture(architecture));
  if (s.model_type.empty())
    f.fail("model_type", "config-missing-field",
           architecture.empty() ? std::string("is missing (and there is no architectures list)")
                                : fmt::format("is missing and architecture {} is not one of the "
                                              "supported families",
                                              quote_text(architecture, '\'')));
  s.architecture = architecture.empty() ? default_architecture(s.model_type) : architecture;
}

void parse_gpt2(const ConfigFields& f, FamilyShape& s) {
  s.arch = Arch::kGPT2;
  s.vocab_size = f.positive_int("vocab_size");
  s.hidden_size = f.positive_int("n_embd");
  s.num_layers = f.layer_count("n_layer");
  s.num_heads = f.positive_int("n_head");
  s.max_position_embeddings = f.positive_int("n_positions");
  if (s.hidden_size % s.num_heads != 0)
    f.fail("n_head", "config-inconsistent",
           fmt::format("({}) must divide n_embd ({})", s.num_heads, s.hidden_size));
  s.num_kv_heads = s.num_heads;
  s.head_dim = s.hidden_size / s.num_heads;
  s.intermediate_size = f.has("n_inner")
                            ? f.positive_int("n_inner")
                            : checked_mul<int64_t>(4, s.hidden_size, "default n_inner 4 x n_embd");
  s.tie_word_embeddings = f.bool_or("tie_word_embeddings", true);
  if (f.bool_or("add_cross_attention", false))
    f.fail("add_cross_attention", "config-unsupported",
           "is true: cross-attention GPT-2 is not supported");
}

void parse_llama(const ConfigFields& f, FamilyShape& s) {
  s.arch = Arch::kLlama;
  s.vocab_size = f.positive_int("vocab_size");
  s.hidden_size = f.positive_int("hidden_size");
  s.intermediate_size = f.positive_int("intermediate_size");
  s.num_layers = f.layer_count("num_hidden_layers");
  s.num_heads = f.positive_int("num_attention_heads");
  s.num_kv_heads = f.positive_int_or("num_key_value_heads", s.num_heads);
  if (s.num_heads % s.num_kv_heads != 0)
    f.fail("num_key_value_heads", "config-inconsistent",
           fmt::format("({}) must divide num_attention_heads ({})", s.num_kv_heads, s.num_heads));
  if (f.has("head_dim")) {
    s.head_dim = f.positive_int("head_dim");
  } else {
    if (s.hidden_size % s.num_heads != 0)
      f.fail("num_attention_heads", "config-inconsistent",
             fmt::format("({}) must divide hidden_size ({}) when head_dim is absent", s.num_heads,
                         s.hidden_size));
    s.head_dim = s.hidden_size / s.num_heads;
  }
  const bool mistral = s.model_type == "mistral", qwen2 = s.model_type == "qwen2";
  // The defaults of LlamaConfig / MistralConfig / Qwen2Config.
  s.max_position_embeddings = f.positive_int_or("max_position_embeddings", mistral ? 4096 * 32
                                                                           : qwen2 ? 32768
                                                                                   : 2048);
  s.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  if (qwen2) {
    s.qkv_bias = true;  // Qwen2Attention: q/k/v have a bias, o_proj none.
    s.o_bias = s.mlp_bias = false;
  } else if (mistral) {
    s.qkv_bias = s.o_bias = s.mlp_bias = false;
  } else {
    s.qkv_bias = s.o_bias = f.bool_or("attention_bias", false);
    s.mlp_bias = f.bool_or("mlp_bias", false);
  }
}

void gpt2_parameters(const FamilyShape& s, std::vector<FamilyParameter>& out) {
  const int64_t n = s.hidden_size, inner = s.intermediate_size, qkv = fused_qkv_width(s);
  out.push_back({"transformer.wte.weight", {s.vocab_size, n}, ""});
  out.push_back({"transformer.wpe.weight", {s.max_position_embeddings, n}, ""});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    // Conv1D stores its weight [in, out].
    out.push_back({p + "ln_1.weight", {n}, ""});
    out.push_back({p + "ln_1.bias", {n}, ""});
    out.push_back({p + "attn.c_attn.weight", {n, qkv}, ""});
    out.push_back({p + "attn.c_attn.bias", {qkv}, ""});
    out.push_back({p + "attn.c_proj.weight", {n, n}, ""});
    out.push_back({p + "attn.c_proj.bias", {n}, ""});
    out.push_back({p + "ln_2.weight", {n}, ""});
    out.push_back({p + "ln_2.bias", {n}, ""});
    out.push_back({p + "mlp.c_fc.weight", {n, inner}, ""});
    out.push_back({p + "mlp.c_fc.bias", {inner}, ""});
    out.push_back({p + "mlp.c_proj.weight", {inner, n}, ""});
    out.push_back({p + "mlp.c_proj.bias", {n}, ""});
  }
  out.push_back({"transformer.ln_f.weight", {n}, ""});
  out.push_back({"transformer.ln_f.bias", {n}, ""});
  out.push_back(
      {"lm_head.weight", {s.vocab_size, n}, s.tie_word_embeddings ? "transformer.wte.weight" : ""});
}

void llama_parameters(const FamilyShape& s, std::vector<FamilyParameter>& out) {
  const int64_t h = s.hidden_size, q = q_width(s), kv = kv_width(s);
  const int64_t inter = s.intermediate_size;
  out.push_back({"model.embed_tokens.weight", {s.vocab_size, h}, ""});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    // Linear stores its weight [out, in].
    auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f, bool bias) {
      out.push_back({p + name + ".weight", {out_f, in_f}, ""});
      if (bias) out.push_back({p + name + ".bias", {out_f}, ""});
    };
    linear("self_attn.q_proj", q, h, s.qkv_bias);
    linear("self_attn.k_proj", kv, h, s.qkv_bias);
    linear("self_attn.v_proj", kv, h, s.qkv_bias);
    linear("self_attn.o_proj", h, q, s.o_bias);
    linear("mlp.gate_proj", inter, h, s.mlp_bias);
    linear("mlp.up_proj", inter, h, s.mlp_bias);
    linear("mlp.down_proj", h, inter, s.mlp_bias);
    out.push_back({p + "input_layernorm.weight", {h}, ""});
    out.push_back({p + "post_attention_layernorm.weight", {h}, ""});
  }
  out.push_back({"model.norm.weight", {h}, ""});
  out.push_back({"lm_head.weight",
                 {s.vocab_size, h},
                 s.tie_word_embeddings ? "model.embed_tokens.weight" : ""});
}

}  // namespace

// Widths derived from a config by multiplication: a config with huge sizes is a
// SizeOverflowError naming the fields, not a wrapped (or undefined) shape.
int64_t fused_qkv_width(const FamilyShape& s) {
  return checked_mul<int64_t>(3, s.hidden_size, "the fused q, k, v width 3 x n_embd");
}
int64_t q_width(const FamilyShape& s) {
  return checked_mul(s.num_heads, s.head_dim, "the q width num_attention_heads x head_dim");
}
int64_t kv_width(const FamilyShape& s) {
  return checked_mul(s.num_kv_heads, s.head_dim, "the k, v width num_key_value_heads x head_dim");
}

const char* arch_name(Arch arch) {
  return arch == Arch::kGPT2 ? "gpt2" : "llama";
}

FamilyShape parse_family_shape(const ConfigFields& f) {
  FamilyShape s;
  s.source = f.file();
  parse_identity(f, s);
  if (s.model_type == "gpt2") {
    parse_gpt2(f, s);
  } else if (s.model_type == "llama" || s.model_type == "mistral" || s.model_type == "qwen2") {
    parse_llama(f, s);
  } else {
    f.fail("model_type", "config-unsupported",
           fmt::format("{} is not supported (supported: gpt2, llama, mistral, qwen2)",
                       quote_text(s.model_type, '\'')));
  }
  return s;
}

std::vector<FamilyParameter> family_parameters(const FamilyShape& shape) {
  std::vector<FamilyParameter> out;
  if (shape.arch == Arch::kGPT2)
    gpt2_parameters(shape, out);
  else
    llama_parameters(shape, out);
  return out;
}

const char* base_model_prefix(const FamilyShape& shape) {
  return shape.arch == Arch::kGPT2 ? "transformer" : "model";
}

}  // namespace metaload
