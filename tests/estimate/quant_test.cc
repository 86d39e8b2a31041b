// Quantized checkpoints (quant/): layouts recognised from headers, describe's exact sizes and
// logical parameter counts, TP limits on group boundaries, estimate, and the typed errors for
// contradicting tensors. Torch-free: the files are written here, in the libraries' layouts.
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "estimate/estimate.h"
#include "identity/checkpoint_shapes.h"
#include "identity/describe.h"
#include "loader/format/quant_layout.h"
#include "loader/format/writer.h"
#include "loader/tp/quant_split.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::TempDir;

// A tiny Llama config (2 layers) with `qc` as its quantization_config (none when null).
nlohmann::json tiny_config(const nlohmann::json& qc) {
  nlohmann::json c = {
      {"model_type", "llama"},  {"hidden_size", 256},       {"intermediate_size", 512},
      {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 8},
      {"vocab_size", 1000},     {"torch_dtype", "float16"}, {"tie_word_embeddings", false}};
  if (!qc.is_null()) c["quantization_config"] = qc;
  return c;
}

// A checkpoint being written: tensors with zero data unless bytes are given.
class Ck {
 public:
  void add(const std::string& name, DType dt, std::vector<int64_t> shape, std::string bytes = "") {
    tensors_.push_back({name, dt, std::move(shape), std::move(bytes)});
  }
  void drop(const std::string& name) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name == name) tensors_.erase(tensors_.begin() + i);
    }
  }
  void set(const std::string& name, std::vector<int64_t> shape) {
    for (auto& t : tensors_) {
      if (t.name == name) t.shape = std::move(shape);
    }
  }
  void set_dtype(const std::string& name, DType dt) {
    for (auto& t : tensors_) {
      if (t.name == name) t.dtype = dt;
    }
  }
  void set_bytes(const std::string& name, std::string bytes) {
    for (auto& t : tensors_) {
      if (t.name == name) {
        t.bytes = std::move(bytes);
        t.shape = {static_cast<int64_t>(t.bytes.size())};
      }
    }
  }
  // Writes model.safetensors and config.json into dir; returns the sum of tensor bytes.
  uint64_t write(const std::string& dir, const nlohmann::json& config) const {
    testing::write_file(dir + "/config.json", config.dump());
    SafetensorsWriter w(dir + "/model.safetensors");
    uint64_t total = 0;
    for (const auto& t : tensors_) {
      if (t.bytes.empty()) {
        w.add(t.name, t.dtype, t.shape, nullptr);
      } else {
        w.add_bytes(t.name, t.dtype, t.shape, t.bytes.data());
      }
      total += tensor_nbytes(t.dtype, t.shape, "", t.name);
    }
    w.write();
    return total;
  }

 private:
  struct T {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<T> tensors_;
};

const char* kProj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                       "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                       "mlp.down_proj"};

// [out, in] of each projection of tiny_config.
std::pair<int64_t, int64_t> proj_shape(const std::string& p) {
  if (p == "mlp.gate_proj" || p == "mlp.up_proj") return {512, 256};
  if (p == "mlp.down_proj") return {256, 512};
  return {256, 256};
}

// Embeddings, norms and the head in F16, as every scheme leaves them; returns their elements.
uint64_t add_unquantized(Ck& ck) {
  ck.add("model.embed_tokens.weight", DType::F16, {1000, 256});
  ck.add("lm_head.weight", DType::F16, {1000, 256});
  ck.add("model.norm.weight", DType::F16, {256});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.add(p + "input_layernorm.weight", DType::F16, {256});
    ck.add(p + "post_attention_layernorm.weight", DType::F16, {256});
  }
  return 2 * 1000 * 256 + 256 + 4 * 256;
}

// Every projection of every layer through `layer(ck, module, out, in)`; returns the logical
// elements.
template <typename F>
uint64_t add_projections(Ck& ck, F layer) {
  uint64_t n = 0;
  for (int l = 0; l < 2; ++l) {
    for (const char* p : kProj) {
      auto [out, in] = proj_shape(p);
      layer(ck, "model.layers." + std::to_string(l) + "." + p, out, in);
      n += static_cast<uint64_t>(out * in);
    }
  }
  return n;
}

