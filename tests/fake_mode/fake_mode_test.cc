#include "fake_mode/fake_mode.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "c10_ext/meta_mode.h"
#include "fake_mode/fake_tensor.h"
#include "fake_mode/scan.h"
#include "fake_mode/scan_module.h"

namespace metaload {
namespace {

const c10::Device kCuda0("cuda:0");
const c10::Device kCuda1("cuda:1");

TEST(FakeTensor, ClaimsItsDeviceWithoutMemoryEvenWithoutCuda) {
  at::Tensor t = empty_fake({4, 8}, at::kHalf, kCuda1);
  EXPECT_TRUE(is_fake(t));
  EXPECT_EQ(t.device(), kCuda1);
  EXPECT_TRUE(t.is_cuda());
  EXPECT_FALSE(t.is_meta());
  EXPECT_EQ(t.sizes(), at::IntArrayRef({4, 8}));
  EXPECT_EQ(t.strides(), at::IntArrayRef({8, 1}));
  EXPECT_EQ(t.scalar_type(), at::kHalf);
}

TEST(FakeTensor, TouchingDataIsATypedError) {
  at::Tensor t = empty_fake({3}, at::kFloat, kCuda0);
  EXPECT_THROW(t.data_ptr(), DataDependentError);
  EXPECT_THROW(t.data_ptr<float>(), DataDependentError);
  EXPECT_THROW(t.sum().item<float>(), DataDependentError);
  std::ostringstream out;
  EXPECT_THROW(out << t, DataDependentError);
}

TEST(FakeMode, FactoriesLandOnTheModeDeviceOrTheExplicitOne) {
  FakeMode mode(kCuda0);
  at::Tensor a = torch::randn({2, 3});
  at::Tensor b = torch::zeros({5}, torch::TensorOptions().device(torch::kCPU).dtype(torch::kLong));
  at::Tensor c = torch::arange(10);
  at::Tensor d = torch::empty_like(a);
  at::Tensor e = torch::ones({2}, torch::TensorOptions().device(kCuda1));
  // "cuda" without an index is the current cuda device, as in a real run.
  EXPECT_EQ(torch::ones({2}, torch::TensorOptions().device(torch::kCUDA)).device(), kCuda0);
  EXPECT_EQ(a.to(torch::kCUDA).device(), kCuda0);
  for (const auto& t : {a, b, c, d, e}) EXPECT_TRUE(is_fake(t));
  EXPECT_EQ(a.device(), kCuda0);
  EXPECT_EQ(b.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(b.scalar_type(), torch::kLong);
  EXPECT_EQ(c.device(), kCuda0);
  EXPECT_EQ(c.sizes(), at::IntArrayRef({10}));
  EXPECT_EQ(d.device(), kCuda0);
  EXPECT_EQ(e.device(), kCuda1);
}

TEST(FakeMode, ShapesStridesDtypesAndAutogradHistoryAsInARealRun) {
  FakeMode mode(kCuda0);
  at::Tensor x = torch::randn({8, 16}, torch::TensorOptions().requires_grad(true));
  at::Tensor w = torch::randn({32, 16}, torch::TensorOptions().dtype(torch::kFloat));
  at::Tensor y = torch::relu(torch::matmul(x, w.t())).sum(1, /*keepdim=*/true);
  EXPECT_EQ(y.sizes(), at::IntArrayRef({8, 1}));
  EXPECT_EQ(y.device(), kCuda0);
  EXPECT_TRUE(y.requires_grad());
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "SumBackward1");
  at::Tensor v = x.t();
  EXPECT_EQ(v.strides(), at::IntArrayRef({1, 16}));
  EXPECT_TRUE(v.is_view());
  at::Tensor h = x.to(torch::kHalf);
  EXPECT_EQ(h.scalar_type(), torch::kHalf);
  at::Tensor promoted = torch::ones({2}, torch::kInt) + torch::ones({2}, torch::kDouble);
  EXPECT_EQ(promoted.scalar_type(), torch::kDouble);
  at::Tensor cl = torch::empty({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.strides(), at::IntArrayRef({60, 1, 15, 3}));
}

TEST(FakeMode, InPlaceOpsKeepTheTensorAndDetachKeepsItFake) {
  FakeMode mode(kCuda0);
  at::Tensor x = torch::zeros({4, 4});
  at::Tensor& r = x.add_(1).mul_(2);
  EXPECT_EQ(r.unsafeGetTensorImpl(), x.unsafeGetTensorImpl());
  at::Tensor d = x.detach();
  EXPECT_TRUE(is_fake(d));
  EXPECT_EQ(d.device(), kCuda0);
  x.unsqueeze_(0);
  EXPECT_EQ(x.sizes(), at::IntArrayRef({1, 4, 4}));
}

TEST(FakeMode, MixingDevicesIsTheErrorARealRunRaisesExceptZeroDimCpuTensors) {
  FakeMode mode(kCuda0);
  at::Tensor gpu = torch::ones({3});
  at::Tensor cpu = torch::ones({3}, torch::TensorOptions().device(torch::kCPU));
  try {
    (void)(gpu + cpu);
    ADD_FAILURE() << "mixed cuda and cpu without an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Expected all tensors to be on the same device"),
              std::string::npos);
  }
  at::Tensor scalar = torch::tensor(2.0, torch::TensorOptions().device(torch::kCPU));
  EXPECT_EQ((gpu * scalar).device(), kCuda0);
  EXPECT_THROW((void)(gpu + torch::ones({3}, torch::TensorOptions().device(kCuda1))), c10::Error);
}

TEST(FakeMode, RealTensorsEnterAsFakeOnTheirDeviceAndStayUntouched) {
  at::Tensor real = torch::arange(6, torch::kFloat).reshape({2, 3});
  at::Tensor real_scalar = torch::tensor(2.0);
  const c10::Device cpu(c10::kCPU);
  {
    // The mode claims cuda:1, so "on their own device" (cpu) and "on the mode's" differ.
    FakeMode mode(kCuda1);
    at::Tensor y = real * 2 + 1;
    EXPECT_TRUE(is_fake(y));
    EXPECT_EQ(y.device(), cpu);
    // Views and aliases of a real tensor (what torch.tensor / as_tensor hand to lift_fresh)
    // stay on its device too.
    for (const at::Tensor& t : {real.detach(), at::lift_fresh(real), real.view({3, 2}),
                                real_scalar.detach(), at::lift_fresh(real_scalar)}) {
      EXPECT_TRUE(is_fake(t));
      EXPECT_EQ(t.device(), cpu);
    }
    EXPECT_EQ((torch::ones({2, 3}) * real_scalar.detach()).device(), kCuda1);
    real.add_(100);  // an in-place op on a real tensor computes on a stand-in
  }
  EXPECT_FALSE(is_fake(real));
  EXPECT_EQ(real.sum().item<float>(), 15.0f);  // data intact and readable
}

TEST(FakeMode, CrossDeviceCopyAndCpuIndicesAreAllowedAsInARealRun) {
  FakeMode mode(kCuda0);
  const auto on_cpu = torch::TensorOptions().device(torch::kCPU);
  at::Tensor gpu = torch::zeros({4, 3});
  at::Tensor cpu = torch::ones({4, 3}, on_cpu);
  at::Tensor real_cpu;
  {
    c10::impl::ExcludeDispatchKeyGuard real(c10::DispatchKey::Fake);
    real_cpu = torch::ones({3}, on_cpu);
  }
  ASSERT_FALSE(is_fake(real_cpu));
  // copy_ from cpu into cuda (gpu.copy_(cpu), gpu[0] = cpu_row): the result is self.
  at::Tensor& copied = gpu.copy_(cpu);
  EXPECT_EQ(copied.unsafeGetTensorImpl(), gpu.unsafeGetTensorImpl());
  EXPECT_EQ(gpu.select(0, 0).copy_(real_cpu).device(), kCuda0);
  EXPECT_EQ(cpu.copy_(gpu).device(), c10::Device(c10::kCPU));  // and back
  // Advanced indexing with cpu indices on a cuda tensor: self's device.
  at::Tensor idx = torch::tensor({0, 2}, on_cpu.dtype(torch::kLong));
  ASSERT_TRUE(idx.is_cpu());
  at::Tensor picked = gpu.index({idx});
  EXPECT_EQ(picked.device(), kCuda0);
  EXPECT_EQ(picked.sizes(), at::IntArrayRef({2, 3}));
  EXPECT_EQ(gpu.index_put_({idx}, torch::ones({2, 3})).device(), kCuda0);
  EXPECT_EQ(at::index_put(gpu, {idx}, torch::ones({3})).device(), kCuda0);
  EXPECT_EQ(at::_index_put_impl_(gpu, {idx}, torch::ones({3}), false, false).device(), kCuda0);
  EXPECT_EQ(gpu.index_put_({idx}, torch::tensor(1.0, on_cpu)).device(), kCuda0);  // cpu scalar
  // What a real run still rejects: index_select with cpu indices, non-scalar cpu values, cpu
  // operands of ordinary ops.
  auto expect_device_error = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "mixed cuda and cpu without an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("Expected all tensors to be on the same device"),
                std::string::npos)
          << e.what();
    }
  };
  expect_device_error([&] { (void)gpu.index_select(0, idx); });
  expect_device_error([&] { (void)gpu.index_put_({idx}, torch::ones({2, 3}, on_cpu)); });
  expect_device_error([&] { (void)at::add(gpu, cpu); });
}

