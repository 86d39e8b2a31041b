// open_checkpoint: directories, files, sharded indexes and their validation, the HF cache.
#include "loader/format/checkpoint.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "loader/format/hf_cache.h"
#include "loader/format/writer.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::ScopedEnv;
using testing::TempDir;

const std::string& kHash = testing::kCommitHash;
const std::string kHash2 = "fedcba9876543210fedcba9876543210fedcba98";

void write_single(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w(path);
  for (const auto& n : names) w.add(n, DType::F32, {2, 2}, nullptr);
  w.write();
}

// Two shards a.safetensors {x, y} and b.safetensors {z} plus an index mapping them.
void write_sharded(const std::string& dir, const std::string& index_json = "") {
  write_single(dir + "/a.safetensors", {"x", "y"});
  write_single(dir + "/b.safetensors", {"z"});
  testing::write_file(
      dir + "/model.safetensors.index.json",
      index_json.empty()
          ? R"({"metadata":{"total_size":48},)"
            R"("weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}})"
          : index_json);
}

TEST(OpenCheckpoint, DirectoryWithSingleFileAndConfig) {
  TempDir dir;
  write_single(dir / "model.safetensors", {"w", "b"});
  testing::write_file(dir / "config.json", R"({"model_type":"gpt2"})");
  Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(c.dir, dir.path());
  ASSERT_EQ(c.files.size(), 1u);
  EXPECT_EQ(c.files[0].path, dir / "model.safetensors");
  EXPECT_EQ(c.num_tensors(), 2u);
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(c.config_path, dir / "config.json");
  EXPECT_FALSE(c.index_path);
  EXPECT_FALSE(c.revision);
  EXPECT_EQ(read_config_json(*c.config_path)["model_type"], "gpt2");
  // A trailing slash and the file itself work too.
  EXPECT_EQ(open_checkpoint(dir.path() + "/").num_tensors(), 2u);
  Checkpoint f = open_checkpoint(dir / "model.safetensors");
  EXPECT_EQ(f.dir, dir.path());
  EXPECT_EQ(f.config_path, dir / "config.json");
}

TEST(OpenCheckpoint, OtherNamesInADirectory) {
  TempDir dir;
  write_single(dir / "weights.safetensors", {"w"});
  EXPECT_EQ(open_checkpoint(dir.path()).files[0].path, dir / "weights.safetensors");
  write_single(dir / "other.safetensors", {"w"});
  auto e = expect_error<ResolveError>([&] { open_checkpoint(dir.path()); });
  EXPECT_NE(std::string(e.what()).find("other.safetensors, weights.safetensors"), std::string::npos)
      << e.what();
}