void gptq_layer(Ck& ck, const std::string& m, int64_t out, int64_t in) {
  ck.add(m + ".qweight", DType::I32, {in / 8, out});
  ck.add(m + ".qzeros", DType::I32, {in / 128, out / 8});
  ck.add(m + ".scales", DType::F16, {in / 128, out});
  ck.add(m + ".g_idx", DType::I32, {in});
}

void awq_layer(Ck& ck, const std::string& m, int64_t out, int64_t in) {
  ck.add(m + ".qweight", DType::I32, {in, out / 8});
  ck.add(m + ".qzeros", DType::I32, {in / 128, out / 8});
  ck.add(m + ".scales", DType::F16, {in / 128, out});
}

std::string blob(int64_t out, int64_t in, const std::string& type = "nf4") {
  return R"({"quant_type": ")" + type + R"(", "blocksize": 64, "dtype": "float16", "shape": [)" +
         std::to_string(out) + ", " + std::to_string(in) + "]}";
}

void nf4_layer(Ck& ck, const std::string& m, int64_t out, int64_t in) {
  ck.add(m + ".weight", DType::U8, {out * in / 2, 1});
  ck.add(m + ".weight.absmax", DType::F32, {out * in / 64});
  ck.add(m + ".weight.quant_map", DType::F32, {16});
  const std::string b = blob(out, in);
  ck.add(m + ".weight.quant_state.bitsandbytes__nf4", DType::U8, {static_cast<int64_t>(b.size())},
         b);
}

std::string i64_bytes(int64_t a, int64_t b) {
  std::string s(16, '\0');
  std::memcpy(s.data(), &a, 8);
  std::memcpy(s.data() + 8, &b, 8);
  return s;
}

void ct_layer(Ck& ck, const std::string& m, int64_t out, int64_t in) {
  ck.add(m + ".weight_packed", DType::I32, {out, in / 8});
  ck.add(m + ".weight_scale", DType::F16, {out, in / 128});
  ck.add(m + ".weight_shape", DType::I64, {2}, i64_bytes(out, in));
}

const nlohmann::json kGptq = {
    {"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", false}, {"sym", true}};
const nlohmann::json kAwq = {{"quant_method", "awq"},
                             {"bits", 4},
                             {"group_size", 128},
                             {"version", "gemm"},
                             {"zero_point", true}};
const nlohmann::json kNf4 = {
    {"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}};
const nlohmann::json kCt = nlohmann::json::parse(R"({"quant_method": "compressed-tensors",
    "format": "pack-quantized", "ignore": ["lm_head"], "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
    "group_size": 128, "symmetric": true}}}})");

TEST(QuantDescribe, GptqSizesAreTheStoredBytesAndParamsAreLogical) {
  TempDir d;
  Ck ck;
  const uint64_t plain = add_unquantized(ck);
  const uint64_t logical = add_projections(ck, gptq_layer);
  const uint64_t bytes = ck.write(d.path(), tiny_config(kGptq));
  CheckpointInfo info = describe_checkpoint(d.path());
  EXPECT_EQ(*info.size_bytes, bytes);
  EXPECT_EQ(*info.n_params, plain + logical);
  EXPECT_EQ(info.dtype, "gptq");
  ASSERT_TRUE(info.quantization);
  const auto& q = *info.quantization;
  EXPECT_EQ(q["scheme"], "gptq");
  EXPECT_EQ(q["n_modules"], 14);
  EXPECT_EQ(q["n_quantized_params"], logical);
  EXPECT_EQ(q["weight_bytes"].get<uint64_t>() + q["aux_bytes"].get<uint64_t>() +
                q["unquantized_bytes"].get<uint64_t>(),
            bytes);
  const auto& down = q["modules"][0];  // sorted: model.layers.0.mlp.down_proj
  EXPECT_EQ(down["module"], "model.layers.0.mlp.down_proj");
  EXPECT_EQ(down["shape"], nlohmann::json({256, 512}));
  EXPECT_EQ(down["weight_bytes"], 512 / 8 * 256 * 4);
  EXPECT_EQ(down["aux_bytes"], 4 * 32 * 4 + 4 * 256 * 2 + 512 * 4);
  // Unquantized, heads/kv/intermediate allow 8; down_proj's 512 inputs in groups of 128 allow 4,
  // o_proj's 256 only 2.
  EXPECT_EQ(q["max_tp_size_unquantized"], 8);
  EXPECT_EQ(info.max_tp_size, 2);
  EXPECT_NE(q["tp_limited_by"].get<std::string>().find("groups of 128"), std::string::npos);
  EXPECT_NE(q["tp_limited_by"].get<std::string>().find("down_proj"), std::string::npos);
}

