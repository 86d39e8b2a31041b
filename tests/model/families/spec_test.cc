// Config parsing, built-in configs, parameter specs and counts, tied groups, checkpoint name
// mapping and TP plans of the families. Torch-free.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "base/checked.h"
#include "loader/errors.h"
#include "model/families/config.h"
#include "model/families/spec.h"

namespace metaload {
namespace {

using nlohmann::json;

std::string source_dir() {
  const char* dir = std::getenv("METALOAD_SOURCE_DIR");
  return dir ? dir : ".";
}

json builtin(const std::string& name) {
  return json::parse(builtin_config_json(name));
}

// Expects `fn` to throw ConfigError whose message contains every one of `parts`.
template <class Fn>
void expect_config_error(Fn fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no ConfigError thrown";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.kind()), "ConfigError");
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
  }
}

FamilyConfig parse(const json& j) {
  return parse_family_config(j, "test/config.json");
}

// The published parameter counts (ties counted once), /work/shared/configs/README.md.
const std::map<std::string, int64_t> kPublished = {
    {"gpt2", 124439808},          {"llama-2-7b", 6738415616},  {"llama-2-70b", 68976648192},
    {"llama-3.2-1b", 1235814400}, {"qwen2.5-0.5b", 494032768}, {"mistral-7b-v0.1", 7241732096},
};

TEST(FamilyConfig, BuiltinsEqualTheJsonFilesInTheSourceTree) {
  namespace fs = std::filesystem;
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(source_dir() + "/model/families/configs"))
    if (entry.path().extension() == ".json") files.insert(entry.path().stem().string());
  std::set<std::string> names(builtin_config_names().begin(), builtin_config_names().end());
  EXPECT_EQ(files, names) << "the build embeds configs/*.json: reconfigure after adding one";
  for (const auto& name : names) {
    std::ifstream in(source_dir() + "/model/families/configs/" + name + ".json");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(json::parse(text.str()), builtin(name))
        << name << ": configs/embed.py changed the text";
    EXPECT_NO_THROW(builtin_config(name)) << name;
  }
}

TEST(FamilyConfig, Gpt2RealConfig) {
  FamilyConfig c = builtin_config("gpt2");
  EXPECT_EQ(c.arch, Arch::kGPT2);
  EXPECT_EQ(c.architecture, "GPT2LMHeadModel");
  EXPECT_EQ(c.source, "builtin:gpt2");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 3072);  // n_inner absent: 4 * n_embd
  EXPECT_EQ(c.max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "gelu_new");
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(FamilyConfig, LlamaFamilyRealConfigs) {
  FamilyConfig l = builtin_config("llama-3.2-1b");
  EXPECT_EQ(l.arch, Arch::kLlama);
  EXPECT_EQ(l.num_kv_heads, 8);
  EXPECT_EQ(l.kv_groups(), 4);
  EXPECT_EQ(l.head_dim, 64);
  EXPECT_TRUE(l.tie_word_embeddings);
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(l.rope_scaling.factor, 32.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(l.rope_theta, 500000.0);
  EXPECT_FALSE(l.qkv_bias);
  EXPECT_EQ(l.torch_dtype, "bfloat16");

  FamilyConfig q = builtin_config("qwen2.5-0.5b");
  EXPECT_EQ(q.model_type, "qwen2");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  EXPECT_DOUBLE_EQ(q.norm_eps, 1e-6);
  // use_sliding_window is false: no layer has a window.
  EXPECT_EQ(q.sliding_window, std::vector<int64_t>(24, 0));

  FamilyConfig m = builtin_config("mistral-7b-v0.1");
  EXPECT_EQ(m.sliding_window, std::vector<int64_t>(32, 4096));
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.rope_scaling.type, "default");

  FamilyConfig seven = builtin_config("llama-2-7b");
  EXPECT_EQ(seven.num_kv_heads, 32);
  EXPECT_EQ(seven.head_dim, 128);
  EXPECT_EQ(seven.rope_scaling.type, "default");  // rope_scaling: null
  EXPECT_EQ(seven.sliding_window, std::vector<int64_t>(32, 0));
}

