// describe_checkpoint: exact parameter counts from headers, sizes per dtype, byte accounting.
#include "identity/describe.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>

#include <gtest/gtest.h>

#include "base/checked.h"
#include "identity/checkpoint_shapes.h"
#include "identity/dtypes.h"
#include "identity/errors.h"
#include "identity/model_key.h"
#include "identity/reference.h"
#include "identity/registry.h"
#include "loader/format/json_util.h"
#include "loader/format/writer.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::ScopedEnv;
using testing::TempDir;

std::string config_text(const std::string& name) {
  return testing::read_file(testing::source_dir() + "/model/families/configs/" + name + ".json");
}

uint64_t numel_sum(const std::vector<TensorSpec>& specs) {
  uint64_t n = 0;
  for (const auto& s : specs) {
    uint64_t k = 1;
    for (int64_t d : s.shape) k *= static_cast<uint64_t>(d);
    n += k;
  }
  return n;
}

// Writes a sparse checkpoint of the published layout of `config_name` into dir (holes, no data).
void write_sparse(const std::string& dir, const std::string& config_name, DType dtype, bool buffers,
                  int shards) {
  std::string text = config_text(config_name);
  testing::write_file(dir + "/config.json", text);
  ShardOptions o;
  o.num_shards = shards;
  ShardedSafetensorsWriter w(dir, o);
  for (const auto& s : checkpoint_tensor_specs(nlohmann::json::parse(text), dtype, buffers)) {
    w.add(s.name, s.dtype, s.shape, nullptr);
  }
  w.write();
}

std::string key_of(const std::string& repo_id) {
  return std::string(kTransformersModel) + ":" +
         python_json_dumps(nlohmann::ordered_json{{"repo_id", repo_id}, {"revision", nullptr}});
}

// The issue's keys: describe opened /etc/passwd for a key naming it.
TEST(Describe, KeysNamingPathsAreRefusedBeforeAnyFileIsRead) {
  for (const std::string id : {"/etc/passwd", "../x", "org/.."}) {
    SCOPED_TRACE(id);
    reset_io_bytes_read();
    const RepoIdError e = expect_error<RepoIdError>([&] { describe_checkpoint(key_of(id)); });
    EXPECT_NE(std::string(e.what()).find(quote_str(key_of(id))), std::string::npos);
    EXPECT_EQ(io_bytes_read(), 0u);
  }
  // Opting in restores path resolution: /etc/passwd is then read, and is no checkpoint.
  expect_error<FormatError>(
      [&] { describe_checkpoint(key_of("/etc/passwd"), std::nullopt, std::nullopt, {true}); });
  EXPECT_GT(io_bytes_read(), 0u);
}

TEST(Describe, KeysAreLookedUpInTheHubCacheNeverInTheWorkingDirectory) {
  TempDir root;
  testing::make_dir(root / "tiny");
  write_sparse(root / "tiny", "gpt2", DType::F32, false, 0);
  ScopedEnv cache("HF_HUB_CACHE", (root / "hub").c_str());  // holds no "tiny"
  testing::ScopedCwd cwd(root.path());
  // "tiny" is a valid Hub repo id; ./tiny is a checkpoint, but a key never names it ...
  const ResolveError e = expect_error<ResolveError>([&] { describe_checkpoint(key_of("tiny")); });
  EXPECT_NE(std::string(e.what()).find("hub"), std::string::npos) << e.what();
  // ... unless the caller opts in to local paths.
  const CheckpointInfo local =
      describe_checkpoint(key_of("tiny"), std::nullopt, std::nullopt, {true});
  EXPECT_EQ(local.n_params, 124439808u);
  EXPECT_FALSE(local.repo_id);
  // The same id given as a plain reference is a path, as before.
  EXPECT_EQ(describe_checkpoint("tiny").n_params, 124439808u);
  // A hand-built ModelKey is checked too.
  expect_error<RepoIdError>([] {
    resolve_reference(ModelKey{kTransformersModel, "../tiny", std::nullopt, {}});
  });
}

