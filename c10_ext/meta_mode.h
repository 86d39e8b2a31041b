// MetaMode and RealGuard: thread-local RAII switches for forcing tensors onto the meta device.
//
// While a MetaMode is alive on a thread, every tensor that thread creates -- factories, the
// *_like family, torch::tensor / torch.tensor, .to(device), .cuda(), .cpu(), _to_copy, and so every
// parameter and buffer of a module constructor -- lands on the meta device: it has a shape and a
// dtype but no memory. A RealGuard inside it suspends the forcing; a MetaMode inside that forces
// again. The innermost guard decides, also across modes: a MetaMode or RealGuard opened inside a
// FakeMode (fake_mode/fake_mode.h) switches FakeMode off until it closes (tensors created in it
// are meta, resp. real; fake tensors stay fake), and a FakeMode opened inside them switches the
// forcing off. Each guard restores exactly the state it found, also when an exception passes.
//
// Mechanism: a dispatch key (DeferredInit, see mode_key.h) is added to the thread's included
// key set; a boxed fallback registered for that key rewrites device arguments to meta.
#pragma once

#include <cstdint>

namespace metaload {

// Whether tensors created on this thread right now are forced onto meta.
bool is_forcing();

class MetaMode {
 public:
  // Registers the mode key on first use; throws ModeError when the key is owned by another library
  // or cannot be registered (then the thread's state is unchanged).
  MetaMode();
  ~MetaMode();
  MetaMode(const MetaMode&) = delete;
  MetaMode& operator=(const MetaMode&) = delete;

 private:
  bool was_included_, was_excluded_, was_faking_;
};

class RealGuard {
 public:
  RealGuard();
  ~RealGuard();
  RealGuard(const RealGuard&) = delete;
  RealGuard& operator=(const RealGuard&) = delete;

 private:
  bool was_included_, was_excluded_, was_faking_;
};

// What forcing has saved so far in this process (all threads): tensors that landed on meta instead
// of a real device, and the bytes they would have allocated.
struct ForcingStats {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};
ForcingStats forcing_stats();
void reset_forcing_stats();

}  // namespace metaload
