// metaload::load end to end: safetensors checkpoints written by the project's writer, loaded into
// torch::nn modules built on meta (or holding previous weights): the planner's one error listing
// every problem, a family's renames / ties / computed buffers / TP shards, dtype conversion,
// sharded checkpoints, the staged engine's twin, and all-or-nothing under faults.
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "base/torch_compat.h"
#include "loader/engine/engine_device.h"
#include "loader/engine/slots.h"
#include "loader/format/safetensors.h"
#include "loader/load/plan.h"
#include "loader/load/torch_save.h"

namespace metaload {
namespace {

namespace fs = std::filesystem;

at::Tensor meta(at::IntArrayRef sizes, at::ScalarType t = at::kFloat) {
  return at::empty(sizes, at::TensorOptions().dtype(t).device(at::kMeta));
}

// A module tree from dotted names (torch::nn names may not contain dots: every prefix becomes a
// submodule).
class Tree : public torch::nn::Module {
 public:
  at::Tensor add(const std::string& dotted, at::Tensor t, bool buffer = false) {
    torch::nn::Module* m = this;
    size_t start = 0, dot;
    while ((dot = dotted.find('.', start)) != std::string::npos) {
      const std::string part = dotted.substr(start, dot - start);
      auto kids = m->named_children();
      torch::nn::Module* next = kids.contains(part) ? kids[part].get() : nullptr;
      if (next == nullptr) {
        next = m->register_module(part, std::make_shared<torch::nn::Module>()).get();
      }
      m = next;
      start = dot + 1;
    }
    const std::string leaf = dotted.substr(start);
    return buffer ? m->register_buffer(leaf, t) : m->register_parameter(leaf, t);
  }
};

// A small GPT-2-like tree: embedding (tied to the head), two blocks, a computed buffer.
struct Tiny : Tree {
  explicit Tiny(bool on_meta = true) {
    auto make = [&](at::IntArrayRef s) { return on_meta ? meta(s) : at::zeros(s); };
    wte = add("transformer.wte.weight", make({16, 8}));
    for (int i = 0; i < 2; ++i) {
      add("transformer.h" + std::to_string(i) + ".weight", make({8, 8}));
      add("transformer.h" + std::to_string(i) + ".bias", make({8}));
    }
    head = add("lm_head.weight", wte);  // tied: the same tensor
    mask = add("transformer.mask", on_meta ? meta({4, 4}) : at::zeros({4, 4}), true);
  }
  at::Tensor wte, head, mask;
};

// Counts c10 CPU allocations (at::empty & co) while installed: slot tensors of the staged engine
// come from it, so a failed load must leave `live` where it was.
struct CountingCpuAllocator final : c10::Allocator {
  static std::atomic<int64_t> live, made;
  static void release(void* p) {
    --live;
    std::free(p);
  }
  c10::DataPtr allocate(size_t n) METALOAD_ALLOCATE_CONST override {
    void* p = nullptr;
    if (::posix_memalign(&p, 64, std::max<size_t>(n, 1)) != 0) throw std::bad_alloc();
    ++live;
    ++made;
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  METALOAD_ALLOCATOR_COPY_DATA
};
std::atomic<int64_t> CountingCpuAllocator::live{0}, CountingCpuAllocator::made{0};

class CountCpuAllocations {
 public:
  CountCpuAllocations() : prev_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(&counting_, 0); }
  ~CountCpuAllocations() { c10::SetCPUAllocator(prev_, 0); }

