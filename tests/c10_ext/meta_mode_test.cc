#include "c10_ext/meta_mode.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <sstream>
#include <thread>
#include <vector>

#include "c10_ext/mode_key.h"
#include "c10_ext/values.h"

namespace metaload {
namespace {

void expect_all_meta(torch::nn::Module& m) {
  for (const auto& p : m.named_parameters()) EXPECT_TRUE(p.value().is_meta()) << p.key();
  for (const auto& b : m.named_buffers()) EXPECT_TRUE(b.value().is_meta()) << b.key();
}

TEST(MetaMode, EveryFactoryLandsOnMeta) {
  MetaMode mode;
  const auto cpu = torch::TensorOptions().device(torch::kCPU);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const at::Tensor real = [] {
    RealGuard g;
    return torch::ones({2, 3});
  }();
  std::vector<std::pair<const char*, at::Tensor>> made = {
      {"empty", torch::empty({4, 4})},
      {"empty cuda", torch::empty({4, 4}, cuda)},
      {"empty_strided", torch::empty_strided({2, 3}, {1, 2}, cpu)},
      {"zeros", torch::zeros({1000, 1000})},
      {"ones", torch::ones({3}, cuda.dtype(torch::kHalf))},
      {"full", torch::full({2, 2}, 7.0)},
      {"rand", torch::rand({5})},
      {"randn", torch::randn({5}, cuda)},
      {"randint", torch::randint(10, {5})},
      {"arange", torch::arange(10)},
      {"linspace", torch::linspace(0, 1, 5)},
      {"eye", torch::eye(4)},
      {"scalar_tensor", torch::scalar_tensor(3.5)},
      {"empty_like", torch::empty_like(real)},
      {"zeros_like", torch::zeros_like(real)},
      {"ones_like", torch::ones_like(real, cuda)},
      {"rand_like", torch::rand_like(real)},
      {"randn_like", torch::randn_like(real)},
      {"full_like", torch::full_like(real, 2)},
      {"new_zeros", real.new_zeros({3})},
      {"tensor(vector)", torch::tensor(std::vector<float>{1, 2, 3})},
      {"tensor(init list)", torch::tensor({{1.0, 2.0}, {3.0, 4.0}})},
      {"tensor(scalar)", torch::tensor(5)},
  };
  for (const auto& [name, t] : made) EXPECT_TRUE(t.is_meta()) << name;
  EXPECT_EQ(made[0].second.sizes(), torch::IntArrayRef({4, 4}));
  EXPECT_EQ(made[4].second.scalar_type(), torch::kHalf);
  EXPECT_EQ(made[20].second.sizes(), torch::IntArrayRef({3}));
  EXPECT_EQ(made[21].second.sizes(), torch::IntArrayRef({2, 2}));
  EXPECT_EQ(made[21].second.scalar_type(), torch::kFloat);  // C++ default dtype
}

TEST(MetaMode, EveryConversionLandsOnMeta) {
  at::Tensor real;
  {
    RealGuard g;
    real = torch::arange(6, torch::kFloat).reshape({2, 3});
  }
  MetaMode mode;
  EXPECT_TRUE(real.to(torch::kCUDA).is_meta());
  EXPECT_TRUE(real.to(torch::Device("cuda:1")).is_meta());
  EXPECT_TRUE(real.cuda().is_meta());
  EXPECT_TRUE(real.cpu().is_meta());
  EXPECT_TRUE(real.to(torch::kCPU, torch::kHalf).is_meta());
  EXPECT_EQ(real.to(torch::kCPU, torch::kHalf).scalar_type(), torch::kHalf);
  EXPECT_TRUE(at::_to_copy(real, torch::TensorOptions().device(torch::kCPU)).is_meta());
  EXPECT_TRUE(real.to(real).is_meta());
  EXPECT_TRUE(real.pin_memory().is_meta());
  EXPECT_EQ(real.cuda().sizes(), real.sizes());
  // Ops that are neither factories nor conversions run as they are.
  EXPECT_FALSE((real + real).is_meta());
}

TEST(MetaMode, ModuleConstructorsBuildOnMeta) {
  MetaMode mode;
  torch::nn::Linear linear(4096, 4096);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(64, 128, 3).bias(true));
  torch::nn::BatchNorm2d bn(128);
  torch::nn::Embedding emb(50000, 1024);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({1024}));
  torch::nn::TransformerEncoderLayer enc(torch::nn::TransformerEncoderLayerOptions(512, 8));
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(128, 256).num_layers(2));
  for (torch::nn::Module* m : std::vector<torch::nn::Module*>{
           linear.get(), conv.get(), bn.get(), emb.get(), ln.get(), enc.get(), lstm.get()}) {
    expect_all_meta(*m);
  }
  EXPECT_EQ(linear->weight.sizes(), torch::IntArrayRef({4096, 4096}));
  EXPECT_EQ(bn->num_batches_tracked.scalar_type(), torch::kLong);
  // Moving a module to CUDA keeps it on meta.
  linear->to(torch::kCUDA);
  expect_all_meta(*linear);
}

