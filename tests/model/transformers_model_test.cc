// TransformersModel on generated checkpoints: construction reads config.json only, scan never
// loads, dispatch loads into the same Parameter objects once, buffers equal an eager build's,
// module access and captures, model keys, tensor parallelism, and every error path (the model
// stays meta and usable after a failed dispatch, and a retry works).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>

#include <atomic>
#include <fstream>
#include <map>
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/checked.h"
#include "c10_ext/meta_mode.h"
#include "fake_mode/fake_tensor.h"
#include "loader/engine/engine_device.h"
#include "loader/format/safetensors.h"
#include "loader/load/plan.h"
#include "loader/load/slots_torch.h"
#include "model/fixtures.h"
#include "identity/registry.h"
#include "identity/tp_degree.h"
#include "model/transformers_model.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::ScopedCwd;
using testing::ScopedEnv;
using testing::TempDir;

std::string make(const std::string& config, const std::string& dir, int shards = 1,
                 DType dtype = DType::F32) {
  FixtureOptions o;
  o.config = config;
  o.shards = shards;
  o.dtype = dtype;
  o.seed = 11;
  return make_checkpoint(o, dir).dir;
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// An eager (real, CPU) build of the same config whose parameters come from the checkpoint through
// the loader, as an independent route to the same weights.
std::shared_ptr<CausalLM> eager_from(const std::string& dir) {
  auto model = build_causal_lm(load_family_config(dir + "/config.json"));
  LoadOptions lo;
  lo.names.checkpoint_to_module = [c = model->config()](const std::string& n) {
    return map_checkpoint_name(c, n);
  };
  lo.names.tied = model->tied_parameter_groups();
  std::set<std::string> buffers;
  for (const BufferSpec& b : model->buffer_specs()) buffers.insert(b.name);
  lo.names.skip = [buffers](const std::string& n) { return buffers.count(n) > 0; };
  load(*model, dir, lo);
  return model;
}

at::Tensor ids_for(const TransformersModel& m, int64_t batch, int64_t seq, int64_t seed) {
  return at::randint(m.config().vocab_size, {batch, seq},
                     at::make_generator<at::CPUGeneratorImpl>(seed), at::kLong);
}

// Counts reads of the data engine (the hook runs once per piece read).
struct EngineCounter {
  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0);
  void attach(ModelOptions& o) const {
    auto r = reads;
    o.engine.hooks.after_read = [r](size_t) { ++*r; };
  }
};

bool all_meta(const TransformersModel& m) {
  for (const auto& p : m.module().parameters())
    if (!p.is_meta()) return false;
  return true;
}

// Built-in config `config` as the hub cache repo metaload-test/<config> under d/hub.
FixtureResult hub_checkpoint(const TempDir& d, const std::string& config) {
  FixtureOptions f;
  f.config = config;
  f.hf_cache = d / "hub";
  f.repo = "metaload-test/" + config;
  return make_checkpoint(f);
}

