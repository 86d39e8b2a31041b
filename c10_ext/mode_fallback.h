// The run-time registration that MetaMode (c10_ext/mode.cc) and FakeMode (fake_mode/) share: a
// boxed fallback for the mode's dispatch key, registered once per process when the mode is first
// switched on, only if no other library holds the key (mode_key.h says why not at load time).
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <c10/core/DispatchKey.h>

#include <atomic>
#include <mutex>
#include <string>

namespace metaload {

class ModeFallback {
 public:
  // `mode` ("MetaMode") and `purpose` ("itself", "fake tensors") word the errors; `debug` names
  // the fallback in dispatcher dumps; `also` registers what else the mode needs once its fallback
  // is in place (may throw: that is a failed registration too).
  ModeFallback(c10::DispatchKey key, const char* mode, const char* purpose,
               c10::KernelFunction (*kernel)(), const char* debug, void (*also)() = nullptr);

  // Registers on the first call; every call after a failure throws ModeError with the first
  // failure's reason. Thread-safe.
  void ensure();
  bool registered() const { return registered_.load(); }

 private:
  void register_once();

  const c10::DispatchKey key_;
  const char* const mode_;
  const char* const purpose_;
  c10::KernelFunction (*const kernel_)();
  const char* const debug_;
  void (*const also_)();
  std::once_flag once_;
  std::atomic<bool> registered_{false};
  std::string error_;  // set once, under once_
};

}  // namespace metaload