TEST(MetaMode, InPlaceInitialisationOfMetaTensorsIsANoOp) {
  at::Tensor real;
  {
    RealGuard g;
    real = torch::ones({8, 8});
  }
  MetaMode mode;
  auto w = torch::empty({256, 256});
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(w.uniform_(-1, 1));
  EXPECT_NO_THROW(w.normal_());
  EXPECT_NO_THROW(w.zero_());
  EXPECT_NO_THROW(w.fill_(3));
  EXPECT_NO_THROW(torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0)));
  EXPECT_NO_THROW(torch::nn::init::kaiming_normal_(w));
  EXPECT_NO_THROW(torch::nn::init::xavier_uniform_(w));
  EXPECT_NO_THROW(torch::nn::init::xavier_normal_(w));
  auto small = torch::empty({8, 8});
  EXPECT_NO_THROW(small.copy_(real));
  EXPECT_TRUE(w.is_meta());
  EXPECT_TRUE(small.is_meta());
  EXPECT_FALSE(real.is_meta());
}

TEST(RealGuard, SuspendsForcingAndMetaModeForcesAgainInside) {
  EXPECT_FALSE(is_forcing());
  {
    MetaMode outer;
    EXPECT_TRUE(is_forcing());
    EXPECT_TRUE(torch::zeros({2}).is_meta());
    {
      RealGuard real;
      EXPECT_FALSE(is_forcing());
      EXPECT_TRUE(torch::zeros({2}).is_cpu());
      {
        MetaMode inner;
        EXPECT_TRUE(is_forcing());
        EXPECT_TRUE(torch::zeros({2}).is_meta());
        {
          MetaMode nested;  // nesting the same mode twice is harmless
          EXPECT_TRUE(torch::zeros({2}).is_meta());
        }
        EXPECT_TRUE(torch::zeros({2}).is_meta());
      }
      EXPECT_TRUE(torch::zeros({2}).is_cpu());
    }
    EXPECT_TRUE(torch::zeros({2}).is_meta());
  }
  EXPECT_FALSE(is_forcing());
  EXPECT_TRUE(torch::zeros({2}).is_cpu());
}

TEST(RealGuard, GuardsRestoreTheExactStateWhenAnExceptionPasses) {
  try {
    MetaMode mode;
    RealGuard real;
    MetaMode again;
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(is_forcing());
  EXPECT_TRUE(torch::zeros({2}).is_cpu());
  MetaMode mode;
  try {
    RealGuard real;
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(is_forcing());
  EXPECT_TRUE(torch::zeros({2}).is_meta());
}

TEST(RealGuard, EachGuardRestoresBothKeyBitsExactly) {
  // The thread's included and excluded bits for the mode key, as the dispatcher sees them.
  auto bits = [] {
    return std::make_pair(c10::impl::tls_is_dispatch_key_included(kMetaModeKey),
                          c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey));
  };
  // Every starting state, including ones this library never sets itself (another guard of c10's
  // excluding the key), with and without an exception passing through the guards.
  for (bool included : {false, true}) {
    for (bool excluded : {false, true}) {
      for (bool fail : {false, true}) {
        c10::impl::tls_set_dispatch_key_included(kMetaModeKey, included);
        c10::impl::tls_set_dispatch_key_excluded(kMetaModeKey, excluded);
        const auto before = bits();
        try {
          MetaMode mode;
          EXPECT_TRUE(is_forcing());
          {
            RealGuard real;
            EXPECT_FALSE(is_forcing());
            const auto in_real = bits();
            {
              MetaMode again;
              EXPECT_TRUE(is_forcing());
            }
            EXPECT_EQ(bits(), in_real);
            if (fail) throw std::runtime_error("boom");
          }
          EXPECT_TRUE(is_forcing());
        } catch (const std::runtime_error&) {
        }
        EXPECT_EQ(bits(), before) << "included=" << included << " excluded=" << excluded
                                  << " exception=" << fail;
        {
          RealGuard real;  // a RealGuard alone restores them too
        }
        EXPECT_EQ(bits(), before);
      }
    }
  }
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, false);
  c10::impl::tls_set_dispatch_key_excluded(kMetaModeKey, false);
}

