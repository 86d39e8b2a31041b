#include "base/torch_library.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <cstdio>
#include <exception>
#include <mutex>
#include <string>

namespace metaload {
namespace {

std::string this_copy_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_copy_path), &info) != 0 && info.dli_fname) {
    return info.dli_fname;
  }
  return "libmetaload";
}

// Decided once per copy, at its first registration (before it has registered anything): if
// metaload::init already exists, another copy put it there.
bool decide_owner() {
  const bool taken = c10::Dispatcher::singleton().findSchema({"metaload::init", ""}).has_value();
  if (taken) {
    std::fprintf(stderr,
                 "metaload: warning: another copy of libmetaload is already loaded; this copy (%s) "
                 "registers no metaload:: operators and cannot switch its modes on\n",
                 this_copy_path().c_str());
  }
  return !taken;
}

}  // namespace

__attribute__((visibility("protected"))) bool owns_metaload_operators() {
  static const bool owner = decide_owner();
  return owner;
}

__attribute__((visibility("protected"))) bool register_metaload_library(
    torch::Library::Kind kind, c10::optional<c10::DispatchKey> key, void (*init)(torch::Library&),
    const char* file, uint32_t line) {
  if (!owns_metaload_operators()) return false;
  try {
    // Kept for the life of the process, like torch's own static registrations.
    auto* lib = new torch::Library(kind, "metaload", key, file, line);
    init(*lib);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metaload: warning: registering operators from %s:%u failed: %s\n", file,
                 line, e.what());
    return false;
  }
}

}  // namespace metaload
