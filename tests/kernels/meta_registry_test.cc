// The conditional registration: what the load-time registration did on this libtorch, how owners
// are recognised from the dispatcher's record, and -- on ops defined here -- that a missing kernel
// is added, a C++ one kept, a Python one replaced, a composite op skipped, a mismatched schema
// reported rather than thrown.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <algorithm>

#include "base/torch_compat.h"
#include "kernels/meta_common.h"
#include "kernels/meta_registry.h"

namespace metaload {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// ---- the load-time registration on this libtorch ----------------------------------------------

TEST(MetaRegistry, EveryTableOpIsAccountedFor) {
  MetaKernelReport r = meta_kernel_report();
  for (const auto& op : meta_kernel_table()) {
    int places = contains(r.registered, op) + contains(r.kept_native, op) +
                 contains(r.composite, op) + contains(r.absent, op);
    for (const auto& [name, why] : r.failed) places += name == op;
    EXPECT_EQ(places, 1) << op;
  }
  for (const auto& [name, why] : r.failed) ADD_FAILURE() << name << ": " << why;
}

TEST(MetaRegistry, ModelCriticalOpsHaveOurKernels) {
  // The ops real models need that libtorch 1.13's C++ has no Meta kernel for (notes/metagap.md).
  for (const char* op :
       {"aten::convolution", "aten::native_batch_norm", "aten::native_layer_norm",
        "aten::native_group_norm", "aten::relu", "aten::where.self", "aten::index_select",
        "aten::logical_not.out", "aten::_adaptive_avg_pool2d", "aten::roll",
        "aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd"}) {
    MetaKernelOwner owner = meta_kernel_owner(op);
    EXPECT_TRUE(owner == MetaKernelOwner::kMetaload || owner == MetaKernelOwner::kNative)
        << op << " is served by " << to_string(owner);
    if (compat::kAtenLacksModelMetaKernels) EXPECT_EQ(owner, MetaKernelOwner::kMetaload) << op;
  }
  // Never replaced: libtorch's own C++ kernels.
  EXPECT_EQ(meta_kernel_owner("aten::add.Tensor"), MetaKernelOwner::kNative);
  EXPECT_EQ(meta_kernel_owner("aten::relu_"), MetaKernelOwner::kNative);
  // Data-dependent: never a shape kernel of ours (c10_ext serves it with a typed error kernel).
  EXPECT_NE(meta_kernel_owner("aten::nonzero"), MetaKernelOwner::kMetaload);
  if (!compat::kAtenHasNativeBatchNormLegit) {
    EXPECT_TRUE(contains(meta_kernel_report().absent, "aten::_native_batch_norm_legit"));
  }
}

TEST(MetaRegistry, UnknownOpIsATypedError) {
  EXPECT_THROW(meta_kernel_owner("aten::no_such_op"), UnknownOpError);
  try {
    meta_kernel_owner("aten::no_such_op.overload");
  } catch (const UnknownOpError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::no_such_op.overload"), std::string::npos);
  }
}

TEST(MetaRegistry, EnsureIsIdempotent) {
  EXPECT_TRUE(ensure_meta_kernels().empty());
  EXPECT_TRUE(ensure_meta_kernels().empty());
}

TEST(MetaRegistry, OurKernelsRunUnderMetaAndRaiseShapeError) {
  at::Tensor x = at::empty({2, 3, 8, 8}, at::kMeta);
  at::Tensor w = at::empty({4, 3, 3, 3}, at::kMeta);
  EXPECT_EQ(at::conv2d(x, w).sizes(), at::IntArrayRef({2, 4, 6, 6}));
  EXPECT_THROW(at::conv2d(x, at::empty({4, 5, 3, 3}, at::kMeta)), ShapeError);
}

// ---- recognising owners from the dispatcher's dump ------------------------------------------

TEST(MetaRegistry, ClassifiesDispatcherDumps) {
  const std::string head =
      "name: aten::relu\nschema: aten::relu(Tensor self) -> Tensor\n"
      "CPU: registered at ./build/aten/src/ATen/RegisterCPU.cpp:30798 :: (Tensor _0) -> Tensor _0 "
      "[ boxed unboxed ]\n";
  EXPECT_EQ(classify_meta_kernel(head), MetaKernelOwner::kNone);
  // libtorch 1.13's Python library records "/dev/null" as the file.
  EXPECT_EQ(classify_meta_kernel(head + "Meta: registered at /dev/null:241 :: (none) [ boxed ]\n"),
            MetaKernelOwner::kPython);
  // 2.x records the Python file.
  EXPECT_EQ(classify_meta_kernel(head + "Meta: registered at /usr/lib/python3/dist-packages/torch/"
                                        "_meta_registrations.py:1234 :: (none) [ boxed ]\n"),
            MetaKernelOwner::kPython);
  EXPECT_EQ(classify_meta_kernel(head +
                                 "Meta: registered at ./build/aten/src/ATen/RegisterMeta.cpp:26815 "
                                 ":: (Tensor _0) -> Tensor _0 [ boxed unboxed ]\n"),
            MetaKernelOwner::kNative);
  // A boxed-only C++ kernel is still C++; so is an unboxed one in a file named like Python.
  EXPECT_EQ(
      classify_meta_kernel(head + "Meta: registered at fallback.cpp:12 :: (none) [ boxed ]\n"),
      MetaKernelOwner::kNative);
  EXPECT_EQ(classify_meta_kernel(head + "Meta: registered at x.py:3 :: (Tensor _0) -> Tensor _0 "
                                        "[ boxed unboxed ]\n"),
            MetaKernelOwner::kNative);
  EXPECT_EQ(classify_meta_kernel(head + "Meta: " + meta::kKernelDebug +
                                 " :: (Tensor _0) -> Tensor _0 [ boxed unboxed ]\n"),
            MetaKernelOwner::kMetaload);
  // Keys whose names start like Meta's are not Meta.
  EXPECT_EQ(classify_meta_kernel(head + "MetaX: registered at /dev/null:1 :: (none) [ boxed ]\n"),
            MetaKernelOwner::kNone);
}

// ---- conditional registration on ops defined here ---------------------------------------------

// Ops with every kind of Meta state the registry meets.
TORCH_LIBRARY(metaload_test, m) {
  m.def("no_meta(Tensor x) -> Tensor");
  m.def("native_meta(Tensor x) -> Tensor");
  m.def("python_meta(Tensor x) -> Tensor");
  m.def("composite(Tensor x) -> Tensor");
  m.def("bad_schema(Tensor x, int n) -> Tensor");
  m.def("late_python(Tensor x) -> Tensor");
}

// Whose kernel ran shows in the output's first size.
constexpr int64_t kNativeMark = 1, kPythonMark = 3, kOurMark = 2;

at::Tensor native_kernel(const at::Tensor&) {
  return at::empty({kNativeMark}, at::kMeta);
}
at::Tensor composite_kernel(const at::Tensor& x) {
  return x;
}

TORCH_LIBRARY_IMPL(metaload_test, Meta, m) {
  m.impl("native_meta", native_kernel);
}
TORCH_LIBRARY_IMPL(metaload_test, CompositeImplicitAutograd, m) {
  m.impl("composite", composite_kernel);
}

// A boxed kernel registered the way torch.library does from Python: a library whose file is
// "/dev/null" (what libtorch 1.13's Python binding passes) and no unboxed kernel.
void python_like(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, 1);
  torch::jit::push(*stack, at::empty({kPythonMark}, at::kMeta));
}