TEST(TransformersModel, ConstructionReadsConfigJsonOnly) {
  TempDir d;
  const std::string dir = make("llama-tiny", d / "ckpt", /*shards=*/2);
  EngineCounter engine;
  ModelOptions o;
  engine.attach(o);
  reset_io_bytes_read();
  TransformersModel m(dir, o);
  // Exactly config.json's bytes: no safetensors header, no index, no weight byte.
  EXPECT_EQ(io_bytes_read(), file_size(dir + "/config.json"));
  EXPECT_EQ(*engine.reads, 0);
  EXPECT_TRUE(all_meta(m));
  for (const auto& b : m.module().buffers()) EXPECT_TRUE(b.is_meta());
  EXPECT_FALSE(m.dispatched());
  EXPECT_EQ(m.module().name(), "LlamaForCausalLM");
  EXPECT_GT(m.build_seconds(), 0);  // reported (how long it takes: bench/model, "construct")
  // A file reference works too: its directory's config.json.
  TransformersModel by_file(dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(by_file.config_path(), m.config_path());
}

TEST(TransformersModel, SkeletonsOfRealSizes) {
  // Every real-size built-in: the vocabulary and the width of layer 0's key projection (GPT-2: its
  // fused c_attn) as published. A built-in missing here fails, so new ones get checked too. How
  // long each skeleton takes to build: bench/model ("skeleton" rows); a unit test asserts no time.
  struct Want {
    int64_t vocab;
    std::string key_path;
    int64_t key_width;
  };
  const std::map<std::string, Want> want = {
      {"gpt2", {50257, "transformer.h.0.attn.c_attn", 3 * 768}},
      {"llama-2-7b", {32000, "model.layers.0.self_attn.k_proj", 32 * 128}},
      {"llama-2-70b", {32000, "model.layers.0.self_attn.k_proj", 8 * 128}},
      {"llama-3.2-1b", {128256, "model.layers.0.self_attn.k_proj", 8 * 64}},
      {"mistral-7b-v0.1", {32000, "model.layers.0.self_attn.k_proj", 8 * 128}},
      {"qwen2.5-0.5b", {151936, "model.layers.0.self_attn.k_proj", 2 * 64}},
  };
  TempDir d;
  int checked = 0;
  for (const std::string& name : builtin_config_names()) {
    if (name.find("tiny") != std::string::npos) continue;
    ++checked;
    const auto w = want.find(name);
    ASSERT_NE(w, want.end()) << "real built-in config '" << name << "' has no expected shapes here";
    testing::make_dir(d / name);
    testing::write_file(d / (name + "/config.json"), builtin_config_json(name));
    TransformersModel m(d / name);
    // A small batch on fake cuda:0 (no GPU needed): shapes only, no weight byte.
    const ModelScan scan = m.scan(1, 16, at::Device("cuda:0"));
    EXPECT_TRUE(all_meta(m)) << name;
    EXPECT_TRUE(is_fake(scan.logits)) << name;
    EXPECT_EQ(scan.logits.sizes(), (at::IntArrayRef{1, 16, w->second.vocab})) << name;
    ASSERT_NE(scan.find(w->second.key_path), nullptr) << name;
    EXPECT_EQ(scan.find(w->second.key_path)->sizes,
              (std::vector<int64_t>{1, 16, w->second.key_width}))
        << name;
    EXPECT_EQ(scan.find(w->second.key_path)->device, at::Device("cuda:0")) << name;
  }
  EXPECT_EQ(checked, static_cast<int>(want.size()));
}

// Byte counts past 64 bits are typed errors naming the quantity: never a total that wrapped
// (44e9 x 1024 on GPT-2 used to report less than lm_head alone), never torch's "internal error".
TEST(TransformersModel, ScanSizesPast64BitsAreNamedErrors) {
  TempDir d;
  testing::make_dir(d / "gpt2");
  testing::write_file(d / "gpt2/config.json", builtin_config_json("gpt2"));
  TransformersModel m(d / "gpt2");
  try {
    m.scan(44000000000, 1024);
    FAIL() << "the total wrapped";
  } catch (const SizeOverflowError& e) {
    EXPECT_NE(e.message().find("total output bytes of the scan (163 modules): "), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("overflows (more than 2^64-1)"), std::string::npos);
  }
  // Larger: one activation passes torch's own int64 limit (its c10::Error, typed here).
  try {
    m.scan(440000000000, 1024);
    FAIL();
  } catch (const SizeOverflowError& e) {
    EXPECT_NE(e.message().find("bytes of an activation in the scan of ids [440000000000, 1024], "
                               "after module \"transformer.h.0.attn.c_attn\": overflows (more "
                               "than 2^63-1)"),
              std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("Exception raised from"), std::string::npos);
  }
  expect_error<SizeOverflowError>([&] { m.scan(INT64_MAX, 2); });
  // A module's own bytes, checked where they are computed.
  ModuleShape huge{"lm_head", "Linear", {int64_t{1} << 40, int64_t{1} << 40}, at::kFloat};
  expect_error<SizeOverflowError>([&] { huge.bytes(); });
  // The model still scans after the errors.
  EXPECT_EQ(m.scan(2, 3).logits.sizes(), (at::IntArrayRef{2, 3, 50257}));
}

TEST(TransformersModel, ScanNeverLoads) {
  TempDir d;
  const std::string dir = make("gpt2-tiny", d / "ckpt");
  EngineCounter engine;
  ModelOptions o;
  engine.attach(o);
  TransformersModel m(dir, o);
  reset_io_bytes_read();
  const ModelScan s = m.scan(3, 10);
  EXPECT_EQ(io_bytes_read(), 0u);
  EXPECT_EQ(*engine.reads, 0);
  EXPECT_TRUE(all_meta(m));
  EXPECT_FALSE(m.dispatched());
  ASSERT_NE(s.find(""), nullptr);
  EXPECT_EQ(s.find("")->sizes, (std::vector<int64_t>{3, 10, 256}));
  EXPECT_EQ(s.find("")->class_name, "GPT2LMHeadModel");
  EXPECT_EQ(s.find("transformer.h.1.attn.c_attn")->sizes, (std::vector<int64_t>{3, 10, 192}));
  EXPECT_EQ(s.find("transformer.h.1.attn.c_attn")->class_name, "Conv1D");
  EXPECT_EQ(s.find("transformer.h.0.mlp")->bytes(), 3u * 10 * 64 * 4);
  EXPECT_EQ(s.modules.back().path, "");  // the logits come last
  EXPECT_TRUE(is_fake(s.logits));
  EXPECT_EQ(s.logits.sizes(), (at::IntArrayRef{3, 10, 256}));
  uint64_t total = 0;
  for (const auto& mod : s.modules) total += mod.bytes();
  EXPECT_EQ(s.total_bytes(), total);
  // The scan claims any device, a GPU not needed.
  const ModelScan cuda = m.scan(1, 4, at::Device("cuda"));
  EXPECT_EQ(cuda.device, at::Device(at::kCUDA, 0));
  EXPECT_EQ(cuda.find("transformer.ln_f")->device, at::Device(at::kCUDA, 0));
  // forward() with meta ids is a scan: fake logits, nothing loaded.
  const at::Tensor fake =
      m.forward(at::zeros({2, 5}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)));
  EXPECT_TRUE(is_fake(fake));
  EXPECT_EQ(fake.sizes(), (at::IntArrayRef{2, 5, 256}));
  EXPECT_EQ(*engine.reads, 0);
  EXPECT_FALSE(m.dispatched());
  // The model's dtype is the skeleton's: a bfloat16 model scans bfloat16 activations.
  ModelOptions bf;
  bf.dtype = at::kBFloat16;
  TransformersModel half(dir, bf);
  EXPECT_EQ(half.scan(1, 3).find("transformer.h.0.attn")->dtype, at::kBFloat16);
}

TEST(TransformersModel, DispatchFillsTheSameParametersOnce) {
  TempDir d;
  for (const std::string config : {"llama-tiny", "gpt2-tiny", "qwen2-tiny", "llama-tiny-tied"}) {
    const std::string dir = make(config, d / config, 2);
    EngineCounter engine;
    ModelOptions o;
    engine.attach(o);
    TransformersModel m(dir, o);
    std::vector<at::Tensor> held;  // references taken before dispatch
    std::vector<std::string> names;
    for (const auto& p : m.module().named_parameters()) {
      held.push_back(p.value());
      names.push_back(p.key());
    }
    const LoadReport r = m.dispatch();
    EXPECT_TRUE(m.dispatched());
    EXPECT_GT(*engine.reads, 0);
    EXPECT_GT(r.bytes, 0u);
    const auto eager = eager_from(dir);
    auto want = eager->named_parameters();
    for (size_t i = 0; i < held.size(); ++i) {
      EXPECT_FALSE(held[i].is_meta()) << config << " " << names[i];
      EXPECT_TRUE(held[i].is_same(m.parameter(names[i]))) << names[i];
      EXPECT_TRUE(held[i].equal(want[names[i]])) << config << " " << names[i];
    }
    // Ties survive: lm_head is the embedding's tensor.
    if (config == "gpt2-tiny") {
      EXPECT_TRUE(m.parameter("lm_head.weight").is_same(m.parameter("transformer.wte.weight")));
    }
    // Non-persistent buffers equal an eager real build's.
    auto eager_buffers = eager->named_buffers();
    for (const auto& b : m.module().named_buffers()) {
      EXPECT_FALSE(b.value().is_meta()) << b.key();
      EXPECT_TRUE(b.value().equal(eager_buffers[b.key()])) << config << " " << b.key();
    }
    // Idempotent: nothing read, same report.
    const int reads = *engine.reads;
    reset_io_bytes_read();
    const LoadReport again = m.dispatch();
    EXPECT_EQ(*engine.reads, reads);
    EXPECT_EQ(io_bytes_read(), 0u);
    EXPECT_EQ(again.bytes, r.bytes);
    EXPECT_EQ(m.load_report()->bytes, r.bytes);
    // The logits are the eager model's.
    at::NoGradGuard no_grad;
    const at::Tensor ids = ids_for(m, 2, 7, 1);
    EXPECT_TRUE(m.forward(ids).equal(eager->forward(ids))) << config;
    EXPECT_EQ(*engine.reads, reads);
  }
}