 private:
  c10::Allocator* prev_;
  CountingCpuAllocator counting_;
};

// Records every read the engine makes: [offset, offset + n).
struct ReadLog {
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::pair<uint64_t, uint64_t>>> reads =
      std::make_shared<std::vector<std::pair<uint64_t, uint64_t>>>();
  void attach(LoadOptions& o) const {
    o.engine.hooks.pread = [mu = mu, reads = reads](int fd, void* buf, size_t n,
                                                    uint64_t off) -> ssize_t {
      {
        std::lock_guard<std::mutex> lock(*mu);
        reads->push_back({off, off + n});
      }
      return ::pread(fd, buf, n, static_cast<off_t>(off));
    };
  }
};

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/metaload_load_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    torch::manual_seed(1);
    // The checkpoint as transformers saves the base model: no "transformer." prefix, the tied
    // head stored once (as wte), a causal-mask buffer the family ignores.
    weights_ = {{"wte.weight", at::randn({16, 8})}, {"h0.weight", at::randn({8, 8})},
                {"h0.bias", at::randn({8})},        {"h1.weight", at::randn({8, 8})},
                {"h1.bias", at::randn({8})},        {"h0.attn.bias", at::ones({4, 4})}};
    path_ = dir_ + "/model.safetensors";
    save_safetensors(path_, weights_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  at::Tensor w(const std::string& name) {
    for (auto& [n, t] : weights_) {
      if (n == name) return t;
    }
    return {};
  }

  // The family's knowledge of this tree.
  NameMapping family() {
    NameMapping m;
    m.checkpoint_to_module = [](const std::string& n) -> std::optional<std::string> {
      if (n.find(".attn.bias") != std::string::npos) return std::nullopt;
      return "transformer." + n;
    };
    m.tied = {{"transformer.wte.weight", "lm_head.weight"}};
    m.skip = [](const std::string& n) { return n == "transformer.mask"; };
    return m;
  }
  LoadOptions options() {
    LoadOptions o;
    o.names = family();
    o.engine.bar = ProgressBar::kOff;
    return o;
  }

  std::string dir_, path_;
  std::vector<std::pair<std::string, at::Tensor>> weights_;
};

TEST_F(LoadTest, MetaModuleTakesTheCheckpointInPlace) {
  Tiny m;
  at::Tensor held = m.named_parameters()["transformer.h0.weight"];  // held across the load
  LoadReport r = load(m, path_, options());
  EXPECT_TRUE(at::equal(held, w("h0.weight")));
  EXPECT_TRUE(held.requires_grad());
  auto p = m.named_parameters();
  EXPECT_TRUE(at::equal(p["transformer.h1.bias"], w("h1.bias")));
  EXPECT_TRUE(at::equal(m.wte, w("wte.weight")));
  EXPECT_TRUE(at::equal(m.head, w("wte.weight")));
  EXPECT_EQ(m.head.data_ptr(), m.wte.data_ptr());  // still one tensor
  EXPECT_TRUE(m.mask.is_meta());                   // computed buffer: not loaded
  EXPECT_EQ(r.engine, "cpu");
  EXPECT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.slot_bytes, (16 * 8 + 2 * (64 + 8)) * 4u);
}

TEST_F(LoadTest, OneErrorListsEveryProblemAndChangesNothing) {
  Tree m;
  m.add("transformer.wte.weight", meta({16, 9}));                 // shape
  m.add("transformer.h0.weight", meta({8, 8}, at::kLong), true);  // dtype (a buffer)
  m.add("transformer.h0.bias", meta({8}));
  m.add("transformer.extra", meta({3}));  // missing
  // h1.* absent: unexpected
  try {
    load(m, path_, options());
    FAIL();
  } catch (const MismatchError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[metaload.MismatchError] checkpoint '" + path_ +
                       "' does not fit: 1 missing, 2 unexpected, 2 mismatched"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("missing: transformer.extra [3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected: h1.bias (as transformer.h1.bias) in model.safetensors"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("mismatched: transformer.wte.weight: shape [16, 9] in the module but "
                       "'wte.weight' in model.safetensors gives [16, 8]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("mismatched: transformer.h0.weight: dtype Long in the module"),
              std::string::npos)
        << msg;
    EXPECT_EQ(e.missing().size(), 1u);
  }
  for (const auto& kv : m.named_parameters()) EXPECT_TRUE(kv.value().is_meta()) << kv.key();
  // Found before any allocation: no byte read, no arena, no slot tensor (the staged engine's
  // slots are at::empty, counted by the allocator), on either engine.
  auto sim = make_sim_device_ops();
  for (DeviceOps* staged : {static_cast<DeviceOps*>(nullptr), sim.get()}) {
    const int64_t arenas = HostArena::live_count();
    ReadLog log;
    LoadOptions o = options();
    log.attach(o);
    o.staged = staged;
    CountCpuAllocations count;
    const int64_t made = CountingCpuAllocator::made;
    EXPECT_THROW(load(m, path_, o), MismatchError);
    EXPECT_EQ(CountingCpuAllocator::made, made);
    EXPECT_EQ(HostArena::live_count(), arenas);
    EXPECT_EQ(sim_device_live_allocations(), 0);
    EXPECT_TRUE(log.reads->empty());
  }
  // Not strict: the unexpected ones are ignored, the rest still counts.
  LoadOptions o = options();
  o.strict = false;
  try {
    load(m, path_, o);
    FAIL();
  } catch (const MismatchError& e) {
    EXPECT_TRUE(e.unexpected().empty());
    EXPECT_EQ(e.mismatched().size(), 2u);
  }
}

// Computed targets (non-persistent buffers) take their values, never a checkpoint tensor of
// their name; unknown values are missing and a shape that does not fit is mismatched, in the one
// error, and nothing changes; a fresh copy, in the target's dtype even when `dtype` is set.
TEST_F(LoadTest, ComputedTargetsTakeTheirValuesInTheSameSwap) {
  LoadOptions o = options();
  o.names = NameMapping{};
  o.dtype = at::kBFloat16;
  const at::Tensor values = at::arange(4, at::kFloat);
  std::vector<LoadTarget> targets;
  for (const auto& [n, t] : weights_) targets.push_back({n, meta(t.sizes().vec())});
  targets.push_back({"inv_freq", meta({4}), /*computed=*/true, values});
  LoadReport r = load_tensors(targets, path_, o);
  EXPECT_EQ(r.files.size(), 1u);
  const at::Tensor& inv = targets.back().tensor;
  ASSERT_FALSE(inv.is_meta());
  EXPECT_EQ(inv.scalar_type(), at::kFloat);  // its own dtype: `dtype` converts checkpoint tensors
  EXPECT_TRUE(at::equal(inv, values));
  EXPECT_NE(inv.data_ptr(), values.data_ptr());  // a copy: the values may be another tensor's
  EXPECT_EQ(targets[0].tensor.scalar_type(), at::kBFloat16);

  // "h0.attn.bias" in the checkpoint is not a computed target's: unexpected; unknown values are
  // missing, values of another shape mismatched; every one in one error, nothing changed.
  std::vector<LoadTarget> bad;
  for (const auto& [n, t] : weights_) {
    if (n != "h0.attn.bias") bad.push_back({n, meta(t.sizes().vec())});
  }
  bad.push_back({"h0.attn.bias", meta({4, 4}), true, at::zeros({4, 4})});
  bad.push_back({"unknown", meta({2}), true, at::Tensor()});
  bad.push_back({"other_shape", meta({2}), true, at::zeros({3})});
  try {
    load_tensors(bad, path_, o);
    FAIL();
  } catch (const MismatchError& e) {
    EXPECT_EQ(e.unexpected(), std::vector<std::string>{"h0.attn.bias"});
    EXPECT_EQ(e.missing(), std::vector<std::string>{"unknown"});
    EXPECT_EQ(e.mismatched(), std::vector<std::string>{"other_shape"});
    EXPECT_NE(std::string(e.what()).find("missing: unknown [2] (a non-persistent buffer"),
              std::string::npos)
        << e.what();
  }
  for (const LoadTarget& t : bad) EXPECT_TRUE(t.tensor.is_meta()) << t.name;
}

// Names in the message are escaped (a NUL would end the message where torch and Python read it;
// a newline would forge a line) and each kind lists at most 20; the error keeps every name.
TEST_F(LoadTest, MismatchMessagesEscapeNamesAndListAtMostTwentyOfEachKind) {
  std::vector<LoadTarget> targets;
  const std::string forged = std::string("bad") + '\0' + "name\n  missing: forged";
  targets.push_back({forged, meta({2})});
  for (int i = 0; i < 100; ++i) targets.push_back({"m" + std::to_string(i), meta({1})});
  targets.push_back({std::string(10 << 20, 'x'), meta({3})});  // a 10 MB name
  LoadOptions o = options();
  o.names = NameMapping{};
  try {
    load_tensors(targets, path_, o);
    FAIL();
  } catch (const MismatchError& e) {
    const std::string msg = e.message();
    EXPECT_EQ(msg.find('\0'), std::string::npos);
    EXPECT_NE(msg.find("does not fit: 102 missing, 6 unexpected, 0 mismatched"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("\n  missing: bad\\x00name\\n  missing: forged [2]"), std::string::npos)
        << msg;
    size_t lines = 0;
    for (size_t at = 0; (at = msg.find("\n  missing: ", at)) != std::string::npos; ++at) ++lines;
    EXPECT_EQ(lines, 20u);
    EXPECT_NE(msg.find("\n  ... and 82 more missing"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 4096u);
    // Every name, in full and as given.
    ASSERT_EQ(e.missing().size(), 102u);
    EXPECT_EQ(e.missing().front(), forged);
    EXPECT_EQ(e.missing().back().size(), size_t{10} << 20);
    EXPECT_EQ(e.unexpected().size(), 6u);
    // The Python package reads them by the message.
    const std::optional<std::string> json = mismatch_names_json(e.message());
    ASSERT_TRUE(json.has_value());
    const nlohmann::json names = nlohmann::json::parse(*json);
    EXPECT_EQ(names["missing"].size(), 102u);
    EXPECT_EQ(names["missing"][0].get<std::string>(), forged);
    EXPECT_FALSE(mismatch_names_json(e.message() + " (another)").has_value());
  }
  // A name past kQuoteMaxChars is cut, with its size.
  std::vector<LoadTarget> one = {{std::string(10 << 20, 'y'), meta({3})}};
  try {
    load_tensors(one, path_, o);
    FAIL();
  } catch (const MismatchError& e) {
    EXPECT_NE(e.message().find("missing: " + std::string(kQuoteMaxChars, 'y') +
                               "... (10485760 bytes) [3]"),
              std::string::npos);
    EXPECT_LT(e.message().size(), 2048u);
  }
}

// Options a caller can get wrong are typed errors naming the option and the range, before any
// file is read; sizes are said in the caller's terms.
TEST_F(LoadTest, ThreadAndStagingOptionsOutOfRangeAreNamedErrors) {
  for (int threads : {-1, kMaxLoaderThreads + 1}) {
    Tiny m;
    LoadOptions o = options();
    o.threads = threads;
    try {
      load(m, path_, o);
      FAIL() << threads;
    } catch (const PlanError& e) {
      EXPECT_EQ(e.message(), "threads must be 0 (one per core) or from 1 to 1024, got " +
                                 std::to_string(threads));
    }
  }
  Tiny m;
  LoadOptions o = options();
  o.threads = 2;
  o.staging_bytes = 1;  // 0 bytes for each of the 2 readers: the old message said "0 bytes"
  try {
    load(m, path_, o);
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_EQ(e.message(),
              "staging_bytes 1 split among 2 reader threads leaves 0 bytes each, less than one "
              "4-byte element: staging_bytes must be at least 8");
  }
  for (const auto& kv : m.named_parameters()) EXPECT_TRUE(kv.value().is_meta()) << kv.key();
  o.staging_bytes = 8;  // the smallest that works
  load(m, path_, o);
  EXPECT_TRUE(at::equal(m.wte, w("wte.weight")));
  // The staged engine: the bound is split among its ring buffers.
  auto sim = make_sim_device_ops();
  Tiny s;
  o.staged = sim.get();
  o.staging_bytes = 3;
  try {
    load(s, path_, o);
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(e.message().find("staging_bytes 3 split among 4 ring buffers leaves 0 bytes each"),
              std::string::npos)
        << e.message();
  }
}

TEST_F(LoadTest, DtypesConvertToTheModulesOrToTheAskedOne) {
  // A bf16 checkpoint into a float module: converted to float, bit-exact with torch's .to().
  std::vector<std::pair<std::string, at::Tensor>> bf;
  for (auto& [n, t] : weights_) bf.push_back({n, t.to(at::kBFloat16)});
  const std::string p = dir_ + "/bf16.safetensors";
  save_safetensors(p, bf);
  Tiny m;
  load(m, p, options());
  EXPECT_EQ(m.wte.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(m.wte, w("wte.weight").to(at::kBFloat16).to(at::kFloat)));
  // dtype=f16: every floating tensor becomes f16.
  Tiny h;
  LoadOptions o = options();
  o.dtype = at::kHalf;
  load(h, p, o);
  EXPECT_EQ(h.wte.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(h.wte, w("wte.weight").to(at::kBFloat16).to(at::kHalf)));
}

TEST_F(LoadTest, ShardedCheckpointsAndTheStagedTwin) {
  ShardOptions so;
  so.num_shards = 3;
  save_safetensors_sharded(dir_, weights_, so);
  auto dev = make_sim_device_ops();
  for (DeviceOps* staged : {static_cast<DeviceOps*>(nullptr), dev.get()}) {
    Tiny m;
    LoadOptions o = options();
    o.staged = staged;
    LoadReport r = load(m, dir_ + "/model.safetensors.index.json", o);
    EXPECT_EQ(r.files.size(), 3u);
    EXPECT_TRUE(at::equal(m.named_parameters()["transformer.h1.weight"], w("h1.weight")));
    EXPECT_TRUE(at::equal(m.head, w("wte.weight")));
  }
}

TEST_F(LoadTest, PreviousWeightsSurviveAFailedLoad) {
  std::vector<std::pair<std::string, at::Tensor>> other;
  for (auto& [n, t] : weights_) other.push_back({n, t + 1});
  const std::string p = dir_ + "/other.safetensors";
  save_safetensors(p, other);
  // The file "shrinks" halfway through its data while being read: reads past there find its end.
  const SafetensorsHeader header = read_safetensors_header(p);
  const uint64_t cut = header.data_start + header.data_size() / 2;
  auto sim = make_sim_device_ops();
  for (DeviceOps* staged : {static_cast<DeviceOps*>(nullptr), sim.get()}) {
    SCOPED_TRACE(staged ? "staged twin" : "cpu engine");
    Tiny m(/*on_meta=*/false);
    load(m, path_, options());
    std::map<std::string, std::pair<at::Tensor, const void*>> before;
    for (const auto& kv : m.named_parameters())
      before[kv.key()] = {kv.value().clone(), kv.value().data_ptr()};
    const int64_t arenas = HostArena::live_count();
    // Each failure kind after the plan: a read fault, truncation during the read, a cancel, a
    // mismatch found late.
    std::atomic<bool> cancel{false};
    std::vector<std::function<void(LoadOptions&)>> faults = {
        [](LoadOptions& o) {
          o.engine.hooks.pread = [](int, void*, size_t, uint64_t) -> ssize_t {
            errno = EIO;
            return -1;
          };
        },
        [cut](LoadOptions& o) {
          o.engine.hooks.pread = [cut](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
            if (off >= cut) return 0;  // end of file
            return ::pread(fd, buf, std::min<uint64_t>(n, cut - off), static_cast<off_t>(off));
          };
        },
        [&](LoadOptions& o) {
          cancel = true;
          o.engine.cancel = &cancel;
        },
        [](LoadOptions& o) { o.engine.hooks.before_verify = [] { throw VerifyError("late"); }; },
    };
    for (size_t f = 0; f < faults.size(); ++f) {
      SCOPED_TRACE("fault " + std::to_string(f));
      LoadOptions o = options();
      o.staged = staged;
      faults[f](o);
      {
        CountCpuAllocations count;  // the staged engine's slots: at::empty tensors
        const int64_t live = CountingCpuAllocator::live;
        EXPECT_THROW(load(m, p, o), LoadError);
        EXPECT_EQ(CountingCpuAllocator::live, live);  // every slot freed
      }
      for (const auto& kv : m.named_parameters()) {
        EXPECT_TRUE(at::equal(kv.value(), before[kv.key()].first)) << kv.key();
        EXPECT_EQ(kv.value().data_ptr(), before[kv.key()].second) << kv.key();
      }
      EXPECT_EQ(HostArena::live_count(), arenas);
      EXPECT_EQ(sim_device_live_allocations(), 0);
    }
    LoadOptions o = options();
    o.staged = staged;
    {
      CountCpuAllocations count;
      const int64_t made = CountingCpuAllocator::made;
      load(m, p, o);
      // The counter does see the staged engine's slots (so "freed" above means something).
      if (staged) EXPECT_GT(CountingCpuAllocator::made, made);
    }
    for (const auto& kv : m.named_parameters())
      EXPECT_TRUE(at::equal(kv.value(), before[kv.key()].first + 1)) << kv.key();
  }
}

// LoadOptions' threads, staging_bytes and progress reach the engine.
TEST_F(LoadTest, ThreadsStagingAndProgressArePassedOn) {
  std::vector<std::pair<std::string, at::Tensor>> bf;
  for (auto& [n, t] : weights_) bf.push_back({n, t.to(at::kBFloat16)});
  const std::string p = dir_ + "/bf16.safetensors";
  save_safetensors(p, bf);  // into a float module: every tensor converts through staging
  for (int threads : {1, 3}) {
    Tiny m;
    LoadOptions o = options();
    o.threads = threads;
    o.staging_bytes = 96;  // far below the 64 MiB default: many small pieces
    std::vector<Progress> seen;
    o.progress = [&](const Progress& pr) { seen.push_back(pr); };
    LoadReport r = load(m, p, o);
    EXPECT_EQ(r.threads, threads);
    EXPECT_GT(r.peak_staging_bytes, 0u);
    EXPECT_LE(r.peak_staging_bytes, 96u);
    EXPECT_GE(r.reads, r.bytes / 96);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back().bytes_done, r.bytes);
    EXPECT_EQ(seen.back().bytes_total, r.bytes);
    EXPECT_TRUE(at::equal(m.wte, w("wte.weight").to(at::kBFloat16).to(at::kFloat)));
  }
}

// A dim-0 slice reads only its own bytes, also when it converts or goes through the staged twin
// (whose reads would otherwise run through small holes: here, other ranks' rows).
TEST_F(LoadTest, ADim0SliceReadsOnlyItsOwnBytes) {
  std::vector<std::pair<std::string, at::Tensor>> bf;
  for (auto& [n, t] : weights_) bf.push_back({n, t.to(at::kBFloat16)});
  const std::string bf_path = dir_ + "/bf16.safetensors";
  save_safetensors(bf_path, bf);
  auto tp = [](const std::string& name, const std::vector<int64_t>& shape, int rank, int size) {
    return even_shard(shape, {0, rank, size}, name);
  };
  const std::vector<std::string> names = {"wte.weight", "h0.weight", "h0.bias", "h1.weight",
                                          "h1.bias"};
  auto sim = make_sim_device_ops();
  struct Case {
    std::string path;
    DeviceOps* staged;
    const char* what;
  };
  for (const Case& c :
       {Case{path_, nullptr, "as stored"}, Case{bf_path, nullptr, "bf16->f32"},
        Case{path_, sim.get(), "staged"}, Case{bf_path, sim.get(), "staged bf16"}}) {
    const SafetensorsHeader header = read_safetensors_header(c.path);
    for (int size : {2, 4}) {
      for (int rank = 0; rank < size; ++rank) {
        SCOPED_TRACE(std::string(c.what) + " rank " + std::to_string(rank) + " of " +
                     std::to_string(size));
        Tree m;
        for (const std::string& n : names) {
          std::vector<int64_t> shape = w(n).sizes().vec();
          shape[0] /= size;
          m.add("transformer." + n, meta(shape));
        }
        LoadOptions o = options();
        o.names.tied.clear();
        o.names.tp_shard = tp;
        o.tp_rank = rank;
        o.tp_size = size;
        o.staged = c.staged;
        o.engine.map_files = false;
        ReadLog log;
        log.attach(o);
        LoadReport r = load(m, c.path, o);
        // The rank's rows of every tensor, as absolute byte ranges, touching ones merged.
        std::vector<std::pair<uint64_t, uint64_t>> own;
        uint64_t own_bytes = 0;
        for (const std::string& n : names) {
          const TensorInfo* t = header.find(n);
          ASSERT_NE(t, nullptr);
          const uint64_t part = t->nbytes() / size;
          const uint64_t b = header.data_start + t->begin + rank * part;
          own.push_back({b, b + part});
          own_bytes += part;
          const at::Tensor want = w(n).to(c.path == bf_path ? at::kBFloat16 : at::kFloat);
          EXPECT_TRUE(at::equal(m.named_parameters()["transformer." + n],
                                want.chunk(size, 0)[rank].to(at::kFloat)))
              << n;
        }
        std::sort(own.begin(), own.end());
        std::vector<std::pair<uint64_t, uint64_t>> merged;
        for (auto iv : own) {
          if (!merged.empty() && iv.first <= merged.back().second)
            merged.back().second = std::max(merged.back().second, iv.second);
          else
            merged.push_back(iv);
        }
        ASSERT_FALSE(log.reads->empty());
        for (auto [b, e] : *log.reads) {
          const bool inside = std::any_of(merged.begin(), merged.end(), [&](const auto& iv) {
            return iv.first <= b && e <= iv.second;
          });
          EXPECT_TRUE(inside) << "read [" << b << ", " << e << ") touches another rank's rows";
        }
        EXPECT_EQ(r.bytes, own_bytes);
      }
    }
  }
}

TEST_F(LoadTest, TensorParallelRanksPutTogetherEqualTheFullModel) {
  // Column-parallel h*.weight / h*.bias (dim 0), row-parallel wte (dim 1): every rank's module is
  // built with its shard shapes.
  auto tp = [](const std::string& name, const std::vector<int64_t>& shape, int rank, int size) {
    const int dim = name.find("wte") != std::string::npos ? 1 : 0;
    return even_shard(shape, {dim, rank, size}, name);
  };
  for (int size : {1, 2, 4}) {
    std::vector<at::Tensor> h0w, wte;
    for (int rank = 0; rank < size; ++rank) {
      Tree m;
      m.add("transformer.wte.weight", meta({16, 8 / size}));
      m.add("transformer.h0.weight", meta({8 / size, 8}));
      m.add("transformer.h0.bias", meta({8 / size}));
      m.add("transformer.h1.weight", meta({8 / size, 8}));
      m.add("transformer.h1.bias", meta({8 / size}));
      LoadOptions o = options();
      o.names.tied.clear();
      o.names.tp_shard = tp;
      o.tp_rank = rank;
      o.tp_size = size;
      load(m, path_, o);
      h0w.push_back(m.named_parameters()["transformer.h0.weight"]);
      wte.push_back(m.named_parameters()["transformer.wte.weight"]);
    }
    EXPECT_TRUE(at::equal(at::cat(h0w, 0), w("h0.weight"))) << size;
    EXPECT_TRUE(at::equal(at::cat(wte, 1), w("wte.weight"))) << size;
  }
  Tiny m;
  LoadOptions o = options();
  o.tp_size = 2;
  EXPECT_THROW(load(m, path_, o), PlanError);  // no TP plan given
}

TEST_F(LoadTest, CorruptOrTruncatedCheckpointsFailBeforeAnyAllocation) {
  const int64_t arenas = HostArena::live_count();
  // Cut off the last tensor's bytes: the header no longer matches the file.
  const std::string cut = dir_ + "/cut.safetensors";
  fs::copy_file(path_, cut);
  fs::resize_file(cut, fs::file_size(cut) - 10);
  // Garbage where the header length should be.
  const std::string junk = dir_ + "/junk.safetensors";
  std::ofstream(junk, std::ios::binary) << "this is not a safetensors file at all";
  for (const std::string& p : {cut, junk}) {
    Tiny m;
    EXPECT_THROW(load(m, p, options()), FormatError) << p;
    for (const auto& kv : m.named_parameters()) EXPECT_TRUE(kv.value().is_meta()) << kv.key();
    EXPECT_EQ(HostArena::live_count(), arenas);
  }
}

TEST_F(LoadTest, MissingCheckpointIsAResolveError) {
  Tiny m;
  EXPECT_THROW(load(m, dir_ + "/nowhere", options()), ResolveError);
  for (const auto& kv : m.named_parameters()) EXPECT_TRUE(kv.value().is_meta());
}

}  // namespace
}  // namespace metaload

namespace metaload {
namespace {

// Zero-copy (map_files): tensors stored as loaded point into copy-on-write file mappings.
TEST_F(LoadTest, MappedLoadEqualsACopiedLoadAndNeverWritesTheFile) {
  Tiny copied;
  load(copied, path_, options());
  Tiny mapped;
  at::Tensor held = mapped.named_parameters()["transformer.h0.weight"];
  LoadOptions o = options();
  o.engine.map_files = true;
  const auto before = fs::last_write_time(path_);
  std::ifstream f(path_, std::ios::binary);
  const std::string bytes_before((std::istreambuf_iterator<char>(f)), {});
  LoadReport r = load(mapped, path_, o);
  EXPECT_EQ(r.engine, "cpu+mapped");
  EXPECT_EQ(r.mapped_bytes, r.slot_bytes);  // every tensor here is stored as loaded
  EXPECT_EQ(r.direct_bytes, 0u);
  for (const auto& item : copied.named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), mapped.named_parameters()[item.key()])) << item.key();
  }
  EXPECT_TRUE(at::equal(held, w("h0.weight")));
  EXPECT_EQ(FileMapping::live_count(), 1);
  // A write to a weight copies its page; the checkpoint never changes.
  {
    at::NoGradGuard no_grad;
    held.fill_(42.0f);
  }
  EXPECT_EQ(held.sum().item<float>(), 42.0f * 64);
  std::ifstream g(path_, std::ios::binary);
  const std::string bytes_after((std::istreambuf_iterator<char>(g)), {});
  EXPECT_EQ(bytes_after, bytes_before);
  EXPECT_EQ(fs::last_write_time(path_), before);
}