TEST(QuantDescribe, UnquantizedCheckpointsHaveNoQuantization) {
  TempDir d;
  Ck ck;
  const uint64_t n = add_unquantized(ck);
  ck.write(d.path(), tiny_config(nullptr));
  CheckpointInfo info = describe_checkpoint(d.path());
  EXPECT_EQ(*info.n_params, n);
  EXPECT_EQ(*info.size_bytes, 2 * n);
  EXPECT_FALSE(info.quantization);
  EXPECT_TRUE(to_json(info)["quantization"].is_null());
  EXPECT_EQ(info.max_tp_size, 8);
}

TEST(QuantDescribe, AwqBnbAndCompressedTensorsLayouts) {
  struct Case {
    nlohmann::json qc;
    void (*layer)(Ck&, const std::string&, int64_t, int64_t);
    const char* scheme;
  } cases[] = {{kAwq, awq_layer, "awq"},
               {kNf4, nf4_layer, "bnb-4bit"},
               {kCt, ct_layer, "ct-pack-quantized"}};
  for (const auto& c : cases) {
    TempDir d;
    Ck ck;
    const uint64_t plain = add_unquantized(ck);
    const uint64_t logical = add_projections(ck, c.layer);
    const uint64_t bytes = ck.write(d.path(), tiny_config(c.qc));
    CheckpointInfo info = describe_checkpoint(d.path());
    EXPECT_EQ(*info.size_bytes, bytes) << c.scheme;
    EXPECT_EQ(*info.n_params, plain + logical) << c.scheme;
    EXPECT_EQ((*info.quantization)["scheme"], c.scheme);
    EXPECT_EQ((*info.quantization)["n_modules"], 14) << c.scheme;
  }
}

// Writes a GPTQ checkpoint with `edit` applied, describes it, and returns the error.
template <typename E = QuantLayoutError, typename F>
E broken(const nlohmann::json& qc, void (*layer)(Ck&, const std::string&, int64_t, int64_t),
         F edit) {
  TempDir d;
  Ck ck;
  add_unquantized(ck);
  add_projections(ck, layer);
  edit(ck);
  ck.write(d.path(), tiny_config(qc));
  return expect_error<E>([&] { describe_checkpoint(d.path()); });
}

const std::string kQ = "model.layers.0.self_attn.q_proj";