TEST(TransformersModel, FirstRealForwardDispatches) {
  TempDir d;
  const std::string dir = make("mistral-tiny", d / "ckpt", 1, DType::BF16);
  EngineCounter engine;
  ModelOptions o;
  engine.attach(o);
  TransformersModel m(dir, o);
  const at::Tensor w = m.parameter("model.layers.1.mlp.down_proj.weight");
  EXPECT_TRUE(w.is_meta());
  const at::Tensor ids = ids_for(m, 1, 9, 2);
  const at::Tensor logits = m.forward(ids);
  EXPECT_TRUE(m.dispatched());
  EXPECT_FALSE(w.is_meta());
  EXPECT_EQ(w.scalar_type(), at::kFloat);  // bfloat16 file, float32 model: converted on load
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{1, 9, 256}));
  const int reads = *engine.reads;
  m.forward(ids);
  EXPECT_EQ(*engine.reads, reads);
  // generate() on a fresh model dispatches too; the same tokens as the family's own generate.
  TransformersModel g(dir);
  const at::Tensor out = g.generate(ids, 5);
  EXPECT_TRUE(g.dispatched());
  EXPECT_TRUE(out.equal(g.module().generate(ids, 5, /*use_cache=*/false)));
  // A model dtype other than the file's.
  ModelOptions half;
  half.dtype = at::kBFloat16;
  TransformersModel h(dir, half);
  h.dispatch();
  EXPECT_EQ(h.parameter("model.norm.weight").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(
      h.parameter("model.norm.weight").equal(g.parameter("model.norm.weight").to(at::kBFloat16)));
}

TEST(TransformersModel, EagerConstructionAndReadyModules) {
  TempDir d;
  const std::string dir = make("gpt2-tiny", d / "ckpt");
  ModelOptions o;
  o.dispatch = true;
  TransformersModel eager(dir, o);
  EXPECT_TRUE(eager.dispatched());
  EXPECT_FALSE(all_meta(eager));
  // A ready module: dispatched from the start, nothing to load.
  auto module = build_causal_lm(builtin_config("gpt2-tiny"));
  TransformersModel ready(module);
  EXPECT_TRUE(ready.dispatched());
  EXPECT_EQ(ready.forward(ids_for(ready, 1, 3, 1)).size(2), 256);
  EXPECT_NE(std::string(expect_error<ModelError>([&] { ready.to_model_key(); }).what())
                .find("has no repo id"),
            std::string::npos);
  BuildOptions meta;
  meta.device = at::kMeta;
  expect_error<ModelError>(
      [&] { TransformersModel(build_causal_lm(builtin_config("gpt2-tiny"), meta)); });
}

TEST(TransformersModel, ModuleAccessByDottedPath) {
  TempDir d;
  TransformersModel m(make("llama-tiny", d / "ckpt"));
  EXPECT_EQ(m.at("model.layers.1.self_attn")->name(), "LlamaAttention");
  EXPECT_EQ(m.at("")->name(), "LlamaForCausalLM");
  EXPECT_EQ(m.module_paths().front(), "");
  const auto e = expect_error<ModulePathError>([&] { m.at("model.layers.1.self_atn"); });
  const std::string msg = e.what();
  EXPECT_NE(msg.find("no module 'model.layers.1.self_atn'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("closest: model.layers.1.self_attn"), std::string::npos) << msg;
  const auto p = expect_error<ModulePathError>([&] { m.parameter("model.norm.weights"); });
  EXPECT_NE(std::string(p.what()).find("closest: model.norm.weight"), std::string::npos);
}

TEST(TransformersModel, CapturesDuringScanAndRealForwards) {
  TempDir d;
  TransformersModel m(make("llama-tiny", d / "ckpt"));
  auto layer = m.capture("model.layers.1");
  auto logits = m.capture("");
  EXPECT_FALSE(layer.has_value());
  expect_error<ModelError>([&] { layer.value(); });
  m.scan(2, 6);
  ASSERT_TRUE(layer.has_value());
  EXPECT_TRUE(is_fake(layer.value()));
  EXPECT_EQ(layer.value().sizes(), (at::IntArrayRef{2, 6, 64}));
  EXPECT_EQ(layer.count(), 1);
  const at::Tensor ids = ids_for(m, 2, 6, 3);
  const at::Tensor out = m.forward(ids);
  EXPECT_FALSE(is_fake(layer.value()));
  EXPECT_EQ(layer.value().sizes(), (at::IntArrayRef{2, 6, 64}));
  EXPECT_TRUE(logits.value().equal(out));
  EXPECT_EQ(layer.count(), 2);
  // The layer output is what the next norm sees: model.norm(layer 1 output) feeds lm_head.
  auto norm = m.capture("model.norm");
  m.forward(ids);
  const auto& cfg = m.config();
  at::Tensor h = layer.value();
  const at::Tensor expect =
      m.parameter("model.norm.weight") * (h * at::rsqrt(h.pow(2).mean(-1, true) + cfg.norm_eps));
  EXPECT_TRUE(at::allclose(norm.value(), expect, 1e-5, 1e-5));
  // Generation: one output per step.
  layer.reset();
  const int64_t before = layer.count();
  m.generate(ids, 4);
  EXPECT_EQ(layer.count() - before, 4);
  EXPECT_EQ(layer.value().size(1), 1);  // the last decode step saw one position
  // Errors: a container, an unknown path.
  const auto c = expect_error<ModelError>([&] { m.capture("model.layers"); });
  EXPECT_NE(std::string(c.what()).find("is a container"), std::string::npos);
  expect_error<ModulePathError>([&] { m.capture("model.layer.1"); });
  // A dropped handle stops capturing (no observer left when no capture lives).
  {
    auto tmp = m.capture("lm_head");
    (void)tmp;
  }
  m.forward(ids);
}

// A hub cache checkpoint dispatches zero-copy (mapped): progress counts the mapped bytes as their
// pages are populated, and the bar (forced on) ends at the full byte count.
TEST(TransformersModel, ZeroCopyDispatchReportsMappedProgress) {
  TempDir d;
  const FixtureResult made = hub_checkpoint(d, "llama-tiny");
  ModelOptions o;
  std::vector<Progress> seen;
  o.engine.progress = [&](const Progress& p) { seen.push_back(p); };
  o.engine.bar = ProgressBar::kOn;
  TransformersModel m(made.dir, o);
  ::testing::internal::CaptureStderr();
  const LoadReport r = m.dispatch();
  const std::string bar = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(r.engine.find("+mapped"), std::string::npos) << r.engine;
  ASSERT_GT(r.mapped_bytes, 0u);
  EXPECT_EQ(r.mapped_bytes, r.bytes);  // every tensor float32 as stored: nothing copied
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
  EXPECT_EQ(seen.back().bytes_done, r.mapped_bytes);
  EXPECT_EQ(seen.back().bytes_total, r.mapped_bytes);
  EXPECT_NE(bar.find("metaload [########################]"), std::string::npos) << bar;
  EXPECT_NE(bar.find(" " + std::to_string(r.mapped_bytes) + " bytes in "), std::string::npos)
      << bar;
  // Off: no bar, the callback still runs.
  ModelOptions quiet = o;
  quiet.engine.bar = ProgressBar::kOff;
  seen.clear();
  TransformersModel q(made.dir, quiet);
  ::testing::internal::CaptureStderr();
  q.dispatch();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, r.mapped_bytes);
}

// The zero-copy contract at the model's own check points (loader/engine/file_mapping.h): a hub
// cache blob that someone truncates or overwrites in place after the dispatch.
struct MappedGpt2 {
  MappedGpt2() {
    made = hub_checkpoint(d, "gpt2-tiny");
    file = made.dir + "/model.safetensors";  // a snapshot link into blobs/
    // A day old, so that a write in place changes the mtime on any filesystem.
    struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 86400, 0}};
    ::utimensat(AT_FDCWD, file.c_str(), times, 0);
  }
  void overwrite_in_place() const {
    const int fd = ::open(file.c_str(), O_WRONLY);
    const std::string junk(4096, '\x7f');
    EXPECT_EQ(::pwrite(fd, junk.data(), junk.size(), 8192), 4096);
    ::close(fd);
  }
  TempDir d;
  FixtureResult made;
  std::string file;
};