TEST(FakeMode, RepeatInterleaveWithIntRepeatsHasItsShape) {
  at::Tensor real = torch::arange(3).repeat_interleave(2);  // real tensors: libtorch's kernel
  EXPECT_TRUE(real.equal(torch::tensor({0, 0, 1, 1, 2, 2})));
  FakeMode mode(kCuda0);
  at::Tensor x = torch::randn({2, 3, 4}, torch::TensorOptions().requires_grad(true));
  at::Tensor flat = x.repeat_interleave(2);
  EXPECT_EQ(flat.sizes(), at::IntArrayRef({48}));
  EXPECT_EQ(flat.device(), kCuda0);
  EXPECT_TRUE(flat.requires_grad());
  at::Tensor along = x.repeat_interleave(3, 1);
  EXPECT_EQ(along.sizes(), at::IntArrayRef({2, 9, 4}));
  EXPECT_EQ(along.strides(), at::IntArrayRef({36, 4, 1}));  // contiguous, as index_select gives
  EXPECT_EQ(x.repeat_interleave(3, -1, /*output_size=*/12).sizes(), at::IntArrayRef({2, 3, 12}));
  EXPECT_THROW(x.repeat_interleave(3, -1, /*output_size=*/5), c10::Error);
  EXPECT_THROW(x.repeat_interleave(-1, 0), c10::Error);
  // A repeats tensor: known with output_size, a typed error without.
  at::Tensor repeats = torch::ones({4}, torch::kLong);
  EXPECT_EQ(at::repeat_interleave(repeats, c10::optional<int64_t>(7)).sizes(),
            at::IntArrayRef({7}));
  EXPECT_EQ(torch::randn({4, 2}).repeat_interleave(repeats, 0, 7).sizes(), at::IntArrayRef({7, 2}));
  EXPECT_THROW(torch::randn({4, 2}).repeat_interleave(repeats, 0), DataDependentError);
}