TEST(QuantErrors, NameTheFileTheTensorAndTheRule) {
  // GPTQ-packed tensors under an AWQ config: qweight's columns do not unpack to scales' outputs.
  auto e = broken(kAwq, gptq_layer, [](Ck&) {});
  EXPECT_EQ(e.rule(), "foreign-tensor");  // g_idx is GPTQ's
  e = broken(kAwq, gptq_layer, [](Ck& ck) {
    for (int l = 0; l < 2; ++l) {
      for (const char* p : kProj) ck.drop("model.layers." + std::to_string(l) + "." + p + ".g_idx");
    }
  });
  EXPECT_EQ(e.rule(), "packed-shape");
  EXPECT_NE(e.tensor().find(".qweight"), std::string::npos);
  EXPECT_NE(e.file().find("model.safetensors"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find("AWQ GEMM packs qweight along the output dim"),
            std::string::npos);
  // Scales of the wrong shape.
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.set(kQ + ".scales", {3, 256}); });
  EXPECT_EQ(e.rule(), "scale-shape");
  EXPECT_EQ(e.tensor(), kQ + ".scales");
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.set(kQ + ".qzeros", {2, 64}); });
  EXPECT_EQ(e.rule(), "zeros-shape");
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.set(kQ + ".g_idx", {255}); });
  EXPECT_EQ(e.rule(), "g-idx-shape");
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.drop(kQ + ".scales"); });
  EXPECT_EQ(e.rule(), "missing-tensor");
  EXPECT_NE(std::string(e.what()).find(kQ + ".scales"), std::string::npos);
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.set_dtype(kQ + ".qweight", DType::I64); });
  EXPECT_EQ(e.rule(), "wrong-dtype");
  // A compressed-tensors tensor in a GPTQ checkpoint.
  e = broken(kGptq, gptq_layer, [](Ck& ck) { ck.add(kQ + ".weight_packed", DType::I32, {8, 8}); });
  EXPECT_EQ(e.rule(), "foreign-tensor");
  EXPECT_EQ(e.tensor(), kQ + ".weight_packed");
  // A config that says GPTQ over plain weights.
  TempDir d;
  Ck ck;
  add_unquantized(ck);
  ck.write(d.path(), tiny_config(kGptq));
  e = expect_error<QuantLayoutError>([&] { describe_checkpoint(d.path()); });
  EXPECT_EQ(e.rule(), "no-quantized-tensors");
  EXPECT_EQ(e.file(), d.path() + "/config.json");
}

TEST(QuantErrors, BitsandbytesBlobsAndPackedShapes) {
  const std::string b = kQ + ".weight.quant_state.bitsandbytes__nf4";
  auto e = broken(kNf4, nf4_layer, [&](Ck& ck) { ck.set_bytes(b, "{not json"); });
  EXPECT_EQ(e.rule(), "quant-state-blob");
  EXPECT_EQ(e.tensor(), b);
  e = broken(kNf4, nf4_layer, [&](Ck& ck) { ck.set_bytes(b, R"({"quant_type": "nf4"})"); });
  EXPECT_EQ(e.rule(), "quant-state-blob");
  EXPECT_NE(std::string(e.what()).find("blocksize"), std::string::npos);
  e = broken(kNf4, nf4_layer, [&](Ck& ck) {
    ck.set_bytes(b, R"({"quant_type": "fp4", "blocksize": 64, "dtype": "float16", "shape": [1]})");
  });
  EXPECT_EQ(e.rule(), "quant-state-blob");  // its name says nf4
  // A nested offset no float32 holds would dequantize every weight to inf.
  e = broken(kNf4, nf4_layer, [&](Ck& ck) {
    ck.set_bytes(b, R"({"quant_type": "nf4", "blocksize": 64, "dtype": "float16", "shape": [256, )"
                    R"(256], "nested_blocksize": 256, "nested_offset": 1e300})");
  });
  EXPECT_EQ(e.rule(), "quant-state-blob");
  EXPECT_NE(std::string(e.what()).find("outside float32's range"), std::string::npos) << e.what();
  // The packed weight holds one byte per two values of the blob's logical shape.
  e = broken(kNf4, nf4_layer, [&](Ck& ck) { ck.set(kQ + ".weight", {256 * 256 / 2 - 1, 1}); });
  EXPECT_EQ(e.rule(), "packed-shape");
  EXPECT_EQ(e.tensor(), kQ + ".weight");
  e = broken(kNf4, nf4_layer, [&](Ck& ck) { ck.set(kQ + ".weight.absmax", {100}); });
  EXPECT_EQ(e.rule(), "absmax-shape");
  e = broken(kNf4, nf4_layer, [&](Ck& ck) { ck.set(kQ + ".weight.quant_map", {15}); });
  EXPECT_EQ(e.rule(), "quant-map-shape");
  // config.json says fp4, the blobs say nf4.
  nlohmann::json fp4 = kNf4;
  fp4["bnb_4bit_quant_type"] = "fp4";
  e = broken(fp4, nf4_layer, [](Ck&) {});
  EXPECT_EQ(e.rule(), "quant-state-mismatch");
  nlohmann::json dq = kNf4;
  dq["bnb_4bit_use_double_quant"] = true;
  e = broken(dq, nf4_layer, [](Ck&) {});
  EXPECT_EQ(e.rule(), "quant-state-mismatch");
}

