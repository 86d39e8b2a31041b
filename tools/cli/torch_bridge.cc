// Runs the subcommands that need libtorch: loads libmetaload.so on demand, so the tool itself
// stays torch-free and `metaload describe` starts in milliseconds.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

std::string exe_dir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

int fail(const char* sub, const std::string& why) {
  std::cerr << "metaload " << sub << ": error: " << sub
            << " needs libmetaload.so (libtorch), which could not be loaded: " << why << "\n";
  return 2;
}

}  // namespace

int run_torch_command(int argc, char** argv) {
  const char* sub = argv[1];
  std::vector<std::string> candidates;
  const char* env = std::getenv("METALOAD_LIB");
  if (env && *env) {
    candidates.push_back(env);  // an explicit choice: no silent fallback to another copy
  } else {
    const std::string dir = exe_dir();
    // Bazel: bazel-bin/tools/metaload + bazel-bin/libmetaload.so; CMake: build/X/tools/cli/metaload
    // + build/X/libmetaload.so; an install: both in one directory.
    for (const char* rel : {"/libmetaload.so", "/../libmetaload.so", "/../../libmetaload.so"})
      candidates.push_back(dir + rel);
#ifdef METALOAD_INSTALLED_LIB  // pip install: the tool in bin/, the library in the package
    candidates.push_back(dir + "/" + METALOAD_INSTALLED_LIB);
#endif
  }
  std::string tried;
  for (const std::string& path : candidates) {
    if (!exists(path)) {
      tried += (tried.empty() ? "" : "; ") + path + " (no such file)";
      continue;
    }
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char* e = ::dlerror();
      tried += (tried.empty() ? "" : "; ") + path + " (" + (e ? e : "dlopen failed") + ")";
      continue;
    }
    using Main = int (*)(int, char**);
    auto main = reinterpret_cast<Main>(::dlsym(lib, "metaload_cli_torch_main"));
    if (!main) return fail(sub, path + " has no metaload_cli_torch_main (an older build?)");
    return main(argc, argv);
  }
  return fail(sub,
              "tried " + tried + (env && *env ? " (from METALOAD_LIB)" : "; set METALOAD_LIB"));
}

}  // namespace cli
}  // namespace metaload
