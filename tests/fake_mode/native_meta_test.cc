// kernels/native_meta: libtorch's C++ shape kernels called directly by FakeMode.
//
// torch 2.x's Python Meta kernels do not exist in a C++ program, so the tests that need one
// register a stand-in the way torch.library does (boxed only, from a .py file), which is how
// meta_registry tells Python kernels apart.
#include "kernels/native_meta.h"

#include <ATen/ScalarOps.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <set>
#include <thread>

#include "fake_mode/fake_mode.h"
#include "fake_mode/fake_tensor.h"
#include "kernels/meta_registry.h"

namespace metaload {
namespace {

using at::Tensor;

const c10::Device kCpu(c10::kCPU);
const c10::Device kCuda0("cuda:0");

c10::OperatorHandle op_named(const std::string& full) {
  auto dot = full.find('.');
  auto op = c10::Dispatcher::singleton().findOp(
      {full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)});
  if (!op) throw std::runtime_error("no operator " + full);
  return *op;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(NativeMeta, EveryEntryFitsThisLibtorchsSchema) {
  for (const auto& [op, why] : native_meta::unfit()) ADD_FAILURE() << op << ": " << why;
  const auto table = native_meta::table();
  EXPECT_GE(table.size(), 120u);
  EXPECT_TRUE(std::is_sorted(table.begin(), table.end()));
  // The ops a transformer or CNN forward spends its time in.
  for (const char* op : {"aten::add.Tensor", "aten::mul.Scalar", "aten::mm", "aten::addmm",
                         "aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::gelu", "aten::silu",
                         "aten::cat", "aten::embedding", "aten::clone", "aten::_unsafe_view",
                         "aten::max_pool2d_with_indices", "aten::uniform_"}) {
    EXPECT_TRUE(has(table, op)) << op;
  }
}

TEST(NativeMeta, LibtorchsOwnKernelsAreCalledWithoutADispatch) {
  // No Python in this program: Meta is served by libtorch's C++ kernels (or, for clone, embedding
  // and the Scalar overloads, by their composite kernels), and the table calls those directly.
  const auto active = native_meta::active();
  for (const char* op :
       {"aten::add.Tensor", "aten::mm", "aten::_softmax", "aten::uniform_", "aten::clone",
        "aten::_unsafe_view", "aten::embedding", "aten::mul.Scalar", "aten::ones"}) {
    EXPECT_TRUE(has(active, op)) << op;
  }
  // Every active entry is in the table; no Python kernel here, so no kPython entry is active.
  for (const auto& op : active) EXPECT_TRUE(has(native_meta::table(), op)) << op;
  EXPECT_FALSE(has(active, "aten::cudnn_batch_norm"));
}

// ---- stand-ins for kernels registered by others ------------------------------------------------

std::atomic<int> g_python_calls{0};
std::atomic<int> g_other_calls{0};

// What torch.library registers: a boxed kernel. This one computes mm's result like a meta kernel.
void python_mm(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  ++g_python_calls;
  Tensor b = torch::jit::pop(*stack).toTensor();
  Tensor a = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, at::empty({a.size(0), b.size(1)}, a.options()));
}

// clone(Tensor self, *, MemoryFormat? memory_format): contiguous, whatever self's layout, which
// is not what libtorch's kernel gives for a transposed input (a way to see who ran).
void python_clone(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  ++g_python_calls;
  torch::jit::pop(*stack);
  Tensor self = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, at::empty(self.sizes(), self.options()));
}

// Another library's C++ Meta kernel over libtorch's.
Tensor other_ge(const Tensor& a, const Tensor& b) {
  ++g_other_calls;
  return at::empty(at::infer_size(a.sizes(), b.sizes()), a.options().dtype(at::kBool));
}