// The configs README's published parameter counts (tied weights counted once).
TEST(Shapes, ReproducePublishedParameterCounts) {
  const std::vector<std::pair<std::string, uint64_t>> published = {
      {"gpt2", 124439808ull},          {"llama-2-7b", 6738415616ull},
      {"llama-2-70b", 68976648192ull}, {"llama-3.2-1b", 1235814400ull},
      {"qwen2.5-0.5b", 494032768ull},  {"mistral-7b-v0.1", 7241732096ull}};
  for (const auto& [name, count] : published) {
    auto specs = checkpoint_tensor_specs(nlohmann::json::parse(config_text(name)), DType::BF16);
    EXPECT_EQ(numel_sum(specs), count) << name;
  }
  EXPECT_EQ(expect_error<ConfigError>([] {
              checkpoint_tensor_specs({{"model_type", "bert"}}, DType::F32);
            }).rule(),
            "config-unsupported");
  EXPECT_EQ(expect_error<ConfigError>([] {
              checkpoint_tensor_specs({{"model_type", "llama"}}, DType::F32);
            }).rule(),
            "config-missing-field");
}

// A hostile layer count (estimate from a config.json, make-checkpoint) listed 13 tensors per layer
// until memory ran out (std::bad_alloc after 11 s for 10^12); past kMaxConfigLayers it is a
// ConfigError naming the field: the families' parser reads the same field by the same rule.
TEST(Shapes, LayerCountsPastTheLimitAreConfigErrors) {
  nlohmann::json gpt2 = nlohmann::json::parse(config_text("gpt2"));
  nlohmann::json llama = nlohmann::json::parse(config_text("llama-3.2-1b"));
  for (int64_t n : {kMaxConfigLayers + 1, int64_t{1000000000000}}) {
    for (auto [config, key] :
         {std::pair{&gpt2, "n_layer"}, std::pair{&llama, "num_hidden_layers"}}) {
      nlohmann::json c = *config;
      c[key] = n;
      auto e = expect_error<ConfigError>([&] { checkpoint_tensor_specs(c, DType::BF16); });
      EXPECT_EQ(e.rule(), "config-too-large");
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + key + "' is " + std::to_string(n)), std::string::npos)
          << what;
      EXPECT_NE(what.find("at most 65536"), std::string::npos) << what;
    }
  }
  gpt2["n_layer"] = kMaxConfigLayers;
  EXPECT_EQ(checkpoint_tensor_specs(gpt2, DType::BF16).size(), 4 + 12 * size_t{65536});
}

TEST(Describe, Gpt2PublishedLayoutCountsParametersNotMaskBuffers) {
  TempDir dir;
  // As the real openai-community/gpt2 model.safetensors: F32, 160 tensors incl. 12 h.N.attn.bias.
  write_sparse(dir.path(), "gpt2", DType::F32, /*buffers=*/true, /*shards=*/0);
  CheckpointInfo info = describe_checkpoint(dir.path());
  EXPECT_EQ(info.n_params, 124439808u);
  EXPECT_EQ(info.n_tensors, 160u);
  EXPECT_EQ(info.n_buffer_elements, 12u * 1024 * 1024);
  EXPECT_EQ(info.size_bytes, 124439808u * 4);
  EXPECT_EQ(info.stored_bytes, (124439808u + 12u * 1024 * 1024) * 4);
  EXPECT_EQ(info.dtype, "F32");
  ASSERT_TRUE(info.config);
  EXPECT_EQ((*info.config)["model_type"], "gpt2");
  EXPECT_EQ(info.max_tp_size, 12);
  EXPECT_FALSE(info.revision);
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("torch.bfloat16")).size_bytes,
            124439808u * 2);
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("nf4")).size_bytes, 124439808u / 2);
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("int8")).size_bytes, 124439808u);
}

TEST(Describe, SizeIsTheCeilingOfParamsTimesBytesPerElement) {
  TempDir dir;
  SafetensorsWriter w(dir / "model.safetensors");
  w.add("a", DType::F16, {3}, nullptr);
  w.add("b", DType::F32, {2}, nullptr);
  w.write();
  CheckpointInfo info = describe_checkpoint(dir.path());
  EXPECT_EQ(info.n_params, 5u);
  EXPECT_EQ(info.dtype, "mixed");
  EXPECT_EQ(info.size_bytes, 3u * 2 + 2u * 4);  // stored bytes when no dtype is given
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("nf4")).size_bytes, 3u);      // 2.5 -> 3
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("f6_e2m3")).size_bytes, 4u);  // 3.75 -> 4
  // No config.json: config and TP degree are unknown, not empty.
  EXPECT_FALSE(info.config);
  EXPECT_FALSE(info.max_tp_size);
  nlohmann::json j = to_json(info);
  EXPECT_TRUE(j["config"].is_null());
  EXPECT_TRUE(j["revision"].is_null());
  EXPECT_EQ(j["n_params"], 5);
}

