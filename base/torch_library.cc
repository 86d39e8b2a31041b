#include "base/torch_library.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace metaload {
namespace {

std::mutex& kept_mu() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& kept_warnings() {
  static std::vector<std::string> v;
  return v;
}

// A Python interpreter exports Py_IsInitialized from its executable (or libpython).
bool in_python_process() {
  static const bool python = dlsym(RTLD_DEFAULT, "Py_IsInitialized") != nullptr;
  return python;
}

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
    // Raised now, not kept: this copy registers no init of its own to raise it later.
    TORCH_WARN("metaload: another copy of libmetaload is already loaded; this copy (",
               this_copy_path(),
               ") registers no metaload:: operators and cannot switch its modes on");
  }
  return !taken;
}

}  // namespace

void load_warning(const std::string& message) {
  if (!in_python_process()) {
    TORCH_WARN(message);
    return;
  }
  std::lock_guard<std::mutex> lock(kept_mu());
  if (kept_warnings().empty()) {
    static std::once_flag at_exit;
    std::call_once(at_exit, [] {
      std::atexit([] {
        for (const std::string& m : take_load_warnings()) TORCH_WARN(m);
      });
    });
  }
  kept_warnings().push_back(message);
}

std::vector<std::string> take_load_warnings() {
  std::vector<std::string> kept;
  std::lock_guard<std::mutex> lock(kept_mu());
  kept.swap(kept_warnings());
  return kept;
}

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
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);  // its message, no backtrace
    load_warning(std::string("metaload: registering operators from ") + file + ":" +
                 std::to_string(line) +
                 " failed: " + (c10_error ? c10_error->what_without_backtrace() : e.what()));
    return false;
  }
}

}  // namespace metaload