TEST(NativeMeta, StandsInForPythonMetaKernelsInsideFakeModeOnly) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                              "/site-packages/torch/_meta_registrations.py", 53);
  lib->impl("mm", torch::CppFunction::makeFromBoxedFunction<&python_mm>());
  lib->impl("clone", torch::CppFunction::makeFromBoxedFunction<&python_clone>());
  ASSERT_EQ(meta_kernel_owner("aten::mm"), MetaKernelOwner::kPython);
  ASSERT_EQ(meta_kernel_owner("aten::clone"), MetaKernelOwner::kPython);
  // Python's over libtorch's C++ Meta kernel (mm) and over its composite kernel (clone).
  EXPECT_NE(native_meta::kernel_for(op_named("aten::mm")), nullptr);
  EXPECT_NE(native_meta::kernel_for(op_named("aten::clone")), nullptr);
  EXPECT_TRUE(has(native_meta::active(), "aten::mm"));

  // Everyone else using the Meta key still gets the Python kernel.
  g_python_calls = 0;
  const auto meta = at::TensorOptions().device(at::kMeta);
  Tensor m = at::mm(at::empty({3, 4}, meta), at::empty({4, 5}, meta));
  EXPECT_EQ(m.sizes(), at::IntArrayRef({3, 5}));
  EXPECT_EQ(m.t().clone().strides(), at::IntArrayRef({3, 1}));  // the stand-in's contiguous
  EXPECT_EQ(g_python_calls.load(), 2);

  // FakeMode does not (a new thread: FakeMode's per-op facts are per thread, so nothing cached
  // from the other tests here decides).
  std::thread([] {
    FakeMode mode(kCuda0);
    Tensor x = torch::randn({3, 4});
    Tensor z = x.mm(torch::randn({4, 5}));
    Tensor c = z.t().clone();  // libtorch's clone keeps the transposed strides
    EXPECT_TRUE(is_fake(z) && is_fake(c));
    EXPECT_EQ(z.device(), kCuda0);
    EXPECT_EQ(z.sizes(), at::IntArrayRef({3, 5}));
    EXPECT_EQ(c.sizes(), at::IntArrayRef({5, 3}));
    EXPECT_EQ(c.strides(), at::IntArrayRef({1, 5}));
  }).join();
  EXPECT_EQ(g_python_calls.load(), 2);

  lib.reset();  // deregisters: libtorch's kernels serve Meta again
  EXPECT_EQ(meta_kernel_owner("aten::mm"), MetaKernelOwner::kNative);
  EXPECT_EQ(m.t().clone().strides(), at::IntArrayRef({1, 5}));
  EXPECT_EQ(g_python_calls.load(), 2);
}

TEST(NativeMeta, AnotherLibrarysCppMetaKernelKeepsServingFakeMode) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                              "other_library.cc", 1);
  lib->impl("ge.Tensor", TORCH_FN(other_ge));
  EXPECT_EQ(native_meta::kernel_for(op_named("aten::ge.Tensor")), nullptr);
  EXPECT_FALSE(has(native_meta::active(), "aten::ge.Tensor"));
  g_other_calls = 0;
  std::thread([] {
    FakeMode mode(kCuda0);
    Tensor r = torch::ones({2, 3}) >= torch::zeros({3});
    EXPECT_EQ(r.sizes(), at::IntArrayRef({2, 3}));
    EXPECT_EQ(r.scalar_type(), at::kBool);
  }).join();
  EXPECT_EQ(g_other_calls.load(), 1);
  lib.reset();
  EXPECT_NE(native_meta::kernel_for(op_named("aten::ge.Tensor")), nullptr);
}

// ---- the kernels against the CPU kernels ----------------------------------------------------

// A fake tensor with `real`'s sizes, strides, storage offset and dtype, claiming cpu.
Tensor fake_like(const Tensor& real) {
  const int64_t extent = real.storage().nbytes() / static_cast<int64_t>(real.element_size());
  Tensor base = at::empty({extent}, real.options().device(at::kMeta));
  return make_fake(base.as_strided(real.sizes(), real.strides(), real.storage_offset()), kCpu);
}

