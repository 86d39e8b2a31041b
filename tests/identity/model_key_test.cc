// Model keys (byte-identical to nnsight's, which uses json.dumps) and the class registry.
#include "identity/model_key.h"

#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "loader/format/json_util.h"
#include "identity/registry.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;

// Expected suffixes were produced by CPython 3.11's json.dumps({"repo_id": s, "revision": None}).
struct DumpsCase {
  std::string repo_id;
  std::string expected_json;
};

TEST(ModelKey, JsonSuffixMatchesPythonJsonDumps) {
  const std::vector<DumpsCase> cases = {
      {"openai-community/gpt2", R"({"repo_id": "openai-community/gpt2", "revision": null})"},
      {"we\"ird\\name", R"({"repo_id": "we\"ird\\name", "revision": null})"},
      {"tab\there\nnl\r\b\f", R"({"repo_id": "tab\there\nnl\r\b\f", "revision": null})"},
      {"ctl\x01\x1f\x7f", R"({"repo_id": "ctl\u0001\u001f\u007f", "revision": null})"},
      {"caf\xc3\xa9/\xc3\xbcn\xc3\xaf",
       R"({"repo_id": "caf\u00e9/\u00fcn\u00ef", "revision": null})"},
      {"\xe6\x97\xa5\xe6\x9c\xac/\xe3\x83\xa2\xe3\x83\x87\xe3\x83\xab",
       R"({"repo_id": "\u65e5\u672c/\u30e2\u30c7\u30eb", "revision": null})"},
      {"emoji\xf0\x9f\x98\x80/x", R"({"repo_id": "emoji\ud83d\ude00/x", "revision": null})"},
  };
  // Most of these are no Hub repo ids: the encoding is checked with local paths allowed.
  const KeyOptions any{/*allow_local_paths=*/true};
  for (const auto& c : cases) {
    std::string key = to_model_key({kTransformersModel, c.repo_id, std::nullopt, {}}, any);
    EXPECT_EQ(key, std::string(kTransformersModel) + ":" + c.expected_json);
    ModelKey back = from_model_key(key, any);
    EXPECT_EQ(back.repo_id, c.repo_id);
    EXPECT_FALSE(back.revision);
    EXPECT_EQ(to_model_key(back, any), key);
  }
}

TEST(ModelKey, ExtraValuesAreWrittenAsJsonDumpsWritesThem) {
  // Each value as CPython 3.11's json.dumps writes it: integers past 64 bits exact (nlohmann reads
  // them as doubles: 2**64 + 1 became 1.8446744073709552e+19), floats as repr writes them.
  const std::vector<std::string> values = {
      "18446744073709551617",
      "-18446744073709551617",
      "9223372036854775808",
      "-9223372036854775809",
      "10000000000000000000000000000000000000000",
      "0.1",
      "1e+16",
      "1000000000000000.0",
      "1.2345678901234568e+17",
      "1.5e-05",
      "0.0001",
      "-0.0",
      "5e-324",
      "1.7976931348623157e+308",
      "100.0",
      "1e+22",
      R"([1, [2.0, {"a": -3e-07, "b": [18446744073709551617]}]])",
      R"("e\u0301\u00e9\ud83d\ude00\u007f\"\\")",
  };
  for (const std::string& v : values) {
    const std::string key = std::string(kTransformersModel) +
                            R"(:{"repo_id": "org/m", "revision": null, "v": )" + v + "}";
    const ModelKey k = from_model_key(key);
    EXPECT_EQ(to_model_key(k), key) << v;
    EXPECT_EQ(python_json_dumps(k.extra[0].second), v);
    EXPECT_EQ(python_json_dumps(parse_key_json(v, "v")), v);
  }
  // Spelled otherwise, the same values are written as json.dumps(json.loads(text)) writes them.
  EXPECT_EQ(python_json_dumps(
                parse_key_json("[1E2, 1e-7, -0, 0.10, 1e16, 12345678901234567890123]", "v")),
            "[100.0, 1e-07, 0, 0.1, 1e+16, 12345678901234567890123]");
  // json.dumps would write inf as Infinity, which is no JSON: refused, naming the field.
  ModelKey inf{kTransformersModel, "org/m", std::nullopt, {}};
  inf.extra.emplace_back("x", std::numeric_limits<double>::infinity());
  const std::string m = expect_error<ModelKeyError>([&] { to_model_key(inf); }).what();
  EXPECT_NE(m.find("extra field \"x\""), std::string::npos) << m;
  EXPECT_NE(m.find("rule json-number-range"), std::string::npos) << m;
}

