#include "identity/checkpoint_shapes.h"

#include <string>

#include "base/text.h"
#include "identity/family_shape.h"

namespace metaload {
namespace {

// GPT-2's Hub checkpoints are saved from GPT2Model: its modules without "transformer."; an untied
// lm_head keeps its full-model name.
std::string stored_name(const FamilyShape& s, const std::string& name) {
  static const std::string kPrefix = "transformer.";
  if (s.arch == Arch::kGPT2 && name.compare(0, kPrefix.size(), kPrefix) == 0)
    return name.substr(kPrefix.size());
  return name;
}

// The buffer an older checkpoint stores after `name`, if any: GPT-2's causal mask after each
// ln_1.bias, Llama's inv_freq after each o_proj weight.
void add_buffer_after(const FamilyShape& s, const std::string& name, DType dt,
                      std::vector<TensorSpec>& out) {
  const int64_t pos = s.max_position_embeddings;
  if (s.arch == Arch::kGPT2 && ends_with(name, ".ln_1.bias")) {
    out.push_back({name.substr(0, name.size() - 9) + "attn.bias", dt, {1, 1, pos, pos}});
  } else if (s.arch == Arch::kLlama && ends_with(name, ".self_attn.o_proj.weight")) {
    out.push_back(
        {name.substr(0, name.size() - 13) + "rotary_emb.inv_freq", DType::F32, {s.head_dim / 2}});
  }
}

}  // namespace

std::vector<TensorSpec> checkpoint_tensor_specs(const nlohmann::json& config, DType dtype,
                                                bool with_buffers, const std::string& source) {
  const FamilyShape shape = parse_family_shape(ConfigFields(config, source));
  std::vector<TensorSpec> out;
  for (const FamilyParameter& p : family_parameters(shape)) {
    if (!p.tied_to.empty()) continue;  // transformers saves a tied tensor once
    const std::string name = stored_name(shape, p.name);
    out.push_back({name, dtype, p.shape});
    if (with_buffers) add_buffer_after(shape, name, dtype, out);
  }
  return out;
}

}  // namespace metaload
