// The dispatch key that carries MetaMode, and its run-time registration.
//
// The key is DispatchKey::DeferredInit: free in libtorch 1.13 and 2.x, and above Autograd, so the
// fallback sees composite ops like to() before they decompose. A future libtorch (or another
// library) may take it, so nothing is registered when the library loads: the first MetaMode checks
// that no fallback exists for the key, then registers ours. A taken key is a ModeError when the
// mode is switched on, never an abort.
#pragma once

#include <c10/core/DispatchKey.h>

#include "base/error.h"

namespace metaload {

// ModeError and DataDependentError, the mode's error kinds, are in base/error.h.

constexpr c10::DispatchKey kMetaModeKey = c10::DispatchKey::DeferredInit;

// FakeMode's key (fake_mode/fake_mode.h), named here because the modes nest with one rule,
// innermost wins: MetaMode and RealGuard switch FakeMode off on their thread while they are
// alive (the key leaves the thread's included set), FakeMode switches MetaMode off.
constexpr c10::DispatchKey kFakeModeKey = c10::DispatchKey::Fake;

// Registers the MetaMode fallback once per process; later calls return at once or rethrow the
// first failure. Thread-safe.
void ensure_mode_key_registered();

// Whether this process's MetaMode fallback is registered (false before the first MetaMode).
bool mode_key_registered();

}  // namespace metaload