TEST(MetaMode, ForcingInOneThreadNeverAffectsAnother) {
  constexpr int kThreads = 8;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([i, &wrong] {
      const bool forced = i % 2 == 0;
      for (int round = 0; round < 20; ++round) {
        std::unique_ptr<MetaMode> mode;
        if (forced) mode = std::make_unique<MetaMode>();
        torch::nn::Sequential net(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                                  torch::nn::Linear(128, 64),
                                  torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})));
        for (const auto& p : net->parameters()) {
          if (p.is_meta() != forced) wrong.fetch_add(1);
        }
        if (forced != is_forcing()) wrong.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(MetaMode, DataDependentReadsRaiseATypedErrorNamingTheOp) {
  MetaMode mode;
  auto t = torch::zeros({3});
  auto expect_dd = [](auto&& fn, const std::string& op) {
    try {
      fn();
      ADD_FAILURE() << op << " did not throw";
    } catch (const DataDependentError& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("RealGuard"), std::string::npos) << e.what();
    }
  };
  expect_dd([&] { t.sum().item<float>(); }, "aten::item");
  expect_dd([&] { at::_local_scalar_dense(t.sum()); }, "aten::_local_scalar_dense");
  expect_dd([&] { t.nonzero(); }, "aten::nonzero");
  expect_dd([&] { t.masked_select(t > 0); }, "aten::masked_select");
  expect_dd([&] { at::_unique2(t); }, "aten::_unique2");
  expect_dd([&] { (void)t.equal(torch::zeros({3})); }, "aten::equal");
  EXPECT_TRUE(t.equal(t));  // one view of one memory: equal without values
  expect_dd([&] { t.to(torch::kLong).repeat_interleave(t.to(torch::kLong)); },
            "aten::repeat_interleave");
  // With output_size, or a repeat count that is a plain number, the size is known.
  EXPECT_EQ(at::repeat_interleave(t.to(torch::kLong), c10::optional<int64_t>(7)).sizes(),
            torch::IntArrayRef({7}));
  auto x = torch::empty({2, 3, 4});
  EXPECT_EQ(x.repeat_interleave(2).sizes(), torch::IntArrayRef({48}));
  EXPECT_EQ(x.repeat_interleave(3, 1).sizes(), torch::IntArrayRef({2, 9, 4}));
  EXPECT_EQ(x.repeat_interleave(3, -1).sizes(), torch::IntArrayRef({2, 3, 12}));
}