std::vector<Tensor> flat(const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  std::vector<Tensor> out;
  for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  return out;
}

struct Case {
  std::string name;
  std::function<std::vector<Tensor>()> inputs;  // real CPU tensors, made afresh for each run
  std::function<c10::IValue(std::vector<Tensor>&)> run;
  std::set<size_t> stay_real = {};  // inputs that enter FakeMode as real tensors
};

Tensor rnd(at::IntArrayRef sizes, at::ScalarType dtype = at::kFloat) {
  return at::randn(sizes).to(dtype);
}

Tensor idx(at::IntArrayRef sizes, int64_t high) {
  return at::randint(high, sizes, at::TensorOptions().dtype(at::kLong));
}

Tensor channels_last(at::IntArrayRef sizes) {
  return rnd(sizes).contiguous(at::MemoryFormat::ChannelsLast);
}

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  const auto cl = at::MemoryFormat::ChannelsLast;
  return {
      {"add.Tensor broadcast, transposed",
       [] {
         return V{rnd({3, 4}).t(), rnd({4, 1})};
       },
       [](V& t) { return at::add(t[0], t[1], 2); }},
      {"add_.Tensor",
       [] {
         return V{rnd({2, 3, 4}).transpose(0, 2), rnd({3, 1})};
       },
       [](V& t) { return t[0].add_(t[1]); }},
      {"sub.Tensor int - double",
       [] {
         return V{idx({5}, 9), rnd({5}, at::kDouble)};
       },
       [](V& t) { return at::sub(t[0], t[1]); }},
      {"mul.Tensor channels-last x contiguous",
       [] {
         return V{channels_last({2, 3, 4, 5}), rnd({3, 4, 5})};
       },
       [](V& t) { return at::mul(t[0], t[1]); }},
      {"mul.Tensor with a wrapped Python number",
       [] {
         return V{idx({4}, 9), at::native::wrapped_scalar_tensor(2.5)};
       },
       [](V& t) { return at::mul(t[0], t[1]); },
       {1}},
      {"mul.Tensor with a 0-dim double tensor",
       [] {
         return V{idx({4}, 9), at::scalar_tensor(2.5, at::kDouble)};
       },
       [](V& t) { return at::mul(t[0], t[1]); },
       {1}},
      {"mul.Scalar int * 2.5",
       [] {
         return V{idx({2, 3}, 9)};
       },
       [](V& t) { return at::mul(t[0], 2.5); }},
      {"add.Scalar half", [] { return V{rnd({3}, at::kHalf)}; },
       [](V& t) { return at::add(t[0], 1.5, 2); }},
      {"div.Scalar int", [] { return V{idx({3}, 9)}; }, [](V& t) { return at::div(t[0], 2); }},
      {"div_.Scalar",
       [] {
         return V{rnd({3, 2}).t()};
       },
       [](V& t) { return t[0].div_(4); }},
      {"div.Tensor_mode floor",
       [] {
         return V{idx({6}, 9), idx({6}, 3) + 1};
       },
       [](V& t) { return at::div(t[0], t[1], "floor"); }},
      {"pow.Tensor_Scalar",
       [] {
         return V{rnd({2, 3}).t()};
       },
       [](V& t) { return at::pow(t[0], 2); }},
      {"pow.Scalar", [] { return V{rnd({4})}; }, [](V& t) { return at::pow(2, t[0]); }},
      {"eq.Scalar / lt.Tensor",
       [] {
         return V{rnd({3, 4}), rnd({4})};
       },
       [](V& t) { return at::logical_and(at::eq(t[0], 0), at::lt(t[0], t[1])); }},
      {"neg, rsqrt, exp keep channels-last",
       [] {
         return V{channels_last({2, 3, 4, 4})};
       },
       [](V& t) { return at::exp(at::rsqrt(at::neg(t[0]))); }},
      {"gelu tanh, silu",
       [] {
         return V{rnd({4, 6}).t()};
       },
       [](V& t) { return at::silu(at::gelu(t[0], "tanh")); }},
      {"relu_ in place, channels-last",
       [] {
         return V{channels_last({1, 2, 3, 3})};
       },
       [](V& t) { return t[0].relu_(); }},
      {"clamp min only, int", [] { return V{idx({5}, 9)}; },
       [](V& t) { return at::clamp(t[0], 2); }},
      {"where(mask, x, scalar) (scalar_tensor)",
       [] {
         return V{rnd({3, 3}) > 0, rnd({3, 3})};
       },
       [](V& t) { return at::where(t[0], t[1], at::Scalar(-1e9)); }},
      {"mm",
       [] {
         return V{rnd({3, 4}), rnd({5, 4}).t()};
       },
       [](V& t) { return at::mm(t[0], t[1]); }},
      {"addmm with a broadcast bias",
       [] {
         return V{rnd({5}), rnd({3, 4}), rnd({4, 5})};
       },
       [](V& t) { return at::addmm(t[0], t[1], t[2], 0.5, 2); }},
      {"bmm, baddbmm",
       [] {
         return V{rnd({2, 3, 4}), rnd({2, 5, 4}).transpose(1, 2)};
       },
       [](V& t) { return at::baddbmm(at::bmm(t[0], t[1]), t[0], t[1]); }},
      {"addmv",
       [] {
         return V{rnd({3}), rnd({3, 4}), rnd({4})};
       },
       [](V& t) { return at::addmv(t[0], t[1], t[2]); }},
      {"matmul 4-d (expand, bmm, _unsafe_view)",
       [] {
         return V{rnd({2, 3, 5, 4}), rnd({4, 6})};
       },
       [](V& t) { return at::matmul(t[0], t[1]); }},
      {"linear 3-d (addmm / _unsafe_view)",
       [] {
         return V{rnd({2, 5, 4}), rnd({6, 4}), rnd({6})};
       },
       [](V& t) { return at::linear(t[0], t[1], t[2]); }},
      {"_softmax of a transposed input",
       [] {
         return V{rnd({3, 4, 5}).transpose(0, 2)};
       },
       [](V& t) { return at::_softmax(t[0], 1, false); }},
      {"softmax to double, log_softmax",
       [] {
         return V{rnd({3, 4})};
       },
       [](V& t) { return at::log_softmax(at::softmax(t[0], -1, at::kDouble), 0); }},
      {"sum.dim_IntList keepdim, mean.dim to double",
       [] {
         return V{rnd({3, 4, 5}).transpose(0, 2)};
       },
       [](V& t) {
         return at::add(at::sum(t[0], at::IntArrayRef{0, 2}, true),
                        at::mean(t[0], at::IntArrayRef{0, 2}, true, at::kDouble));
       }},
      {"amax, argmax",
       [] {
         return V{rnd({3, 4})};
       },
       [](V& t) { return at::add(at::amax(t[0], {1}), at::argmax(t[0], 1)); }},
      {"max.dim",
       [] {
         return V{rnd({3, 4, 2})};
       },
       [](V& t) { return c10::IValue(at::max(t[0], 1, true)); }},
      {"any.dim, cumsum",
       [] {
         return V{rnd({3, 4}) > 0};
       },
       [](V& t) { return at::add(at::cumsum(t[0], 1), at::any(t[0], 0)); }},
      {"topk",
       [] {
         return V{rnd({4, 6})};
       },
       [](V& t) { return c10::IValue(at::topk(t[0], 3, 0)); }},
      {"sort stable",
       [] {
         return V{rnd({4, 6}).t()};
       },
       [](V& t) { return c10::IValue(at::sort(t[0], true, 1, true)); }},
      {"cat: channels-last, mixed dtypes, an empty 1-d tensor",
       [] {
         return V{channels_last({2, 3, 4, 4}), rnd({2, 3, 4, 4}, at::kHalf), at::empty({0})};
       },
       [](V& t) {
         return at::cat({t[0], t[1], t[2]}, 1);
       }},
      {"tril, triu",
       [] {
         return V{rnd({4, 5}).t()};
       },
       [](V& t) { return at::add(at::tril(t[0], 1), at::triu(t[0])); }},
      {"gather, scatter.src, scatter_add",
       [] {
         return V{rnd({3, 4}), idx({3, 2}, 3)};
       },
       [](V& t) {
         Tensor g = at::gather(t[0], 1, t[1]);
         return at::add(at::scatter(t[0], 1, t[1], g), at::scatter_add(t[0], 1, t[1], g));
       }},
      {"index_add, index_copy",
       [] {
         return V{rnd({5, 3}), idx({2}, 5), rnd({2, 3})};
       },
       [](V& t) {
         return at::add(at::index_add(t[0], 0, t[1], t[2]), at::index_copy(t[0], 0, t[1], t[2]));
       }},
      {"embedding",
       [] {
         return V{rnd({10, 4}), idx({2, 3}, 10)};
       },
       [](V& t) { return at::embedding(t[0], t[1]); }},
      {"_unsafe_view",
       [] {
         return V{rnd({4, 6})};
       },
       [](V& t) {
         return at::_unsafe_view(t[0], {2, -1, 3});
       }},
      {"clone: preserve a transposed, a strided slice, channels-last",
       [] {
         return V{rnd({3, 4}).t(), rnd({8, 6}).slice(0, 0, 8, 2), channels_last({2, 3, 2, 2})};
       },
       [](V& t) { return c10::IValue(std::make_tuple(t[0].clone(), t[1].clone(), t[2].clone())); }},
      {"clone to a memory format",
       [] {
         return V{channels_last({2, 3, 2, 2}), rnd({2, 3, 2, 2})};
       },
       [cl](V& t) {
         return c10::IValue(
             std::make_tuple(t[0].clone(at::MemoryFormat::Contiguous), t[1].clone(cl)));
       }},
      {"max_pool2d_with_indices, ceil mode",
       [] {
         return V{channels_last({2, 3, 7, 7})};
       },
       [](V& t) {
         return c10::IValue(
             at::max_pool2d_with_indices(t[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true));
       }},
      {"avg_pool2d",
       [] {
         return V{rnd({2, 3, 7, 6})};
       },
       [](V& t) {
         return at::avg_pool2d(t[0], {2, 2}, {2, 1}, {1, 0}, true, false, 3);
       }},
      {"upsample nearest / bilinear",
       [] {
         return V{channels_last({1, 2, 3, 4})};
       },
       [](V& t) {
         return c10::IValue(std::make_tuple(at::upsample_nearest2d(t[0], {6, 8}),
                                            at::upsample_bilinear2d(t[0], {5, 7}, true)));
       }},
      {"uniform_, normal_, fill_, zero_ keep a transposed layout",
       [] {
         return V{rnd({3, 4}).t()};
       },
       [](V& t) { return t[0].uniform_(-1, 1).normal_(0, 2).fill_(3).zero_(); }},
      {"empty_like, zeros_like, ones_like, full_like: layouts and dtypes",
       [] {
         return V{rnd({3, 4}).t(), rnd({8, 6}).slice(0, 0, 8, 2), channels_last({2, 3, 2, 2})};
       },
       [cl](V& t) {
         return c10::IValue(std::make_tuple(
             at::empty_like(t[0]), at::zeros_like(t[1], at::kHalf), at::ones_like(t[2]),
             at::full_like(t[2], 7, at::kLong, c10::nullopt, c10::nullopt, c10::nullopt,
                           at::MemoryFormat::Contiguous),
             at::empty_like(t[2].contiguous(), at::TensorOptions(), cl)));
       }},
      {"new_empty, new_zeros, new_ones",
       [] {
         return V{rnd({3, 4}, at::kHalf).t()};
       },
       [](V& t) {
         return c10::IValue(std::make_tuple(t[0].new_empty({2, 5}), t[0].new_zeros({3}),
                                            t[0].new_ones({1, 2}, at::kLong)));
       }},
      {"index.Tensor: broadcast indices around a slice",
       [] {
         return V{rnd({5, 6, 7}), idx({4, 1}, 5), idx({3}, 7)};
       },
       [](V& t) {
         c10::List<c10::optional<Tensor>> indices;
         indices.push_back(t[1]);
         indices.push_back(c10::nullopt);
         indices.push_back(t[2]);
         return at::index(t[0], indices);
       }},
      {"ones, zeros, scalar_tensor", [] { return V{}; },
       [](V&) {
         return c10::IValue(std::make_tuple(at::ones({2, 3}), at::zeros({4}, at::kLong),
                                            at::scalar_tensor(1.5, at::kHalf)));
       }},
  };
}

