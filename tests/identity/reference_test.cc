// resolve_reference: every kind of reference a user names a model by, and the one error kind for
// a key whose revision disagrees with the one asked for. Torch-free.
#include "identity/reference.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "identity/describe.h"
#include "model/fixtures.h"
#include "identity/registry.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::ScopedEnv;
using testing::TempDir;

std::string key_of(const std::string& repo_id, const std::string& revision_json = "null") {
  return std::string(kTransformersModel) + ":{\"repo_id\": \"" + repo_id +
         "\", \"revision\": " + revision_json + "}";
}

FixtureResult make(const TempDir& d, const std::string& name, int shards = 1) {
  FixtureOptions f;
  f.config = "gpt2-tiny";
  f.shards = shards;
  return make_checkpoint(f, d / name);
}

FixtureResult make_hub(const TempDir& d) {
  FixtureOptions f;
  f.config = "gpt2-tiny";
  f.hf_cache = d / "hub";
  f.repo = "org/tiny";
  return make_checkpoint(f);
}

TEST(Reference, DirectoryAndFileAndIndex) {
  TempDir d;
  const std::string one = make(d, "one").dir;
  const ModelReference dir = resolve_reference(one + "/");
  EXPECT_EQ(dir.checkpoint.kind, ReferenceKind::kDirectory);
  EXPECT_EQ(dir.checkpoint.path, one);  // the trailing '/' dropped
  EXPECT_EQ(dir.checkpoint.dir, one);
  EXPECT_FALSE(dir.key);
  EXPECT_FALSE(dir.checkpoint.repo_id);
  EXPECT_FALSE(dir.checkpoint.snapshot_of);

  const ModelReference file = resolve_reference(one + "/model.safetensors");
  EXPECT_EQ(file.checkpoint.kind, ReferenceKind::kFile);
  EXPECT_EQ(file.checkpoint.path, one + "/model.safetensors");
  EXPECT_EQ(file.checkpoint.dir, one);

  const std::string two = make(d, "two", /*shards=*/2).dir;
  const ModelReference index = resolve_reference(two + "/model.safetensors.index.json");
  EXPECT_EQ(index.checkpoint.kind, ReferenceKind::kIndex);
  EXPECT_EQ(index.checkpoint.dir, two);

  // Something there that is neither file nor directory is named, not passed over.
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  const auto fifo = expect_error<ResolveError>([&] { resolve_reference(d / "fifo"); });
  EXPECT_NE(std::string(fifo.what()).find("FIFO"), std::string::npos) << fifo.what();
  // Revisions select hub snapshots only.
  expect_error<ResolveError>([&] { resolve_reference(one, std::string("main")); });
  expect_error<ResolveError>([&] { resolve_reference(d / "absent"); });
  expect_error<ResolveError>([&] { resolve_reference(""); });
}

TEST(Reference, RepoIdAtARevision) {
  TempDir d;
  const FixtureResult made = make_hub(d);
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  for (const std::optional<std::string>& rev :
       {std::optional<std::string>(), std::optional<std::string>("main"), made.commit}) {
    const ModelReference r = resolve_reference("org/tiny", rev);
    EXPECT_EQ(r.checkpoint.kind, ReferenceKind::kRepoId);
    EXPECT_EQ(r.checkpoint.repo_id, "org/tiny");
    EXPECT_EQ(r.checkpoint.commit, made.commit);
    EXPECT_EQ(r.checkpoint.dir, made.dir);
    EXPECT_TRUE(r.checkpoint.snapshot_of);
    EXPECT_EQ(r.revision, rev);
  }
  const auto e =
      expect_error<ResolveError>([&] { resolve_reference("org/tiny", std::string("v9")); });
  EXPECT_NE(std::string(e.what()).find("v9"), std::string::npos) << e.what();
  // open_checkpoint resolves through the same function.
  const Checkpoint c = open_checkpoint("org/tiny", std::string("main"));
  EXPECT_EQ(c.repo_id, "org/tiny");
  EXPECT_EQ(c.revision, made.commit);
}

TEST(Reference, ModelKeysNameHubRepos) {
  TempDir d;
  const FixtureResult made = make_hub(d);
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  EXPECT_TRUE(is_model_key_reference(key_of("org/tiny")));
  EXPECT_FALSE(is_model_key_reference("org/tiny"));
  const ModelReference k = resolve_reference(key_of("org/tiny"));
  ASSERT_TRUE(k.key);
  EXPECT_EQ(k.key->repo_id, "org/tiny");
  EXPECT_EQ(k.checkpoint.kind, ReferenceKind::kRepoId);
  EXPECT_EQ(k.checkpoint.commit, made.commit);
  EXPECT_FALSE(k.revision);
  // The key's own revision is the one resolved.
  const ModelReference pinned = resolve_reference(key_of("org/tiny", "\"" + *made.commit + "\""));
  EXPECT_EQ(pinned.revision, made.commit);
  // A key never names a path unless the policy allows it.
  const std::string local = make(d, "local").dir;
  expect_error<RepoIdError>([&] { resolve_reference(key_of(local)); });
  const ModelReference allowed = resolve_reference(key_of(local), std::nullopt, KeyOptions{true});
  EXPECT_EQ(allowed.checkpoint.kind, ReferenceKind::kDirectory);
  EXPECT_EQ(allowed.checkpoint.dir, local);
}

TEST(Reference, AKeyPinningAnotherRevisionIsAModelKeyErrorEverywhere) {
  TempDir d;
  const FixtureResult made = make_hub(d);
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  const std::string key = key_of("org/tiny", "\"main\"");
  // The same revision twice agrees; another one is refused before anything is looked up.
  EXPECT_EQ(resolve_reference(key, std::string("main")).revision, "main");
  const auto e = expect_error<ModelKeyError>([&] { resolve_reference(key, std::string("v2")); });
  EXPECT_NE(std::string(e.what()).find("pins revision"), std::string::npos) << e.what();
  expect_error<ModelKeyError>([&] { describe_checkpoint(key, std::nullopt, std::string("v2")); });
  ModelKey parsed = from_model_key(key);
  expect_error<ModelKeyError>([&] { join_revision(parsed, std::string("v2")); });
  EXPECT_EQ(join_revision(parsed, std::nullopt), "main");
  parsed.revision.reset();
  EXPECT_EQ(join_revision(parsed, std::string("v2")), "v2");
}

}  // namespace
}  // namespace metaload