std::unique_ptr<torch::Library> register_python_like(const char* op) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "metaload_test",
                                              c10::DispatchKey::Meta, "/dev/null", 0);
  lib->impl(op, torch::CppFunction::makeFromBoxedFunction<&python_like>());
  return lib;
}

at::Tensor our_kernel(const at::Tensor&) {
  return at::empty({kOurMark}, at::kMeta);
}

int64_t call_on_meta(const char* op) {
  // These test ops have no autograd kernel (and AutogradMeta no fallthrough in 1.13).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, "");
  auto typed = handle.typed<at::Tensor(const at::Tensor&)>();
  return typed.call(at::empty({5}, at::kMeta)).size(0);
}

std::vector<meta::KernelDef> test_defs() {
  return {
      METALOAD_META_KERNEL("metaload_test::no_meta", our_kernel),
      METALOAD_META_KERNEL("metaload_test::native_meta", our_kernel),
      METALOAD_META_KERNEL("metaload_test::python_meta", our_kernel),
      METALOAD_META_KERNEL("metaload_test::composite", our_kernel),
      METALOAD_META_KERNEL("metaload_test::bad_schema", our_kernel),  // lacks `int n`
      METALOAD_META_KERNEL("metaload_test::not_defined", our_kernel),
  };
}

TEST(MetaRegistry, RegistersOnlyWhereMissingOrPython) {
  auto python = register_python_like("python_meta");
  EXPECT_EQ(meta_kernel_owner("metaload_test::python_meta"), MetaKernelOwner::kPython);
  EXPECT_EQ(meta_kernel_owner("metaload_test::no_meta"), MetaKernelOwner::kNone);
  EXPECT_EQ(call_on_meta("metaload_test::python_meta"), kPythonMark);

  MetaKernelReport round;
  auto added = meta::ensure_kernels(test_defs(), &round);
  EXPECT_EQ(added,
            (std::vector<std::string>{"metaload_test::no_meta", "metaload_test::python_meta"}));
  EXPECT_EQ(round.kept_native, std::vector<std::string>{"metaload_test::native_meta"});
  EXPECT_EQ(round.composite, std::vector<std::string>{"metaload_test::composite"});
  EXPECT_EQ(round.absent, std::vector<std::string>{"metaload_test::not_defined"});
  ASSERT_EQ(round.failed.size(), 1u);
  EXPECT_EQ(round.failed[0].first, "metaload_test::bad_schema");
  EXPECT_NE(round.failed[0].second.find("metaload_test::bad_schema"), std::string::npos)
      << round.failed[0].second;

  // Who runs now.
  EXPECT_EQ(call_on_meta("metaload_test::no_meta"), kOurMark);
  EXPECT_EQ(call_on_meta("metaload_test::python_meta"), kOurMark);
  EXPECT_EQ(call_on_meta("metaload_test::native_meta"), kNativeMark);
  EXPECT_EQ(meta_kernel_owner("metaload_test::no_meta"), MetaKernelOwner::kMetaload);
  EXPECT_EQ(meta_kernel_owner("metaload_test::python_meta"), MetaKernelOwner::kMetaload);
  EXPECT_EQ(meta_kernel_owner("metaload_test::native_meta"), MetaKernelOwner::kNative);
  MetaKernelReport all = meta_kernel_report();
  EXPECT_TRUE(contains(all.replaced_python, "metaload_test::python_meta"));
  EXPECT_FALSE(contains(all.replaced_python, "metaload_test::no_meta"));
  EXPECT_TRUE(contains(registered_meta_kernels(), "metaload_test::no_meta"));

  // Nothing more to do the second time.
  MetaKernelReport again;
  EXPECT_TRUE(meta::ensure_kernels(test_defs(), &again).empty());
  EXPECT_EQ(again.kept_native, std::vector<std::string>{"metaload_test::native_meta"});
}

TEST(MetaRegistry, APythonKernelRegisteredLaterIsReplacedOnTheNextRound) {
  // LD_PRELOAD before `import torch`: our kernels can land first and Python's on top.
  std::vector<meta::KernelDef> defs = {
      METALOAD_META_KERNEL("metaload_test::late_python", our_kernel)};
  EXPECT_EQ(meta::ensure_kernels(defs), std::vector<std::string>{"metaload_test::late_python"});
  auto python = register_python_like("late_python");
  EXPECT_EQ(meta_kernel_owner("metaload_test::late_python"), MetaKernelOwner::kPython);
  EXPECT_EQ(call_on_meta("metaload_test::late_python"), kPythonMark);
  EXPECT_EQ(meta::ensure_kernels(defs), std::vector<std::string>{"metaload_test::late_python"});
  EXPECT_EQ(meta_kernel_owner("metaload_test::late_python"), MetaKernelOwner::kMetaload);
  EXPECT_EQ(call_on_meta("metaload_test::late_python"), kOurMark);
}

}  // namespace
}  // namespace metaload
