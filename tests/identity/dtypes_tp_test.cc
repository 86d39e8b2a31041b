// bytes_per_element / the QUANTIZATIONS table, and the TP degree rules.
#include <gtest/gtest.h>

#include "identity/dtypes.h"
#include "identity/errors.h"
#include "identity/tp_degree.h"
#include "loader/format/checkpoint.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;

nlohmann::json real_config(const std::string& name) {
  return read_config_json(testing::source_dir() + "/model/families/configs/" + name + ".json");
}

TEST(DTypes, QuantizationTableIsNnsights) {
  std::vector<std::pair<std::string, double>> q;
  for (const auto& e : QUANTIZATIONS) q.emplace_back(std::string(e.name), e.bytes_per_element);
  EXPECT_EQ(q, (std::vector<std::pair<std::string, double>>{{"nf4", 0.5},
                                                            {"int4", 0.5},
                                                            {"4bit", 0.5},
                                                            {"fp4", 0.5},
                                                            {"int8", 1.0},
                                                            {"8bit", 1.0},
                                                            {"fp8", 1.0}}));
  // The table is the start of the one dtype table.
  for (size_t i = 0; i < QUANTIZATIONS.size(); ++i) {
    EXPECT_EQ(dtype_table()[i].name, QUANTIZATIONS[i].name);
    EXPECT_EQ(dtype_table()[i].kind, DTypeKind::kQuantization);
  }
}

TEST(DTypes, BytesPerElementOfNames) {
  EXPECT_EQ(bytes_per_element("nf4"), 0.5);
  EXPECT_EQ(bytes_per_element("NF4"), 0.5);
  EXPECT_EQ(bytes_per_element("4bit"), 0.5);
  EXPECT_EQ(bytes_per_element("int8"), 1.0);
  EXPECT_EQ(bytes_per_element("torch.int8"), 1.0);
  EXPECT_EQ(bytes_per_element("torch.bfloat16"), 2.0);
  EXPECT_EQ(bytes_per_element("TORCH.Float32"), 4.0);
  EXPECT_EQ(bytes_per_element("float"), 4.0);
  EXPECT_EQ(bytes_per_element("half"), 2.0);
  EXPECT_EQ(bytes_per_element("double"), 8.0);
  EXPECT_EQ(bytes_per_element("torch.complex128"), 16.0);
  EXPECT_EQ(bytes_per_element("torch.float8_e4m3fn"), 1.0);
  EXPECT_EQ(bytes_per_element("bool"), 1.0);
  EXPECT_EQ(bytes_per_element("int64"), 8.0);
  // The file format's names, any case.
  EXPECT_EQ(bytes_per_element("BF16"), 2.0);
  EXPECT_EQ(bytes_per_element("f8_e4m3"), 1.0);
  EXPECT_EQ(bytes_per_element("F4"), 0.5);
  EXPECT_EQ(bytes_per_element("F6_E2M3"), 0.75);
  EXPECT_EQ(resolve_dtype_name("bf16").torch_name, "bfloat16");
  EXPECT_EQ(resolve_dtype_name("torch.half").torch_name, "float16");
  EXPECT_EQ(resolve_dtype_name("f8_e4m3").torch_name, "float8_e4m3fn");
  EXPECT_EQ(resolve_dtype_name("float").file_dtype, DType::F32);
}

TEST(DTypes, SubByteAndUnknownNamesAreRefusedWithTheAcceptedList) {
  for (const char* n : {"torch.uint4", "int3", "uint1", "torch.int7", "torch.float4_e2m1fn_x2"}) {
    auto e = expect_error<DTypeError>([&] { bytes_per_element(n); });
    const std::string m = e.what();
    EXPECT_NE(m.find("sub-byte"), std::string::npos) << n;
    for (const char* a : {"accepted", "nf4", "bfloat16", "float8_e4m3fn"})
      EXPECT_NE(m.find(a), std::string::npos) << n << ": " << a;
  }
  auto e = expect_error<DTypeError>([] { bytes_per_element("float13"); });
  std::string m = e.what();
  EXPECT_NE(m.find("[metaload.DTypeError] unknown dtype or quantization \"float13\""),
            std::string::npos)
      << m;
  for (const char* n : {"nf4", "fp8", "bfloat16", "float8_e5m2", "bf16"})
    EXPECT_NE(m.find(n), std::string::npos) << n;
  expect_error<DTypeError>([] { bytes_per_element(""); });
  expect_error<DTypeError>([] { bytes_per_element("torch."); });
}