TEST(Describe, MalformedConfigIsAFormatErrorNamingIt) {
  TempDir dir;
  SafetensorsWriter w(dir / "model.safetensors");
  w.add("a", DType::F16, {3}, nullptr);
  w.write();
  testing::write_file(dir / "config.json",
                      R"({"num_attention_heads": 4, "num_attention_heads": 8})");
  auto e = expect_error<FormatError>([&] { describe_checkpoint(dir.path()); });
  EXPECT_EQ(e.rule(), "duplicate-key");
  EXPECT_EQ(e.file(), dir / "config.json");
  testing::write_file(dir / "config.json", "{\"a\": ");
  EXPECT_EQ(expect_error<FormatError>([&] { describe_checkpoint(dir.path()); }).rule(),
            "invalid-json");
}

TEST(Describe, UnknownDTypeFailsBeforeAnyRead) {
  TempDir dir;
  write_sparse(dir.path(), "gpt2", DType::F32, false, 0);
  reset_io_bytes_read();
  expect_error<DTypeError>([&] { describe_checkpoint(dir.path(), std::string("fp5")); });
  EXPECT_EQ(io_bytes_read(), 0u);
}

// The issue's acceptance test: a 140 GB sparse sharded Llama-2-70B is described from < 1 MB of
// reads.
TEST(Describe, SparseLlama70BShardedReadsUnderOneMegabyte) {
  TempDir dir;
  write_sparse(dir.path(), "llama-2-70b", DType::BF16, false, 15);
  struct stat st;
  ASSERT_EQ(::stat((dir / "model-00001-of-00015.safetensors").c_str(), &st), 0);
  reset_io_bytes_read();
  CheckpointInfo info = describe_checkpoint(dir.path());
  const uint64_t read = io_bytes_read();
  EXPECT_LT(read, 1u << 20);
  EXPECT_GT(read, 15u * 8);  // it did read every header
  EXPECT_EQ(info.n_params, 68976648192ull);
  EXPECT_EQ(info.size_bytes, 68976648192ull * 2);
  EXPECT_GT(info.stored_bytes, 137000000000ull);  // ~138 GB apparent
  EXPECT_EQ(info.n_files, 15u);
  EXPECT_EQ(info.n_tensors, 723u);
  EXPECT_EQ(info.max_tp_size, 8);
  EXPECT_EQ(describe_checkpoint(dir.path(), std::string("nf4")).size_bytes, 68976648192ull / 2);
}

TEST(Describe, ModelKeysResolveThroughTheHubCache) {
  TempDir root;
  const std::string hash = "89abcdef0123456789abcdef0123456789abcdef";
  std::string repo = root / "models--openai-community--gpt2";
  testing::make_dir(repo);
  testing::make_dir(repo + "/refs");
  testing::make_dir(repo + "/snapshots");
  testing::make_dir(repo + "/snapshots/" + hash);
  testing::write_file(repo + "/refs/main", hash);
  write_sparse(repo + "/snapshots/" + hash, "gpt2", DType::F32, true, 0);
  ScopedEnv cache("HF_HUB_CACHE", root.path().c_str());

  // Minted as nnsight mints it: f"{cls.__module__}.{cls.__name__}:{json.dumps({...})}".
  const std::string nnsight_key =
      R"(nnsight.modeling.language.LanguageModel:{"repo_id": "openai-community/gpt2", "revision": null})";
  CheckpointInfo info = describe_checkpoint(nnsight_key);
  EXPECT_EQ(info.n_params, 124439808u);
  EXPECT_EQ(info.revision, hash);
  EXPECT_EQ(info.repo_id, "openai-community/gpt2");
  std::string pinned = to_model_key({kTransformersModel, "openai-community/gpt2", hash, {}});
  EXPECT_EQ(describe_checkpoint(pinned).revision, hash);
  EXPECT_EQ(
      describe_checkpoint("openai-community/gpt2", std::nullopt, std::string("main")).revision,
      hash);
  EXPECT_EQ(describe_checkpoint(nnsight_key, std::nullopt, hash).revision, hash);
  // A key pinning another revision: ModelKeyError, as everywhere a key meets a revision
  // (identity/reference.h join_revision).
  expect_error<ModelKeyError>(
      [&] { describe_checkpoint(pinned, std::nullopt, std::string("main")); });
  expect_error<ModelKeyError>([] { describe_checkpoint(R"(unknown.Class:{"repo_id": "x"})"); });
  expect_error<ResolveError>([] { describe_checkpoint("openai-community/missing"); });
}

