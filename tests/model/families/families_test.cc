// The GPT-2 and Llama module trees: names and shapes against the specs, meta builds of the real
// configs, non-persistent buffers, forward with and without the KV cache, greedy generation,
// errors, and a gpt2-sized generation (how long it takes: bench/model).
#include <cmath>
#include <map>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "model/families/family.h"

#include "c10_ext/meta_mode.h"

namespace metaload {
namespace {

const std::vector<std::string> kTiny = {"gpt2-tiny", "llama-tiny", "llama-tiny-tied", "qwen2-tiny",
                                        "mistral-tiny"};
const std::map<std::string, int64_t> kPublished = {
    {"gpt2", 124439808},          {"llama-2-7b", 6738415616},  {"llama-2-70b", 68976648192},
    {"llama-3.2-1b", 1235814400}, {"qwen2.5-0.5b", 494032768}, {"mistral-7b-v0.1", 7241732096},
};

BuildOptions seeded(uint64_t seed) {
  BuildOptions o;
  o.seed = seed;
  return o;
}

at::Tensor random_ids(const FamilyConfig& c, int64_t batch, int64_t length, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {batch, length}, gen, at::kLong);
}

BuildOptions on_meta() {
  BuildOptions o;
  o.device = at::kMeta;
  return o;
}

std::string dtype_name(at::ScalarType t) {
  return t == at::kBool ? "bool" : t == at::kFloat ? "float32" : c10::toString(t);
}

// named_parameters() and named_buffers() of `model` are exactly the specs: names, order, shapes.
void expect_tree_matches_specs(CausalLM& model, const std::string& what) {
  auto params = model.named_parameters(/*recurse=*/true);
  std::vector<ParamSpec> specs = model.parameter_specs();
  ASSERT_EQ(params.size(), specs.size()) << what;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(params[i].key(), specs[i].name) << what;
    EXPECT_EQ(params[i].value().sizes().vec(), specs[i].shape) << what << " " << specs[i].name;
    if (!specs[i].tied_to.empty()) {
      EXPECT_TRUE(params[i].value().is_same(*params.find(specs[i].tied_to)))
          << what << ": " << specs[i].name << " is not the tensor of " << specs[i].tied_to;
    }
  }
  auto buffers = model.named_buffers(/*recurse=*/true);
  std::vector<BufferSpec> bspecs = model.buffer_specs();
  ASSERT_EQ(buffers.size(), bspecs.size()) << what;
  for (size_t i = 0; i < bspecs.size(); ++i) {
    EXPECT_EQ(buffers[i].key(), bspecs[i].name) << what;
    EXPECT_EQ(buffers[i].value().sizes().vec(), bspecs[i].shape) << what << " " << bspecs[i].name;
    EXPECT_EQ(dtype_name(buffers[i].value().scalar_type()), bspecs[i].dtype) << bspecs[i].name;
  }
}

TEST(FamilyBuild, TinyModulesMatchTheSpecs) {
  for (const auto& name : kTiny) {
    auto model = build_causal_lm(builtin_config(name), seeded(1));
    expect_tree_matches_specs(*model, name);
    EXPECT_EQ(model->num_parameters(), parameter_count(model->config())) << name;
    for (const auto& p : model->parameters()) EXPECT_TRUE(p.device().is_cpu());
  }
}

// Every real config builds on meta in no time and no memory; its tree is the spec and its
// parameter count the published one.
TEST(FamilyBuild, RealConfigsOnMetaHaveThePublishedCounts) {
  for (const auto& [name, count] : kPublished) {
    auto model = build_causal_lm(builtin_config(name), on_meta());
    expect_tree_matches_specs(*model, name);
    EXPECT_EQ(model->num_parameters(), count) << name;
    for (const auto& p : model->parameters()) ASSERT_TRUE(p.is_meta()) << name;
    for (const auto& b : model->buffers()) ASSERT_TRUE(b.is_meta()) << name;
  }
}