TEST(ModelKey, RevisionAndExtraFieldsRoundTrip) {
  ModelKey k{"nnsight.modeling.language.LanguageModel", "a", std::string("v1.0"), {}};
  k.extra.emplace_back("task", "text-generation");
  k.extra.emplace_back("n", 3);
  k.extra.emplace_back("b", true);
  k.extra.emplace_back("l", nlohmann::ordered_json::array({1, nullptr, "\xc3\xa9"}));
  k.extra.emplace_back("o", nlohmann::ordered_json::object());
  const std::string expected =
      "nnsight.modeling.language.LanguageModel:"
      R"({"repo_id": "a", "revision": "v1.0", "task": "text-generation", "n": 3, "b": true, "l": [1, null, "\u00e9"], "o": {}})";
  EXPECT_EQ(to_model_key(k), expected);
  ModelKey back = from_model_key(expected);
  EXPECT_EQ(back, k);
}

TEST(ModelKey, AcceptsOtherSpacingAndOrderAndWritesCanonicalForm) {
  ModelKey k =
      from_model_key(R"(metaload.TransformersModel:{ "revision" :"main","repo_id":"org/m" })");
  EXPECT_EQ(k.repo_id, "org/m");
  EXPECT_EQ(k.revision, "main");
  EXPECT_EQ(to_model_key(k),
            R"(metaload.TransformersModel:{"repo_id": "org/m", "revision": "main"})");
  // An absent revision is unpinned.
  EXPECT_FALSE(from_model_key(R"(metaload.TransformersModel:{"repo_id": "x"})").revision);
  // The JSON may itself contain colons.
  EXPECT_EQ(
      from_model_key(R"(metaload.TransformersModel:{"repo_id": "x", "revision": "a:b"})").revision,
      "a:b");
}

TEST(ModelKey, MalformedKeysSayWhatIsWrong) {
  auto msg = [](const std::string& key) {
    return std::string(expect_error<ModelKeyError>([&] { from_model_key(key); }).what());
  };
  EXPECT_NE(msg("metaload.TransformersModel").find("has no ':'"), std::string::npos);
  EXPECT_NE(msg(R"(some.Unknown:{"repo_id": "x"})").find("unknown class \"some.Unknown\""),
            std::string::npos);
  EXPECT_NE(msg(R"(some.Unknown:{"repo_id": "x"})").find("nnsight.modeling.language.LanguageModel"),
            std::string::npos);
  EXPECT_NE(msg(R"(not a class:{"repo_id": "x"})").find("not a dotted Python name"),
            std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"repo_id": )").find("bad JSON"), std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"repo_id": "a", "repo_id": "b"})").find("bad JSON"),
            std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:["x"])").find("not an object"), std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"revision": null})").find("no \"repo_id\""),
            std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"repo_id": ""})").find("non-empty string"),
            std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"repo_id": 5})").find("non-empty string"),
            std::string::npos);
  EXPECT_NE(msg(R"(metaload.TransformersModel:{"repo_id": "x", "revision": 1})")
                .find("neither a string nor null"),
            std::string::npos);
  EXPECT_EQ(expect_error<ModelKeyError>([] {
              to_model_key({"metaload.X", "", std::nullopt, {}});
            }).kind(),
            std::string("ModelKeyError"));
  expect_error<ModelKeyError>([] { to_model_key({"", "x", std::nullopt, {}}); });
  expect_error<ModelKeyError>([] { to_model_key({"a.B", "bad\xff", std::nullopt, {}}); });
}

