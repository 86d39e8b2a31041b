// Slots as tensors and the all-or-nothing swap: meta Parameters take loaded data in place (same
// TensorImpl, autograd state kept), torch::nn modules see it through references taken before, and
// any failure leaves every target as it was and frees every slot.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "loader/engine/slots.h"
#include "loader/load/slots_torch.h"
#include "loader/load/swap.h"

namespace metaload {
namespace {

namespace fs = std::filesystem;

at::Tensor meta(at::IntArrayRef sizes, at::ScalarType t = at::kFloat) {
  return at::empty(sizes, at::TensorOptions().dtype(t).device(at::kMeta));
}

TEST(SwapTest, MetaParameterTakesLoadedDataInPlace) {
  at::Tensor p = meta({4, 3}).requires_grad_(true);
  at::Tensor ref = p;  // another handle on the same TensorImpl, taken before the load
  const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
  at::Tensor src = at::randn({4, 3});
  swap_in({p}, {src}, {"w"});
  EXPECT_EQ(ref.unsafeGetTensorImpl(), impl);
  EXPECT_TRUE(ref.device().is_cpu());
  EXPECT_TRUE(at::equal(ref, src));
  EXPECT_TRUE(ref.requires_grad());
  EXPECT_TRUE(ref.is_leaf());
  (ref * 2).sum().backward();
  ASSERT_TRUE(ref.grad().defined());
  EXPECT_TRUE(at::equal(ref.grad(), at::full({4, 3}, 2.0f)));
}

struct Net : torch::nn::Module {
  Net() {
    w = register_parameter("w", meta({5, 2}));
    running = register_buffer("running", meta({5}));
    lin = register_module("lin", torch::nn::Linear(2, 5));  // on the CPU: "previous weights"
  }
  at::Tensor forward(const at::Tensor& x) { return lin(x) + at::matmul(x, w.t()) + running; }
  at::Tensor w, running;
  torch::nn::Linear lin{nullptr};
};

TEST(SwapTest, TorchNnModuleParametersAndBuffers) {
  auto net = std::make_shared<Net>();
  at::Tensor lin_weight = net->lin->weight;  // held across the load
  std::vector<at::Tensor> targets;
  std::vector<std::string> names;
  for (const auto& kv : net->named_parameters()) {
    names.push_back(kv.key());
    targets.push_back(kv.value());
  }
  for (const auto& kv : net->named_buffers()) {
    names.push_back(kv.key());
    targets.push_back(kv.value());
  }
  std::vector<at::Tensor> sources;
  for (const at::Tensor& t : targets) sources.push_back(at::randn(t.sizes()));
  swap_in(targets, sources, names);
  for (size_t i = 0; i < targets.size(); ++i) EXPECT_TRUE(at::equal(targets[i], sources[i]));
  ASSERT_EQ(names, (std::vector<std::string>{"w", "lin.weight", "lin.bias", "running"}));
  EXPECT_TRUE(at::equal(lin_weight, sources[1]));
  EXPECT_TRUE(net->w.device().is_cpu());
  EXPECT_TRUE(net->w.requires_grad());
  EXPECT_FALSE(net->running.requires_grad());
  at::Tensor x = at::randn({3, 2});
  at::Tensor want =
      at::linear(x, sources[1], sources[2]) + at::matmul(x, sources[0].t()) + sources[3];
  EXPECT_TRUE(at::allclose(net->forward(x), want));
  net->forward(x).sum().backward();
  EXPECT_TRUE(net->w.grad().defined());
}

TEST(SwapTest, ChecksEverythingBeforeChangingAnything) {
  at::Tensor a = meta({2, 2}).requires_grad_(true), b = meta({3, 3});
  try {
    swap_in({a, b}, {at::randn({2, 2}), at::randn({4, 4})}, {"layer.a", "layer.b"});
    FAIL();
  } catch (const SwapError& e) {
    EXPECT_NE(std::string(e.what()).find("'layer.b': shape [3, 3] in the module but [4, 4] loaded"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(a.is_meta());  // the first pair was fine but was not swapped
  EXPECT_TRUE(b.is_meta());
  EXPECT_THROW(swap_in({a}, {}), SwapError);
  EXPECT_THROW(swap_in({a}, {at::Tensor()}), SwapError);
  EXPECT_THROW(swap_in({a}, {at::zeros({2, 2}, at::kLong)}), SwapError);  // int cannot require grad
  EXPECT_THROW(swap_in({at::randn({2, 2}).to_sparse()}, {at::randn({2, 2})}), SwapError);
  EXPECT_TRUE(a.is_meta());
}

TEST(SwapTest, TiedTensorsTakeOneSource) {
  at::Tensor t = meta({2, 3});
  at::Tensor s = at::randn({2, 3});
  swap_in({t, t}, {s, s}, {"embed", "lm_head"});
  EXPECT_TRUE(at::equal(t, s));
  at::Tensor u = meta({2, 3});
  EXPECT_THROW(swap_in({u, u}, {at::randn({2, 3}), at::randn({2, 3})}, {"embed", "lm_head"}),
               SwapError);
  EXPECT_TRUE(u.is_meta());
}

TEST(SwapTest, DtypeChangeDropsTheStaleGradAccumulator) {
  at::Tensor p = at::randn({3}).requires_grad_(true);
  (p * p).sum().backward();  // creates and caches p's AccumulateGrad node
  p.mutable_grad() = at::Tensor();
  swap_in({p}, {at::randn({3}).to(at::kDouble)});
  EXPECT_EQ(p.scalar_type(), at::kDouble);
  (p * 3).sum().backward();  // a stale accumulator would reject the double gradient
  EXPECT_EQ(p.grad().scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(p.grad(), at::full({3}, 3.0, at::kDouble)));
}

// --- load_slots: slots on the device, filled, or all freed ------------------------------------

class LoadSlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/metaload_swap_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // One raw shard: w [8, 6] f32 at 0, e [10, 4] f32 after it, h [7] f16, i [3] int64.
    torch::manual_seed(3);
    w_ = at::randn({8, 6});
    e_ = at::randn({10, 4});
    h_ = at::randn({7}).to(at::kHalf);
    i_ = at::arange(3, at::kLong);
    path_ = dir_ + "/shard.bin";
    std::ofstream f(path_, std::ios::binary);
    for (const at::Tensor& t : {w_, e_, h_, i_}) {
      offsets_.push_back(static_cast<uint64_t>(f.tellp()));
      f.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  SlotSpec spec(const std::string& name, int which, at::ScalarType dtype, TpSlice slice = {}) {
    const at::Tensor& t = which == 0 ? w_ : which == 1 ? e_ : which == 2 ? h_ : i_;
    SlotSpec s;
    s.name = name;
    s.data_offset = offsets_[which];
    s.stored_shape = t.sizes().vec();
    s.stored_dtype = t.scalar_type();
    s.dtype = dtype;
    s.slice = slice;
    return s;
  }
  std::vector<SlotSpec> mixed() {
    return {spec("w", 0, at::kFloat),
            spec("w.bf16", 0, at::kBFloat16),
            spec("w.rows", 0, at::kFloat, {1, 1, 2}),
            spec("e.cols", 1, at::kHalf, {0, 1, 5}),
            spec("h", 2, at::kFloat),
            spec("i", 3, at::kLong)};
  }
  std::vector<at::Tensor> want() {
    return {w_,
            w_.to(at::kBFloat16),
            w_.slice(1, 3, 6),
            e_.slice(0, 2, 4).to(at::kHalf),
            h_.to(at::kFloat),
            i_};
  }
  EngineOptions quiet() {
    EngineOptions o;
    o.bar = ProgressBar::kOff;
    return o;
  }

  std::string dir_, path_;
  at::Tensor w_, e_, h_, i_;
  std::vector<uint64_t> offsets_;
};

TEST_F(LoadSlotsTest, CpuSlotsLiveInOneArenaAndHoldTheData) {
  const int64_t arenas = HostArena::live_count();
  {
    SlotLoad l = load_slots({path_}, mixed(), at::kCPU, quiet());
    std::vector<at::Tensor> w = want();
    ASSERT_EQ(l.tensors.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(l.tensors[i].scalar_type(), w[i].scalar_type()) << i;
      EXPECT_TRUE(at::equal(l.tensors[i], w[i])) << i;
    }
    EXPECT_EQ(HostArena::live_count(), arenas + 1);
    EXPECT_EQ(l.report.engine, "cpu");
    // w and e are neighbours in the file and are both read as they are: back to back in one
    // arena, so one read fills both.
    SlotLoad pair = load_slots({path_}, {spec("w", 0, at::kFloat), spec("e", 1, at::kFloat)},
                               at::kCPU, quiet());
    EXPECT_EQ(static_cast<char*>(pair.tensors[1].data_ptr()),
              static_cast<char*>(pair.tensors[0].data_ptr()) + w_.nbytes());
    EXPECT_EQ(pair.report.reads, 1u);
    EXPECT_EQ(pair.report.direct_bytes, w_.nbytes() + e_.nbytes());
    pair = SlotLoad();
    at::Tensor keep = l.tensors[3];
    l.tensors.clear();
    EXPECT_EQ(HostArena::live_count(), arenas + 1);  // a tensor still holds the arena
  }
  EXPECT_EQ(HostArena::live_count(), arenas);
}

TEST_F(LoadSlotsTest, StagedTwinFillsDeviceTensorsIdentically) {
  auto dev = make_sim_device_ops();
  SlotLoad l = load_slots({path_}, mixed(), at::kCPU, quiet(), dev.get());
  std::vector<at::Tensor> w = want();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(at::equal(l.tensors[i], w[i])) << i;
  EXPECT_EQ(l.report.engine, "staged:sim");
}

TEST_F(LoadSlotsTest, FamilyShardsInterleaveSectionsAndPadTheVocabulary) {
  // w_ as a GPT-2 Conv1D c_attn [in=8, out=6] with three sections of 2 (q|k|v), column-parallel
  // (dim 1), rank 1 of 2; e_ as a vocabulary [10, 4] split by rows, rank 1 of 2, padded to 6.
  SlotSpec qkv = spec("c_attn", 0, at::kFloat);
  qkv.shard = TpShard{1, {{1, 2}, {3, 4}, {5, 6}}, {8, 3}};
  SlotSpec vocab = spec("wte", 1, at::kBFloat16);
  vocab.shard = TpShard{0, {{5, 10}}, {6, 4}};
  const at::Tensor want_qkv = at::cat({w_.slice(1, 1, 2), w_.slice(1, 3, 4), w_.slice(1, 5, 6)}, 1);
  const at::Tensor want_vocab =
      at::cat({e_.slice(0, 5, 10), at::zeros({1, 4})}, 0).to(at::kBFloat16);
  auto dev = make_sim_device_ops();
  for (DeviceOps* staged : {static_cast<DeviceOps*>(nullptr), dev.get()}) {
    SlotLoad l = load_slots({path_}, {qkv, vocab}, at::kCPU, quiet(), staged);
    EXPECT_TRUE(at::equal(l.tensors[0], want_qkv)) << l.report.engine;
    EXPECT_TRUE(at::equal(l.tensors[1], want_vocab)) << l.report.engine;
  }
  SlotSpec bad = qkv;
  bad.shard->ranges.push_back({0, 7});
  EXPECT_THROW(load_slots({path_}, {bad}, at::kCPU, quiet()), SliceError);
}

TEST_F(LoadSlotsTest, AFailedLoadFreesEverySlotAndLeavesTheModuleAsBefore) {
  at::Tensor w = meta({8, 6}).requires_grad_(true), e = meta({10, 4});
  const int64_t arenas = HostArena::live_count();
  EngineOptions o = quiet();
  o.hooks.before_verify = [] { throw VerifyError("late mismatch"); };
  try {
    SlotLoad l =
        load_slots({path_}, {spec("w", 0, at::kFloat), spec("e", 1, at::kFloat)}, at::kCPU, o);
    swap_in({w, e}, l.tensors);
    FAIL();
  } catch (const VerifyError&) {
  }
  EXPECT_EQ(HostArena::live_count(), arenas);
  EXPECT_TRUE(w.is_meta());
  EXPECT_TRUE(e.is_meta());
  // And the same load without the fault goes through.
  SlotLoad l =
      load_slots({path_}, {spec("w", 0, at::kFloat), spec("e", 1, at::kFloat)}, at::kCPU, quiet());
  swap_in({w, e}, l.tensors);
  EXPECT_TRUE(at::equal(w, w_));
  EXPECT_TRUE(at::equal(e, e_));
  EXPECT_TRUE(w.requires_grad());
}

TEST_F(LoadSlotsTest, UnloadableSpecsAreNamed) {
  try {
    load_slots({path_}, {spec("i", 3, at::kFloat)}, at::kCPU, quiet());
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'i': cannot convert Long to Float"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_slots({path_}, {spec("w", 0, at::kFloat, {1, 0, 4})}, at::kCPU, quiet()),
               SliceError);
  if (!cuda_device_available()) {
    EXPECT_THROW(load_slots({path_}, {spec("w", 0, at::kFloat)}, at::Device("cuda:0"), quiet()),
                 DeviceError);
  }
}

}  // namespace
}  // namespace metaload