// The model layer's route: default (CPU) options under MetaMode give a skeleton.
TEST(FamilyBuild, RealConfigsUnderMetaModeHaveThePublishedCounts) {
  for (const auto& [name, count] : kPublished) {
    std::shared_ptr<CausalLM> model;
    {
      MetaMode guard;
      model = build_causal_lm(builtin_config(name));
    }
    expect_tree_matches_specs(*model, name);
    EXPECT_EQ(model->num_parameters(), count) << name;
    for (const auto& p : model->parameters()) ASSERT_TRUE(p.is_meta()) << name;
    for (const auto& b : model->buffers()) ASSERT_TRUE(b.is_meta()) << name;
  }
}

// Buffers of a MetaMode build: still meta when recomputed under the mode, real (and equal to an
// eager build's) in a RealGuard window or after the mode ends.
TEST(FamilyBuffers, MetaModeBuildThenRealWindow) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    auto eager = build_causal_lm(builtin_config(name), seeded(1));
    std::shared_ptr<CausalLM> model;
    {
      MetaMode guard;
      model = build_causal_lm(builtin_config(name));
      model->init_nonpersistent_buffers(at::kCPU);
      for (const auto& b : model->buffers()) EXPECT_TRUE(b.is_meta()) << name;
      RealGuard real;
      model->init_nonpersistent_buffers(at::kCPU);
    }
    auto expect = eager->named_buffers();
    for (const auto& b : model->named_buffers())
      EXPECT_TRUE(b.value().equal(expect[b.key()])) << name << " " << b.key();
  }
}

TEST(FamilyBuild, ClassNamesAndDottedPaths) {
  auto gpt2 = build_causal_lm(builtin_config("gpt2-tiny"), on_meta());
  EXPECT_EQ(gpt2->name(), "GPT2LMHeadModel");
  auto mods = gpt2->named_modules();
  ASSERT_NE(mods.find("transformer.h.1.attn"), nullptr);
  EXPECT_EQ((*mods.find("transformer.h.1.attn"))->name(), "GPT2Attention");
  EXPECT_EQ((*mods.find("transformer.h.1.attn.c_attn"))->name(), "Conv1D");
  auto mistral = build_causal_lm(builtin_config("mistral-tiny"), on_meta());
  EXPECT_EQ(mistral->name(), "MistralForCausalLM");
  auto mm = mistral->named_modules();
  EXPECT_EQ((*mm.find("model.layers.0.self_attn"))->name(), "MistralAttention");
  EXPECT_EQ((*mm.find("model.norm"))->name(), "MistralRMSNorm");
  EXPECT_EQ((*mm.find("model.rotary_emb"))->name(), "MistralRotaryEmbedding");
  EXPECT_EQ((*mm.find("model.layers.1.mlp.act_fn"))->name(), "SiLU");
  // transformers' parameterless modules exist too, in its registration order.
  EXPECT_EQ((*mods.find("transformer.drop"))->name(), "Dropout");
  EXPECT_EQ((*mods.find("transformer.h.0.mlp.act"))->name(), "NewGELUActivation");
  std::vector<std::string> attn_children, mlp_children;
  for (const auto& c : (*mods.find("transformer.h.0.attn"))->named_children())
    attn_children.push_back(c.key());
  for (const auto& c : (*mods.find("transformer.h.0.mlp"))->named_children())
    mlp_children.push_back(c.key());
  EXPECT_EQ(attn_children,
            (std::vector<std::string>{"c_attn", "c_proj", "attn_dropout", "resid_dropout"}));
  EXPECT_EQ(mlp_children, (std::vector<std::string>{"c_fc", "c_proj", "act", "dropout"}));
}