TEST(FakeMode, MetaBuiltParametersCountAsFakeOnTheModeDevice) {
  torch::nn::Linear linear(nullptr);
  {
    MetaMode meta;
    linear = torch::nn::Linear(16, 64);
  }
  ASSERT_TRUE(linear->weight.is_meta());
  FakeMode mode(kCuda0);
  at::Tensor y = linear(torch::randn({4, 16}));
  EXPECT_TRUE(is_fake(y));
  EXPECT_EQ(y.device(), kCuda0);
  EXPECT_EQ(y.sizes(), at::IntArrayRef({4, 64}));
  EXPECT_TRUE(linear->weight.is_meta());  // parameters are untouched
}

TEST(FakeMode, DataDependentOpsRaiseATypedErrorNamingTheOp) {
  FakeMode mode(kCuda0);
  at::Tensor t = torch::randn({5});
  auto expect_named = [](auto&& fn, const char* op) {
    try {
      fn();
      ADD_FAILURE() << op << " did not throw";
    } catch (const DataDependentError& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  expect_named([&] { t.nonzero(); }, "aten::nonzero");
  expect_named([&] { t.masked_select(t > 0); }, "aten::masked_select");
  expect_named([&] { at::_unique2(t); }, "aten::_unique2");
  expect_named([&] { t.sum().item<float>(); }, "aten::_local_scalar_dense");
  expect_named([&] { (void)t.equal(t.clone()); }, "aten::equal");
  EXPECT_TRUE(t.equal(t));  // the same memory: equal without values
  expect_named([&] { t.to(torch::kLong).repeat_interleave(t.to(torch::kLong)); },
               "repeat_interleave");
  at::Tensor counts = torch::zeros({5}, torch::kLong);
  expect_named([&] { at::bincount(counts); }, "aten::bincount");
  expect_named([&] { at::unique_consecutive(t); }, "aten::unique_consecutive");
  expect_named([&] { at::unique_dim(t, 0); }, "aten::unique_dim");
}

TEST(FakeMode, NestsRestoresAndStaysOnItsThread) {
  {
    FakeMode outer(kCuda0);
    {
      FakeMode inner(c10::Device(c10::kCPU));
      EXPECT_EQ(torch::empty({1}).device(), c10::Device(c10::kCPU));
    }
    EXPECT_EQ(torch::empty({1}).device(), kCuda0);
    bool other_thread_fake = true;
    std::thread([&] { other_thread_fake = is_fake(torch::empty({1})); }).join();
    EXPECT_FALSE(other_thread_fake);
  }
  EXPECT_FALSE(fake_mode_device().has_value());
  EXPECT_FALSE(is_fake(torch::empty({1})));
  EXPECT_TRUE(torch::empty({1}).is_cpu());
}

TEST(FakeMode, TheInnermostOfFakeModeMetaModeAndRealGuardDecides) {
  {
    FakeMode fake(kCuda1);
    {
      MetaMode meta;
      EXPECT_TRUE(torch::empty({1}).is_meta());
      EXPECT_FALSE(fake_mode_device().has_value());
      {
        FakeMode inner(c10::Device(c10::kCPU));
        EXPECT_TRUE(is_fake(torch::empty({1})));
        EXPECT_EQ(torch::empty({1}).device(), c10::Device(c10::kCPU));
      }
      EXPECT_TRUE(torch::empty({1}).is_meta());
    }
    {
      RealGuard real;
      const at::Tensor t = torch::ones({2});
      EXPECT_TRUE(t.is_cpu() && !is_fake(t));
      EXPECT_EQ(t.sum().item<float>(), 2.0f);
    }
    EXPECT_EQ(torch::empty({1}).device(), kCuda1);
  }
  MetaMode meta;
  {
    FakeMode fake(kCuda0);
    EXPECT_FALSE(is_forcing());
    EXPECT_EQ(torch::zeros({1}, torch::TensorOptions().device(torch::kCPU)).device(),
              c10::Device(c10::kCPU));  // an explicit device, not meta's rewrite
  }
  EXPECT_TRUE(is_forcing() && torch::empty({1}).is_meta());
}

TEST(FakeMode, ADeviceItCannotClaimIsAModeErrorBeforeAnythingChanges) {
  for (const char* device : {"cpu:1", "cuda:16", "meta", "xla"}) {
    EXPECT_THROW(FakeMode mode{c10::Device(device)}, ModeError) << device;
    EXPECT_FALSE(fake_mode_device().has_value());
  }
  FakeMode cpu0(c10::Device("cpu:0"));
  EXPECT_EQ(fake_mode_device(), c10::Device(c10::kCPU));
}

TEST(FakeMode, TransformerEncoderLayerRunsOnFakeTensors) {
  torch::nn::TransformerEncoderLayer layer(nullptr);
  {
    MetaMode meta;
    layer = torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(64, 4));
  }
  layer->eval();
  FakeMode mode(kCuda0);
  torch::NoGradGuard no_grad;
  at::Tensor out = layer(torch::randn({10, 2, 64}));
  EXPECT_EQ(out.sizes(), at::IntArrayRef({10, 2, 64}));
  EXPECT_EQ(out.device(), kCuda0);
}

TEST(Scan, RunsACallableOnFakeInputsAndCollectsReportedModules) {
  torch::nn::Sequential net(nullptr);
  {
    MetaMode meta;
    net = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                                torch::nn::Linear(64, 8));
  }
  std::function<void(ModuleObserver)> attach = [](ModuleObserver) {};
  ModuleObserver observer;
  attach = [&observer](ModuleObserver o) { observer = std::move(o); };
  auto fn = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = in[0];
    size_t i = 0;
    for (auto& m : *net) {
      h = m.forward(h);
      if (observer) observer(std::to_string(i++), h);
    }
    return std::vector<at::Tensor>{h};
  };
  at::Tensor real_input = torch::ones({5, 32});  // real: becomes fake on the scan's device
  ScanResult r = scan(fn, {real_input}, kCuda0, attach);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(is_fake(r.outputs[0]));
  EXPECT_EQ(r.outputs[0].device(), kCuda0);
  EXPECT_EQ(r.outputs[0].sizes(), at::IntArrayRef({5, 8}));
  EXPECT_FALSE(r.outputs[0].requires_grad());  // gradients are off during a scan
  ASSERT_EQ(r.modules.size(), 3u);
  EXPECT_EQ(r.modules["1"], (ShapeInfo{{5, 64}, at::kFloat, kCuda0}));
  EXPECT_EQ(r.modules["1"].calls, 1);
  EXPECT_FALSE(observer);  // detached after the run
  EXPECT_FALSE(fake_mode_device().has_value());
  EXPECT_FALSE(is_fake(real_input));
}

