// One config reader, one tensor list (issue 23). Every reader of config.json (the families' parser,
// the published checkpoint layouts, the TP degree and describe) refuses a broken field with the
// same ConfigError: kind, rule, field and message. The families' parameters and the published
// checkpoint tensors are two views of identity's one list: mapped onto module names, they agree.
// Torch-free.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "identity/checkpoint_shapes.h"
#include "identity/describe.h"
#include "identity/tp_degree.h"
#include "loader/format/writer.h"
#include "model/families/config.h"
#include "model/families/spec.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using nlohmann::json;
using testing::TempDir;

json builtin(const std::string& name) {
  return json::parse(builtin_config_json(name));
}

// What a reader said of a config: the error's kind, rule, field and message, or "ok".
struct Verdict {
  std::string kind = "ok", rule, field, message;
  bool operator==(const Verdict& o) const {
    return kind == o.kind && rule == o.rule && field == o.field && message == o.message;
  }
};

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  return os << v.kind << " rule=" << v.rule << " field=" << v.field << " message=" << v.message;
}

Verdict verdict_of(const std::function<void()>& read) {
  try {
    read();
  } catch (const ConfigError& e) {
    return {e.kind(), e.rule(), e.field(), e.message()};
  }
  return {};
}

// describe of a one-tensor checkpoint beside `config`: describe succeeds and records the problem.
Verdict describe_verdict(const json& config, const std::string& dir) {
  testing::write_file(dir + "/config.json", config.dump());
  SafetensorsWriter w(dir + "/model.safetensors");
  w.add("model.norm.weight", DType::F32, {4}, nullptr);
  w.write();
  const CheckpointInfo info = describe_checkpoint(dir);
  if (!info.config_error) return {};
  EXPECT_EQ(info.max_tp_size, std::nullopt);
  return {"ConfigError", info.config_error->rule, info.config_error->field,
          info.config_error->message};
}

// The four readers' verdicts on `config`, saved as dir/config.json.
std::map<std::string, Verdict> verdicts(const json& config, const std::string& dir) {
  const std::string file = dir + "/config.json";
  return {
      {"family parser", verdict_of([&] { parse_family_config(config, file); })},
      {"checkpoint shapes",
       verdict_of([&] { checkpoint_tensor_specs(config, DType::BF16, false, file); })},
      {"tp degree", verdict_of([&] { max_tp_size(config, false, file); })},
      {"describe", describe_verdict(config, dir)},
  };
}

TEST(ConfigReaders, EveryReaderRefusesABrokenFieldAlike) {
  const std::vector<std::pair<json, std::string>> cases = {
      {-4, "config-not-positive"},
      {0, "config-not-positive"},
      {16.0, "config-not-integer"},
      {16.5, "config-not-integer"},
      {true, "config-not-integer"},
      {"16", "config-not-integer"},
      {json::array({16}), "config-not-integer"},
      {int64_t{1} << 40, "config-too-large"},
      {uint64_t{1} << 63, "config-too-large"},
  };
  for (const auto& [value, rule] : cases) {
    SCOPED_TRACE(value.dump());
    TempDir dir;
    json config = builtin("llama-tiny");
    config["num_attention_heads"] = value;
    const auto v = verdicts(config, dir.path());
    const Verdict& first = v.at("family parser");
    EXPECT_EQ(first.kind, "ConfigError");
    EXPECT_EQ(first.rule, rule);
    EXPECT_EQ(first.field, "num_attention_heads");
    EXPECT_NE(first.message.find(dir / "config.json"), std::string::npos) << first;
    for (const auto& [reader, verdict] : v) EXPECT_EQ(verdict, first) << reader;
  }
}