TEST(TransformersModel, ZeroCopyWeightsKeepTheirBytesWhenALeasedFileIsRewrittenInPlace) {
  MappedGpt2 c;
  TransformersModel m(c.made.dir);
  const at::Tensor ids = ids_for(m, 1, 5, 3);
  const at::Tensor before = m.forward(ids);
  ASSERT_GT(m.load_report()->mapped_bytes, 0u);
  const auto maps = mappings_of({m.parameter("transformer.h.0.attn.c_attn.weight")});
  ASSERT_EQ(maps.size(), 1u);
  if (maps[0]->guard() != MappingGuard::kLease) GTEST_SKIP() << "no read lease here";
  c.overwrite_in_place();  // waits while the weights are copied
  EXPECT_EQ(maps[0]->guard(), MappingGuard::kDetached);
  EXPECT_TRUE(at::equal(m.forward(ids), before));
  ASSERT_EQ(::truncate(c.file.c_str(), 0), 0);
  EXPECT_TRUE(at::equal(m.forward(ids), before));  // no SIGBUS: nothing maps the file any more
}

TEST(TransformersModel, ZeroCopyForwardRefusesWeightsWhoseFileChangedInPlace) {
  MappedGpt2 c;
  const int writer = ::open(c.file.c_str(), O_WRONLY);  // no lease while a writer has it open
  ASSERT_GE(writer, 0);
  TransformersModel m(c.made.dir);
  const at::Tensor ids = ids_for(m, 1, 5, 3);
  const at::Tensor before = m.forward(ids);
  ASSERT_EQ(mappings_of({m.parameter("transformer.wte.weight")}).at(0)->guard(),
            MappingGuard::kChecked);
  EXPECT_TRUE(at::equal(m.forward(ids), before));
  c.overwrite_in_place();
  for (int i = 0; i < 2; ++i) {  // and stays refused
    const FileChangedError e = expect_error<FileChangedError>([&] { m.forward(ids); });
    EXPECT_NE(std::string(e.what()).find(c.file + ": the file was written in place"),
              std::string::npos)
        << e.what();
  }
  expect_error<FileChangedError>([&] { m.generate(ids, 2); });
  ::close(writer);
}

TEST(TransformersModel, ZeroCopyForwardRefusesWeightsWhoseFileWasTruncated) {
  MappedGpt2 c;
  const int writer = ::open(c.file.c_str(), O_WRONLY);
  ASSERT_GE(writer, 0);
  TransformersModel m(c.made.dir);
  m.dispatch();
  ASSERT_EQ(::ftruncate(writer, 100), 0);
  const FileChangedError e =
      expect_error<FileChangedError>([&] { m.forward(ids_for(m, 1, 5, 3)); });
  EXPECT_NE(std::string(e.what()).find(c.file + ": the file was truncated to 100 bytes"),
            std::string::npos)
      << e.what();
  ::close(writer);
}

TEST(TransformersModel, ZeroCopyFilesReplacedByRenameAreFine) {
  MappedGpt2 c;
  const int writer = ::open(c.file.c_str(), O_WRONLY);  // checked, not leased: the harder case
  TransformersModel m(c.made.dir);
  const at::Tensor ids = ids_for(m, 1, 5, 3);
  const at::Tensor before = m.forward(ids);
  // The blob replaced by a new file renamed over it (how huggingface_hub writes).
  char blob[PATH_MAX];
  ASSERT_NE(::realpath(c.file.c_str(), blob), nullptr);
  testing::write_file(std::string(blob) + ".incomplete", std::string(1000, 'z'));
  ASSERT_EQ(::rename((std::string(blob) + ".incomplete").c_str(), blob), 0);
  EXPECT_TRUE(at::equal(m.forward(ids), before));
  ::close(writer);
}