// The observer sees every module's output under its dotted path, once per forward: what the
// model layer's scan and capture are built on.
TEST(FamilyObserver, EveryModuleReportsItsOutputByPath) {
  for (const auto& name : kTiny) {
    auto model = build_causal_lm(builtin_config(name), seeded(1));
    const FamilyConfig& c = model->config();
    std::vector<std::pair<std::string, std::vector<int64_t>>> seen;
    model->set_output_observer([&](const std::string& path, const at::Tensor& out) {
      seen.emplace_back(path, out.sizes().vec());
    });
    at::NoGradGuard no_grad;
    model->forward(random_ids(c, 2, 7, 1));
    std::map<std::string, int> count;
    std::map<std::string, std::vector<int64_t>> shape;
    for (const auto& [path, sizes] : seen) {
      ++count[path];
      shape[path] = sizes;
    }
    for (const auto& item : model->named_modules()) {
      const std::string& path = item.key();
      // Containers have no output; rotary_emb's (cos, sin) is reported element by element.
      const bool silent =
          path == "transformer.h" || path == "model.layers" || path == "model.rotary_emb";
      EXPECT_EQ(count[path], silent ? 0 : 1) << name << " '" << path << "'";
      EXPECT_EQ(output_elements(*item.value()), path == "model.rotary_emb" ? 2 : 0) << path;
    }
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back().first, "");  // the logits come last
    EXPECT_EQ(seen.back().second, (std::vector<int64_t>{2, 7, c.vocab_size}));
    EXPECT_EQ(shape["lm_head"], (std::vector<int64_t>{2, 7, c.vocab_size}));
    if (c.arch == Arch::kGPT2) {
      EXPECT_EQ(shape["transformer.h.0.attn.c_attn"], (std::vector<int64_t>{2, 7, 192}));
      EXPECT_EQ(shape["transformer.h.1.attn.attn_dropout"], (std::vector<int64_t>{2, 4, 7, 7}));
      EXPECT_EQ(shape["transformer.h.0.mlp.act"], (std::vector<int64_t>{2, 7, 256}));
      EXPECT_EQ(shape["transformer"], (std::vector<int64_t>{2, 7, 64}));
    } else {
      const int64_t kv = c.num_kv_heads * c.head_dim;
      EXPECT_EQ(shape["model.layers.0.self_attn.k_proj"], (std::vector<int64_t>{2, 7, kv}));
      EXPECT_EQ(shape["model.layers.1.mlp.act_fn"],
                (std::vector<int64_t>{2, 7, c.intermediate_size}));
      EXPECT_EQ(shape["model.layers.1"], (std::vector<int64_t>{2, 7, c.hidden_size}));
      EXPECT_EQ(shape["model"], (std::vector<int64_t>{2, 7, c.hidden_size}));
      // cos and sin as transformers returns them, [B, S, head_dim], right after the embedding.
      EXPECT_EQ(count["model.rotary_emb.0"], 1);
      EXPECT_EQ(shape["model.rotary_emb.0"], (std::vector<int64_t>{2, 7, c.head_dim}));
      EXPECT_EQ(shape["model.rotary_emb.1"], (std::vector<int64_t>{2, 7, c.head_dim}));
      ASSERT_GE(seen.size(), 3u);
      EXPECT_EQ(seen[1].first, "model.rotary_emb.0");
      EXPECT_EQ(seen[2].first, "model.rotary_emb.1");
    }
    // A decode step reports the one new position; attention probabilities span the cache.
    KVCache cache;
    model->forward(random_ids(c, 1, 5, 2), &cache);
    seen.clear();
    model->forward(random_ids(c, 1, 1, 3), &cache);
    shape.clear();
    for (const auto& [path, sizes] : seen) shape[path] = sizes;
    EXPECT_EQ(shape[""], (std::vector<int64_t>{1, 1, c.vocab_size}));
    if (c.arch == Arch::kGPT2) {
      EXPECT_EQ(shape["transformer.h.0.attn.attn_dropout"], (std::vector<int64_t>{1, 4, 1, 6}));
    } else {
      EXPECT_EQ(shape["model.rotary_emb.1"], (std::vector<int64_t>{1, 1, c.head_dim}));
    }
    // Cleared: nothing is reported.
    model->set_output_observer(nullptr);
    seen.clear();
    model->forward(random_ids(c, 1, 3, 1));
    EXPECT_TRUE(seen.empty());
  }
}