TEST(QuantErrors, CompressedTensorsShapes) {
  auto e = broken(kCt, ct_layer, [](Ck& ck) {
    ck.set_bytes(kQ + ".weight_shape", i64_bytes(256, 512));
    ck.set(kQ + ".weight_shape", {2});
  });
  EXPECT_EQ(e.rule(), "packed-shape");
  EXPECT_EQ(e.tensor(), kQ + ".weight_packed");
  e = broken(kCt, ct_layer, [](Ck& ck) { ck.set(kQ + ".weight_scale", {256, 1}); });
  EXPECT_EQ(e.rule(), "scale-shape");
}

TEST(QuantErrors, UnknownSchemes) {
  TempDir d;
  Ck ck;
  add_unquantized(ck);
  ck.write(d.path(), tiny_config({{"quant_method", "hqq"}}));
  auto e = expect_error<QuantSchemeError>([&] { describe_checkpoint(d.path()); });
  EXPECT_EQ(e.rule(), "unknown-scheme");
  EXPECT_EQ(e.file(), d.path() + "/config.json");
  EXPECT_NE(std::string(e.what()).find("\"hqq\""), std::string::npos);
  auto v = expect_error<QuantSchemeError>([] {
    parse_quant_config({{"quant_method", "awq"}, {"version", "gemv"}}, "c.json");
  });
  EXPECT_EQ(v.rule(), "unsupported-scheme");
  auto f = expect_error<QuantSchemeError>([] {
    parse_quant_config({{"quant_method", "gptq"}, {"bits", "4"}}, "c.json");
  });
  EXPECT_EQ(f.rule(), "invalid-field");
  auto p = expect_error<QuantSchemeError>([] { resolve_quant_scheme("gptq-int5", nullptr); });
  EXPECT_EQ(p.rule(), "unknown-scheme");
  EXPECT_NE(std::string(p.what()).find("gptq-int4"), std::string::npos);  // lists the presets
}

// Without a quantization_config (a dequantizing load's case) the scheme is read off the tensors,
// and the same parser checks every module against it.
TEST(QuantInfer, SchemeFromTheTensorsAlone) {
  struct Case {
    void (*layer)(Ck&, const std::string&, int64_t, int64_t);
    QuantKind kind;
    size_t parts;                                  // of model.layers.0.mlp.down_proj
  } cases[] = {{gptq_layer, QuantKind::kGptq, 4},  // q, scales, zeros, g_idx
               {awq_layer, QuantKind::kAwq, 3},
               {nf4_layer, QuantKind::kBnb4, 4}};  // q, scales (absmax), code, state
  for (const auto& c : cases) {
    TempDir d;
    Ck ck;
    add_unquantized(ck);
    add_projections(ck, c.layer);
    ck.write(d.path(), tiny_config(nullptr));
    const Checkpoint ckpt = open_checkpoint(d.path());
    std::optional<QuantConfig> cfg = infer_quant_config(ckpt);
    ASSERT_TRUE(cfg);
    EXPECT_TRUE(cfg->inferred);
    EXPECT_EQ(cfg->kind, c.kind);
    EXPECT_EQ(cfg->method, "");
    if (c.kind != QuantKind::kBnb4) {
      EXPECT_EQ(cfg->bits, 4);
      EXPECT_EQ(cfg->group_size, 128);
    } else {
      EXPECT_EQ(cfg->quant_type, "nf4");
      EXPECT_FALSE(cfg->double_quant);
    }
    const QuantLayout l = recognise_quantized(ckpt, *cfg, d.path());
    ASSERT_EQ(l.modules.size(), 14u);
    const QuantModule& down = l.modules[0];
    EXPECT_EQ(down.name, "model.layers.0.mlp.down_proj");
    EXPECT_EQ(down.parts.size(), c.parts);
    EXPECT_EQ(down.parts.at("q"), down.weight_tensor);
    if (c.kind == QuantKind::kBnb4) EXPECT_EQ(down.block, 64);
  }
  TempDir d;
  Ck ck;
  add_unquantized(ck);
  ck.write(d.path(), tiny_config(nullptr));
  EXPECT_FALSE(infer_quant_config(open_checkpoint(d.path())));
}

