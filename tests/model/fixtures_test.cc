// make_checkpoint (model/fixtures.h): deterministic bytes, the HF layouts (single file, shards +
// index, hub cache tree), the values it promises, and every bad request. Torch-free.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/convert.h"
#include "loader/format/checkpoint.h"
#include "model/families/config.h"
#include "model/families/spec.h"
#include "model/fixtures.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::ScopedEnv;
using testing::TempDir;

FixtureOptions opts(const std::string& config, const std::string& arch = "") {
  FixtureOptions o;
  o.config = config;
  o.arch = arch;
  return o;
}

// The stored bytes of a tensor, read straight from its file.
std::string stored_bytes(const Checkpoint& c, const std::string& name) {
  const TensorInfo* t = c.find(name);
  if (!t) throw std::runtime_error("no tensor " + name);
  const std::string file = read_file(c.file_of(name)->path);
  return file.substr(c.file_of(name)->data_start + t->begin, t->end - t->begin);
}

std::vector<float> stored_floats(const Checkpoint& c, const std::string& name) {
  const TensorInfo* t = c.find(name);
  const std::string bytes = stored_bytes(c, name);
  FloatFormat from = FloatFormat::kF32;
  parse_float_format(dtype_name(t->dtype), &from);
  const size_t n = bytes.size() / float_format_size(from);
  std::vector<float> out(n);
  convert_cpu(bytes.data(), from, out.data(), FloatFormat::kF32, n);
  return out;
}

std::vector<std::string> file_digests(const FixtureResult& r) {
  std::vector<std::string> out;
  for (const auto& f : r.files) out.push_back(file_sha256(f));
  return out;
}

TEST(Fixtures, SameOptionsSameBytesOtherSeedOtherBytes) {
  TempDir a, b, c;
  FixtureOptions o = opts("llama-tiny", "llama");
  o.seed = 7;
  const FixtureResult ra = make_checkpoint(o, a / "ckpt");
  const FixtureResult rb = make_checkpoint(o, b / "ckpt");
  ASSERT_EQ(ra.files.size(), 2u);  // config.json, model.safetensors
  EXPECT_EQ(read_file(ra.files[1]), read_file(rb.files[1]));
  EXPECT_EQ(file_digests(ra), file_digests(rb));
  o.seed = 8;
  const FixtureResult rc = make_checkpoint(o, c / "ckpt");
  EXPECT_EQ(read_file(ra.files[0]), read_file(rc.files[0]));  // same config
  EXPECT_NE(read_file(ra.files[1]), read_file(rc.files[1]));
  EXPECT_NE(file_sha256(ra.files[1]), file_sha256(rc.files[1]));
  // The parameter count is the family's.
  EXPECT_EQ(ra.n_params, static_cast<uint64_t>(parameter_count(builtin_config("llama-tiny"))));
  EXPECT_EQ(ra.data_bytes, 4 * ra.n_params);
}

TEST(Fixtures, ValuesAreTheDocumentedOnes) {
  TempDir d;
  FixtureOptions o = opts("gpt2-tiny", "gpt2");
  o.seed = 3;
  o.buffers = true;
  make_checkpoint(o, d / "ckpt");
  const Checkpoint c = open_checkpoint(d / "ckpt");
  // Published GPT-2 names: no "transformer." prefix, masks stored, lm_head tied (absent).
  EXPECT_NE(c.find("wte.weight"), nullptr);
  EXPECT_EQ(c.find("transformer.wte.weight"), nullptr);
  EXPECT_EQ(c.find("lm_head.weight"), nullptr);
  ASSERT_NE(c.find("h.1.attn.bias"), nullptr);
  for (const std::string name : {"wte.weight", "h.0.attn.c_attn.weight", "h.1.ln_2.weight",
                                 "h.0.mlp.c_fc.bias", "h.1.attn.bias"}) {
    const TensorInfo* t = c.find(name);
    const std::vector<float> v = stored_floats(c, name);
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{v.size() / 2}, uint64_t{v.size() - 1}})
      EXPECT_EQ(v[i], fixture_value(name, t->shape, "gpt2", 10000, 3, i)) << name << " " << i;
  }
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / v.size();
    return std::make_pair(mean, std::sqrt(s2 / v.size() - mean * mean));
  };
  // Embeddings: std 0.25; Conv1D [in, out] = [64, 192]: std 2/sqrt(64); norms around 1.
  auto [m_e, s_e] = stats(stored_floats(c, "wte.weight"));
  EXPECT_NEAR(m_e, 0, 0.02);
  EXPECT_NEAR(s_e, 0.25, 0.01);
  auto [m_w, s_w] = stats(stored_floats(c, "h.0.attn.c_attn.weight"));
  EXPECT_NEAR(s_w, 2.0 / 8, 0.01);
  auto [m_n, s_n] = stats(stored_floats(c, "h.0.ln_1.weight"));
  EXPECT_NEAR(m_n, 1.0, 0.05);
  // The causal mask: 1 on and below the diagonal.
  const std::vector<float> mask = stored_floats(c, "h.0.attn.bias");
  const int64_t P = 64;
  EXPECT_EQ(mask[0 * P + 0], 1.0f);
  EXPECT_EQ(mask[0 * P + 1], 0.0f);
  EXPECT_EQ(mask[5 * P + 3], 1.0f);
  EXPECT_EQ(mask[(P - 1) * P + P - 1], 1.0f);
}