TEST(ModelKey, DeepJsonIsRefusedNotACrash) {
  // A key with an extra field 100,000 arrays deep overflowed the stack in from_model_key (60,000
  // in `metaload key`, which writes the key back).
  const std::string head = R"(metaload.TransformersModel:{"repo_id": "org/x", "task": )";
  auto key = [&](size_t depth) {
    return head + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  for (size_t depth : {size_t(kMaxJsonDepth), size_t(100'000)}) {
    const std::string m = expect_error<ModelKeyError>([&] { from_model_key(key(depth)); }).what();
    EXPECT_NE(m.find("rule json-too-deep"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(kMaxJsonDepth)), std::string::npos) << m;
    EXPECT_LT(m.size(), 1000u);  // the key is quoted cut short
  }
  // Up to the limit (the key's object is the first level) it round-trips.
  const ModelKey k = from_model_key(key(kMaxJsonDepth - 1));
  EXPECT_EQ(from_model_key(to_model_key(k)), k);
  // A deeper extra built in code is refused when written, not written as a key no one can read.
  ModelKey built = k;
  nlohmann::ordered_json deep = built.extra[0].second;
  for (int i = 0; i < 3; ++i) deep = nlohmann::ordered_json::array({deep});
  built.extra[0].second = deep;
  const std::string w = expect_error<ModelKeyError>([&] { to_model_key(built); }).what();
  EXPECT_NE(w.find("extra field \"task\""), std::string::npos) << w;
  EXPECT_NE(w.find("rule json-too-deep"), std::string::npos) << w;
}

// Keys come from remote users: a repo_id is a Hub repo id unless the caller opts in to paths.
struct HostileCase {
  std::string repo_id;
  std::string rule;
};

TEST(ModelKey, RepoIdsThatAreNoHubRepoIdsAreRefusedNamingTheKeyAndTheRule) {
  const std::vector<HostileCase> cases = {
      {"/etc/passwd", "repo-id-absolute-path"},
      {"../x", "repo-id-parent-dir"},
      {"org/..", "repo-id-parent-dir"},
      {"..", "repo-id-parent-dir"},
      {"a..b", "repo-id-parent-dir"},
      {"a/b/c", "repo-id-parts"},
      {"org/", "repo-id-parts"},
      {"./x", "repo-id-edge"},
      {".", "repo-id-edge"},
      {"~/x", "repo-id-character"},
      {"C:\\models\\x", "repo-id-character"},
      {"a b", "repo-id-character"},
      {"caf\xc3\xa9", "repo-id-character"},
      {"a\nb", "repo-id-character"},
      {"a--b/c", "repo-id-double-dash"},
      {"-a/b", "repo-id-edge"},
      {"a/b-", "repo-id-edge"},
      {"org/.hidden", "repo-id-edge"},
      {std::string(97, 'x'), "repo-id-length"},
      {"org/" + std::string(97, 'x'), "repo-id-length"},
      {"org/name.git", "repo-id-git-suffix"},
  };
  for (const HostileCase& c : cases) {
    SCOPED_TRACE(c.repo_id);
    ASSERT_TRUE(hub_repo_id_problem(c.repo_id));
    EXPECT_EQ(hub_repo_id_problem(c.repo_id)->rule, c.rule);
    const std::string key =
        std::string(kTransformersModel) + ":" +
        python_json_dumps(nlohmann::ordered_json{{"repo_id", c.repo_id}, {"revision", nullptr}});
    const RepoIdError parsed = expect_error<RepoIdError>([&] { from_model_key(key); });
    EXPECT_EQ(parsed.rule(), c.rule);
    EXPECT_EQ(parsed.repo_id(), c.repo_id);
    EXPECT_EQ(std::string(parsed.kind()), "RepoIdError");
    const std::string msg = parsed.what();
    EXPECT_NE(msg.find(quote_str(key)), std::string::npos) << msg;           // the key ...
    EXPECT_NE(msg.find("(rule " + c.rule + ")"), std::string::npos) << msg;  // ... and the rule
    EXPECT_NE(msg.find("allow_local_paths"), std::string::npos) << msg;      // ... and the way out
    // A ModelKeyError like any other bad key.
    expect_error<ModelKeyError>([&] { from_model_key(key); });
    EXPECT_EQ(expect_error<RepoIdError>([&] {
                to_model_key({kTransformersModel, c.repo_id, std::nullopt, {}});
              }).rule(),
              c.rule);
    // The caller's own keys may name paths when it opts in.
    const KeyOptions paths{/*allow_local_paths=*/true};
    EXPECT_EQ(from_model_key(key, paths).repo_id, c.repo_id);
    EXPECT_EQ(to_model_key(from_model_key(key, paths), paths), key);
  }
}

TEST(ModelKey, HubRepoIdsAreAccepted) {
  for (const std::string& id : std::vector<std::string>{
           "gpt2", "openai-community/gpt2", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B-Instruct",
           "_private/x_", "a.b/c.d", "a-b_c.d/0", std::string(96, 'x'),
           "org/" + std::string(96, 'y'), "org/gitlike.gi"}) {
    SCOPED_TRACE(id);
    EXPECT_FALSE(hub_repo_id_problem(id));
    const std::string key = to_model_key({kTransformersModel, id, std::nullopt, {}});
    EXPECT_EQ(from_model_key(key).repo_id, id);
  }
}

TEST(ModelKey, LocalPathsStillCannotHoldNul) {
  const std::string key = std::string(kTransformersModel) + R"(:{"repo_id": "/tmp/a\u0000b"})";
  const KeyOptions paths{/*allow_local_paths=*/true};
  EXPECT_EQ(expect_error<RepoIdError>([&] { from_model_key(key, paths); }).rule(), "repo-id-nul");
  EXPECT_EQ(expect_error<RepoIdError>([&] { from_model_key(key); }).rule(),
            "repo-id-absolute-path");
}

TEST(Registry, NnsightClassesAreAliasesOfTransformersModel) {
  EXPECT_EQ(canonical_model_class("nnsight.modeling.language.LanguageModel"), kTransformersModel);
  EXPECT_EQ(canonical_model_class("nnsight.modeling.transformers.TransformersModel"),
            kTransformersModel);
  EXPECT_EQ(canonical_model_class(kTransformersModel), kTransformersModel);
  auto known = known_model_classes();
  EXPECT_NE(std::find(known.begin(), known.end(), kTransformersModel), known.end());
  EXPECT_NE(std::string(expect_error<ModelKeyError>([] { canonical_model_class("x.Y"); }).what())
                .find("known:"),
            std::string::npos);
}

TEST(Registry, FactoriesAttachThroughAliasesAndKeepTheirType) {
  using Factory = std::function<int(const ModelKey&)>;
  register_model_class("tests.Wrapper");
  register_model_alias("tests.OldWrapper", "tests.Wrapper");
  EXPECT_FALSE(model_factory<Factory>("tests.Wrapper"));
  set_model_factory("tests.OldWrapper",
                    Factory([](const ModelKey& k) { return static_cast<int>(k.repo_id.size()); }));
  auto f = model_factory<Factory>("tests.Wrapper");
  ASSERT_TRUE(f);
  EXPECT_EQ((*f)(from_model_key(R"(tests.OldWrapper:{"repo_id": "abcd", "revision": null})")), 4);
  EXPECT_FALSE(model_factory<std::function<void()>>("tests.Wrapper"));  // wrong type: none
  expect_error<ModelKeyError>([] { register_model_alias("tests.Alias2", "tests.NotRegistered"); });
  expect_error<ModelKeyError>([] { register_model_class("tests.OldWrapper"); });
  expect_error<ModelKeyError>([] { set_model_factory("tests.Nope", 1); });
}

}  // namespace
}  // namespace metaload