TEST(Scan, KeepsTheOrderOfFirstOutputsAndCountsCalls) {
  ModuleObserver observer;
  auto attach = [&observer](ModuleObserver o) { observer = std::move(o); };
  auto fn = [&](const std::vector<at::Tensor>& in) {
    // "b" runs first and twice (a module called again, as a shared block would be).
    observer("b", in[0]);
    const at::Tensor h = at::cat({in[0], in[0]});
    observer("a", h);
    observer("b", h);
    return std::vector<at::Tensor>{h};
  };
  ScanResult r = scan(fn, {torch::ones({2, 3})}, kCuda0, attach);
  EXPECT_EQ(r.order, (std::vector<std::string>{"b", "a"}));  // not the map's sorted order
  EXPECT_EQ(r.modules["b"].calls, 2);
  EXPECT_EQ(r.modules["a"].calls, 1);
  EXPECT_EQ(r.modules["b"], (ShapeInfo{{4, 3}, at::kFloat, kCuda0}));  // the latest output wins
}

// A Sequential nests in another only as a subclass with a typed forward (AnyModule needs one).
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  at::Tensor forward(at::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Block);

TEST(Scan, ATorchNnModuleReportsItsOutputAndEverySequentialChildByPath) {
  torch::nn::Sequential net(nullptr);
  torch::nn::Linear linear(nullptr);
  {
    MetaMode meta;
    net = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                                Block(torch::nn::Linear(64, 16), torch::nn::ReLU()),
                                torch::nn::Linear(16, 8));
    linear = torch::nn::Linear(32, 4);
  }
  ScanResult r = scan(net, {torch::ones({5, 32})}, kCuda0);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(is_fake(r.outputs[0]));
  EXPECT_EQ(r.outputs[0].sizes(), at::IntArrayRef({5, 8}));
  const std::map<std::string, ShapeInfo> expected = {
      {"", {{5, 8}, at::kFloat, kCuda0}},     {"0", {{5, 64}, at::kFloat, kCuda0}},
      {"1", {{5, 64}, at::kFloat, kCuda0}},   {"2", {{5, 16}, at::kFloat, kCuda0}},
      {"2.0", {{5, 16}, at::kFloat, kCuda0}}, {"2.1", {{5, 16}, at::kFloat, kCuda0}},
      {"3", {{5, 8}, at::kFloat, kCuda0}},
  };
  EXPECT_EQ(r.modules, expected);
  // Any other module is one call: its output under "" (a shared_ptr to the impl works too).
  ScanResult one = scan(linear.ptr(), {torch::ones({2, 32})}, kCuda1);
  ASSERT_EQ(one.modules.size(), 1u);
  EXPECT_EQ(one.modules[""], (ShapeInfo{{2, 4}, at::kFloat, kCuda1}));
  EXPECT_TRUE(linear->weight.is_meta());
  EXPECT_FALSE(fake_mode_device().has_value());
  // Wrong inputs: a typed error for the count, the module's own error for the shape.
  EXPECT_THROW(scan(linear.ptr(), {}, kCuda0), ScanError);
  EXPECT_THROW(
      scan(torch::nn::AnyModule(linear),
           {torch::ones({2, 32}), torch::ones({2}), torch::ones({2}), torch::ones({2})}, kCuda0),
      ScanError);
  EXPECT_THROW(scan(torch::nn::AnyModule(linear), {torch::ones({2, 32}), torch::ones({2})}, kCuda0),
               c10::Error);  // Linear's forward takes one tensor
  EXPECT_THROW(scan(net, {torch::ones({5, 31})}, kCuda0), c10::Error);
  EXPECT_FALSE(fake_mode_device().has_value());
}

}  // namespace
}  // namespace metaload