// Sums over a checkpoint's files past 64 bits are errors naming the sum (they used to wrap, and
// the size for a dtype was cut to 64 bits). Sparse shards of 2^60 bytes each: only a file system
// that allows such files (tmpfs) can hold them; elsewhere the test skips.
TEST(Describe, SumsPast64BitsAreNamedErrors) {
  struct stat st;
  if (::stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) GTEST_SKIP() << "no /dev/shm";
  ScopedEnv tmp("TEST_TMPDIR", "/dev/shm");
  auto write = [](const std::string& dir, int n) {
    ShardOptions o;
    o.max_shard_bytes = uint64_t{1} << 60;  // one tensor per shard
    ShardedSafetensorsWriter w(dir, o);
    for (int i = 0; i < n; ++i)
      w.add("t" + std::to_string(i), DType::U8, {int64_t{1} << 60}, nullptr);
    w.write();
  };
  TempDir five;
  try {
    write(five.path(), 5);
  } catch (const FormatError& e) {
    GTEST_SKIP() << "this file system holds no 2^60-byte sparse files: " << e.what();
  }
  // 5 x 2^60 parameters fit; as float32 they are 20 x 2^60 bytes, past 2^64.
  const CheckpointInfo info = describe_checkpoint(five.path());
  EXPECT_EQ(info.n_params, 5 * (uint64_t{1} << 60));
  EXPECT_EQ(info.stored_bytes, 5 * (uint64_t{1} << 60));
  auto as_f32 = expect_error<SizeOverflowError>(
      [&] { describe_checkpoint(five.path(), std::string("float32")); });
  EXPECT_NE(as_f32.message().find("size in bytes of 5764607523034234880 parameters as \"float32\""),
            std::string::npos)
      << as_f32.message();
  EXPECT_EQ(describe_checkpoint(five.path(), std::string("nf4")).size_bytes,
            5 * (uint64_t{1} << 59));  // 4 bits each: fits
  // 17 x 2^60 stored bytes: past 2^64.
  TempDir seventeen;
  write(seventeen.path(), 17);
  auto stored = expect_error<SizeOverflowError>([&] { describe_checkpoint(seventeen.path()); });
  EXPECT_NE(stored.message().find("stored bytes of the checkpoint: "), std::string::npos)
      << stored.message();
}

TEST(Describe, BuffersAreRecognisedByNameAndShape) {
  auto t = [](std::string name, std::vector<int64_t> shape) {
    TensorInfo i;
    i.name = std::move(name);
    i.shape = std::move(shape);
    return i;
  };
  EXPECT_TRUE(is_non_parameter_buffer(t("h.0.attn.bias", {1, 1, 1024, 1024})));
  EXPECT_TRUE(is_non_parameter_buffer(t("gpt_neox.layers.0.attention.bias", {1, 1, 2048, 2048})));
  EXPECT_TRUE(is_non_parameter_buffer(t("h.0.attn.masked_bias", {})));
  EXPECT_TRUE(is_non_parameter_buffer(t("model.layers.0.self_attn.rotary_emb.inv_freq", {64})));
  EXPECT_FALSE(is_non_parameter_buffer(t("h.0.attn.c_attn.bias", {2304})));
  EXPECT_FALSE(is_non_parameter_buffer(t("h.0.attn.bias", {768})));
  EXPECT_FALSE(is_non_parameter_buffer(t("x.bias", {1, 1, 3, 4})));
}

// ---- mixtures of experts (issue 25) -----------------------------------------------------------