TEST(FamilyBuild, InitFollowsTransformersAndSeedsAreDeterministic) {
  auto a = build_causal_lm(builtin_config("gpt2"), seeded(3));
  auto p = a->named_parameters();
  const at::Tensor wte = p["transformer.wte.weight"];
  EXPECT_NEAR(wte.std().item<double>(), 0.02, 0.0005);
  EXPECT_NEAR(wte.mean().item<double>(), 0.0, 0.0005);
  // Output projections: std 0.02 / sqrt(2 * n_layer).
  EXPECT_NEAR(p["transformer.h.0.attn.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(24.0),
              0.0003);
  EXPECT_TRUE(p["transformer.h.0.ln_1.weight"].eq(1).all().item<bool>());
  EXPECT_TRUE(p["transformer.h.0.attn.c_attn.bias"].eq(0).all().item<bool>());
  EXPECT_TRUE(p["lm_head.weight"].is_same(wte));

  auto l1 = build_causal_lm(builtin_config("llama-tiny"), seeded(5));
  auto l2 = build_causal_lm(builtin_config("llama-tiny"), seeded(5));
  auto l3 = build_causal_lm(builtin_config("llama-tiny"), seeded(6));
  auto p1 = l1->named_parameters(), p2 = l2->named_parameters(), p3 = l3->named_parameters();
  for (const auto& item : p1) EXPECT_TRUE(item.value().equal(p2[item.key()])) << item.key();
  EXPECT_FALSE(
      p1["model.layers.0.mlp.up_proj.weight"].equal(p3["model.layers.0.mlp.up_proj.weight"]));
  EXPECT_TRUE(p1["model.norm.weight"].eq(1).all().item<bool>());
  EXPECT_FALSE(p1["lm_head.weight"].is_same(p1["model.embed_tokens.weight"]));
}

// transformers' llama3 inv_freq, written here independently in double precision.
std::vector<double> llama3_inv_freq(const FamilyConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  const double old = r.original_max_position_embeddings;
  std::vector<double> out;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    const double f = 1.0 / std::pow(c.rope_theta, double(i) / double(c.head_dim));
    const double wavelen = 2 * M_PI / f;
    if (wavelen < old / r.high_freq_factor) {
      out.push_back(f);
    } else if (wavelen > old / r.low_freq_factor) {
      out.push_back(f / r.factor);
    } else {
      const double s =
          (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      out.push_back((1 - s) * f / r.factor + s * f);
    }
  }
  return out;
}

TEST(FamilyBuffers, Llama3InvFreqMatchesTheFormula) {
  for (const char* name : {"llama-3.2-1b", "llama-tiny"}) {
    FamilyConfig c = builtin_config(name);
    // Only the buffer matters; a meta build recomputed on the CPU gives it without 1B weights.
    auto model = build_causal_lm(c, on_meta());
    model->init_nonpersistent_buffers(at::kCPU);
    at::Tensor inv = model->named_buffers()["model.rotary_emb.inv_freq"];
    ASSERT_EQ(inv.scalar_type(), at::kFloat);
    std::vector<double> expect = llama3_inv_freq(c);
    ASSERT_EQ(inv.numel(), static_cast<int64_t>(expect.size()));
    int scaled = 0, kept = 0, smoothed = 0;
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_NEAR(inv[i].item<double>(), expect[i], 2e-6 * expect[i]) << name << " " << i;
      const double f = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
      if (std::abs(expect[i] - f) < 1e-12 * f)
        ++kept;
      else if (std::abs(expect[i] - f / c.rope_scaling.factor) < 1e-12 * f)
        ++scaled;
      else
        ++smoothed;
    }
    // The configs exercise all three bands of the llama3 rule.
    EXPECT_GT(kept, 0) << name;
    EXPECT_GT(scaled, 0) << name;
    EXPECT_GT(smoothed, 0) << name;
  }
  // No scaling: plain 1 / theta^(i/d).
  auto plain = build_causal_lm(builtin_config("llama-tiny-tied"), seeded(1));
  at::Tensor inv = plain->named_buffers()["model.rotary_emb.inv_freq"];
  for (int64_t i = 0; i < inv.numel(); ++i)
    EXPECT_NEAR(inv[i].item<double>(), 1.0 / std::pow(500000.0, 2.0 * i / 8), 1e-6);
}

