// Shape (Meta) kernels for the aten ops that libtorch ships without one, registered at load time
// only where the dispatcher has no C++ Meta kernel for the op.
//
// Rules (see meta_registry.cc for why):
//  - an op that already has a C++ Meta kernel keeps it (a newer libtorch wins);
//  - an op whose Meta kernel was registered from Python (torch/_meta_registrations.py and
//    torch/_decomp register ~115 of them on `import torch`) gets ours on top: those run Python per
//    call and some disagree with the CPU kernel (1.13's native_batch_norm eval save_mean);
//  - CompositeImplicitAutograd ops are left alone: they decompose before reaching Meta;
//  - data-dependent ops (nonzero, item, unique, ...) are not in the table at all.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/errors.h"

namespace metaload {

// Who serves an op's Meta dispatch key right now.
enum class MetaKernelOwner {
  kNone,      // no Meta kernel registered for the op
  kMetaload,  // ours
  kPython,    // registered from Python (torch.library)
  kNative,    // a C++ kernel of libtorch or of another library
};

const char* to_string(MetaKernelOwner owner);

// What the registration did, op names as "aten::name.overload".
struct MetaKernelReport {
  std::vector<std::string> registered;       // ours serve Meta (including replaced_python)
  std::vector<std::string> replaced_python;  // ours were put over a Python-registered kernel
  std::vector<std::string> kept_native;      // libtorch has its own C++ Meta kernel: kept
  std::vector<std::string> composite;        // CompositeImplicitAutograd in this libtorch: skipped
  std::vector<std::string> absent;           // the op does not exist in this libtorch
  std::vector<std::pair<std::string, std::string>> failed;  // op, reason (e.g. schema mismatch)
};

// Registers every kernel of the table that is missing (or only Python-registered) now. Runs once
// automatically when the library loads (unless METALOAD_META_KERNELS=off); call it again when
// Python may have registered its meta kernels after the load (LD_PRELOAD before `import torch`).
// Idempotent and thread-safe. Never throws: problems go to the report's `failed`.
// Returns the ops registered by this call.
std::vector<std::string> ensure_meta_kernels();

// The ops whose Meta kernel metaload registered so far, sorted.
std::vector<std::string> registered_meta_kernels();

// The full state after the registrations so far.
MetaKernelReport meta_kernel_report();

// Every op metaload has a Meta kernel for (the table), whether registered or not.
std::vector<std::string> meta_kernel_table();

// The current owner of `op`'s Meta kernel ("aten::relu", "aten::where.self"), read from the
// dispatcher. Throws UnknownOpError if this libtorch has no such op.
MetaKernelOwner meta_kernel_owner(const std::string& op);

// Classifies one operator's dispatcher dump (OperatorHandle::dumpState()) by its "Meta:" line.
// Exposed for tests; meta_kernel_owner uses it.
MetaKernelOwner classify_meta_kernel(const std::string& dump_state);

}  // namespace metaload