TEST(Fixtures, ShardsHoldTheSameTensorsAsOneFile) {
  TempDir d;
  FixtureOptions o = opts("llama-tiny-tied");
  const FixtureResult one = make_checkpoint(o, d / "one");
  o.shards = 3;
  const FixtureResult three = make_checkpoint(o, d / "three");
  ASSERT_EQ(three.files.size(), 5u);  // config, 3 shards, index
  EXPECT_NE(three.files.back().find("model.safetensors.index.json"), std::string::npos);
  EXPECT_NE(three.files[1].find("model-00001-of-00003.safetensors"), std::string::npos);
  const Checkpoint a = open_checkpoint(d / "one"), b = open_checkpoint(d / "three");
  ASSERT_TRUE(b.index_path.has_value());
  EXPECT_EQ(b.files.size(), 3u);
  ASSERT_EQ(a.tensor_names(), b.tensor_names());
  for (const std::string& n : a.tensor_names()) EXPECT_EQ(stored_bytes(a, n), stored_bytes(b, n));
}

TEST(Fixtures, HalfPrecisionIsTheRoundedFloat32) {
  TempDir d;
  FixtureOptions o = opts("qwen2-tiny");
  const FixtureResult f32 = make_checkpoint(o, d / "f32");
  o.dtype = DType::BF16;
  make_checkpoint(o, d / "bf16");
  o.dtype = DType::F16;
  make_checkpoint(o, d / "f16");
  const Checkpoint a = open_checkpoint(d / "f32"), b = open_checkpoint(d / "bf16"),
                   h = open_checkpoint(d / "f16");
  const std::string name = "model.layers.0.self_attn.q_proj.bias";
  EXPECT_EQ(b.find(name)->dtype, DType::BF16);
  EXPECT_EQ(h.find(name)->dtype, DType::F16);
  const std::vector<float> full = stored_floats(a, name);
  std::string want(full.size() * 2, '\0');
  convert_cpu(full.data(), FloatFormat::kF32, want.data(), FloatFormat::kBF16, full.size());
  EXPECT_EQ(stored_bytes(b, name), want);
  convert_cpu(full.data(), FloatFormat::kF32, want.data(), FloatFormat::kF16, full.size());
  EXPECT_EQ(stored_bytes(h, name), want);
  EXPECT_EQ(f32.n_params, static_cast<uint64_t>(parameter_count(builtin_config("qwen2-tiny"))));
}

TEST(Fixtures, SavedLayoutUsesModuleNames) {
  TempDir d;
  FixtureOptions o = opts("gpt2-tiny");
  o.layout = FixtureLayout::kSaved;
  make_checkpoint(o, d / "ckpt");
  const Checkpoint c = open_checkpoint(d / "ckpt");
  EXPECT_NE(c.find("transformer.wte.weight"), nullptr);
  EXPECT_EQ(c.find("wte.weight"), nullptr);
  EXPECT_EQ(c.find("lm_head.weight"), nullptr);  // tied: stored once
  // Same values under either name.
  TempDir e;
  make_checkpoint(opts("gpt2-tiny"), e / "ckpt");
  const Checkpoint p = open_checkpoint(e / "ckpt");
  EXPECT_EQ(stored_bytes(c, "transformer.h.1.mlp.c_proj.weight"),
            stored_bytes(p, "h.1.mlp.c_proj.weight"));
}