TEST(TransformersModel, HubCacheAndModelKeys) {
  TempDir d;
  const FixtureResult made = hub_checkpoint(d, "gpt2-tiny");
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  reset_io_bytes_read();
  TransformersModel m("metaload-test/gpt2-tiny");
  // refs/main (the 40-hex commit) and config.json: no safetensors byte.
  EXPECT_EQ(io_bytes_read(), 40 + file_size(made.dir + "/config.json"));
  EXPECT_EQ(m.repo_id(), "metaload-test/gpt2-tiny");
  EXPECT_EQ(m.commit(), made.commit);
  EXPECT_EQ(m.to_model_key(),
            "metaload.TransformersModel:{\"repo_id\": \"metaload-test/gpt2-tiny\", "
            "\"revision\": null}");
  // Keys (and nnsight's aliases) give models in meta state, through the registry's factory.
  for (const std::string cls :
       {"metaload.TransformersModel", "nnsight.modeling.language.LanguageModel"}) {
    const std::string key = cls + ":{\"repo_id\": \"metaload-test/gpt2-tiny\", \"revision\": null}";
    auto k = TransformersModel::from_model_key(key);
    EXPECT_TRUE(all_meta(*k));
    EXPECT_EQ(k->to_model_key(), m.to_model_key());
    TransformersModel direct(key);  // the constructor takes keys too
    EXPECT_TRUE(all_meta(direct));
  }
  EXPECT_TRUE(model_factory<ModelFactory>(kTransformersModel).has_value());
  // Pinned revisions: the branch and the commit.
  ModelOptions rev;
  rev.revision = "main";
  TransformersModel pinned("metaload-test/gpt2-tiny", rev);
  EXPECT_EQ(pinned.to_model_key(),
            "metaload.TransformersModel:{\"repo_id\": \"metaload-test/gpt2-tiny\", "
            "\"revision\": \"main\"}");
  const std::string by_commit =
      "metaload.TransformersModel:{\"repo_id\": \"metaload-test/gpt2-tiny\", \"revision\": \"" +
      *made.commit + "\"}";
  auto c = TransformersModel::from_model_key(by_commit);
  EXPECT_EQ(c->to_model_key(), by_commit);
  c->dispatch();
  EXPECT_FALSE(all_meta(*c));
  // Key errors.
  expect_error<ModelKeyError>([&] {
    TransformersModel(
        "metaload.TransformersModel:{\"repo_id\": \"metaload-test/gpt2-tiny\", "
        "\"revision\": null, \"task\": \"summarization\"}");
  });
  expect_error<ModelKeyError>(
      [&] { TransformersModel("metaload.Nothing:{\"repo_id\": \"a/b\"}"); });
  ModelOptions other;
  other.revision = "v2";
  expect_error<ModelKeyError>([&] { TransformersModel::from_model_key(by_commit, other); });
  expect_error<ResolveError>([&] {
    TransformersModel(
        "metaload.TransformersModel:{\"repo_id\": \"metaload-test/absent\", \"revision\": null}");
  });
  // A local directory's key names its absolute path: not a Hub repo id, so only with local paths
  // allowed (by the call, or by the options the model was made with).
  TransformersModel local(made.dir);
  EXPECT_EQ(expect_error<RepoIdError>([&] { local.to_model_key(); }).rule(),
            "repo-id-absolute-path");
  const KeyOptions paths{/*allow_local_paths=*/true};
  const std::string local_key = local.to_model_key(paths);
  EXPECT_NE(local_key.find(made.dir), std::string::npos);
  ModelOptions trusting;
  trusting.keys = paths;
  EXPECT_EQ(TransformersModel(made.dir, trusting).to_model_key(), local_key);
  // Such a key is refused unless its reader opts in too.
  EXPECT_EQ(expect_error<RepoIdError>([&] { TransformersModel::from_model_key(local_key); }).rule(),
            "repo-id-absolute-path");
  expect_error<RepoIdError>([&] { TransformersModel{local_key}; });
  EXPECT_EQ(TransformersModel::from_model_key(local_key, trusting)->checkpoint(), made.dir);
  EXPECT_EQ(TransformersModel(local_key, trusting).checkpoint(), made.dir);
}

TEST(TransformersModel, KeysNameHubReposNeverPaths) {
  TempDir d;
  FixtureOptions f;
  f.config = "gpt2-tiny";
  make_checkpoint(f, d / "tiny");  // ./tiny once the working directory is d
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  ScopedCwd cwd(d.path());
  const std::string key = R"(metaload.TransformersModel:{"repo_id": "tiny", "revision": null})";
  // "tiny" is a Hub repo id that the hub cache lacks; the directory ./tiny is never tried.
  expect_error<ResolveError>([&] { TransformersModel{key}; });
  expect_error<ResolveError>([&] { TransformersModel::from_model_key(key); });
  ModelOptions trusting;
  trusting.keys.allow_local_paths = true;
  EXPECT_EQ(TransformersModel(key, trusting).checkpoint(), d / "tiny");
  EXPECT_EQ(TransformersModel::from_model_key(key, trusting)->checkpoint(), d / "tiny");
  // The issue's hostile keys, through every way a key reaches a model.
  for (const std::string id : {"/etc/passwd", "../tiny", "org/.."}) {
    SCOPED_TRACE(id);
    const std::string bad = std::string(kTransformersModel) + ":" +
                            python_json_dumps(nlohmann::ordered_json{{"repo_id", id}});
    expect_error<RepoIdError>([&] { TransformersModel{bad}; });
    expect_error<RepoIdError>([&] { TransformersModel::from_model_key(bad); });
    expect_error<RepoIdError>([&] {
      TransformersModel(ModelKey{kTransformersModel, id, std::nullopt, {}});
    });
  }
  EXPECT_EQ(TransformersModel(ModelKey{kTransformersModel, "./tiny", std::nullopt, {}}, trusting)
                .checkpoint(),
            d / "tiny");
}