void expect_same(const Tensor& fake, const Tensor& real, const std::string& what) {
  EXPECT_TRUE(is_fake(fake)) << what;
  EXPECT_EQ(fake.sizes(), real.sizes()) << what;
  EXPECT_EQ(fake.strides(), real.strides()) << what;
  EXPECT_EQ(fake.storage_offset(), real.storage_offset()) << what;
  EXPECT_EQ(fake.scalar_type(), real.scalar_type()) << what;
}

TEST(NativeMeta, FakeResultsAreTheCpuKernelsSizesStridesAndDtypes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    at::manual_seed(0);
    std::vector<Tensor> real_in = c.inputs();
    std::vector<Tensor> fake_in;
    for (size_t i = 0; i < real_in.size(); ++i) {
      fake_in.push_back(c.stay_real.count(i) ? real_in[i] : fake_like(real_in[i]));
    }
    const std::vector<Tensor> real = flat(c.run(real_in));
    std::vector<Tensor> fake;
    {
      FakeMode mode(kCpu);
      fake = flat(c.run(fake_in));
    }
    ASSERT_EQ(fake.size(), real.size()) << c.name;
    for (size_t i = 0; i < real.size(); ++i) {
      expect_same(fake[i], real[i], c.name + " (output " + std::to_string(i) + ")");
    }
  }
}