TEST(OpenCheckpoint, BinOnlyDirectoryIsExplained) {
  TempDir dir;
  testing::write_file(dir / "pytorch_model.bin", "x");
  auto e = expect_error<ResolveError>([&] { open_checkpoint(dir.path()); });
  EXPECT_NE(std::string(e.what()).find("only safetensors"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos);
  auto file = expect_error<ResolveError>([&] { open_checkpoint(dir / "pytorch_model.bin"); });
  EXPECT_NE(std::string(file.what()).find("pickle"), std::string::npos) << file.what();
}

TEST(OpenCheckpoint, RevisionOnALocalPathIsAnError) {
  TempDir dir;
  write_single(dir / "model.safetensors", {"w"});
  auto e = expect_error<ResolveError>([&] { open_checkpoint(dir.path(), std::string("main")); });
  EXPECT_NE(std::string(e.what()).find("revision \"main\""), std::string::npos);
}

// A NUL would end the path where the system calls read it (opening another file) and the message
// where torch and Python read it: refused, and shown escaped.
TEST(OpenCheckpoint, AReferenceWithANulIsRefusedAndShownEscaped) {
  TempDir dir;
  write_single(dir / "model.safetensors", {"w"});
  const std::string ref = dir.path() + std::string(1, '\0') + "/elsewhere";
  auto e = expect_error<ResolveError>([&] { open_checkpoint(ref); });
  EXPECT_EQ(e.message(),
            "checkpoint reference \"" + dir.path() + "\\x00/elsewhere\" contains a NUL byte");
  auto repo =
      expect_error<ResolveError>([&] { open_checkpoint(std::string("org/na") + '\0' + "me"); });
  EXPECT_NE(repo.message().find("\"org/na\\x00me\""), std::string::npos) << repo.message();
  EXPECT_EQ(repo.message().find('\0'), std::string::npos);
}

TEST(Messages, FormatErrorsEscapeAndCapTheFileAndTheTensorName) {
  const FormatError e(std::string("dir") + '\0' + "/a.safetensors", "w\nx", "size-mismatch",
                      "detail");
  EXPECT_EQ(e.message(), "dir\\x00/a.safetensors: tensor 'w\\nx': detail (rule size-mismatch)");
  EXPECT_EQ(e.tensor(), "w\nx");  // the accessors keep it as given
  const FormatError big("f", std::string(10 << 20, 'n'), "r", "d");
  EXPECT_LT(big.message().size(), 300u);
  EXPECT_NE(big.message().find("...' (10485760 bytes): d (rule r)"), std::string::npos);
}

TEST(OpenCheckpoint, BadFileInsideIsAFormatError) {
  TempDir dir;
  testing::write_file(dir / "model.safetensors", testing::raw_safetensors("{\"a\":3}", 0));
  auto e = expect_error<FormatError>([&] { open_checkpoint(dir.path()); });
  EXPECT_EQ(e.rule(), "entry-not-object");
  EXPECT_EQ(e.file(), dir / "model.safetensors");
}

TEST(Sharded, OpensEveryShardAndMapsEveryTensorOnce) {
  TempDir dir;
  write_sharded(dir.path());
  reset_io_bytes_read();
  Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(c.files.size(), 2u);
  EXPECT_EQ(c.index_path, dir / "model.safetensors.index.json");
  EXPECT_EQ(c.num_tensors(), 3u);
  EXPECT_EQ(c.file_of("z")->path, dir / "b.safetensors");
  EXPECT_EQ(c.find("y")->nbytes(), 16u);
  // Headers and index only: the 48 data bytes are never read.
  uint64_t expected = 0;
  for (const auto& f : c.files) expected += f.data_start;
  expected += testing::read_file(dir / "model.safetensors.index.json").size();
  EXPECT_EQ(io_bytes_read(), expected);
  // The index file itself is a reference too.
  EXPECT_EQ(open_checkpoint(dir / "model.safetensors.index.json").num_tensors(), 3u);
}

TEST(Sharded, MissingShardIsNamed) {
  TempDir dir;
  write_sharded(dir.path());
  ASSERT_EQ(::unlink((dir / "b.safetensors").c_str()), 0);
  auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
  EXPECT_EQ(e.rule(), "missing-shard");
  EXPECT_EQ(e.tensor(), "z");
  EXPECT_NE(std::string(e.what()).find("\"b.safetensors\""), std::string::npos) << e.what();
  EXPECT_EQ(e.kind(), std::string("ShardError"));
}

TEST(Sharded, DanglingSymlinkShardIsMissing) {
  TempDir dir;
  write_sharded(dir.path());
  ASSERT_EQ(::unlink((dir / "b.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("gone.safetensors", (dir / "b.safetensors").c_str()), 0);
  auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
  EXPECT_EQ(e.rule(), "missing-shard");
  EXPECT_NE(std::string(e.what()).find("dangling"), std::string::npos);
}

TEST(Sharded, IndexMustAgreeWithShards) {
  {
    TempDir dir;  // index says z lives in a.safetensors, but b holds it
    write_sharded(
        dir.path(),
        R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"a.safetensors"}})");
    auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
    // b.safetensors is not named by this index, so z is simply absent from what the index opens.
    EXPECT_EQ(e.rule(), "index-mismatch");
    EXPECT_EQ(e.tensor(), "z");
  }
  {
    TempDir dir;  // y stored in a, index says b
    write_sharded(
        dir.path(),
        R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors","z":"b.safetensors"}})");
    auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "index-mismatch");
    EXPECT_EQ(e.tensor(), "y");
    EXPECT_EQ(e.file(), dir / "a.safetensors");
  }
  {
    TempDir dir;  // a holds y, which the index does not list
    write_sharded(dir.path(), R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})");
    auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "tensor-not-in-index");
    EXPECT_EQ(e.tensor(), "y");
  }
  {
    TempDir dir;  // x in both shards
    write_single(dir / "a.safetensors", {"x", "y"});
    write_single(dir / "b.safetensors", {"x", "z"});
    testing::write_file(
        dir / "model.safetensors.index.json",
        R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}})");
    auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "duplicate-tensor");
    EXPECT_EQ(e.tensor(), "x");
  }
}