TEST(TransformersModel, ConfigAndReferenceErrors) {
  TempDir d;
  testing::make_dir(d / "bert");
  testing::write_file(d / "bert/config.json", R"({"model_type": "bert", "hidden_size": 8})");
  const auto bert = expect_error<ConfigError>([&] { TransformersModel(d / "bert"); });
  EXPECT_NE(std::string(bert.what()).find("model_type"), std::string::npos);
  testing::make_dir(d / "broken");
  testing::write_file(d / "broken/config.json", R"({"model_type": "llama", )");
  expect_error<FormatError>([&] { TransformersModel(d / "broken"); });
  testing::make_dir(d / "nocfg");
  const auto nocfg = expect_error<ResolveError>([&] { TransformersModel(d / "nocfg"); });
  EXPECT_NE(std::string(nocfg.what()).find("has no config.json"), std::string::npos);
  expect_error<ResolveError>([&] { TransformersModel(d / "absent"); });
  {
    ScopedEnv env("HF_HUB_CACHE", (d / "empty-hub").c_str());
    expect_error<ResolveError>([&] { TransformersModel("org/absent"); });
  }
  ModelOptions rev;
  rev.revision = "main";
  const std::string dir = make("gpt2-tiny", d / "ckpt");
  expect_error<ResolveError>([&] { TransformersModel(dir, rev); });
  ModelOptions tp;
  tp.tp_rank = 2;
  tp.tp_size = 2;
  expect_error<ModelError>([&] { TransformersModel(dir, tp); });
  ModelOptions bad_dtype;
  bad_dtype.dtype = at::kInt;
  expect_error<FamilyError>([&] { TransformersModel(dir, bad_dtype); });
  TransformersModel m(dir);
  expect_error<ModelError>([&] { m.scan(0, 3); });
  expect_error<ModelError>([&] { m.scan(std::vector<at::Tensor>{}); });
  // A sequence longer than GPT-2's positions, out-of-vocabulary ids: the family's errors.
  expect_error<FamilyError>([&] { m.scan(1, 65); });
  expect_error<FamilyError>([&] { m.forward(at::full({1, 2}, 999, at::kLong)); });
  expect_error<ModelError>([&] {
    m.generate(at::zeros({1, 2}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)), 2);
  });
}

