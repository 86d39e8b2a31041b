// In its own binary: another library owns the Fake key before metaload's first FakeMode.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "fake_mode/fake_mode.h"

namespace metaload {
namespace {

void other_library_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::Fake);
  op.callBoxed(stack);
}

TEST(FakeKey, TakenKeyIsAClearErrorWhenTheModeIsSwitchedOn) {
  static auto handle = c10::Dispatcher::singleton().registerFallback(
      c10::DispatchKey::Fake, c10::KernelFunction::makeFromBoxedFunction<&other_library_fallback>(),
      "another library");
  try {
    FakeMode mode(c10::Device("cuda:0"));
    ADD_FAILURE() << "FakeMode switched on over a taken key";
  } catch (const ModeError& e) {
    EXPECT_NE(std::string(e.what()).find("Fake already has a fallback"), std::string::npos);
  }
  EXPECT_FALSE(fake_mode_device().has_value());
  EXPECT_TRUE(at::zeros({2}).is_cpu());
}

}  // namespace
}  // namespace metaload