// A tiny Mixtral-shaped MoE: 2 layers of E experts (per-expert:
// block_sparse_moe.experts.<e>.w1/w2/w3; fused: mlp.experts.gate_up_proj [E, 2I, H] and down_proj
// [E, H, I]), a router, attention, norms and embeddings, as holes; `skip_expert` leaves one expert
// of layer 1 out.
struct TinyMoe {
  int64_t e = 4, k = 2, h = 16, i = 8, vocab = 32;
  bool fused = false;
  int64_t skip_expert = -1;
  uint64_t total = 0, routed = 0;

  void add(SafetensorsWriter& w, const std::string& name, std::vector<int64_t> shape,
           bool expert = false) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    total += n;
    if (expert) routed += n;
    w.add(name, DType::BF16, shape, nullptr);
  }

  void write(const std::string& dir, const nlohmann::json& config) {
    testing::write_file(dir + "/config.json", config.dump());
    SafetensorsWriter w(dir + "/model.safetensors");
    add(w, "model.embed_tokens.weight", {vocab, h});
    add(w, "lm_head.weight", {vocab, h});
    for (int layer = 0; layer < 2; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      add(w, p + "self_attn.q_proj.weight", {h, h});
      add(w, p + "input_layernorm.weight", {h});
      if (fused) {
        add(w, p + "mlp.gate.weight", {e, h});
        add(w, p + "mlp.experts.gate_up_proj", {e, 2 * i, h}, true);
        add(w, p + "mlp.experts.down_proj", {e, h, i}, true);
        continue;
      }
      add(w, p + "block_sparse_moe.gate.weight", {e, h});
      for (int64_t x = 0; x < e; ++x) {
        if (layer == 1 && x == skip_expert) continue;
        const std::string q = p + "block_sparse_moe.experts." + std::to_string(x) + ".";
        add(w, q + "w1.weight", {i, h}, true);
        add(w, q + "w3.weight", {i, h}, true);
        add(w, q + "w2.weight", {h, i}, true);
      }
    }
    w.write();
  }

  nlohmann::json config() const {
    return {{"model_type", "mixtral"},  {"hidden_size", h},         {"intermediate_size", i},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_local_experts", e},
            {"num_experts_per_tok", k}};
  }
};

TEST(DescribeMoe, BothLayoutsGiveExpertsTopKAndActiveParameters) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "per-expert");
    TempDir dir;
    TinyMoe m;
    m.fused = fused;
    m.write(dir.path(), m.config());
    const CheckpointInfo info = describe_checkpoint(dir.path());
    ASSERT_TRUE(info.moe);
    EXPECT_EQ(info.n_params, m.total);
    EXPECT_EQ(m.routed, 2u * 4 * 3 * 16 * 8);
    EXPECT_EQ(info.moe->n_experts, 4);
    EXPECT_EQ(info.moe->experts_per_token, 2);
    EXPECT_EQ(info.moe->n_moe_layers, 2);
    EXPECT_EQ(info.moe->layout, fused ? "fused" : "per-expert");
    EXPECT_EQ(info.moe->expert_params, m.routed);
    EXPECT_EQ(info.moe->expert_bytes, m.routed * 2);
    // Every MoE layer's routed experts count k / E; router, attention and embeddings fully.
    EXPECT_EQ(info.moe->active_params, m.total - m.routed + m.routed * 2 / 4);
    EXPECT_EQ(info.moe->max_ep_size, 4);
    EXPECT_EQ(info.moe->ep_degrees, (std::vector<int64_t>{1, 2, 4}));
    EXPECT_EQ(info.moe->n_shared_experts, 0);
    // gcd(4 heads, 2 kv heads, 8) = 2.
    EXPECT_EQ(info.max_tp_size, 2);
    const nlohmann::json j = to_json(info)["moe"];
    EXPECT_EQ(j["active_params"], *info.moe->active_params);
    EXPECT_EQ(j["layout"], info.moe->layout);
  }
}

TEST(DescribeMoe, DenseCheckpointsHaveNoMoeSection) {
  TempDir dir;
  write_sparse(dir.path(), "llama-3.2-1b", DType::BF16, false, 0);
  const CheckpointInfo info = describe_checkpoint(dir.path());
  EXPECT_FALSE(info.moe);
  EXPECT_TRUE(to_json(info)["moe"].is_null());
}