TEST(Sharded, ShardNamesMustBePlainFileNames) {
  for (const char* bad :
       {"../a.safetensors", "/etc/passwd", "sub/a.safetensors", "..", ".", "", "a\\\\b"}) {
    TempDir dir;
    write_sharded(dir.path(), std::string(R"({"weight_map":{"x":")") + bad + R"("}})");
    auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
    EXPECT_EQ(e.rule(), "invalid-shard-name") << bad;
    EXPECT_EQ(e.tensor(), "x");
  }
}

TEST(Sharded, SymlinksMayNotLeaveTheDirectory) {
  TempDir outside;
  write_single(outside / "b.safetensors", {"z"});
  TempDir dir;
  write_sharded(dir.path());
  ASSERT_EQ(::unlink((dir / "b.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink((outside / "b.safetensors").c_str(), (dir / "b.safetensors").c_str()), 0);
  auto e = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
  EXPECT_EQ(e.rule(), "shard-outside-directory");
  EXPECT_EQ(e.tensor(), "z");  // the tensor the index puts there
  EXPECT_NE(std::string(e.what()).find(outside.path()), std::string::npos) << e.what();

  // A symlink that stays inside the directory is fine.
  TempDir ok;
  write_sharded(ok.path());
  testing::make_dir(ok / "store");
  ASSERT_EQ(::rename((ok / "b.safetensors").c_str(), (ok / "store/b.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("store/b.safetensors", (ok / "b.safetensors").c_str()), 0);
  EXPECT_EQ(open_checkpoint(ok.path()).num_tensors(), 3u);
}

TEST(Index, ParseRules) {
  auto rule = [](const std::string& json) {
    return expect_error<ShardError>([&] { parse_safetensors_index(json, "i.json"); }).rule();
  };
  EXPECT_EQ(rule("{"), "invalid-json");
  EXPECT_EQ(rule("[]"), "index-not-object");
  EXPECT_EQ(rule("{}"), "missing-weight-map");
  EXPECT_EQ(rule(R"({"weight_map":[]})"), "invalid-weight-map");
  EXPECT_EQ(rule(R"({"weight_map":{}})"), "empty-weight-map");
  EXPECT_EQ(rule(R"({"weight_map":{"a":1}})"), "invalid-weight-map");
  EXPECT_EQ(rule(R"({"weight_map":{"a":"x","a":"y"}})"), "duplicate-tensor");
  EXPECT_EQ(rule(R"({"weight_map":{"a":"x"},"weight_map":{"b":"y"}})"), "duplicate-key");
  EXPECT_EQ(rule(R"({"metadata":[],"weight_map":{"a":"x"}})"), "invalid-metadata");
  EXPECT_EQ(rule(R"({"metadata":{"total_size":-1},"weight_map":{"a":"x"}})"), "invalid-metadata");
  SafetensorsIndex idx = parse_safetensors_index(
      R"({"metadata":{"total_size":1.2e10,"format":"pt"},"weight_map":{"b":"s2","a":"s1","c":"s1"}})",
      "i.json");
  EXPECT_EQ(idx.total_size, std::optional<uint64_t>(12000000000ull));
  EXPECT_EQ(idx.shards, (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(idx.metadata["format"], "pt");
}

// A hub cache laid out as huggingface_hub writes it: snapshot files are symlinks into blobs/.
struct FakeHub {
  TempDir root;
  std::string repo;

  explicit FakeHub(const std::string& folder = "models--org--tiny") {
    repo = root / folder;
    for (size_t i = folder.find('/'); i != std::string::npos; i = folder.find('/', i + 1)) {
      testing::make_dir(root / folder.substr(0, i));
    }
    testing::make_dir(repo);
    testing::make_dir(repo + "/blobs");
    testing::make_dir(repo + "/refs");
    testing::make_dir(repo + "/snapshots");
  }
  // Snapshot `hash` holding one model.safetensors with `names`, plus config.json.
  void add_snapshot(const std::string& hash, const std::vector<std::string>& names) {
    std::string snap = repo + "/snapshots/" + hash;
    testing::make_dir(snap);
    write_single(repo + "/blobs/w" + hash, names);
    testing::write_file(repo + "/blobs/c" + hash, R"({"num_attention_heads": 4})");
    EXPECT_EQ(::symlink(("../../blobs/w" + hash).c_str(), (snap + "/model.safetensors").c_str()),
              0);
    EXPECT_EQ(::symlink(("../../blobs/c" + hash).c_str(), (snap + "/config.json").c_str()), 0);
  }
  void set_ref(const std::string& name, const std::string& hash) {
    testing::write_file(repo + "/refs/" + name, hash);  // huggingface_hub writes no newline
  }
};

TEST(HubCache, ResolvesBranchTagAndCommit) {
  FakeHub hub;
  hub.add_snapshot(kHash, {"a"});
  hub.add_snapshot(kHash2, {"a", "b"});
  hub.set_ref("main", kHash2);
  testing::make_dir(hub.repo + "/refs/tags");
  hub.set_ref("tags/v1", kHash);
  hub.set_ref("tags/newline", kHash + "\n");
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());

  Checkpoint c = open_checkpoint("org/tiny");
  EXPECT_EQ(c.revision, kHash2);
  EXPECT_EQ(c.repo_id, "org/tiny");
  EXPECT_EQ(c.num_tensors(), 2u);
  EXPECT_EQ(c.dir, hub.repo + "/snapshots/" + kHash2);
  EXPECT_EQ(c.config_path, c.dir + "/config.json");

  EXPECT_EQ(open_checkpoint("org/tiny", std::string("tags/v1")).revision, kHash);
  Checkpoint by_hash = open_checkpoint("org/tiny", kHash);
  EXPECT_EQ(by_hash.revision, kHash);
  EXPECT_EQ(by_hash.num_tensors(), 1u);
  // huggingface_hub reads a ref without stripping it: with a newline it resolves nothing (and
  // scan_cache_dir reports the repo corrupted), so neither does metaload.
  const std::string m = expect_error<ResolveError>([&] {
                          open_checkpoint("org/tiny", std::string("tags/newline"));
                        }).what();
  EXPECT_NE(m.find(hub.repo + "/refs/tags/newline: does not hold exactly a 40-hex commit hash"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("\\n"), std::string::npos) << m;  // the newline shown, escaped
}

TEST(HubCache, ARefIsACommitHashAndItsContentIsNeverQuoted) {
  FakeHub hub;
  hub.add_snapshot(kHash, {"a"});
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
  // A file outside the repo whose text must not reach a message.
  const std::string secret = hub.root / "secret.txt";
  testing::write_file(secret, "SECRET-TOKEN-1234\n");
  struct Case {
    std::string content, says;
  };
  const std::vector<Case> cases = {
      {"../../secret.txt", "byte 0 is \".\" (a path is no commit)"},
      {secret, "byte 0 is \"/\" (a path is no commit)"},
      {kHash + "\n", "byte 40 is \"\\n\" after the hash (41 bytes in all)"},
      {kHash + std::string(1 << 20, 'x'), "byte 40 is \"x\" after the hash (1048616 bytes in all)"},
      {std::string(5 << 20, '/'), "byte 0 is \"/\""},
      {kHash.substr(0, 39), "it is 39 bytes long"},
      {"ABCDEF" + kHash.substr(6), "byte 0 is \"A\", not a lowercase hex digit"},
  };
  for (const Case& c : cases) {
    hub.set_ref("main", c.content);
    const std::string m = expect_error<ResolveError>([&] { open_checkpoint("org/tiny"); }).what();
    EXPECT_NE(
        m.find(hub.repo + "/refs/main: does not hold exactly a 40-hex commit hash: " + c.says),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("(rule ref-not-commit)"), std::string::npos) << m;
    EXPECT_EQ(m.find("secret.txt"), std::string::npos) << m;
    EXPECT_LT(m.size(), 2000u) << m;
  }
  // A refs file linking out of refs/ is refused before it is read: the target's text never shows.
  ::unlink((hub.repo + "/refs/main").c_str());
  testing::write_file(secret, kHash);  // even a valid hash there resolves nothing
  ASSERT_EQ(::symlink(secret.c_str(), (hub.repo + "/refs/main").c_str()), 0);
  const FormatError e = expect_error<FormatError>([&] { open_checkpoint("org/tiny"); });
  EXPECT_EQ(e.rule(), "link-outside-repo");
  EXPECT_NE(std::string(e.what()).find("refs file is a symbolic link to"), std::string::npos)
      << e.what();
  EXPECT_EQ(std::string(e.what()).find(kHash), std::string::npos) << e.what();
}

TEST(HubCache, FailureListsEveryPlaceLooked) {
  FakeHub hub;
  hub.add_snapshot(kHash, {"a"});
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
  auto e = expect_error<ResolveError>([&] { open_checkpoint("org/tiny", std::string("dev")); });
  std::string m = e.what();
  EXPECT_NE(m.find("org/tiny: no such file or directory"), std::string::npos) << m;
  EXPECT_NE(m.find(hub.repo + "/refs/dev: no such file"), std::string::npos) << m;
  EXPECT_NE(m.find("not a 40-hex commit hash"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos);  // one line

  auto missing = expect_error<ResolveError>([&] { open_checkpoint("org/other"); });
  EXPECT_NE(std::string(missing.what()).find(hub.root / "models--org--other"), std::string::npos);
  EXPECT_NE(std::string(missing.what()).find("HF_HUB_CACHE"), std::string::npos);

  auto not_repo = expect_error<ResolveError>([&] { open_checkpoint("no such/../thing"); });
  EXPECT_NE(std::string(not_repo.what()).find("not a Hugging Face repo id"), std::string::npos);

  auto bad_rev =
      expect_error<ResolveError>([&] { open_checkpoint("org/tiny", std::string("../../x")); });
  EXPECT_NE(std::string(bad_rev.what()).find("not a valid branch"), std::string::npos);
}

TEST(HubCache, RootSelectionOrder) {
  ScopedEnv a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", nullptr),
      d("XDG_CACHE_HOME", nullptr), home("HOME", "/home/u");
  EXPECT_EQ(hf_hub_cache_root().path, "/home/u/.cache/huggingface/hub");
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(hf_hub_cache_root().path, "/xdg/huggingface/hub");
  ScopedEnv hf_home("HF_HOME", "/hfhome");
  EXPECT_EQ(hf_hub_cache_root().path, "/hfhome/hub");
  EXPECT_EQ(hf_hub_cache_root().source, "HF_HOME/hub");
  ScopedEnv empty("HF_HUB_CACHE", "");  // empty counts as unset
  EXPECT_EQ(hf_hub_cache_root().path, "/hfhome/hub");
  ScopedEnv hub("HF_HUB_CACHE", "/hub");
  EXPECT_EQ(hf_hub_cache_root().path, "/hub");
}

TEST(HubCache, HfHomeIsUsedWhenHubCacheUnset) {
  FakeHub hub("hub/models--org--tiny");  // <HF_HOME>/hub/models--...
  hub.add_snapshot(kHash, {"a"});
  hub.set_ref("main", kHash);
  ScopedEnv unset("HF_HUB_CACHE", nullptr), unset2("HUGGINGFACE_HUB_CACHE", nullptr);
  ScopedEnv home("HF_HOME", hub.root.path().c_str());
  EXPECT_EQ(open_checkpoint("org/tiny").revision, kHash);
}

TEST(HubCache, ShardedSnapshotMayPointIntoItsOwnBlobsOnly) {
  FakeHub hub;
  std::string snap = hub.repo + "/snapshots/" + kHash;
  testing::make_dir(snap);
  hub.set_ref("main", kHash);
  write_sharded(hub.repo + "/blobs");
  for (const char* f : {"a.safetensors", "b.safetensors", "model.safetensors.index.json"}) {
    ASSERT_EQ(::symlink((std::string("../../blobs/") + f).c_str(), (snap + "/" + f).c_str()), 0);
  }
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
  Checkpoint c = open_checkpoint("org/tiny");
  EXPECT_EQ(c.num_tensors(), 3u);
  EXPECT_EQ(c.files[0].path, snap + "/a.safetensors");
  // Opened as a plain directory, the snapshot is still recognised as one.
  EXPECT_EQ(open_checkpoint(snap).num_tensors(), 3u);

  // A shard symlinked into another repo's blobs is rejected.
  FakeHub other("models--evil--repo");
  write_single(other.repo + "/blobs/b", {"z"});
  ASSERT_EQ(::unlink((snap + "/b.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink((other.repo + "/blobs/b").c_str(), (snap + "/b.safetensors").c_str()), 0);
  auto outside = expect_error<ShardError>([&] { open_checkpoint("org/tiny"); });
  EXPECT_EQ(outside.rule(), "shard-outside-directory");
  EXPECT_EQ(outside.tensor(), "z");
}

TEST(HubCache, RepoIdShapes) {
  EXPECT_TRUE(looks_like_repo_id("gpt2"));
  EXPECT_TRUE(looks_like_repo_id("openai-community/gpt2"));
  EXPECT_TRUE(looks_like_repo_id("meta-llama/Llama-3.2-1B"));
  EXPECT_FALSE(looks_like_repo_id("a/b/c"));
  EXPECT_FALSE(looks_like_repo_id("/abs/path"));
  EXPECT_FALSE(looks_like_repo_id("a--b/c"));
  EXPECT_FALSE(looks_like_repo_id("a/.."));
  EXPECT_FALSE(looks_like_repo_id("-a/b"));
  EXPECT_FALSE(looks_like_repo_id(""));
  EXPECT_FALSE(looks_like_repo_id(std::string(97, 'a')));
  EXPECT_EQ(hf_repo_folder_name("openai-community/gpt2"), "models--openai-community--gpt2");
}

}  // namespace
}  // namespace metaload
