// TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL for the metaload namespace that never abort the
// process.
//
// torch's macros register in static initializers and throw when an operator is defined twice;
// a throw there terminates the process. That happens whenever a second copy of libmetaload.so is
// loaded from another path (LD_PRELOAD of one copy, torch.ops.load_library of another). With these
// macros the first copy loaded owns the `metaload::` operators; a later copy registers none of
// them and says so once in a warning (its modes then raise ModeError: the dispatch keys are taken).
#pragma once

#include <torch/library.h>

#include <cstdint>
#include <string>
#include <vector>

namespace metaload {

// A warning raised while the library loads, through torch's warning machinery (TORCH_WARN) or,
// in Python, Python's `warnings`. Static initializers run inside dlopen, where no Python caller
// can catch a warning, and calls through torch.ops do not turn TORCH_WARN into Python warnings;
// so in a Python process (Py_IsInitialized is exported, whether the interpreter has started or the
// library was preloaded) the warning is kept, and the Python package raises each kept one as a
// UserWarning right after loading the library (take_load_warnings, through the operator
// metaload::load_warnings). Elsewhere (a C++ program) it is raised at once, and c10's handler
// prints it on stderr; so are kept warnings nobody took, when the process exits.
void load_warning(const std::string& message);

// The warnings load_warning kept, each once; the caller raises them.
std::vector<std::string> take_load_warnings();

// Runs `init` on a fresh library object of `kind` for namespace "metaload", unless another copy
// of the library registered the namespace first; a failure is a warning, never an abort.
// Defined with protected visibility: every loaded copy runs its own (with its own notion of
// "first"), never one interposed from another copy, yet it stays exported for builds that link
// components as separate shared libraries (Bazel's test binaries).
bool register_metaload_library(torch::Library::Kind kind, c10::optional<c10::DispatchKey> key,
                               void (*init)(torch::Library&), const char* file, uint32_t line);

// Whether this copy of the library owns the metaload:: operators (false when another copy loaded
// first).
bool owns_metaload_operators();

}  // namespace metaload

#define METALOAD_LIBRARY_FRAGMENT(m) METALOAD_LIBRARY_INIT_(FRAGMENT, c10::nullopt, m, C10_UID)
#define METALOAD_LIBRARY_IMPL(k, m) \
  METALOAD_LIBRARY_INIT_(IMPL, c10::make_optional(c10::DispatchKey::k), m, C10_UID)
#define METALOAD_LIBRARY_INIT_(kind, key, m, uid)                                          \
  static void C10_CONCATENATE(metaload_library_init_, uid)(torch::Library&);               \
  static const bool C10_CONCATENATE(metaload_library_registered_, uid) =                   \
      ::metaload::register_metaload_library(torch::Library::kind, key,                     \
                                            &C10_CONCATENATE(metaload_library_init_, uid), \
                                            __FILE__, __LINE__);                           \
  static void C10_CONCATENATE(metaload_library_init_, uid)(torch::Library & m)