TEST(Fixtures, HubCacheTreeResolvesAndIsStable) {
  TempDir d;
  FixtureOptions o = opts("llama-tiny");
  o.hf_cache = d / "hub";
  o.repo = "metaload-test/llama-tiny";
  o.shards = 2;
  const FixtureResult r = make_checkpoint(o);
  ASSERT_TRUE(r.commit.has_value());
  EXPECT_EQ(r.commit->size(), 40u);
  const std::string repo_dir = d / "hub/models--metaload-test--llama-tiny";
  EXPECT_EQ(read_file(repo_dir + "/refs/main"), *r.commit);
  EXPECT_EQ(r.dir, repo_dir + "/snapshots/" + *r.commit);
  ASSERT_EQ(r.files.size(), 4u);
  for (const std::string& f : r.files) {
    struct stat st;
    ASSERT_EQ(::lstat(f.c_str(), &st), 0) << f;
    EXPECT_TRUE(S_ISLNK(st.st_mode)) << f;
    char target[512];
    const ssize_t n = ::readlink(f.c_str(), target, sizeof target);
    ASSERT_GT(n, 0);
    EXPECT_EQ(std::string(target, 12), "../../blobs/");
  }
  // Nothing else left behind (no staging directory).
  const std::string staging = repo_dir + "/.staging-" + std::to_string(::getpid());
  struct stat st;
  EXPECT_NE(::stat(staging.c_str(), &st), 0);
  {
    ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
    const Checkpoint c = open_checkpoint("metaload-test/llama-tiny");
    EXPECT_EQ(c.revision, r.commit);
    EXPECT_EQ(c.files.size(), 2u);
    EXPECT_TRUE(c.config_path.has_value());
  }
  // Writing again gives the same commit (the content is the same).
  const FixtureResult again = make_checkpoint(o);
  EXPECT_EQ(again.commit, r.commit);
}