// After a meta build, init_nonpersistent_buffers gives exactly the eager build's buffers, into the
// same buffer tensors (a reference taken before sees them).
TEST(FamilyBuffers, MetaBuildThenInitEqualsEagerBuild) {
  for (const auto& name : kTiny) {
    auto eager = build_causal_lm(builtin_config(name), seeded(1));
    auto meta = build_causal_lm(builtin_config(name), on_meta());
    auto before = meta->named_buffers();
    for (const auto& b : before) ASSERT_TRUE(b.value().is_meta());
    meta->init_nonpersistent_buffers(at::kCPU);
    auto expect = eager->named_buffers();
    for (const auto& b : before) {
      const at::Tensor& held = b.value();
      EXPECT_TRUE(held.device().is_cpu()) << name << " " << b.key();
      EXPECT_EQ(held.scalar_type(), expect[b.key()].scalar_type());
      EXPECT_TRUE(held.equal(expect[b.key()])) << name << " " << b.key();
    }
    // Recomputing on an eager model changes nothing.
    eager->init_nonpersistent_buffers();
    for (const auto& b : eager->named_buffers()) EXPECT_TRUE(b.value().equal(expect[b.key()]));
  }
  auto gpt2 = build_causal_lm(builtin_config("gpt2-tiny"), seeded(1));
  auto buffers = gpt2->named_buffers();
  at::Tensor mask = buffers["transformer.h.1.attn.bias"];
  EXPECT_TRUE(mask[0][0].equal(at::ones({64, 64}, at::kBool).tril()));
  EXPECT_EQ(buffers["transformer.h.0.attn.masked_bias"].item<float>(), -1e4f);
}

// Larger-than-init weights so attention is far from uniform and the comparisons mean something.
void scramble(CausalLM& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : model.parameters()) p.normal_(0, 0.2, gen);
}

TEST(FamilyForward, ShapesAndLastOnly) {
  for (const auto& name : kTiny) {
    auto model = build_causal_lm(builtin_config(name), seeded(2));
    scramble(*model, 2);
    at::NoGradGuard no_grad;
    at::Tensor ids = random_ids(model->config(), 2, 9, 1);
    at::Tensor logits = model->forward(ids);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 9, model->config().vocab_size}));
    EXPECT_EQ(logits.scalar_type(), at::kFloat);
    at::Tensor last = model->forward(ids, nullptr, /*last_only=*/true);
    EXPECT_EQ(last.sizes().vec(), (std::vector<int64_t>{2, 1, model->config().vocab_size}));
    EXPECT_TRUE(at::allclose(last.squeeze(1), logits.select(1, 8), 1e-5, 1e-5)) << name;
    // int32 ids give the same logits.
    EXPECT_TRUE(at::allclose(model->forward(ids.to(at::kInt)), logits)) << name;
    // Causality: changing the last token leaves earlier positions alone.
    at::Tensor changed = ids.clone();
    changed[0][8] = (changed[0][8].item<int64_t>() + 1) % model->config().vocab_size;
    at::Tensor other = model->forward(changed);
    EXPECT_TRUE(at::allclose(other.narrow(1, 0, 8), logits.narrow(1, 0, 8), 1e-5, 1e-5)) << name;
    EXPECT_FALSE(at::allclose(other.select(1, 8), logits.select(1, 8))) << name;
  }
}

