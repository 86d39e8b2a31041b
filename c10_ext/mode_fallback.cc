#include "c10_ext/mode_fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <exception>

#include "c10_ext/mode_key.h"

namespace metaload {

ModeFallback::ModeFallback(c10::DispatchKey key, const char* mode, const char* purpose,
                           c10::KernelFunction (*kernel)(), const char* debug, void (*also)())
    : key_(key), mode_(mode), purpose_(purpose), kernel_(kernel), debug_(debug), also_(also) {}

void ModeFallback::register_once() {
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string prefix = std::string("cannot switch ") + mode_ + " on: ";
  if (dispatcher.hasBackendFallbackForDispatchKey(key_)) {
    error_ = prefix + "dispatch key " + c10::toString(key_) +
             " already has a fallback registered by another library (or another copy of "
             "metaload loaded from a different path); metaload needs that key for " +
             purpose_;
    return;
  }
  try {
    // Never deregistered: the fallback must outlive every thread that may still dispatch.
    new c10::RegistrationHandleRAII(dispatcher.registerFallback(key_, kernel_(), debug_));
    if (also_ != nullptr) also_();
    registered_.store(true);
  } catch (const std::exception& e) {
    error_ =
        prefix + "registering the fallback for " + c10::toString(key_) + " failed: " + e.what();
  }
}

void ModeFallback::ensure() {
  std::call_once(once_, [this] { register_once(); });
  if (!registered_.load()) throw ModeError(error_);
}

}  // namespace metaload