TEST(Fixtures, HubCacheBlobsAreNamedBySha256) {
  TempDir d;
  // The digest itself, against FIPS 180-4's examples.
  testing::write_file(d / "abc", "abc");
  EXPECT_EQ(file_sha256(d / "abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  testing::write_file(d / "empty", "");
  EXPECT_EQ(file_sha256(d / "empty"),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  FixtureOptions o = opts("gpt2-tiny");
  o.hf_cache = d / "hub";
  o.repo = "metaload-test/gpt2-tiny";
  const FixtureResult r = make_checkpoint(o);
  ASSERT_FALSE(r.files.empty());
  for (const std::string& f : r.files) {
    char target[512];
    const ssize_t n = ::readlink(f.c_str(), target, sizeof target);
    ASSERT_GT(n, 0) << f;
    EXPECT_EQ(std::string(target, n), "../../blobs/" + file_sha256(f)) << f;
  }
}

TEST(Fixtures, HubCacheNeverRepointsARepoItDidNotCreate) {
  TempDir d;
  // A repo as a download leaves it: refs/main names a snapshot; no marker.
  const std::string repo_dir = d / "hub/models--metaload-test--real";
  const std::string commit(40, 'a');
  ASSERT_EQ(::mkdir((d / "hub").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(repo_dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((repo_dir + "/refs").c_str(), 0755), 0);
  testing::write_file(repo_dir + "/refs/main", commit);
  FixtureOptions o = opts("gpt2-tiny");
  o.hf_cache = d / "hub";
  o.repo = "metaload-test/real";
  const std::string m = expect_error<FixtureError>([&] { make_checkpoint(o); }).what();
  EXPECT_NE(m.find("refusing to repoint refs/main of 'metaload-test/real'"), std::string::npos)
      << m;
  EXPECT_NE(m.find(repo_dir), std::string::npos) << m;
  // Nothing written: the ref, no staging, no blobs, no marker.
  EXPECT_EQ(read_file(repo_dir + "/refs/main"), commit);
  struct stat st;
  EXPECT_NE(::stat((repo_dir + "/blobs").c_str(), &st), 0);
  EXPECT_NE(::stat((repo_dir + "/.metaload-fixture").c_str(), &st), 0);
  EXPECT_NE(::stat((repo_dir + "/.staging-" + std::to_string(::getpid())).c_str(), &st), 0);
  // A repo make_checkpoint created carries the marker, so it may be written again.
  o.repo = "metaload-test/made";
  const FixtureResult first = make_checkpoint(o);
  EXPECT_EQ(::stat((d / "hub/models--metaload-test--made/.metaload-fixture").c_str(), &st), 0);
  o.seed = 7;  // other bytes: refs/main moves to the new snapshot
  const FixtureResult second = make_checkpoint(o);
  EXPECT_NE(second.commit, first.commit);
  EXPECT_EQ(read_file(d / "hub/models--metaload-test--made/refs/main"), *second.commit);
}

// Tags share refs/ with branches; a pull request's ref "refs/pr/N" is kept at refs/refs/pr/N, as
// huggingface_hub lays them out. A name that could leave refs/ is refused before anything is
// written.
TEST(Fixtures, HubCacheRefsOfTagsAndPullRequests) {
  TempDir d;
  FixtureOptions o = opts("gpt2-tiny");
  o.hf_cache = d / "hub";
  o.repo = "metaload-test/refs";
  const std::string repo_dir = d / "hub/models--metaload-test--refs";
  for (const char* ref : {"v1.0", "refs/pr/3", "feature/x"}) {
    o.branch = ref;
    ++o.seed;
    const FixtureResult r = make_checkpoint(o);
    EXPECT_EQ(read_file(repo_dir + "/refs/" + ref), *r.commit) << ref;
  }
  for (const char* bad : {"", "a/../b", "/x", "x/", "a//b", "..", "a b"}) {
    o.branch = bad;
    o.repo = "metaload-test/bad";
    try {
      make_checkpoint(o);
      ADD_FAILURE() << "no error for ref " << bad;
    } catch (const FixtureError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a ref name"), std::string::npos) << e.what();
    }
    struct stat st;
    EXPECT_NE(::stat((d / "hub/models--metaload-test--bad").c_str(), &st), 0) << bad;
  }
}

// The real gpt2 config's fixture: the published parameter count, stored as float32 in full. How
// long it takes to write: bench/model ("fixture" row); a unit test asserts no time.
TEST(Fixtures, Gpt2SizedCheckpointHasThePublishedCount) {
  TempDir d;
  const FixtureResult r = make_checkpoint(opts("gpt2", "gpt2"), d / "gpt2");
  EXPECT_EQ(r.n_params, 124439808u);        // the published count
  EXPECT_GE(r.data_bytes, 4 * r.n_params);  // float32 (buffers add to it)
  uint64_t on_disk = 0;
  for (const std::string& f : r.files) {
    struct stat st;
    ASSERT_EQ(::stat(f.c_str(), &st), 0) << f;
    if (f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0) on_disk += st.st_size;
  }
  EXPECT_GT(on_disk, r.data_bytes);  // every tensor byte, and the headers
}

TEST(Fixtures, BadRequestsAreTypedErrors) {
  TempDir d;
  auto msg = [&](FixtureOptions o, const std::string& out) {
    return std::string(expect_error<Error>([&] { make_checkpoint(o, out); }).what());
  };
  EXPECT_NE(msg(opts("llama-tiny", "gpt2"), d / "a")
                .find("--arch gpt2 but builtin:llama-tiny is a llama"),
            std::string::npos);
  EXPECT_NE(msg(opts("gpt5"), d / "b").find("neither a built-in config"), std::string::npos);
  FixtureOptions o = opts("gpt2-tiny");
  o.dtype = DType::I32;
  EXPECT_NE(msg(o, d / "c").find("dtype I32 is not one of F32, F16, BF16"), std::string::npos);
  o = opts("gpt2-tiny");
  o.shards = 0;
  EXPECT_NE(msg(o, d / "c").find("--shards must be >= 1"), std::string::npos);
  o = opts("gpt2-tiny");
  o.repo = "a/b";
  EXPECT_NE(msg(o, "").find("needs both"), std::string::npos);
  o.hf_cache = d / "hub";
  o.repo = "not a repo";
  EXPECT_NE(msg(o, "").find("is not a Hugging Face repo id"), std::string::npos);
  o.repo = "a/b";
  EXPECT_NE(msg(o, d / "x").find("not both"), std::string::npos);
  o = opts("gpt2-tiny");
  o.layout = FixtureLayout::kSaved;
  o.buffers = true;
  EXPECT_NE(msg(o, d / "y").find("published layout"), std::string::npos);
  // A non-empty output directory is refused (stale shards would mix in).
  make_checkpoint(opts("gpt2-tiny"), d / "full");
  EXPECT_NE(msg(opts("gpt2-tiny"), d / "full").find("is not empty"), std::string::npos);
  // A config.json the families reject: ConfigError names the field.
  testing::write_file(d / "bert.json", R"({"model_type": "bert", "vocab_size": 10})");
  EXPECT_NE(msg(opts(d / "bert.json"), d / "z").find("model_type"), std::string::npos);
  expect_error<ConfigError>([&] { make_checkpoint(opts(d / "bert.json"), d / "z2"); });
}

}  // namespace
}  // namespace metaload