// transformers 5 writes rope_theta and the scaling inside `rope_parameters`; older configs
// `rope_theta` and `rope_scaling` at the top. Both are read as transformers reads them.
TEST(FamilyConfig, RopeParametersAsTransformersReadsThem) {
  json j = builtin("llama-3.2-1b");
  json scaling = j["rope_scaling"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  scaling["rope_theta"] = 250000.0;
  j["rope_parameters"] = scaling;
  FamilyConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 250000.0);
  // rope_theta outside the object when the object lacks it.
  j["rope_parameters"].erase("rope_theta");
  j["rope_theta"] = 1234.0;
  EXPECT_DOUBLE_EQ(parse(j).rope_theta, 1234.0);
  // A non-empty rope_scaling wins over rope_parameters (convert_rope_params_to_dict); an empty
  // one does not.
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(j).rope_scaling.type, "linear");
  j["rope_scaling"] = json::object();
  EXPECT_EQ(parse(j).rope_scaling.type, "llama3");
  // llama3 without original_max_position_embeddings takes max_position_embeddings.
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(parse(j).rope_scaling.original_max_position_embeddings,
            j["max_position_embeddings"].get<int64_t>());
  // The object's partial_rotary_factor wins over the top-level one.
  j["partial_rotary_factor"] = 0.5;
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_DOUBLE_EQ(parse(j).rope_theta, 1234.0);
  j.erase("partial_rotary_factor");
  j["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(j).rope_scaling.type, "default");
}

