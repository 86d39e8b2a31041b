#include "fake_mode/fake_mode.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "c10_ext/meta_mode.h"
#include "fake_mode/fake_tensor.h"
#include "fake_mode/scan.h"

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
  {
    FakeMode mode(c10::Device(c10::kCPU));
    at::Tensor y = real * 2 + 1;
    EXPECT_TRUE(is_fake(y));
    EXPECT_EQ(y.device(), c10::Device(c10::kCPU));
    real.add_(100);  // an in-place op on a real tensor computes on a stand-in
  }
  EXPECT_FALSE(is_fake(real));
  EXPECT_EQ(real.sum().item<float>(), 15.0f);  // data intact and readable
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
  EXPECT_FALSE(observer);  // detached after the run
  EXPECT_FALSE(fake_mode_device().has_value());
  EXPECT_FALSE(is_fake(real_input));
}

}  // namespace
}  // namespace metaload