TEST_F(LoadTest, MappedLoadConvertsWhatNeedsConvertingThroughTheEngine) {
  Tiny mapped;
  LoadOptions o = options();
  o.engine.map_files = true;
  o.dtype = at::kHalf;  // every tensor converts: nothing can be mapped
  LoadReport r = load(mapped, path_, o);
  EXPECT_EQ(r.mapped_bytes, 0u);
  EXPECT_EQ(r.engine, "cpu");
  EXPECT_TRUE(at::equal(mapped.wte, w("wte.weight").to(at::kHalf)));
}

TEST_F(LoadTest, MappedLoadOfATruncatedFileFailsAndLeavesNothingBehind) {
  // The header promises more data than the file holds: mapping would SIGBUS on access, so the
  // load checks sizes and faults pages in before anything is swapped.
  const auto size = fs::file_size(path_);
  fs::resize_file(path_, size - 100);
  Tiny m;
  LoadOptions o = options();
  o.engine.map_files = true;
  EXPECT_THROW(load(m, path_, o), Error);
  EXPECT_TRUE(m.wte.is_meta());
  EXPECT_EQ(FileMapping::live_count(), 0);
}

TEST(FileMappingTest, PopulatingPagesPastTheEndIsAReadErrorNotASignal) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(base ? base : "/tmp") + "/metaload_mapping_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    std::string page(1 << 16, 'x');
    out << page;
  }
  // A writer holding the file open keeps the kernel from granting a read lease, so the
  // truncation lands under the mapping instead of waiting for it to detach (file_mapping.h).
  std::ofstream writer(path, std::ios::binary | std::ios::in | std::ios::out);
  auto map = FileMapping::open(path, 1 << 16);
  EXPECT_EQ(map->guard(), MappingGuard::kChecked);
  map->populate(0, 1 << 16);
  EXPECT_EQ(map->data()[100], 'x');
  fs::resize_file(path, 4096);  // another process truncates the file under the mapping
  EXPECT_THROW(map->populate(0, 1 << 16), ReadError);
  EXPECT_THROW(map->check(), FileChangedError);
  EXPECT_THROW(FileMapping::open(path, 1 << 16), ReadError);  // the size no longer matches
  map.reset();
  fs::remove(path);
}

}  // namespace
}  // namespace metaload