TEST(FamilyConfig, DefaultsFollowTransformers) {
  json j = {{"model_type", "llama"},   {"vocab_size", 10},       {"hidden_size", 8},
            {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  FamilyConfig c = parse(j);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");

  j["attention_bias"] = true;
  c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);

  // Mistral's window defaults to 4096; null switches it off.
  j["model_type"] = "mistral";
  EXPECT_EQ(parse(j).sliding_window, std::vector<int64_t>(1, 4096));
  EXPECT_FALSE(parse(j).qkv_bias);  // attention_bias is a llama key
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse(j).sliding_window, std::vector<int64_t>(1, 0));

  // Qwen2: windows from max_window_layers on, only with use_sliding_window.
  json q = {{"model_type", "qwen2"},   {"vocab_size", 10},       {"hidden_size", 8},
            {"intermediate_size", 16}, {"num_hidden_layers", 4}, {"num_attention_heads", 2},
            {"sliding_window", 7},     {"max_window_layers", 2}};
  EXPECT_EQ(parse(q).sliding_window, std::vector<int64_t>(4, 0));
  q["use_sliding_window"] = true;
  EXPECT_EQ(parse(q).sliding_window, (std::vector<int64_t>{0, 0, 7, 7}));
  q["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(parse(q).sliding_window, (std::vector<int64_t>{7, 0, 0, 7}));
  // sliding_window null turns the window off (Qwen2Config: every layer full_attention); a missing
  // one is 4096.
  q["sliding_window"] = nullptr;
  EXPECT_EQ(parse(q).sliding_window, std::vector<int64_t>(4, 0));
  q.erase("layer_types");
  EXPECT_EQ(parse(q).sliding_window, std::vector<int64_t>(4, 0));
  q.erase("sliding_window");
  EXPECT_EQ(parse(q).sliding_window, (std::vector<int64_t>{0, 0, 4096, 4096}));

  // The model type may come from the architectures list alone.
  json g = {{"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", 10},
            {"n_embd", 8},
            {"n_layer", 1},
            {"n_head", 2},
            {"n_positions", 16}};
  FamilyConfig gc = parse(g);
  EXPECT_EQ(gc.model_type, "gpt2");
  EXPECT_TRUE(gc.tie_word_embeddings);
  EXPECT_EQ(gc.intermediate_size, 32);
}

TEST(FamilyConfig, ErrorsNameTheFieldAndTheFile) {
  json gpt2 = builtin("gpt2");
  json j = gpt2;
  j.erase("n_head");
  expect_config_error([&] { parse(j); }, {"test/config.json", "'n_head'", "missing"});
  j = gpt2;
  j["n_head"] = "12";
  expect_config_error([&] { parse(j); }, {"'n_head'", "positive integer", "\"12\""});
  j["n_head"] = 7;
  expect_config_error([&] { parse(j); }, {"'n_head'", "must divide n_embd (768)"});
  j = gpt2;
  j["n_embd"] = 768.5;
  expect_config_error([&] { parse(j); }, {"'n_embd'", "768.5"});
  j = gpt2;
  j["layer_norm_epsilon"] = -1;
  expect_config_error([&] { parse(j); }, {"'layer_norm_epsilon'", "positive number"});
  j = gpt2;
  j["activation_function"] = "tanh";
  expect_config_error([&] { parse(j); }, {"'activation_function'", "'tanh'", "gelu_new"});
  j = gpt2;
  j["tie_word_embeddings"] = 1;
  expect_config_error([&] { parse(j); }, {"'tie_word_embeddings'", "true or false"});
  j = gpt2;
  j["model_type"] = "bert";
  expect_config_error([&] { parse(j); }, {"'model_type'", "'bert'", "gpt2, llama"});
  j.erase("model_type");
  j["architectures"] = {"BertModel"};
  expect_config_error([&] { parse(j); }, {"'model_type'", "missing", "BertModel"});
  expect_config_error([&] { parse(json::array()); }, {"test/config.json", "JSON object"});

  json llama = builtin("llama-3.2-1b");
  j = llama;
  j["num_key_value_heads"] = 5;
  expect_config_error([&] { parse(j); }, {"'num_key_value_heads'", "(5)", "(32)"});
  j = llama;
  j["rope_scaling"]["rope_type"] = "yarn";
  expect_config_error([&] { parse(j); }, {"'rope_scaling.rope_type'", "'yarn'", "llama3"});
  j = llama;
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  j.erase("rope_scaling");
  expect_config_error([&] { parse(j); }, {"'rope_parameters.rope_type'", "'yarn'", "llama3"});
  j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  expect_config_error([&] { parse(j); }, {"'rope_parameters.partial_rotary_factor'"});
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", -1}};
  expect_config_error([&] { parse(j); }, {"'rope_parameters.rope_theta'", "positive"});
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  expect_config_error([&] { parse(j); }, {"'rope_parameters.full_attention'", "per layer type"});
  j["rope_parameters"] = json::array();
  expect_config_error([&] { parse(j); }, {"'rope_parameters'", "object"});
  j = llama;
  j["rope_scaling"]["high_freq_factor"] = 0.5;
  expect_config_error([&] { parse(j); }, {"'rope_scaling.high_freq_factor'", "greater"});
  j = llama;
  j["rope_scaling"] = 3;
  expect_config_error([&] { parse(j); }, {"'rope_scaling'", "object"});
  j = llama;
  j["head_dim"] = 63;
  expect_config_error([&] { parse(j); }, {"'head_dim'", "even"});
  j = llama;
  j["partial_rotary_factor"] = 0.5;
  expect_config_error([&] { parse(j); }, {"'partial_rotary_factor'"});
  j = builtin("qwen2-tiny");
  j["layer_types"] = {"full_attention", "banded"};
  expect_config_error([&] { parse(j); }, {"'layer_types'", "[1]", "banded"});
  j["layer_types"] = {"full_attention"};
  expect_config_error([&] { parse(j); }, {"'layer_types'", "2 layer types"});
}

// Every size field is at most kMaxConfigInt (2^31 - 1: config-too-large, as every reader of the
// field says, identity/config_fields.h), so a width derived from two fields fits int64; a
// parameter's bytes and the sums may still not: a SizeOverflowError naming the quantity, not a
// wrapped shape (or undefined behaviour) handed to torch.
TEST(FamilyConfig, SizesPastTorchsInt64AreNamedErrors) {
  auto expect_overflow = [](const json& j, const std::string& part) {
    try {
      parse(j);
      ADD_FAILURE() << "no SizeOverflowError for " << part;
    } catch (const SizeOverflowError& e) {
      EXPECT_NE(e.message().find(part), std::string::npos) << e.message();
    }
  };
  constexpr int64_t kMax = kMaxConfigInt;
  json j = builtin("gpt2");
  j["n_embd"] = int64_t{1} << 62;  // 4 x n_embd, the default n_inner, would wrap
  j["n_head"] = 1;
  expect_config_error([&] { parse(j); }, {"'n_embd'", "at most 2147483647", "config-too-large"});
  j["n_embd"] = kMax;
  j["vocab_size"] = kMax;  // wte: ~2^62 elements, ~2^65 bytes
  expect_overflow(j, "test/config.json: bytes of parameter transformer.wte.weight");
  j = builtin("llama-3.2-1b");
  j["head_dim"] = int64_t{1} << 60;
  expect_config_error([&] { parse(j); }, {"'head_dim'", "config-too-large"});
  j = builtin("llama-3.2-1b");
  j["num_hidden_layers"] = 1;
  j["hidden_size"] = int64_t{1} << 28;  // each weight fits; no sum is past 2^63 either
  j["num_attention_heads"] = 1;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 2;
  j["intermediate_size"] = 2;
  j["vocab_size"] = kMax;  // embed_tokens: ~2^59 elements, ~2^62 bytes at 8 each
  // embed_tokens (tied head), q, k, v, o, gate, up, down [2, h] or [h, 2], three norms [h].
  EXPECT_EQ(parameter_count(parse(j)),
            kMax * (int64_t{1} << 28) + 7 * (int64_t{1} << 29) + 3 * (int64_t{1} << 28));
  j["hidden_size"] = kMax;  // ~2^62 elements: ~2^65 bytes
  expect_overflow(j, "bytes of parameter model.embed_tokens.weight");
}

TEST(FamilyConfig, FilesDirectoriesAndBuiltinNames) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/families_spec_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    std::ofstream out(dir + "/config.json");
    out << builtin_config_json("llama-tiny");
  }
  FamilyConfig from_dir = load_family_config(dir);
  EXPECT_EQ(from_dir.source, dir + "/config.json");
  EXPECT_EQ(from_dir.hidden_size, 64);
  EXPECT_EQ(resolve_family_config(dir + "/config.json").num_layers, 2);
  EXPECT_EQ(resolve_family_config("gpt2").vocab_size, 50257);
  {
    std::ofstream out(dir + "/bad.json");
    out << "{\"model_type\": \"gpt2\",";
  }
  expect_config_error([&] { load_family_config(dir + "/bad.json"); },
                      {dir + "/bad.json", "invalid JSON"});
  expect_config_error([&] { load_family_config(dir + "/none.json"); },
                      {dir + "/none.json", "no such config file"});
  expect_config_error([&] { builtin_config("llama-3"); }, {"'llama-3'", "gpt2", "llama-tiny"});
  expect_config_error([&] { resolve_family_config("no-such-thing"); },
                      {"'no-such-thing'", "neither", "llama-2-70b"});
  fs::remove_all(dir);
}