TEST(QuantTp, SliceUnitsFallOnPacksGroupsAndBlocks) {
  QuantModule m;
  m.name = "model.layers.0.mlp.down_proj";
  m.out = 256;
  m.in = 512;
  std::string b;
  const QuantConfig gptq = parse_quant_config(kGptq, "c.json");
  EXPECT_EQ(tp_unit(gptq, m, 1, &b), 128);
  EXPECT_NE(b.find("groups of 128"), std::string::npos);
  EXPECT_EQ(tp_unit(gptq, m, 0, &b), 8);  // zero points: 8 per int32
  EXPECT_TRUE(tp_sliceable(gptq, m, 4, nullptr));
  EXPECT_FALSE(tp_sliceable(gptq, m, 8, &b));  // 64 inputs: half a group
  EXPECT_NE(b.find("groups of 128"), std::string::npos);
  const QuantConfig nf4 = parse_quant_config(kNf4, "c.json");
  m.in = 100;  // rows of 100 elements do not start on 64-element blocks
  EXPECT_EQ(tp_unit(nf4, m, 1, &b), 0);
  EXPECT_EQ(tp_unit(nf4, m, 0, &b), 16);  // 16 rows of 100 = 25 blocks
}

// DeepSeek-V3's FP8 blocks: MLA's kv_a_proj_with_mqa (576 rows, 4.5 blocks) and q_a_proj stay
// whole on every rank (vLLM and SGLang replicate them), so they never limit the degree; q_b_proj,
// split by its output rows, still does.
TEST(QuantTp, MlaLowRankProjectionsAreReplicated) {
  const QuantConfig fp8 = parse_quant_config(
      {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}, "c.json");
  QuantModule m;
  m.out = 576;
  m.in = 7168;
  std::string b;
  for (const char* leaf : {"kv_a_proj_with_mqa", "q_a_proj"}) {
    m.name = std::string("model.layers.0.self_attn.") + leaf;
    EXPECT_TRUE(is_replicated_in_tp(m.name));
    EXPECT_TRUE(tp_sliceable(fp8, m, 16, &b)) << leaf;
  }
  m.name = "model.layers.0.self_attn.q_b_proj";
  EXPECT_FALSE(is_replicated_in_tp(m.name));
  EXPECT_FALSE(tp_sliceable(fp8, m, 16, &b));
  EXPECT_NE(b.find("q_b_proj"), std::string::npos) << b;
}

// One family: a load's DequantError and a scheme's QuantSchemeError are QuantLayoutErrors.
TEST(QuantErrors, OneFamily) {
  try {
    throw DequantError(QuantLayoutError("m.safetensors", "w", "scale-shape", "too small"));
  } catch (const QuantLayoutError& e) {
    EXPECT_EQ(e.rule(), "scale-shape");
    EXPECT_EQ(e.tensor(), "w");
    EXPECT_NE(dynamic_cast<const DequantError*>(&e), nullptr);
    EXPECT_NE(std::string(e.what()).find("DequantError"), std::string::npos);
  }
  try {
    parse_quant_config({{"quant_method", "hqq"}}, "c.json");
    FAIL();
  } catch (const QuantLayoutError& e) {
    EXPECT_NE(dynamic_cast<const QuantSchemeError*>(&e), nullptr);
  }
}