nlohmann::json cfg(int heads, int kv, int inter) {
  return {
      {"num_attention_heads", heads}, {"num_key_value_heads", kv}, {"intermediate_size", inter}};
}

TEST(TP, TheIssueCases) {
  EXPECT_EQ(max_tp_size(cfg(24, 8, 8192)), 8);
  EXPECT_EQ(max_tp_size(cfg(14, 2, 4864)), 2);
  EXPECT_EQ(max_tp_size(cfg(3, 1, 11)), std::nullopt);
  EXPECT_EQ(max_tp_size(cfg(64, 8, 28672)), 8);
}

TEST(TP, RealConfigs) {
  EXPECT_EQ(max_tp_size(real_config("llama-2-70b")), 8);
  EXPECT_EQ(max_tp_size(real_config("llama-2-7b")), 32);  // 32 / 32 / 11008 = 32 x 344
  EXPECT_EQ(max_tp_size(real_config("llama-3.2-1b")), 8);
  EXPECT_EQ(max_tp_size(real_config("qwen2.5-0.5b")), 2);
  EXPECT_EQ(max_tp_size(real_config("mistral-7b-v0.1")), 8);
  // GPT-2 names its head count n_head and leaves n_inner null: gcd of 12 alone.
  EXPECT_EQ(max_tp_size(real_config("gpt2")), 12);
}

// Absent and null fields drop out, zero expert sizes too; a zero head count is a ConfigError
// (config-not-positive), as the families' parser says of it (config_fields.h: one set of limits).
TEST(TP, FieldsSkippedTextConfigAndExperts) {
  const auto zero = expect_error<ConfigError>([] {
    max_tp_size(nlohmann::json{{"num_attention_heads", 16}, {"num_key_value_heads", 0}}, false,
                "c.json");
  });
  EXPECT_EQ(zero.rule(), "config-not-positive");
  EXPECT_EQ(zero.field(), "num_key_value_heads");
  EXPECT_EQ(zero.file(), "c.json");
  EXPECT_EQ(
      max_tp_size(nlohmann::json{{"num_attention_heads", 16}, {"intermediate_size", nullptr}}), 16);
  EXPECT_EQ(max_tp_size(nlohmann::json{{"num_attention_heads", 16}, {"moe_intermediate_size", 0}}),
            16);
  EXPECT_EQ(max_tp_size(nlohmann::json::object()), std::nullopt);
  nlohmann::json mm = {{"num_attention_heads", 3}, {"text_config", cfg(32, 8, 14336)}};
  EXPECT_EQ(max_tp_size(mm), 8);
  nlohmann::json moe = cfg(32, 8, 14336);
  moe["num_local_experts"] = 6;
  EXPECT_EQ(max_tp_size(moe), 8);
  EXPECT_EQ(max_tp_size(moe, /*expert_parallel=*/true), 2);
  EXPECT_EQ(tp_degrees(moe, true), (std::vector<int64_t>{1, 2}));
  // A field that is no size is a ConfigError (a TPError is a degree the model cannot take).
  auto bad = expect_error<ConfigError>([] {
    max_tp_size(nlohmann::json{{"num_attention_heads", "32"}});
  });
  EXPECT_NE(std::string(bad.what()).find("num_attention_heads"), std::string::npos);
  EXPECT_EQ(bad.rule(), "config-not-integer");
  EXPECT_EQ(expect_error<ConfigError>([] {
              max_tp_size(nlohmann::json{{"num_attention_heads", -4}});
            }).rule(),
            "config-not-positive");
  EXPECT_EQ(expect_error<ConfigError>([] { max_tp_size(nlohmann::json::array()); }).rule(),
            "config-not-object");
  // text_config's fields are named by their path.
  EXPECT_EQ(expect_error<ConfigError>([] {
              max_tp_size(nlohmann::json{{"text_config", {{"num_attention_heads", true}}}});
            }).field(),
            "text_config.num_attention_heads");
}