// A hostile layer count was std::bad_alloc (10^12) or a std::length_error (2^62) when the per-layer
// tables were sized; any count past 2^16 is a ConfigError naming the field.
TEST(FamilyConfig, LayerCountsPastTheLimitAreConfigErrors) {
  for (const char* count : {"65537", "1000000000000", "4611686018427387904"}) {
    expect_config_error(
        [&] {
          parse_family_config_text(
              std::string(R"({"model_type": "gpt2", "vocab_size": 8, )") +
                  R"("n_embd": 8, "n_head": 2, "n_positions": 8, "n_layer": )" + count + "}",
              "g/config.json");
        },
        {"g/config.json", "'n_layer'", count, "at most 65536"});
    expect_config_error(
        [&] {
          parse_family_config_text(
              std::string(R"({"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, )") +
                  R"("intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": )" +
                  count + "}",
              "m/config.json");
        },
        {"m/config.json", "'num_hidden_layers'", count, "at most 65536"});
  }
  FamilyConfig c = parse_family_config_text(
      R"({"model_type": "gpt2", "vocab_size": 8, "n_embd": 8, "n_head": 2, "n_positions": 8, )"
      R"("n_layer": 65536})",
      "g/config.json");
  EXPECT_EQ(c.num_layers, 65536);
}