// Feeding the sequence in chunks through one KV cache gives the logits of one uncached forward,
// including across the sliding window (mistral-tiny: window 5; qwen2-tiny: window 6 on layer 1).
TEST(FamilyForward, ChunkedWithCacheEqualsUncached) {
  for (const auto& name : kTiny) {
    auto model = build_causal_lm(builtin_config(name), seeded(4));
    scramble(*model, 4);
    at::NoGradGuard no_grad;
    at::Tensor ids = random_ids(model->config(), 2, 14, 3);
    at::Tensor full = model->forward(ids);
    // A preallocated cache and a lazily grown one (empty KVCache, capacity doubling).
    for (bool preallocate : {true, false}) {
      KVCache cache = preallocate ? model->new_cache(2, 6) : KVCache{};
      std::vector<at::Tensor> parts;
      int64_t offset = 0;
      for (int64_t n : {4, 1, 3, 1, 5}) {
        parts.push_back(model->forward(ids.narrow(1, offset, n), &cache));
        offset += n;
      }
      EXPECT_EQ(cache.length, 14);
      EXPECT_GE(cache.capacity(), 14);
      at::Tensor chunked = at::cat(parts, 1);
      EXPECT_TRUE(at::allclose(chunked, full, 1e-4, 1e-5))
          << name << " max diff " << (chunked - full).abs().max().item<double>();
    }
  }
}

TEST(FamilyForward, SlidingWindowLimitsWhatATokenSees) {
  // mistral-tiny's window is 5: the logits at position 10 depend on tokens 6..10 only.
  auto model = build_causal_lm(builtin_config("mistral-tiny"), seeded(8));
  scramble(*model, 8);
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(model->config(), 1, 11, 5);
  at::Tensor base = model->forward(ids);
  at::Tensor far = ids.clone();
  far[0][5] = (far[0][5].item<int64_t>() + 7) % model->config().vocab_size;
  at::Tensor near = ids.clone();
  near[0][6] = (near[0][6].item<int64_t>() + 7) % model->config().vocab_size;
  // Token 6 is inside position 10's window. Token 5 is outside it, but with two layers it still
  // reaches position 10 through position 9 (windows compose across layers): one layer shows the
  // window exactly.
  EXPECT_FALSE(at::allclose(model->forward(near).select(1, 10), base.select(1, 10)));
  auto one_layer = builtin_config("mistral-tiny").raw;
  one_layer["num_hidden_layers"] = 1;
  auto single = build_causal_lm(parse_family_config(one_layer, "one-layer"), seeded(8));
  scramble(*single, 8);
  at::Tensor b1 = single->forward(ids);
  EXPECT_TRUE(at::allclose(single->forward(far).select(1, 10), b1.select(1, 10), 1e-6, 1e-6));
  EXPECT_FALSE(at::allclose(single->forward(near).select(1, 10), b1.select(1, 10)));
}

TEST(FamilyGenerate, CachedAndUncachedGiveTheSameTokens) {
  for (const auto& name : kTiny) {
    auto model = build_causal_lm(builtin_config(name), seeded(9));
    scramble(*model, 9);
    at::Tensor prompt = random_ids(model->config(), 2, 5, 7);
    at::Tensor cached = model->generate(prompt, 12);
    at::Tensor plain = model->generate(prompt, 12, /*use_cache=*/false);
    EXPECT_EQ(cached.sizes().vec(), (std::vector<int64_t>{2, 17}));
    EXPECT_TRUE(cached.narrow(1, 0, 5).equal(prompt));
    EXPECT_TRUE(cached.equal(plain)) << name << "\n" << cached << "\n" << plain;
    // Not a degenerate repetition of one token: the model is really conditioning.
    EXPECT_GT(std::get<0>(at::_unique(cached.narrow(1, 5, 12))).numel(), 1) << name;
    EXPECT_TRUE(model->generate(prompt, 0).equal(prompt));
  }
}

TEST(FamilyForward, HalfPrecisionRuns) {
  auto f32 = build_causal_lm(builtin_config("llama-tiny"), seeded(11));
  scramble(*f32, 11);
  BuildOptions o;
  o.dtype = at::kBFloat16;
  o.init_weights = false;
  auto bf16 = build_causal_lm(builtin_config("llama-tiny"), o);
  {
    at::NoGradGuard no_grad;
    auto src = f32->named_parameters();
    for (auto& p : bf16->named_parameters()) p.value().copy_(src[p.key()]);
  }
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(f32->config(), 1, 8, 2);
  at::Tensor a = f32->forward(ids), b = bf16->forward(ids);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  // bf16 keeps ~3 significant digits.
  EXPECT_LT((b.to(at::kFloat) - a).abs().max().item<double>(), 0.05 * a.abs().max().item<double>());
  EXPECT_EQ(bf16->generate(ids, 3).size(1), 11);
}