TEST(NativeMeta, SafeSoftmaxAsTheCpuKernel) {
  // scaled_dot_product_attention's math path (torch 2.x only).
  auto op = c10::Dispatcher::singleton().findSchema({"aten::_safe_softmax", ""});
  if (!op) GTEST_SKIP() << "no aten::_safe_softmax in this libtorch";
  auto safe_softmax = op->typed<Tensor(const Tensor&, int64_t, c10::optional<at::ScalarType>)>();
  Tensor x = rnd({2, 3, 4}).transpose(0, 1);
  for (auto dtype : {c10::optional<at::ScalarType>(), c10::optional<at::ScalarType>(at::kDouble)}) {
    Tensor real = safe_softmax.call(x, -1, dtype);
    Tensor fake;
    {
      FakeMode mode(kCpu);
      fake = safe_softmax.call(fake_like(x), -1, dtype);
    }
    expect_same(fake, real, "_safe_softmax");
  }
}

TEST(NativeMeta, ArgumentErrorsAreTheKernelsErrors) {
  FakeMode mode(kCuda0);
  // at::meta::mm's own check, not a crash or a silent shape.
  EXPECT_THROW((void)at::mm(torch::ones({2, 3}), torch::ones({4, 5})), c10::Error);
  EXPECT_THROW((void)torch::ones({2}, torch::kBool).relu_(), c10::Error);
  EXPECT_THROW((void)at::cat({torch::ones({2, 3}), torch::ones({2, 4})}, 0), c10::Error);
}

}  // namespace
}  // namespace metaload