TEST(FamilyConfig, DeepJsonAndFilesThatAreNoFilesAreConfigErrors) {
  namespace fs = std::filesystem;
  // 70,000 nested objects overflowed the stack; every JSON metaload reads has one depth limit.
  std::string deep = R"({"model_type": "gpt2", "x": )";
  for (int i = 0; i < 70'000; ++i) deep += "{\"a\": ";
  deep += "1" + std::string(70'000, '}') + "}";
  expect_config_error([&] { parse_family_config_text(deep, "deep/config.json"); },
                      {"deep/config.json", "rule json-too-deep", "128"});
  char tmpl[] = "/tmp/families_spec_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // A FIFO is opened without blocking and named for what it is (it was "no such config file").
  ASSERT_EQ(::mkfifo((dir + "/fifo.json").c_str(), 0644), 0);
  expect_config_error([&] { load_family_config(dir + "/fifo.json"); },
                      {dir + "/fifo.json", "is a FIFO", "rule not-a-file"});
  fs::create_directories(dir + "/sub/config.json");
  expect_config_error([&] { load_family_config(dir + "/sub"); },
                      {dir + "/sub/config.json", "is a directory"});
  fs::remove_all(dir);
}

TEST(FamilySpec, ParameterCountsEqualThePublishedOnes) {
  for (const auto& [name, count] : kPublished)
    EXPECT_EQ(parameter_count(builtin_config(name)), count) << name;
}

TEST(FamilySpec, Gpt2NamesShapesAndTies) {
  FamilyConfig c = builtin_config("gpt2");
  std::vector<ParamSpec> specs = parameter_specs(c);
  ASSERT_EQ(specs.size(), 2 + 12 * 12 + 2 + 1u);
  EXPECT_EQ(specs[0].name, "transformer.wte.weight");
  EXPECT_EQ(specs[1].name, "transformer.wpe.weight");
  EXPECT_EQ(specs[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(specs[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(specs[4].shape, (std::vector<int64_t>{768, 2304}));  // Conv1D: [in, out]
  EXPECT_EQ(specs[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(specs[12].shape, (std::vector<int64_t>{3072, 768}));
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_EQ(specs.back().tied_to, "transformer.wte.weight");
  EXPECT_EQ(tied_parameter_groups(c),
            (std::vector<std::vector<std::string>>{{"transformer.wte.weight", "lm_head.weight"}}));
  std::vector<BufferSpec> buffers = buffer_specs(c);
  ASSERT_EQ(buffers.size(), 24u);
  EXPECT_EQ(buffers[0].name, "transformer.h.0.attn.bias");
  EXPECT_EQ(buffers[0].shape, (std::vector<int64_t>{1, 1, 1024, 1024}));
  EXPECT_EQ(buffers[1].name, "transformer.h.0.attn.masked_bias");
  EXPECT_FALSE(buffers[0].persistent);
}

TEST(FamilySpec, LlamaNamesShapesAndTies) {
  FamilyConfig c = builtin_config("llama-2-70b");
  std::vector<ParamSpec> specs = parameter_specs(c);
  ASSERT_EQ(specs.size(), 1 + 80 * 9 + 2u);
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{1024, 8192}));  // 8 kv heads of 128
  EXPECT_EQ(specs[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_TRUE(tied_parameter_groups(c).empty());
  EXPECT_EQ(buffer_specs(c)[0].name, "model.rotary_emb.inv_freq");
  EXPECT_EQ(buffer_specs(c)[0].shape, (std::vector<int64_t>{64}));

  FamilyConfig q = builtin_config("qwen2.5-0.5b");
  std::vector<std::string> layer0;
  for (const auto& p : parameter_specs(q))
    if (p.name.rfind("model.layers.0.", 0) == 0) layer0.push_back(p.name.substr(15));
  EXPECT_EQ(
      layer0,
      (std::vector<std::string>{
          "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
          "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}));
  EXPECT_EQ(
      tied_parameter_groups(q),
      (std::vector<std::vector<std::string>>{{"model.embed_tokens.weight", "lm_head.weight"}}));
}

TEST(FamilySpec, CheckpointNameMapping) {
  FamilyConfig g = builtin_config("gpt2");
  // The published gpt2 model.safetensors: base-model names and causal-mask buffers.
  EXPECT_EQ(map_checkpoint_name(g, "h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(map_checkpoint_name(g, "wte.weight"), "transformer.wte.weight");
  EXPECT_EQ(map_checkpoint_name(g, "ln_f.bias"), "transformer.ln_f.bias");
  EXPECT_EQ(map_checkpoint_name(g, "h.11.attn.bias"), std::nullopt);
  EXPECT_EQ(map_checkpoint_name(g, "transformer.h.3.attn.masked_bias"), std::nullopt);
  EXPECT_EQ(map_checkpoint_name(g, "transformer.h.3.attn.c_proj.bias"),
            "transformer.h.3.attn.c_proj.bias");
  EXPECT_EQ(map_checkpoint_name(g, "lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(map_checkpoint_name(g, "score.weight"), "score.weight");  // unknown: unchanged
  EXPECT_EQ(std::string(base_model_prefix(g)), "transformer");

  FamilyConfig l = builtin_config("llama-tiny");
  EXPECT_EQ(map_checkpoint_name(l, "layers.1.mlp.up_proj.weight"),
            "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(map_checkpoint_name(l, "norm.weight"), "model.norm.weight");
  EXPECT_EQ(map_checkpoint_name(l, "model.layers.1.self_attn.rotary_emb.inv_freq"), std::nullopt);
  EXPECT_EQ(map_checkpoint_name(l, "model.rotary_emb.inv_freq"), std::nullopt);
  EXPECT_EQ(map_checkpoint_name(l, "model.embed_tokens.weight"), "model.embed_tokens.weight");
}

TEST(FamilySpec, EveryParameterMatchesExactlyOneTPRule) {
  for (const auto& name : builtin_config_names()) {
    FamilyConfig c = builtin_config(name);
    std::vector<TPRule> plan = tp_plan(c);
    for (const auto& p : parameter_specs(c)) {
      int matches = 0;
      for (const auto& r : plan) {
        std::vector<TPRule> one{r};
        try {
          tp_rule_for(one, p.name);
          ++matches;
        } catch (const PlanError&) {
        }
      }
      EXPECT_EQ(matches, 1) << name << ": " << p.name;
    }
  }
  std::vector<TPRule> plan = tp_plan(builtin_config("gpt2"));
  EXPECT_THROW(tp_rule_for(plan, "transformer.h.0.attn.c_attn"), PlanError);
  EXPECT_THROW(tp_rule_for(plan, "transformer.h..attn.c_attn.weight"), PlanError);
}

TEST(FamilySpec, TPStylesAsVllmShards) {
  FamilyConfig g = builtin_config("gpt2");
  auto gp = tp_plan(g);
  const TPRule& c_attn = tp_rule_for(gp, "transformer.h.5.attn.c_attn.weight");
  EXPECT_EQ(c_attn.style, TPStyle::kColumn);
  EXPECT_EQ(c_attn.split_dim, 1);  // Conv1D [in, out]
  TpShard s = tp_shard(c_attn, {768, 2304}, 1, 4);
  EXPECT_EQ(s.dim, 1);
  // Rank 1's heads of q, of k and of v: 192 columns each.
  EXPECT_EQ(s.ranges,
            (std::vector<std::pair<int64_t, int64_t>>{{192, 384}, {960, 1152}, {1728, 1920}}));
  EXPECT_EQ(s.shape, (std::vector<int64_t>{768, 576}));
  const TPRule& proj = tp_rule_for(gp, "transformer.h.5.attn.c_proj.weight");
  EXPECT_EQ(proj.style, TPStyle::kRow);
  EXPECT_EQ(proj.split_dim, 0);
  EXPECT_EQ(tp_rule_for(gp, "transformer.h.5.mlp.c_proj.bias").style, TPStyle::kReplicated);
  EXPECT_EQ(tp_rule_for(gp, "transformer.wpe.weight").style, TPStyle::kReplicated);
  const TPRule& wte = tp_rule_for(gp, "transformer.wte.weight");
  EXPECT_EQ(wte.style, TPStyle::kVocab);
  TpShard v = tp_shard(wte, {50257, 768}, 1, 2);  // padded to 50304: 25152 rows per rank
  EXPECT_EQ(v.ranges, (std::vector<std::pair<int64_t, int64_t>>{{25152, 50257}}));
  EXPECT_EQ(v.shape, (std::vector<int64_t>{25152, 768}));
  // TP 3: padded to a multiple of lcm(64, 3) = 192 (50304 again), 16768 rows per rank.
  EXPECT_EQ(tp_shard(wte, {50257, 768}, 2, 3).ranges,
            (std::vector<std::pair<int64_t, int64_t>>{{33536, 50257}}));
  // llama-tiny-tied's vocabulary of 200 on 3 ranks (max_tp_size 6 allows 3): padded to 384, 128
  // rows each; rank 2 holds padding only.
  const std::vector<TPRule> tied = tp_plan(builtin_config("llama-tiny-tied"));
  const TPRule& embed = tp_rule_for(tied, "model.embed_tokens.weight");
  EXPECT_EQ(tp_shard(embed, {200, 48}, 1, 3).ranges,
            (std::vector<std::pair<int64_t, int64_t>>{{128, 200}}));
  TpShard pad_only = tp_shard(embed, {200, 48}, 2, 3);
  EXPECT_TRUE(pad_only.ranges.empty());
  EXPECT_EQ(pad_only.shape, (std::vector<int64_t>{128, 48}));
  EXPECT_THROW(tp_shard(c_attn, {768, 2304}, 0, 5), SliceError);  // 12 heads, TP 5
  EXPECT_THROW(tp_shard(c_attn, {768, 2300}, 0, 2), SliceError);  // wrong shape
  EXPECT_THROW(tp_shard(c_attn, {768, 2304}, 2, 2), SliceError);  // rank out of range
  TpShard r = tp_shard(tp_rule_for(gp, "transformer.ln_f.weight"), {768}, 1, 4);
  EXPECT_EQ(r.dim, -1);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{768}));

  FamilyConfig l = builtin_config("llama-2-70b");
  auto lp = tp_plan(l);
  const TPRule& k = tp_rule_for(lp, "model.layers.7.self_attn.k_proj.weight");
  EXPECT_EQ(k.style, TPStyle::kColumn);
  EXPECT_EQ(k.split_dim, 0);
  // 8 kv heads on 16 ranks: two ranks per head; rank 3 holds kv head 1.
  TpShard ks = tp_shard(k, {1024, 8192}, 3, 16);
  EXPECT_EQ(ks.ranges, (std::vector<std::pair<int64_t, int64_t>>{{128, 256}}));
  EXPECT_EQ(ks.shape, (std::vector<int64_t>{128, 8192}));
  const TPRule& o = tp_rule_for(lp, "model.layers.7.self_attn.o_proj.weight");
  EXPECT_EQ(o.style, TPStyle::kRow);
  EXPECT_EQ(o.split_dim, 1);
  TpShard os = tp_shard(o, {8192, 8192}, 2, 8);
  EXPECT_EQ(os.ranges, (std::vector<std::pair<int64_t, int64_t>>{{2048, 3072}}));
  EXPECT_EQ(os.shape, (std::vector<int64_t>{8192, 1024}));
  // 64 query heads do not split over 3 ranks; neither may query heads be replicated.
  EXPECT_THROW(
      tp_shard(tp_rule_for(lp, "model.layers.0.self_attn.q_proj.weight"), {8192, 8192}, 0, 3),
      SliceError);
  EXPECT_THROW(
      tp_shard(tp_rule_for(lp, "model.layers.0.self_attn.q_proj.weight"), {8192, 8192}, 0, 128),
      SliceError);
  EXPECT_EQ(tp_rule_for(lp, "model.layers.0.mlp.down_proj.weight").split_dim, 1);
  EXPECT_EQ(tp_rule_for(lp, "lm_head.weight").style, TPStyle::kVocab);
  EXPECT_EQ(std::string(tp_style_name(TPStyle::kRow)), "row");
}

// For every TP size that a tensor admits, the ranks' ranges tile the split dimension exactly (or,
// for replicated kv heads, every rank gets one whole head and every head is held).
TEST(FamilySpec, TpShardsTileEveryTensor) {
  for (const auto& name : builtin_config_names()) {
    FamilyConfig c = builtin_config(name);
    std::vector<TPRule> plan = tp_plan(c);
    std::vector<ParamSpec> specs = parameter_specs(c);
    std::set<std::string> seen_patterns;
    for (const auto& p : specs) {
      const TPRule& rule = tp_rule_for(plan, p.name);
      if (!seen_patterns.insert(rule.pattern).second) continue;
      for (int64_t size : {1, 2, 3, 4, 8, 16, 32}) {
        std::vector<TpShard> shards;
        try {
          for (int64_t r = 0; r < size; ++r) shards.push_back(tp_shard(rule, p.shape, r, size));
        } catch (const SliceError&) {
          continue;  // a size this tensor does not admit
        }
        if (rule.style == TPStyle::kReplicated) {
          for (const auto& s : shards) EXPECT_EQ(s.shape, p.shape);
          continue;
        }
        const int dim = rule.split_dim;
        std::vector<int> covered(p.shape[dim], 0);
        for (const auto& s : shards) {
          int64_t local = 0;
          for (auto [b, e] : s.ranges) {
            ASSERT_LE(0, b);
            ASSERT_LE(b, e);
            ASSERT_LE(e, p.shape[dim]);
            for (int64_t i = b; i < e; ++i) ++covered[i];
            local += e - b;
          }
          if (rule.style == TPStyle::kVocab)
            EXPECT_GE(s.shape[dim], local);
          else
            EXPECT_EQ(s.shape[dim], local) << p.name;
        }
        const bool replicated_heads = !rule.sections.empty() && rule.sections[0].replicate_heads &&
                                      rule.sections[0].heads < size;
        const int expect = replicated_heads ? static_cast<int>(size / rule.sections[0].heads) : 1;
        for (int64_t i = 0; i < p.shape[dim]; ++i)
          ASSERT_EQ(covered[i], expect) << name << " " << p.name << " tp " << size << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace metaload
