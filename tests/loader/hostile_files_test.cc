// Hostile and unlucky files for the torch-free readers: JSON nested past kMaxJsonDepth, things
// that are not regular files where a file is expected (a FIFO, a directory, a device, a socket, a
// symbolic link loop), and hub snapshot links that lead out of their repo. Every reader refuses
// them with a typed error saying what it found, and none blocks: each call runs under a watchdog
// that fails the test (and releases the reader) when it hangs.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "loader/format/checkpoint.h"
#include "loader/format/file_io.h"
#include "loader/format/hf_cache.h"
#include "loader/format/json_util.h"
#include "loader/format/writer.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::ScopedEnv;
using testing::TempDir;

std::string nested_arrays(size_t depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::string nested_objects(size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

void write_single(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w(path);
  for (const auto& n : names) w.add(n, DType::F32, {2}, nullptr);
  w.write();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Deep JSON

TEST(JsonDepth, EveryParserStopsAtTheOneLimit) {
  EXPECT_NO_THROW(parse_json_strict(nested_arrays(kMaxJsonDepth), "f.json"));
  EXPECT_NO_THROW(parse_json(nested_arrays(kMaxJsonDepth), "f.json"));
  for (const std::string& deep : {nested_arrays(kMaxJsonDepth + 1),
                                  nested_objects(kMaxJsonDepth + 1), nested_arrays(1'000'000)}) {
    for (bool strict : {true, false}) {
      auto e = expect_error<FormatError>(
          [&] { strict ? parse_json_strict(deep, "f.json") : parse_json(deep, "f.json"); });
      EXPECT_EQ(e.rule(), "json-too-deep");
      EXPECT_EQ(e.file(), "f.json");
      EXPECT_TRUE(contains(e.what(), std::to_string(kMaxJsonDepth))) << e.what();
    }
  }
}

TEST(JsonDepth, IndexMetadataNestedDeepIsRefusedNotACrash) {
  // 100,000 nested arrays in "metadata" (200 KB) overflowed the stack when the index was copied.
  TempDir dir;
  write_single(dir / "a.safetensors", {"x"});
  const std::string index = R"({"metadata": {"deep": )" + nested_arrays(100'000) +
                            R"(}, "weight_map": {"x": "a.safetensors"}})";
  testing::write_file(dir / "model.safetensors.index.json", index);
  auto parsed =
      expect_error<ShardError>([&] { parse_safetensors_index(index, "model.index.json"); });
  EXPECT_EQ(parsed.rule(), "json-too-deep");
  auto opened = expect_error<ShardError>([&] { open_checkpoint(dir.path()); });
  EXPECT_EQ(opened.rule(), "json-too-deep");
  EXPECT_EQ(opened.file(), dir / "model.safetensors.index.json");
  // At the limit it is an ordinary index.
  const std::string ok = R"({"metadata": {"deep": )" + nested_arrays(kMaxJsonDepth - 2) +
                         R"(}, "weight_map": {"x": "a.safetensors"}})";
  EXPECT_EQ(parse_safetensors_index(ok, "i.json").weight_map.size(), 1u);
}

TEST(JsonDepth, ConfigNestedDeepIsRefusedNamingTheFile) {
  TempDir dir;
  write_single(dir / "model.safetensors", {"x"});
  testing::write_file(dir / "config.json",
                      R"({"model_type": "gpt2", "deep": )" + nested_objects(70'000) + "}");
  auto e = expect_error<FormatError>([&] { read_config_json(dir / "config.json"); });
  EXPECT_EQ(e.rule(), "json-too-deep");
  EXPECT_EQ(e.file(), dir / "config.json");
}

TEST(JsonDepth, HeaderUnknownFieldsAreSkippedOnlyUpToTheLimit) {
  // Unknown fields of an entry are ignored, but still counted: top object, entry, then the field.
  auto header = [](size_t field_depth) {
    return testing::raw_safetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" +
                                        nested_arrays(field_depth) + "}}",
                                    1);
  };
  EXPECT_EQ(parse_safetensors_bytes(header(kMaxJsonDepth - 2), "ok.safetensors").tensors.size(),
            1u);
  for (size_t depth : {size_t(kMaxJsonDepth - 1), size_t(5'000'000)}) {
    auto e = expect_error<FormatError>([&] { parse_safetensors_bytes(header(depth), "d.st"); });
    EXPECT_EQ(e.rule(), "json-too-deep");
    EXPECT_EQ(e.tensor(), "w");
  }
}

// ---------------------------------------------------------------------------------------------
// Non-regular files

// What f threw through run_unblocked: the message and (for a FormatError) the rule; nullopt when
// it threw nothing.
std::optional<std::string> run_guarded(const std::function<void()>& f,
                                       const std::vector<std::string>& fifos,
                                       std::string* rule = nullptr) {
  try {
    testing::run_unblocked(f, fifos);
  } catch (const FormatError& e) {
    if (rule) *rule = e.rule();
    return std::string(e.what());
  } catch (const Error& e) {
    if (rule) *rule = "";
    return std::string(e.what());
  }
  return std::nullopt;
}

// Makes something that is not a regular file at `path`; returns the words messages use for it.
struct Odd {
  const char* kind;
  const char* words;
};
const Odd kOdd[] = {{"fifo", "a FIFO"},
                    {"directory", "a directory"},
                    {"device", "a character device"},
                    {"socket", "a socket"},
                    {"loop", "a symbolic link loop"}};

// Listening Unix sockets, closed and removed at the end. sun_path is short: a socket whose path
// would not fit is bound in a short directory under /tmp, with a link to it at the path.
class Sockets {
 public:
  ~Sockets() {
    for (int fd : fds_) ::close(fd);
    for (const auto& p : bound_) ::unlink(p.c_str());
    for (const auto& d : dirs_) ::rmdir(d.c_str());
  }
  void make(const std::string& path) {
    std::string at = path;
    if (at.size() >= sizeof(sockaddr_un::sun_path)) {
      std::string tmpl = "/tmp/metaload-sock-XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
      dirs_.push_back(tmpl);
      at = tmpl + "/s";
      ASSERT_EQ(::symlink(at.c_str(), path.c_str()), 0);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    fds_.push_back(fd);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", at.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << at;
    bound_.push_back(at);
  }

 private:
  std::vector<int> fds_;
  std::vector<std::string> bound_, dirs_;
};

void make_odd(const std::string& kind, const std::string& path, Sockets& sockets,
              std::vector<std::string>& fifos) {
  if (kind == "fifo") {
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
    fifos.push_back(path);
  } else if (kind == "directory") {
    testing::make_dir(path);
  } else if (kind == "device") {
    ASSERT_EQ(::symlink("/dev/null", path.c_str()), 0);  // stat follows it to the device
  } else if (kind == "socket") {
    sockets.make(path);
  } else {
    ASSERT_EQ(::symlink((path + ".loop").c_str(), path.c_str()), 0);
    ASSERT_EQ(::symlink(path.c_str(), (path + ".loop").c_str()), 0);
  }
}

// Each case puts the odd thing at one name a reader expects to be a file, then reads.
struct Case {
  const char* name;
  const char* file;  // inside the checkpoint directory
  std::function<void(const std::string& dir)> setup;
  std::function<void(const std::string& dir)> read;
};

std::vector<Case> cases() {
  auto sharded = [](const std::string& dir) {
    write_single(dir + "/a.safetensors", {"x"});
    testing::write_file(dir + "/model.safetensors.index.json",
                        R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  };
  auto single = [](const std::string& dir) { write_single(dir + "/model.safetensors", {"x"}); };
  return {
      {"read_safetensors_header", "w.safetensors", [](const std::string&) {},
       [](const std::string& d) { read_safetensors_header(d + "/w.safetensors"); }},
      {"read_safetensors_index", "i.index.json", [](const std::string&) {},
       [](const std::string& d) { read_safetensors_index(d + "/i.index.json"); }},
      {"read_config_json", "config.json", [](const std::string&) {},
       [](const std::string& d) { read_config_json(d + "/config.json"); }},
      {"open_checkpoint: model.safetensors", "model.safetensors", [](const std::string&) {},
       [](const std::string& d) { open_checkpoint(d); }},
      {"open_checkpoint: the index", "model.safetensors.index.json", [](const std::string&) {},
       [](const std::string& d) { open_checkpoint(d); }},
      {"open_checkpoint: a shard the index names", "b.safetensors", sharded,
       [](const std::string& d) { open_checkpoint(d); }},
      {"open_checkpoint: the only *.safetensors", "weights.safetensors", [](const std::string&) {},
       [](const std::string& d) { open_checkpoint(d); }},
      {"open_checkpoint: config.json", "config.json", single,
       [](const std::string& d) { open_checkpoint(d); }},
  };
}

TEST(NonRegularFiles, EveryReaderSaysWhatItFoundAndNoneBlocks) {
  for (const Case& c : cases()) {
    for (const Odd& odd : kOdd) {
      SCOPED_TRACE(std::string(c.name) + " on " + odd.kind);
      TempDir dir;
      Sockets sockets;
      std::vector<std::string> fifos;
      c.setup(dir.path());
      make_odd(odd.kind, dir / c.file, sockets, fifos);
      std::string rule;
      auto err = run_guarded([&] { c.read(dir.path()); }, fifos, &rule);
      ASSERT_TRUE(err) << "accepted";
      EXPECT_EQ(rule, "not-a-file") << *err;
      EXPECT_TRUE(contains(*err, odd.words)) << *err;
      // The file is named (a shard by its name in the index, and the directory).
      EXPECT_TRUE(contains(*err, c.file)) << *err;
      EXPECT_TRUE(contains(*err, dir.path())) << *err;
      EXPECT_FALSE(contains(*err, "no safetensors weights")) << *err;
    }
  }
}

TEST(NonRegularFiles, FileOpensWithoutBlockingAndReportsTheKind) {
  TempDir dir;
  std::vector<std::string> fifos;
  Sockets sockets;
  make_odd("fifo", dir / "p", sockets, fifos);
  EXPECT_EQ(fileio::file_kind(dir / "p"), "a FIFO (named pipe)");
  EXPECT_EQ(fileio::file_kind(dir.path()), "a directory");
  EXPECT_EQ(fileio::file_kind(dir / "none"), "nothing");
  ASSERT_EQ(::symlink("none", (dir / "dangling").c_str()), 0);
  EXPECT_EQ(fileio::file_kind(dir / "dangling"), "a dangling symbolic link");
  EXPECT_TRUE(fileio::exists(dir / "dangling"));
  EXPECT_FALSE(fileio::exists(dir / "none"));
  auto e = run_guarded([&] { fileio::File f(dir / "p"); }, fifos);
  ASSERT_TRUE(e);
  EXPECT_TRUE(contains(*e, "is a FIFO (named pipe), not a regular file")) << *e;
  auto d = run_guarded([&] { fileio::File f(dir / "dangling"); }, {});
  ASSERT_TRUE(d);
  EXPECT_TRUE(contains(*d, "dangling symbolic link")) << *d;
}

TEST(NonRegularFiles, ReferenceThatIsALinkLoopOrAFifoSaysSo) {
  TempDir dir;
  Sockets sockets;
  std::vector<std::string> fifos;
  make_odd("loop", dir / "ck", sockets, fifos);
  auto loop = expect_error<ResolveError>([&] { open_checkpoint(dir / "ck"); });
  EXPECT_TRUE(contains(loop.what(), dir / "ck: is a symbolic link loop")) << loop.what();
  make_odd("fifo", dir / "p.safetensors", sockets, fifos);
  auto fifo = run_guarded([&] { open_checkpoint(dir / "p.safetensors"); }, fifos);
  ASSERT_TRUE(fifo);
  EXPECT_TRUE(contains(*fifo, "is a FIFO")) << *fifo;
}

// A hub cache laid out as huggingface_hub writes it: snapshot files are symlinks into blobs/.
struct FakeHub {
  TempDir root;
  std::string repo = root / "models--org--tiny";
  std::string snap = repo + "/snapshots/" + testing::kCommitHash;

  FakeHub() {
    for (const std::string& d : {repo, repo + "/blobs", repo + "/refs", repo + "/snapshots", snap})
      testing::make_dir(d);
    write_single(repo + "/blobs/w", {"x"});
    testing::write_file(repo + "/blobs/c", R"({"model_type": "gpt2"})");
    EXPECT_EQ(::symlink("../../blobs/w", (snap + "/model.safetensors").c_str()), 0);
    EXPECT_EQ(::symlink("../../blobs/c", (snap + "/config.json").c_str()), 0);
  }
  void set_main(const std::string& content) { testing::write_file(repo + "/refs/main", content); }
};

TEST(NonRegularFiles, HubRefThatIsNoFileSaysWhatItIs) {
  for (const Odd& odd : kOdd) {
    SCOPED_TRACE(odd.kind);
    FakeHub hub;
    Sockets sockets;
    std::vector<std::string> fifos;
    make_odd(odd.kind, hub.repo + "/refs/main", sockets, fifos);
    ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
    std::string rule;
    auto err = run_guarded([&] { open_checkpoint("org/tiny"); }, fifos, &rule);
    ASSERT_TRUE(err);
    EXPECT_TRUE(contains(*err, "[metaload.ResolveError]")) << *err;
    EXPECT_TRUE(contains(*err, hub.repo + "/refs/main: is " + odd.words)) << *err;
    EXPECT_FALSE(contains(*err, "refs/main: no such file")) << *err;
  }
}

// ---------------------------------------------------------------------------------------------
// Hub snapshot links stay inside their repo

TEST(SnapshotLinks, FilesMustLeadIntoTheRepoBlobStore) {
  TempDir elsewhere;
  write_single(elsewhere / "evil.safetensors", {"x"});
  testing::write_file(elsewhere / "config.json", R"({"model_type": "gpt2"})");
  testing::write_file(elsewhere / "index.json", R"({"weight_map": {"x": "a.safetensors"}})");
  struct Swap {
    const char* name;  // the snapshot file replaced by a link out of the repo
    std::string target;
  };
  for (const Swap& s : {Swap{"model.safetensors", elsewhere / "evil.safetensors"},
                        Swap{"config.json", elsewhere / "config.json"},
                        Swap{"model.safetensors.index.json", elsewhere / "index.json"}}) {
    SCOPED_TRACE(s.name);
    FakeHub hub;
    hub.set_main(testing::kCommitHash);
    if (std::string(s.name) == "model.safetensors.index.json") {
      // A sharded snapshot: a.safetensors leads into the blobs, the index out of the repo.
      ASSERT_EQ(::unlink((hub.snap + "/model.safetensors").c_str()), 0);
      ASSERT_EQ(::symlink("../../blobs/w", (hub.snap + "/a.safetensors").c_str()), 0);
      testing::write_file(hub.repo + "/blobs/i", R"({"weight_map": {"x": "a.safetensors"}})");
      ASSERT_EQ(::symlink("../../blobs/i", (hub.snap + "/" + s.name).c_str()), 0);
    }
    ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
    ASSERT_EQ(open_checkpoint("org/tiny").num_tensors(), 1u);  // as downloaded: fine
    const std::string link = hub.snap + "/" + s.name;
    ASSERT_EQ(::unlink(link.c_str()), 0);
    ASSERT_EQ(::symlink(s.target.c_str(), link.c_str()), 0);
    // Resolved from the repo id, and opened as a directory that is a snapshot.
    for (const std::string& ref : {std::string("org/tiny"), hub.snap}) {
      auto e = expect_error<FormatError>([&] { open_checkpoint(ref); });
      EXPECT_EQ(e.rule(), "link-outside-repo") << e.what();
      EXPECT_EQ(e.file(), link);
      EXPECT_TRUE(contains(e.what(), s.target)) << e.what();
      EXPECT_TRUE(contains(e.what(), hub.repo + "/blobs")) << e.what();
    }
  }
  // A file the user names directly may be a link anywhere, in a snapshot or not.
  FakeHub hub;
  const std::string link = hub.snap + "/model.safetensors";
  ASSERT_EQ(::unlink(link.c_str()), 0);
  ASSERT_EQ(::symlink((elsewhere / "evil.safetensors").c_str(), link.c_str()), 0);
  EXPECT_EQ(open_checkpoint(link).num_tensors(), 1u);
  TempDir mine;
  ASSERT_EQ(::symlink((elsewhere / "evil.safetensors").c_str(), (mine / "m.safetensors").c_str()),
            0);
  EXPECT_EQ(open_checkpoint(mine / "m.safetensors").num_tensors(), 1u);
  EXPECT_EQ(open_checkpoint(mine.path()).num_tensors(), 1u);  // a plain directory of the user's
}

TEST(SnapshotLinks, SnapshotFilesStoredWithoutLinksAreFine) {
  FakeHub hub;
  hub.set_main(testing::kCommitHash);
  ::unlink((hub.snap + "/model.safetensors").c_str());
  write_single(hub.snap + "/model.safetensors", {"x", "y"});  // a cache written without symlinks
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
  EXPECT_EQ(open_checkpoint("org/tiny").num_tensors(), 2u);
}

TEST(SnapshotLinks, SnapshotDirectoryMustStayInTheRepo) {
  FakeHub hub;
  hub.set_main(testing::kCommitHash);
  ScopedEnv cache("HF_HUB_CACHE", hub.root.path().c_str());
  // A snapshot linked to a sibling snapshot of the same repo resolves.
  const std::string other = "fedcba9876543210fedcba9876543210fedcba98";
  ASSERT_EQ(::symlink(testing::kCommitHash.c_str(), (hub.repo + "/snapshots/" + other).c_str()), 0);
  EXPECT_EQ(open_checkpoint("org/tiny", other).num_tensors(), 1u);
  // One linked anywhere else on the disk is refused, naming the link and its target.
  TempDir elsewhere;
  write_single(elsewhere / "model.safetensors", {"x"});
  const std::string bad = "1111111111111111111111111111111111111111";
  const std::string link = hub.repo + "/snapshots/" + bad;
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), link.c_str()), 0);
  auto e = expect_error<FormatError>([&] { open_checkpoint("org/tiny", bad); });
  EXPECT_EQ(e.rule(), "link-outside-repo");
  EXPECT_EQ(e.file(), link);
  EXPECT_TRUE(contains(e.what(), elsewhere.path())) << e.what();
  auto r = expect_error<FormatError>([&] { resolve_hf_snapshot("org/tiny", bad); });
  EXPECT_EQ(r.rule(), "link-outside-repo");
}

TEST(SnapshotLinks, CheckSnapshotFileDirectly) {
  FakeHub hub;
  EXPECT_NO_THROW(check_snapshot_file(hub.snap + "/model.safetensors", hub.snap, hub.repo));
  EXPECT_EQ(hf_repo_of_snapshot(fileio::real_path(hub.snap)), fileio::real_path(hub.repo));
  EXPECT_EQ(hf_repo_of_snapshot(fileio::real_path(hub.repo)), std::nullopt);
  TempDir elsewhere;
  testing::write_file(elsewhere / "f", "x");
  ASSERT_EQ(::symlink((elsewhere / "f").c_str(), (hub.snap + "/x").c_str()), 0);
  auto e =
      expect_error<FormatError>([&] { check_snapshot_file(hub.snap + "/x", hub.snap, hub.repo); });
  EXPECT_EQ(e.rule(), "link-outside-repo");
  EXPECT_TRUE(contains(e.what(), "is a symbolic link to \"" + elsewhere / "f" + "\"")) << e.what();
  // A link loop in a snapshot says so rather than "outside".
  ASSERT_EQ(::symlink("y", (hub.snap + "/y").c_str()), 0);
  auto loop =
      expect_error<FormatError>([&] { check_snapshot_file(hub.snap + "/y", hub.snap, hub.repo); });
  EXPECT_EQ(loop.rule(), "not-a-file");
}

}  // namespace
}  // namespace metaload