// Each expert's rows must split too: Qwen3-30B-A3B (32 heads, 4 kv heads, dense 6144, 768 per
// expert) splits 4 ways; an expert intermediate size that no larger degree divides limits the
// degree, as Qwen2-MoE's shared expert does. moe_config reads the counts from text_config first.
TEST(TP, ExpertIntermediateSizesAndMoeConfig) {
  nlohmann::json qwen3 = cfg(32, 4, 6144);
  qwen3["moe_intermediate_size"] = 768;
  EXPECT_EQ(max_tp_size(qwen3), 4);
  nlohmann::json c = cfg(8, 8, 64);
  EXPECT_EQ(max_tp_size(c), 8);
  c["moe_intermediate_size"] = 12;
  EXPECT_EQ(max_tp_size(c), 4);
  c["moe_intermediate_size"] = 16;
  c["shared_expert_intermediate_size"] = 20;
  EXPECT_EQ(max_tp_size(c), 4);
  nlohmann::json mm = {
      {"num_experts", 3},
      {"text_config",
       {{"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8}}}};
  const MoeConfig m = moe_config(mm);
  EXPECT_EQ(m.routed_experts, 256);
  EXPECT_EQ(std::string(m.routed_field), "n_routed_experts");
  EXPECT_EQ(m.experts_per_token, 8);
  EXPECT_EQ(m.shared_experts, 1);
  EXPECT_EQ(moe_config(nlohmann::json{{"experts_per_token", 4}}).experts_per_token, 4);
  EXPECT_EQ(moe_config(nlohmann::json::object()).routed_experts, 0);
  EXPECT_EQ(expect_error<ConfigError>([] {
              moe_config(nlohmann::json{{"num_experts", "8"}});
            }).rule(),
            "config-not-integer");
  EXPECT_EQ(expect_error<ConfigError>([] {
              moe_config(nlohmann::json{{"n_shared_experts", -1}});
            }).rule(),
            "config-not-positive");
  EXPECT_EQ(divisors(12), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(divisors(1), (std::vector<int64_t>{1}));
}

// Found by the quant fuzzer: a float head count beyond int64 was cast (undefined behaviour). Every
// size past 2^31 - 1 is a ConfigError naming its field (config-too-large), and so is every float:
// sizes are JSON integers for every reader (config_fields.h), 16.0 included, as the families'
// parser has always said.
TEST(TP, OutOfRangeAndFloatSizesAreConfigErrors) {
  for (nlohmann::json v : {nlohmann::json(uint64_t{1} << 63), nlohmann::json(int64_t{1} << 31)}) {
    auto e = expect_error<ConfigError>([&] { max_tp_size(nlohmann::json{{"n_head", v}}); });
    EXPECT_EQ(e.rule(), "config-too-large") << e.what();
    EXPECT_NE(std::string(e.what()).find("'n_head'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2147483647"), std::string::npos) << e.what();
  }
  for (nlohmann::json v :
       {nlohmann::json(4.44444e75), nlohmann::json(1e19), nlohmann::json(-1e19),
        nlohmann::json(2147483648.0), nlohmann::json(16.5), nlohmann::json(16.0)}) {
    auto e = expect_error<ConfigError>([&] { max_tp_size(nlohmann::json{{"n_head", v}}); });
    EXPECT_EQ(e.rule(), "config-not-integer") << e.what();
    EXPECT_NE(std::string(e.what()).find("'n_head'"), std::string::npos) << e.what();
  }
  // The largest size accepted: 2^31 - 1 is prime, so its degrees are 1 and itself, listed in
  // pairs up to its square root rather than by a walk of two billion steps.
  nlohmann::json prime = {{"num_attention_heads", 2147483647}};
  EXPECT_EQ(tp_degrees(prime), (std::vector<int64_t>{1, 2147483647}));
  std::vector<int64_t> powers;
  for (int k = 0; k <= 30; ++k) powers.push_back(int64_t{1} << k);
  EXPECT_EQ(tp_degrees(nlohmann::json{{"num_attention_heads", int64_t{1} << 30}}), powers);
  EXPECT_EQ(tp_degrees(cfg(36, 36, 36)), (std::vector<int64_t>{1, 2, 3, 4, 6, 9, 12, 18, 36}));
}

TEST(TP, DegreeForARequest) {
  nlohmann::json c = cfg(24, 8, 8192);
  EXPECT_EQ(tp_degrees(c), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(tp_degree_for(c, 1), 1);
  EXPECT_EQ(tp_degree_for(c, 3), 4);
  EXPECT_EQ(tp_degree_for(c, 8), 8);
  auto e = expect_error<TPError>([&] { tp_degree_for(c, 9); });
  EXPECT_NE(std::string(e.what()).find("degrees that work: 1, 2, 4, 8"), std::string::npos)
      << e.what();
  expect_error<TPError>([&] { tp_degree_for(c, 0); });
  nlohmann::json none = cfg(3, 1, 11);
  EXPECT_EQ(tp_degree_for(none, 1), 1);
  EXPECT_NE(std::string(expect_error<TPError>([&] { tp_degree_for(none, 2); }).what())
                .find("cannot be split"),
            std::string::npos);
}

}  // namespace
}  // namespace metaload