// Small tensors made from constants keep their values (c10_ext/values.h); weights never do.
TEST(MetaMode, SmallTensorsMadeFromConstantsKeepTheirValues) {
  MetaMode mode;
  at::Tensor widths = torch::arange(4) * 2.5 + 1;  // RegNet-style constructor arithmetic
  ASSERT_TRUE(widths.is_meta());
  EXPECT_DOUBLE_EQ(widths.sum().item<double>(), 19.0);
  EXPECT_DOUBLE_EQ(widths.max().item<double>(), 8.5);
  EXPECT_TRUE(widths.gt(0).all().item<bool>());
  // A read through to(cpu), as tolist() does: still a meta tensor, whose data pointer holds them.
  at::Tensor host = widths.to(torch::kCPU).contiguous();
  ASSERT_TRUE(host.is_meta());
  ASSERT_NE(host.data_ptr(), nullptr);
  const float* v = host.data_ptr<float>();
  EXPECT_EQ(std::vector<float>(v, v + 4), (std::vector<float>{1.0f, 3.5f, 6.0f, 8.5f}));
  // Views share them, in-place ops by tensors with values update them.
  at::Tensor tail = widths.narrow(0, 2, 2);
  EXPECT_DOUBLE_EQ(tail[1].item<double>(), 8.5);
  widths.mul_(2);
  EXPECT_DOUBLE_EQ(tail[0].item<double>(), 12.0);
  at::Tensor steps = torch::linspace(0, 1, 5);
  EXPECT_DOUBLE_EQ(steps[4].item<double>(), 1.0);
  EXPECT_EQ(steps.nonzero().sizes(), torch::IntArrayRef({4, 1}));  // answered from the values
  // Never invented: weights, large tensors, anything mixed with a tensor without values.
  for (const at::Tensor& t :
       {torch::zeros({3}), torch::randn({3}), torch::arange(kMaxValueElements + 1),
        torch::arange(3) + torch::zeros({3}), torch::arange(3.0).add_(torch::ones({3}))}) {
    EXPECT_TRUE(t.is_meta());
    EXPECT_THROW(t.sum().item<double>(), DataDependentError) << t.sizes();
  }
  // Written by something without values: forgotten, also through a view.
  at::Tensor a = torch::arange(4.0);
  at::Tensor view = a.narrow(0, 0, 2);
  a.copy_(torch::empty({4}));
  EXPECT_THROW(view.sum().item<double>(), DataDependentError);
}

TEST(MetaMode, PrintingAForcedTensorIsAnErrorNotACrash) {
  at::Tensor forced;
  {
    MetaMode mode;
    forced = torch::zeros({2, 2});
    std::ostringstream out;
    // Inside the mode even the copy to cpu that printing makes lands on meta; libtorch then finds
    // no data (its own error: the data pointer is read without the dispatcher).
    EXPECT_THROW(out << forced, c10::Error);
  }
  // Outside it, reading the values is a typed error naming the op.
  std::ostringstream out;
  try {
    out << forced;
    ADD_FAILURE() << "printed a meta tensor";
  } catch (const DataDependentError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::_to_copy"), std::string::npos) << e.what();
  }
  EXPECT_THROW(forced.cpu(), DataDependentError);
  at::Tensor real = torch::ones({2, 2});
  EXPECT_THROW(real.copy_(forced), DataDependentError);
  // Meta to meta keeps working, with libtorch's layout rules.
  at::Tensor cl = at::empty({2, 3, 4, 5}, at::TensorOptions().device(at::kMeta))
                      .contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.to(at::kHalf).strides(), cl.strides());
  EXPECT_EQ(forced.to(at::kDouble).scalar_type(), at::kDouble);
  EXPECT_THROW(forced.copy_(at::empty({3}, at::TensorOptions().device(at::kMeta))), c10::Error);
}

TEST(MetaMode, CountsForcedTensorsAndTheBytesNotAllocated) {
  reset_forcing_stats();
  {
    MetaMode mode;
    torch::nn::Linear big(1024, 1024);             // weight 4 MiB + bias 4 KiB
    auto z = torch::zeros({256}, torch::kDouble);  // 2 KiB
    auto already = torch::empty({10}, torch::TensorOptions().device(torch::kMeta));  // not a saving
  }
  const ForcingStats s = forcing_stats();
  EXPECT_EQ(s.tensors, 3u);
  // The bias came from empty() small enough for a host shadow buffer: forced but allocated.
  EXPECT_EQ(s.bytes, 1024u * 1024 * 4 + 256 * 8);
}

TEST(MetaMode, NoEffectWhenOff) {
  EXPECT_FALSE(is_forcing());
  torch::nn::Linear l(16, 16);
  EXPECT_TRUE(l->weight.is_cpu());
  EXPECT_EQ(torch::tensor(std::vector<float>{1, 2}).sum().item<float>(), 3.0f);
}

}  // namespace
}  // namespace metaload