namespace metaload {
namespace {

TEST_F(LoadTest, MappingIsTheDefaultForHuggingFaceCacheBlobsOnly) {
  // A Hugging Face cache holding this checkpoint as a content-addressed blob.
  const std::string cache = dir_ + "/hub";
  const std::string repo = cache + "/models--org--tiny";
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  fs::create_directories(repo + "/blobs");
  fs::create_directories(repo + "/refs");
  fs::create_directories(repo + "/snapshots/" + commit);
  fs::copy_file(path_, repo + "/blobs/feedface");
  fs::create_symlink("../../blobs/feedface", repo + "/snapshots/" + commit + "/model.safetensors");
  std::ofstream(repo + "/refs/main") << commit;
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  Tiny from_cache;
  LoadReport r = load(from_cache, "org/tiny", options());
  ::unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(r.engine, "cpu+mapped");
  EXPECT_TRUE(at::equal(from_cache.wte, w("wte.weight")));
  Tiny from_snapshot;  // the snapshot directory itself: its files are still blobs
  EXPECT_EQ(load(from_snapshot, repo + "/snapshots/" + commit, options()).engine, "cpu+mapped");
  Tiny from_dir;
  EXPECT_EQ(load(from_dir, path_, options()).engine, "cpu");  // a plain file may be rewritten
  LoadOptions never = options();
  never.map_files = false;
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  Tiny copied;
  EXPECT_EQ(load(copied, "org/tiny", never).engine, "cpu");
  ::unsetenv("HF_HUB_CACHE");
}

}  // namespace
}  // namespace metaload
