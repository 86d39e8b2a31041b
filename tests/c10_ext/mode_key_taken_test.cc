// In its own binary: another library owns the mode key before metaload's first MetaMode.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "c10_ext/meta_mode.h"
#include "c10_ext/mode_key.h"

namespace metaload {
namespace {

void other_library_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
  op.callBoxed(stack);
}

TEST(ModeKey, TakenKeyIsAClearErrorWhenTheModeIsSwitchedOn) {
  ASSERT_FALSE(mode_key_registered());
  static auto handle = c10::Dispatcher::singleton().registerFallback(
      kMetaModeKey, c10::KernelFunction::makeFromBoxedFunction<&other_library_fallback>(),
      "another library");
  for (int attempt = 0; attempt < 2; ++attempt) {  // the same answer every time
    try {
      MetaMode mode;
      ADD_FAILURE() << "MetaMode switched on over a taken key";
    } catch (const ModeError& e) {
      EXPECT_NE(std::string(e.what()).find("DeferredInit"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("already has a fallback"), std::string::npos);
    }
  }
  EXPECT_FALSE(is_forcing());
  EXPECT_TRUE(at::zeros({2}).is_cpu());
}

}  // namespace
}  // namespace metaload