// Headers and config disagreeing is an error naming both counts: the active parameters depend on
// E, so either count would make them wrong, and such a checkpoint does not load.
TEST(DescribeMoe, HeadersDisagreeingWithTheConfigAreFormatErrors) {
  {
    TempDir dir;
    TinyMoe m;
    nlohmann::json c = m.config();
    c["num_local_experts"] = 5;
    m.write(dir.path(), c);
    auto e = expect_error<FormatError>([&] { describe_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "moe-expert-count");
    EXPECT_NE(e.detail().find("num_local_experts is 5 routed experts"), std::string::npos)
        << e.what();
    EXPECT_NE(e.detail().find("hold 4"), std::string::npos) << e.what();
  }
  {
    TempDir dir;
    TinyMoe m;
    m.skip_expert = 2;  // layer 1 lacks expert 2
    m.write(dir.path(), m.config());
    auto e = expect_error<FormatError>([&] { describe_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "moe-expert-count");
    EXPECT_EQ(e.tensor(), "model.layers.1.block_sparse_moe.experts");
    EXPECT_NE(e.detail().find("no expert 2"), std::string::npos) << e.what();
  }
  {
    TempDir dir;
    TinyMoe m;
    m.skip_expert = 3;  // layer 1 holds 3 experts, layer 0 four; no config count to follow
    nlohmann::json c = m.config();
    c.erase("num_local_experts");
    m.write(dir.path(), c);
    auto e = expect_error<FormatError>([&] { describe_checkpoint(dir.path()); });
    EXPECT_NE(e.detail().find("hold 3 experts"), std::string::npos) << e.what();
  }
  {
    TempDir dir;
    TinyMoe m;
    nlohmann::json c = m.config();
    c["num_experts_per_tok"] = 6;
    m.write(dir.path(), c);
    EXPECT_EQ(expect_error<FormatError>([&] { describe_checkpoint(dir.path()); }).rule(),
              "moe-experts-per-token");
  }
}

// Shared experts and the router count fully, Switch-style "experts.expert_<e>" names and Granite's
// fused input_linear / output_linear are routed experts.
TEST(DescribeMoe, SharedExpertsSwitchAndGraniteNames) {
  TempDir dir;
  testing::write_file(
      dir / "config.json",
      R"({"n_routed_experts": 2, "n_shared_experts": 1, "num_experts_per_tok": 1})");
  SafetensorsWriter w(dir / "model.safetensors");
  w.add("model.layers.0.mlp.shared_experts.gate_proj.weight", DType::F32, {4, 2}, nullptr);
  w.add("model.layers.0.mlp.gate.weight", DType::F32, {2, 2}, nullptr);
  w.add("model.layers.0.mlp.experts.0.gate_proj.weight", DType::F32, {3, 2}, nullptr);
  w.add("model.layers.0.mlp.experts.1.gate_proj.weight", DType::F32, {3, 2}, nullptr);
  w.add("encoder.block.1.mlp.experts.expert_0.wi.weight", DType::F32, {5}, nullptr);
  w.add("encoder.block.1.mlp.experts.expert_1.wi.weight", DType::F32, {5}, nullptr);
  w.add("model.layers.2.block_sparse_moe.input_linear.weight", DType::F32, {2, 4, 2}, nullptr);
  w.add("model.layers.2.block_sparse_moe.output_linear.weight", DType::F32, {2, 2, 2}, nullptr);
  w.write();
  const CheckpointInfo info = describe_checkpoint(dir.path());
  ASSERT_TRUE(info.moe);
  EXPECT_EQ(info.n_params, 8u + 4 + 12 + 10 + 24);
  EXPECT_EQ(info.moe->n_moe_layers, 3);
  EXPECT_EQ(info.moe->layout, "mixed");
  EXPECT_EQ(info.moe->n_shared_experts, 1);
  EXPECT_EQ(info.moe->shared_expert_params, 8u);
  EXPECT_EQ(info.moe->expert_params, 12u + 10 + 24);
  EXPECT_EQ(info.moe->active_params, 8u + 4 + 6 + 5 + 12);
}

}  // namespace
}  // namespace metaload