// A field only some readers need: those that need it say the same; the others go on without it.
TEST(ConfigReaders, AMissingFieldIsOneRuleForThoseThatNeedIt) {
  TempDir dir;
  json config = builtin("llama-tiny");
  config.erase("num_attention_heads");
  const auto v = verdicts(config, dir.path());
  EXPECT_EQ(v.at("family parser").rule, "config-missing-field");
  EXPECT_EQ(v.at("family parser").field, "num_attention_heads");
  EXPECT_EQ(v.at("checkpoint shapes"), v.at("family parser"));
  EXPECT_EQ(v.at("tp degree"), Verdict{});  // the TP degree skips absent fields
  EXPECT_EQ(v.at("describe"), Verdict{});
}

// Multimodal configs keep the language model's sizes under text_config: the readers of TP degrees
// and describe name the nested field alike. The families take no multimodal config: their parser
// and the published layouts refuse it by its model_type, alike.
TEST(ConfigReaders, ABrokenTextConfigFieldIsNamedByItsPath) {
  TempDir dir;
  json config = {{"model_type", "llava"},
                 {"text_config", builtin("llama-tiny")},
                 {"vision_config", {{"hidden_size", 8}}}};
  config["text_config"]["num_key_value_heads"] = -2;
  const auto v = verdicts(config, dir.path());
  EXPECT_EQ(v.at("tp degree").rule, "config-not-positive");
  EXPECT_EQ(v.at("tp degree").field, "text_config.num_key_value_heads");
  EXPECT_EQ(v.at("describe"), v.at("tp degree"));
  EXPECT_EQ(v.at("family parser").rule, "config-unsupported");
  EXPECT_EQ(v.at("family parser").field, "model_type");
  EXPECT_EQ(v.at("checkpoint shapes"), v.at("family parser"));
}

TEST(ConfigReaders, LayerCountsAndNonObjectsAlike) {
  TempDir dir;
  json config = builtin("gpt2-tiny");
  config["n_layer"] = kMaxConfigLayers + 1;
  EXPECT_EQ(verdict_of([&] { parse_family_config(config, "c.json"); }),
            verdict_of([&] { checkpoint_tensor_specs(config, DType::BF16, false, "c.json"); }));
  EXPECT_EQ(verdict_of([&] { checkpoint_tensor_specs(config, DType::BF16, false, "c.json"); }).rule,
            "config-too-large");
  for (const json& doc : {json::array(), json(3), json("x")}) {
    const auto v = verdicts(doc, dir.path());
    EXPECT_EQ(v.at("family parser").rule, "config-not-object");
    for (const char* reader : {"checkpoint shapes", "tp degree", "describe"})
      EXPECT_EQ(v.at(reader), v.at("family parser")) << reader;
  }
}

// The two views of the one list: every tensor a published checkpoint stores for a family config
// is, under map_checkpoint_name, one of its untied parameters with the same shape (buffers map to
// nothing), and every untied parameter is stored. Would fail if either view listed its own.
TEST(ConfigReaders, PublishedTensorsAreTheFamilysParameters) {
  for (const std::string& name : builtin_config_names()) {
    for (bool buffers : {false, true}) {
      SCOPED_TRACE(name + (buffers ? " with buffers" : ""));
      const json raw = builtin(name);
      const FamilyConfig c = parse_family_config(raw, "builtin:" + name);
      std::map<std::string, std::vector<int64_t>> params, stored;
      for (const ParamSpec& p : parameter_specs(c))
        if (p.tied_to.empty()) params[p.name] = p.shape;
      size_t n_buffers = 0;
      for (const TensorSpec& t : checkpoint_tensor_specs(raw, DType::BF16, buffers)) {
        const std::optional<std::string> module = map_checkpoint_name(c, t.name);
        if (!module) {
          ++n_buffers;
          continue;
        }
        EXPECT_TRUE(stored.emplace(*module, t.shape).second) << "stored twice: " << *module;
      }
      EXPECT_EQ(stored, params);
      EXPECT_EQ(n_buffers, buffers ? static_cast<size_t>(c.num_layers) : 0u);
    }
  }
}

}  // namespace
}  // namespace metaload
