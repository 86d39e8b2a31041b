// FakeMode: a thread-local RAII mode in which tensor operations compute shapes, dtypes, strides and
// devices without memory and without computing. Factories make fake tensors on their explicit
// device or the mode's; real tensors entering an op are treated as fake on their device; meta
// tensors (a meta-built model's parameters) count as fake on the mode's device. Device rules are
// those of a real run: mixing cuda and cpu tensors in one op is the same error, except for
// zero-dim cpu tensors. Ops whose output size depends on values raise DataDependentError.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include "c10_ext/mode_key.h"

namespace metaload {

class FakeMode {
 public:
  // Registers the Fake key's fallback on first use (ModeError if another library owns the key).
  explicit FakeMode(c10::Device device);
  ~FakeMode();
  FakeMode(const FakeMode&) = delete;
  FakeMode& operator=(const FakeMode&) = delete;

 private:
  bool was_included_, was_excluded_;
  c10::optional<c10::Device> saved_device_;
};

// The innermost FakeMode's device on this thread, if one is active.
c10::optional<c10::Device> fake_mode_device();

// Registers the fallback for fake tensors (and a no-op CUDA device guard where CUDA is absent).
void ensure_fake_key_registered();

}  // namespace metaload