// The estimate of a scheme over an unquantized checkpoint equals describe's stored bytes of the
// checkpoint written in that scheme's layout (by this test's own writers above).
TEST(QuantEstimate, MatchesTheLayoutWrittenByHand) {
  TempDir src;
  Ck plain;
  add_unquantized(plain);
  add_projections(plain, [](Ck& ck, const std::string& m, int64_t out, int64_t in) {
    ck.add(m + ".weight", DType::F16, {out, in});
  });
  plain.write(src.path(), tiny_config(nullptr));
  struct Case {
    const char* preset;
    nlohmann::json qc;
    void (*layer)(Ck&, const std::string&, int64_t, int64_t);
  } cases[] = {
      {"gptq-int4", kGptq, gptq_layer}, {"awq-int4", kAwq, awq_layer}, {"ct-w4a16", kCt, ct_layer}};
  for (const auto& c : cases) {
    TempDir q;
    Ck ck;
    add_unquantized(ck);
    add_projections(ck, c.layer);
    const uint64_t bytes = ck.write(q.path(), tiny_config(c.qc));
    QuantEstimate e = estimate_quantized(src.path(), c.preset);
    EXPECT_EQ(e.size_bytes, bytes) << c.preset;
    EXPECT_EQ(e.size_bytes, *describe_checkpoint(q.path()).size_bytes) << c.preset;
    EXPECT_EQ(e.n_params, *describe_checkpoint(src.path()).n_params) << c.preset;
    EXPECT_EQ(e.layout.modules.size(), 14u) << c.preset;
    EXPECT_EQ(e.source, "checkpoint");
    EXPECT_EQ(e.table_bytes, e.n_params / 2) << c.preset;  // the old table: 0.5 bytes each
  }
}

TEST(QuantEstimate, FromAConfigAloneWithTheLibraryDefaults) {
  TempDir d;
  const std::string cfg = testing::source_dir() + "/model/families/configs/llama-2-7b.json";
  const nlohmann::json config = nlohmann::json::parse(testing::read_file(cfg));
  QuantEstimate e = estimate_quantized(cfg, "gptq-int4");
  EXPECT_EQ(e.source, "config");
  EXPECT_EQ(e.n_params, 6738415616u);
  // Per layer: 4 attention [4096, 4096] and 3 MLP [11008, 4096] / [4096, 11008] projections.
  auto gptq = [](uint64_t out, uint64_t in) {
    const uint64_t g = (in + 127) / 128;
    return in / 8 * out * 4 + g * out / 8 * 4 + g * out * 2 + in * 4;
  };
  const uint64_t layer = 4 * gptq(4096, 4096) + 2 * gptq(11008, 4096) + gptq(4096, 11008);
  const uint64_t rest = 2 * (32000ull * 4096 * 2) + 2 * 4096 * 32 * 2 + 4096 * 2;
  EXPECT_EQ(e.size_bytes, 32 * layer + rest);
  // 11008 inputs of down_proj are 86 groups of 128: only degrees dividing 86 (and 32) remain.
  EXPECT_EQ(e.max_tp_size_unquantized, 32);
  EXPECT_EQ(e.max_tp_size, 2);
  // bitsandbytes quantizes every linear layer but lm_head; NF4 in blocks of 64.
  QuantEstimate nf4 = estimate_quantized(cfg, "bnb-nf4");
  EXPECT_EQ(nf4.layout.modules.size(), 32u * 7);
  EXPECT_GT(nf4.size_bytes, nf4.table_bytes);  // the old table under-counts
  auto e2 = expect_error<QuantSchemeError>([&] { estimate_quantized(cfg, "nf5"); });
  EXPECT_EQ(e2.rule(), "unknown-scheme");
}

}  // namespace
}  // namespace metaload
