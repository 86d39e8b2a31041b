#include "base/registration.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace metaload {
namespace {

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<void (*)()>& pending() {
  static std::vector<void (*)()> v;
  return v;
}

}  // namespace

bool preloaded_into_python() {
  // An interpreter exports Py_IsInitialized from its executable; before main() it returns 0.
  using IsInit = int (*)();
  static const bool preloaded = [] {
    auto fn = reinterpret_cast<IsInit>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    return fn != nullptr && fn() == 0;
  }();
  return preloaded;
}

void register_when_safe(void (*fn)()) {
  if (!preloaded_into_python()) return fn();
  std::lock_guard<std::mutex> lock(mu());
  pending().push_back(fn);
}

void run_deferred_registrations() {
  std::vector<void (*)()> todo;
  {
    std::lock_guard<std::mutex> lock(mu());
    todo.swap(pending());
  }
  for (auto fn : todo) fn();
}

}  // namespace metaload