TEST(TransformersModel, HostileConfigJsonIsATypedError) {
  TempDir d;
  const std::string dir = make("gpt2-tiny", d / "ckpt");
  const std::string cfg = dir + "/config.json";
  const std::string good = testing::read_file(cfg);
  // 70,000 nested objects beside the real fields overflowed the stack.
  std::string deep = "{\"deep\": ";
  for (int i = 0; i < 70'000; ++i) deep += "{\"a\": ";
  deep += "1" + std::string(70'000, '}') + ", " + good.substr(good.find('{') + 1);
  testing::write_file(cfg, deep);
  const auto too_deep = expect_error<FormatError>([&] { TransformersModel m(dir); });
  EXPECT_EQ(too_deep.rule(), "json-too-deep");
  EXPECT_EQ(too_deep.file(), cfg);
  // A FIFO in config.json's place blocked the constructor forever in open().
  ASSERT_EQ(::unlink(cfg.c_str()), 0);
  ASSERT_EQ(::mkfifo(cfg.c_str(), 0644), 0);
  const auto fifo = expect_error<FormatError>(
      [&] { testing::run_unblocked([&] { TransformersModel m(dir); }, {cfg}); });
  EXPECT_EQ(fifo.rule(), "not-a-file");
  EXPECT_NE(std::string(fifo.what()).find("is a FIFO"), std::string::npos) << fifo.what();
  // A loop says so (it was "has no config.json").
  ASSERT_EQ(::unlink(cfg.c_str()), 0);
  ASSERT_EQ(::symlink("config.json", cfg.c_str()), 0);
  const auto loop = expect_error<FormatError>([&] { TransformersModel m(dir); });
  EXPECT_NE(std::string(loop.what()).find("symbolic link loop"), std::string::npos) << loop.what();
}

TEST(TransformersModel, SnapshotConfigLinkedOutOfTheRepoIsRefused) {
  TempDir d;
  const FixtureResult made = hub_checkpoint(d, "gpt2-tiny");
  ScopedEnv env("HF_HUB_CACHE", (d / "hub").c_str());
  const std::string link = made.dir + "/config.json";
  testing::write_file(d / "elsewhere.json", testing::read_file(link));
  ASSERT_EQ(::unlink(link.c_str()), 0);
  ASSERT_EQ(::symlink((d / "elsewhere.json").c_str(), link.c_str()), 0);
  for (const std::string& ref : {std::string("metaload-test/gpt2-tiny"), made.dir}) {
    const auto e = expect_error<FormatError>([&] { TransformersModel m(ref); });
    EXPECT_EQ(e.rule(), "link-outside-repo") << e.what();
    EXPECT_EQ(e.file(), link);
    EXPECT_NE(std::string(e.what()).find(d / "elsewhere.json"), std::string::npos) << e.what();
  }
}

TEST(TransformersModel, MismatchedCheckpointLeavesTheModelMeta) {
  TempDir d;
  const std::string dir = make("llama-tiny", d / "ckpt");
  // The same weights, described by a config with a different MLP width.
  nlohmann::json cfg = nlohmann::json::parse(builtin_config_json("llama-tiny"));
  cfg["intermediate_size"] = 128;
  testing::write_file(dir + "/config.json", cfg.dump());
  TransformersModel m(dir);
  const at::Tensor held = m.parameter("model.layers.0.mlp.up_proj.weight");
  const auto e = expect_error<MismatchError>([&] { m.dispatch(); });
  EXPECT_EQ(e.mismatched().size(), 6u);  // gate, up, down of both layers
  EXPECT_TRUE(e.missing().empty());
  const std::string msg = e.what();
  EXPECT_NE(msg.find("model.layers.1.mlp.down_proj.weight: shape [64, 128]"), std::string::npos)
      << msg;
  EXPECT_FALSE(m.dispatched());
  EXPECT_TRUE(all_meta(m));
  EXPECT_TRUE(held.is_meta());
  // Still usable: scans work, and a real forward tries (and fails) the same way.
  EXPECT_EQ(m.scan(1, 4).find("model.layers.0.mlp")->sizes, (std::vector<int64_t>{1, 4, 64}));
  expect_error<MismatchError>([&] { m.forward(ids_for(m, 1, 3, 1)); });
  // Tensors the model has no place for are listed as unexpected: biases the config turned off.
  TempDir e2;
  const std::string biased = make("llama-tiny-tied", e2 / "ckpt");
  nlohmann::json nobias = nlohmann::json::parse(builtin_config_json("llama-tiny-tied"));
  nobias["attention_bias"] = false;
  testing::write_file(biased + "/config.json", nobias.dump());
  TransformersModel t(biased);
  const auto u = expect_error<MismatchError>([&] { t.dispatch(); });
  EXPECT_EQ(u.unexpected().size(), 8u);  // q, k, v, o biases of both layers
  EXPECT_NE(std::string(u.what()).find("model.layers.1.self_attn.o_proj.bias"), std::string::npos);
  EXPECT_TRUE(all_meta(t));
}

TEST(TransformersModel, FailedDispatchCanBeRetried) {
  TempDir d;
  // config.json alone: the skeleton builds, dispatch finds no weights.
  testing::make_dir(d / "late");
  testing::write_file(d / "late/config.json", builtin_config_json("gpt2-tiny"));
  EngineCounter engine;
  ModelOptions o;
  engine.attach(o);
  TransformersModel m(d / "late", o);
  expect_error<ResolveError>([&] { m.dispatch(); });
  EXPECT_FALSE(m.dispatched());
  EXPECT_TRUE(all_meta(m));
  // The weights arrive; the retry loads them.
  make("gpt2-tiny", d / "weights");
  ASSERT_EQ(
      ::rename((d / "weights/model.safetensors").c_str(), (d / "late/model.safetensors").c_str()),
      0);
  m.dispatch();
  EXPECT_TRUE(m.dispatched());
  EXPECT_FALSE(all_meta(m));

  // A read error in the middle of the load: nothing changes; the next try succeeds.
  const std::string dir = make("llama-tiny", d / "flaky", 2);
  auto fail = std::make_shared<std::atomic<bool>>(true);
  ModelOptions flaky;
  flaky.engine.hooks.pread = [fail](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    if (fail->exchange(false)) {
      errno = EIO;
      return -1;
    }
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  flaky.threads = 1;
  TransformersModel f(dir, flaky);
  expect_error<ReadError>([&] { f.dispatch(); });
  EXPECT_TRUE(all_meta(f));
  for (const auto& b : f.module().buffers()) EXPECT_TRUE(b.is_meta());
  f.dispatch();
  EXPECT_FALSE(all_meta(f));

  // A device that is not there (no GPU on this machine): DeviceError, still meta.
  if (!cuda_device_available()) {
    ModelOptions cuda;
    cuda.device = at::Device("cuda:0");
    TransformersModel c(dir, cuda);
    EXPECT_EQ(c.scan(1, 2).device, at::Device("cuda:0"));  // placement is used by scans
    expect_error<LoadError>([&] { c.dispatch(); });
    EXPECT_TRUE(all_meta(c));
  }
}

TEST(TransformersModel, TensorParallelRanksLoadTheirShards) {
  TempDir d;
  const std::string dir = make("llama-tiny", d / "ckpt");
  TransformersModel full(dir);
  full.dispatch();
  std::vector<at::Tensor> q, o;
  for (int rank = 0; rank < 2; ++rank) {
    ModelOptions opt;
    opt.tp_rank = rank;
    opt.tp_size = 2;
    TransformersModel m(dir, opt);
    m.scan(1, 3);  // the skeleton scans whole before dispatch
    m.dispatch();
    q.push_back(m.parameter("model.layers.0.self_attn.q_proj.weight"));
    o.push_back(m.parameter("model.layers.1.self_attn.o_proj.weight"));
    EXPECT_EQ(q.back().sizes(), (at::IntArrayRef{32, 64}));  // column-parallel: heads split
    EXPECT_EQ(o.back().sizes(), (at::IntArrayRef{64, 32}));  // row-parallel: inputs split
    EXPECT_EQ(m.parameter("model.norm.weight").sizes(), (at::IntArrayRef{64}));  // replicated
    const auto e = expect_error<ModelError>([&] { m.forward(ids_for(m, 1, 2, 1)); });
    EXPECT_NE(std::string(e.what()).find("cannot run the model alone"), std::string::npos);
  }
  EXPECT_TRUE(at::cat(q, 0).equal(full.parameter("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_TRUE(at::cat(o, 1).equal(full.parameter("model.layers.1.self_attn.o_proj.weight")));
  // A degree the model cannot be split into: every problem listed, the skeleton unchanged.
  ModelOptions three;
  three.tp_size = 3;
  TransformersModel m3(dir, three);
  const auto e = expect_error<MismatchError>([&] { m3.dispatch(); });
  EXPECT_GT(e.mismatched().size(), 3u);
  EXPECT_EQ(m3.parameter("model.layers.0.self_attn.q_proj.weight").sizes(),
            (at::IntArrayRef{64, 64}));
  EXPECT_TRUE(all_meta(m3));
}

TEST(TransformersModel, DispatchFromTakesHandedOverShardsAllOrNothing) {
  // A broadcast receiver: config.json only, rank 1 of 2's shards handed over (here from a rank
  // that read them), never a read of its own.
  TempDir d;
  const std::string dir = make("llama-tiny", d / "ckpt");
  ModelOptions opt;
  opt.tp_rank = 1;
  opt.tp_size = 2;
  TransformersModel source(dir, opt);
  source.dispatch();
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const auto& item : source.module().named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    tensors.push_back(item.value().clone());
  }
  testing::make_dir(d / "receiver");
  testing::write_file(d / "receiver/config.json", builtin_config_json("llama-tiny"));
  EngineCounter engine;
  engine.attach(opt);
  TransformersModel m(d / "receiver", opt);
  const std::string q_name = "model.layers.0.self_attn.q_proj.weight";
  const at::Tensor q = m.parameter(q_name);
  // Every problem listed at once; nothing changes.
  std::vector<std::string> bad_names = names;
  std::vector<at::Tensor> bad = tensors;
  bad_names.back() = "model.no_such.weight";  // the last one missing, an unexpected one
  bad[0] = at::zeros({3, 3});                 // misshapen
  bad[1] = tensors[1].to(at::kLong);          // not floating point
  const auto e = expect_error<MismatchError>([&] { m.dispatch_from(bad_names, bad); });
  EXPECT_EQ(e.missing(), std::vector<std::string>{names.back()});
  EXPECT_EQ(e.unexpected(), std::vector<std::string>{"model.no_such.weight"});
  EXPECT_EQ(e.mismatched().size(), 2u);
  EXPECT_NE(std::string(e.what()).find("shape [3, 3] given, rank 1 of 2 holds ["),
            std::string::npos)
      << e.what();
  EXPECT_FALSE(m.dispatched());
  EXPECT_TRUE(all_meta(m));
  EXPECT_EQ(q.sizes(), (at::IntArrayRef{64, 64}));  // whole again
  // The checks alone change nothing either.
  m.dispatch_from(names, tensors, /*check_only=*/true);
  EXPECT_FALSE(m.dispatched());
  EXPECT_TRUE(all_meta(m));
  EXPECT_EQ(q.sizes(), (at::IntArrayRef{64, 64}));
  m.dispatch_from(names, tensors);
  EXPECT_TRUE(m.dispatched());
  EXPECT_EQ(*engine.reads, 0);
  EXPECT_EQ(q.sizes(), (at::IntArrayRef{32, 64}));  // the same Parameter, now rank 1's shard
  for (const auto& item : source.module().named_parameters(/*recurse=*/true))
    EXPECT_TRUE(m.parameter(item.key()).equal(item.value())) << item.key();
  for (const auto& item : source.module().named_buffers(/*recurse=*/true))
    EXPECT_TRUE(m.parameter(item.key()).equal(item.value())) << item.key();  // computed
  EXPECT_EQ(m.dispatch().bytes, 0u);  // dispatched: nothing to read
  expect_error<ModelError>([&] { m.dispatch_from(names, tensors); });
}

// Puts the ranks' local tensors of one parameter back together by its TP rule, independently of
// tp_shard's ranges: cat per section (de-duplicating replicated kv heads, which must agree), or cat
// the vocabulary blocks, check the padding rows are zero and trim them.
at::Tensor put_back_together(const TPRule& rule, const std::vector<at::Tensor>& ranks,
                             int64_t full_rows) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  if (rule.style == TPStyle::kReplicated) {
    for (const auto& t : ranks) EXPECT_TRUE(t.equal(ranks[0])) << rule.pattern;
    return ranks[0];
  }
  const int dim = rule.split_dim;
  if (rule.style == TPStyle::kVocab) {
    at::Tensor all = at::cat(ranks, dim);
    EXPECT_EQ(all.size(dim) % n, 0) << rule.pattern;
    at::Tensor pad = all.narrow(dim, full_rows, all.size(dim) - full_rows);
    EXPECT_TRUE(pad.eq(0).all().item<bool>()) << rule.pattern << ": padding rows not zero";
    return all.narrow(dim, 0, full_rows);
  }
  std::vector<at::Tensor> sections;
  std::vector<int64_t> at_offset(n, 0);
  for (const TPSection& s : rule.sections) {
    const bool split = s.heads == 0 || s.heads % n == 0;
    const int64_t width = split ? s.size / n : s.size / s.heads;
    const int64_t replicas = split ? 1 : n / s.heads;
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < n; ++r) {
      at::Tensor piece = ranks[r].narrow(dim, at_offset[r], width);
      at_offset[r] += width;
      if (r % replicas == 0)
        pieces.push_back(piece);
      else
        EXPECT_TRUE(piece.equal(pieces.back())) << rule.pattern << ": replicated head differs";
    }
    sections.push_back(at::cat(pieces, dim));
  }
  for (int64_t r = 0; r < n; ++r) EXPECT_EQ(at_offset[r], ranks[r].size(dim)) << rule.pattern;
  return at::cat(sections, dim);
}

// For every tiny config and every degree that its config.json allows (tp_degrees, i.e. the divisors
// of max_tp_size), every rank loads, and every parameter put back together equals the full load.
TEST(TransformersModel, EveryAllowedTPDegreePutsBackTogetherToTheFullLoad) {
  TempDir d;
  std::map<std::string, std::vector<int64_t>> seen;
  for (const std::string& config : builtin_config_names()) {
    if (config.find("tiny") == std::string::npos) continue;
    const std::string dir = make(config, d / config);
    std::ifstream in(dir + "/config.json");
    std::vector<int64_t> degrees = tp_degrees(nlohmann::json::parse(in));
    if (degrees.empty()) degrees = {1};  // cannot be split: degree 1 only (tp_degree_for)
    TransformersModel full(dir);
    full.dispatch();
    const std::vector<TPRule> plan = tp_plan(full.config());
    for (int64_t n : degrees) {
      SCOPED_TRACE(config + " tp " + std::to_string(n));
      std::vector<std::unique_ptr<TransformersModel>> ranks;
      for (int64_t r = 0; r < n; ++r) {
        ModelOptions opt;
        opt.tp_rank = static_cast<int>(r);
        opt.tp_size = static_cast<int>(n);
        ranks.push_back(std::make_unique<TransformersModel>(dir, opt));
        ASSERT_NO_THROW(ranks.back()->dispatch());
      }
      int checked = 0;
      for (const auto& item : full.module().named_parameters()) {
        std::vector<at::Tensor> local;
        for (const auto& m : ranks) local.push_back(m->parameter(item.key()));
        const TPRule& rule = tp_rule_for(plan, item.key());
        const at::Tensor whole = item.value();
        const int64_t rows = rule.split_dim >= 0 ? whole.size(rule.split_dim) : 0;
        EXPECT_TRUE(put_back_together(rule, local, rows).equal(whole)) << item.key();
        ++checked;
      }
      EXPECT_GT(checked, 5);
      seen[config].push_back(n);
    }
  }
  // llama-tiny-tied's 3 and 6 need the vocabulary padded to a multiple of lcm(64, n).
  const std::map<std::string, std::vector<int64_t>> want = {{"gpt2-tiny", {1, 2, 4}},
                                                            {"llama-tiny", {1, 2}},
                                                            {"llama-tiny-tied", {1, 2, 3, 6}},
                                                            {"mistral-tiny", {1, 2}},
                                                            {"qwen2-tiny", {1}}};
  EXPECT_EQ(seen, want);
}

TEST(TransformersModel, InsideMetaModeDispatchIsStillReal) {
  TempDir d;
  const std::string dir = make("gpt2-tiny", d / "ckpt");
  MetaMode meta;  // a user's meta scope around everything
  TransformersModel m(dir);
  m.dispatch();
  EXPECT_FALSE(all_meta(m));
  for (const auto& b : m.module().buffers()) EXPECT_FALSE(b.is_meta());
  RealGuard real;
  EXPECT_EQ(m.forward(ids_for(m, 1, 4, 5)).device(), at::Device(at::kCPU));
}

}  // namespace
}  // namespace metaload