template <class Fn>
void expect_family_error(Fn fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no FamilyError thrown";
  } catch (const FamilyError& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
  }
}

TEST(FamilyErrors, BadInputsAreTypedAndSayWhat) {
  auto gpt2 = build_causal_lm(builtin_config("gpt2-tiny"), seeded(1));
  auto llama = build_causal_lm(builtin_config("llama-tiny"), seeded(1));
  at::NoGradGuard no_grad;
  expect_family_error([&] { gpt2->forward(at::zeros({4}, at::kLong)); },
                      {"GPT2LMHeadModel.forward", "[batch, sequence]", "[4]"});
  expect_family_error([&] { llama->forward(at::zeros({1, 0}, at::kLong)); }, {"[1, 0]"});
  expect_family_error(
      [&] {
        llama->forward(at::zeros({1, 3}, at::kFloat));
      },
      {"integers", "Float"});
  at::Tensor ids = at::zeros({2, 3}, at::kLong);
  ids[1][2] = 256;
  expect_family_error([&] { llama->forward(ids); },
                      {"token id 256", "[1, 2]", "[0, 256)", "builtin:llama-tiny"});
  ids[1][2] = -1;
  expect_family_error([&] { gpt2->generate(ids, 2); }, {"generate", "token id -1"});
  expect_family_error(
      [&] {
        gpt2->generate(at::zeros({1, 60}, at::kLong), 5);
      },
      {"60 prompt tokens + 5", "64 positions", "builtin:gpt2-tiny"});
  expect_family_error(
      [&] {
        gpt2->forward(at::zeros({1, 65}, at::kLong));
      },
      {"65", "n_positions (64)"});
  expect_family_error([&] { llama->generate(at::zeros({1, 2}, at::kLong), -1); }, {">= 0", "-1"});
  KVCache cache = llama->new_cache(2, 8);
  expect_family_error(
      [&] {
        llama->forward(at::zeros({3, 2}, at::kLong), &cache);
      },
      {"batch of 2", "batch of 3"});
  KVCache other = gpt2->new_cache(1, 8);
  other.keys.pop_back();
  expect_family_error(
      [&] {
        gpt2->forward(at::zeros({1, 2}, at::kLong), &other);
      },
      {"1 layers", "the model 2"});
  expect_family_error([&] { llama->new_cache(0, 8); }, {"batch (0)"});
  BuildOptions ints;
  ints.dtype = at::kInt;
  expect_family_error([&] { build_causal_lm(builtin_config("gpt2-tiny"), ints); },
                      {"floating", "Int"});
}

// Greedy generation of 16 tokens after a 32-token prompt on gpt2-sized random weights (the real
// gpt2 config: 12 layers, 1024 positions): the KV cache gives exactly the tokens of recomputing
// every position. How much faster the cache is: bench/model (its "generate" row); a unit test
// asserts no time.
TEST(FamilyGenerate, Gpt2SizedCachedAndUncachedGiveTheSameTokens) {
  auto model = build_causal_lm(builtin_config("gpt2"), seeded(1));
  at::Tensor prompt = random_ids(model->config(), 1, 32, 1);
  at::Tensor cached = model->generate(prompt, 16);
  at::Tensor plain = model->generate(prompt, 16, /*use_cache=*/false);
  EXPECT_EQ(cached.sizes().vec(), (std::vector<int64_t>{1, 48}));
  EXPECT_TRUE(cached.narrow(1, 0, 32).equal(prompt));
  EXPECT_TRUE(cached.equal(plain)) << cached << "\n" << plain;
}

}  // namespace
}  // namespace metaload
