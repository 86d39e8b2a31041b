// FakeMode: a thread-local RAII mode in which tensor operations compute shapes, dtypes, strides and
// devices without memory and without computing. Factories make fake tensors on their explicit
// device or the mode's; real tensors entering an op are treated as fake on their device; meta
// tensors (a meta-built model's parameters) count as fake on the mode's device. Device rules are
// those of a real run: mixing cuda and cpu tensors in one op is the same error, except for
// zero-dim cpu tensors. Ops whose output size depends on values raise DataDependentError.
//
// Nesting: the innermost guard decides (c10_ext/meta_mode.h). A FakeMode switches MetaMode off on
// its thread; a MetaMode or RealGuard opened inside a FakeMode switches it off (its device too)
// until they close. Fake tensors stay fake wherever they are used.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <string>

#include "c10_ext/mode_key.h"

namespace metaload {

// The devices a FakeMode claims: cpu (no index, or 0), cuda:N for N below this (c10's
// C10_COMPILE_TIME_MAX_GPUS, the most a CUDA build addresses).
constexpr int kMaxFakeCudaDevices = 16;

class FakeMode {
 public:
  // Registers the Fake key's fallback on first use (ModeError if another library owns the key).
  // A device it cannot claim (see kMaxFakeCudaDevices) is a ModeError, before anything changes.
  explicit FakeMode(c10::Device device);
  ~FakeMode();
  FakeMode(const FakeMode&) = delete;
  FakeMode& operator=(const FakeMode&) = delete;

 private:
  bool was_included_, was_excluded_, was_forcing_;
  c10::optional<c10::Device> saved_device_;
};

// `device` as a FakeMode claims it (cpu:0 is cpu); ModeError naming `what` (the argument) and the
// rule if it cannot be claimed.
c10::Device claimable_fake_device(c10::Device device, const std::string& what);

// The innermost FakeMode's device on this thread, if one is on (not switched off by a MetaMode or
// RealGuard inside it).
c10::optional<c10::Device> fake_mode_device();

// Registers the fallback for fake tensors (and a no-op CUDA device guard where CUDA is absent).
void ensure_fake_key_registered();

}  // namespace metaload
