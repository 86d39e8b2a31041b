// When to register kernels with the dispatcher.
//
// Kernels for ops that lack them are registered by static initializers when the library loads.
// One case needs care: LD_PRELOAD into a Python interpreter. Then the library loads before
// `import torch`, and torch's Python kernels (torch/_meta_registrations.py) would override ours
// with a warning per op. In that case registrations wait until run_deferred_registrations() --
// which the Python package and FakeMode call -- by which time torch's own are in place.
#pragma once

namespace metaload {

// Runs `fn` now, or, when preloaded into a Python interpreter that has not started yet, later.
void register_when_safe(void (*fn)());

// Runs every registration that was deferred, once. Thread-safe; cheap when nothing is pending.
void run_deferred_registrations();

// Whether this library was loaded into a Python interpreter before it started (LD_PRELOAD).
bool preloaded_into_python();

}  // namespace metaload
