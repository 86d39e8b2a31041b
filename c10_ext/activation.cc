// Switching MetaMode on from outside C++: the METALOAD environment variable (for unmodified
// programs under LD_PRELOAD), the exit report, and the torch.ops.metaload.* control operators that
// the Python package uses.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/registration.h"
#include "base/text.h"
#include "base/torch_library.h"
#include "c10_ext/meta_mode.h"
#include "c10_ext/mode_key.h"
#include "c10_ext/random_draws.h"
#include "c10_ext/scopes.h"

namespace metaload {
namespace {

[[noreturn]] void stop(const char* what) {
  std::fprintf(stderr, "metaload: %s\n", what);
  std::fflush(stderr);
  _exit(2);  // a deliberate stop at start-up: no static destructors of a half-started program
}

void print_report() {
  const ForcingStats s = forcing_stats();
  std::fprintf(stderr,
               "metaload: %llu tensors forced onto meta; %llu bytes (%.3f GiB) not allocated\n",
               static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.bytes),
               static_cast<double>(s.bytes) / (1024.0 * 1024.0 * 1024.0));
}

// The process-wide MetaMode that METALOAD=meta switches on for the thread that loads the library
// (the main thread under LD_PRELOAD). Never destroyed: it lasts until the process ends.
//
// An empty value counts as unset, for both variables (README, "By environment variable"): that
// is how a shell (`METALOAD= prog`), a Dockerfile (`ENV METALOAD=`) or a Kubernetes manifest
// switches off a variable it cannot unset, and `import metaload` loads this library into every
// Python program, which an empty variable must not stop. Every other value that is not accepted
// stops the process before it runs.
struct EnvActivation {
  EnvActivation() {
    const char* report = std::getenv("METALOAD_REPORT");
    if (report && *report && std::strcmp(report, "0") != 0) {
      if (std::strcmp(report, "1") != 0) {
        stop((std::string("METALOAD_REPORT='") + escape_text(report) +
              "' is not valid: accepted values are 1 (print a summary on exit) and 0, empty or "
              "unset (no summary)")
                 .c_str());
      }
      std::atexit(print_report);
    }
    const char* mode = std::getenv("METALOAD");
    if (!mode || !*mode || std::strcmp(mode, "off") == 0) return;
    if (std::strcmp(mode, "meta") != 0) {
      stop((std::string("METALOAD='") + escape_text(mode) +
            "' is not valid: accepted values are 'meta' (build every tensor on the meta device) "
            "and 'off', empty or unset (no effect)")
               .c_str());
    }
    try {
      new MetaMode();
    } catch (const std::exception& e) {
      stop((std::string("METALOAD=meta: ") + e.what()).c_str());
    }
  }
};
EnvActivation g_env_activation;

// ---- control operators ----------------------------------------------------------------------

thread_local std::vector<std::unique_ptr<Scope>> t_scopes;

int64_t enter_meta() {
  return push_scope(std::make_unique<ScopeOf<MetaMode>>());
}

int64_t enter_real() {
  return push_scope(std::make_unique<ScopeOf<RealGuard>>());
}

void exit_scope(int64_t token) {
  pop_scope(token);
}

bool forcing() {
  return is_forcing();
}

std::vector<int64_t> stats() {
  const ForcingStats s = forcing_stats();
  return {static_cast<int64_t>(s.tensors), static_cast<int64_t>(s.bytes)};
}

void reset_stats() {
  reset_forcing_stats();
}

bool draws_in_step() {
  return cpu_draws_in_step();
}

void skipped_draw() {
  note_skipped_draw();
}

void reseeded() {
  note_reseeded();
}

std::string draws_hint() {
  return random_draws_hint();
}

bool key_registered() {
  return mode_key_registered();
}

void init() {
  run_deferred_registrations();
}

std::vector<std::string> load_warnings() {
  return take_load_warnings();
}

// Python: the data of the error whose what() the text of a RuntimeError holds (base/error.h's
// record), as JSON, or None (an error made elsewhere, or long gone).
c10::optional<std::string> error_data(std::string text) {
  std::optional<std::string> data = error_data_json(text);
  if (!data) return c10::nullopt;
  return *data;
}

}  // namespace

int64_t push_scope(std::unique_ptr<Scope> scope) {
  t_scopes.push_back(std::move(scope));
  return static_cast<int64_t>(t_scopes.size());
}

void pop_scope(int64_t token) {
  if (token != static_cast<int64_t>(t_scopes.size()) || token <= 0) {
    throw ModeError("scopes must be exited innermost first: exit of scope " +
                    std::to_string(token) + " while " + std::to_string(t_scopes.size()) +
                    " are open on this thread");
  }
  t_scopes.pop_back();
}

}  // namespace metaload

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("enter_meta() -> int", &metaload::enter_meta);
  m.def("enter_real() -> int", &metaload::enter_real);
  m.def("exit_scope(int token) -> ()", &metaload::exit_scope);
  m.def("is_forcing() -> bool", &metaload::forcing);
  m.def("forcing_stats() -> int[]", &metaload::stats);
  m.def("reset_forcing_stats() -> ()", &metaload::reset_stats);
  m.def("random_draws_in_step() -> bool", &metaload::draws_in_step);
  m.def("note_skipped_draw() -> ()", &metaload::skipped_draw);
  m.def("note_reseeded() -> ()", &metaload::reseeded);
  m.def("random_draws_hint() -> str", &metaload::draws_hint);
  m.def("mode_key_registered() -> bool", &metaload::key_registered);
  m.def("init() -> ()", &metaload::init);
  m.def("load_warnings() -> str[]", &metaload::load_warnings);
  m.def("error_data(str text) -> str?", &metaload::error_data);
}

// With MetaMode or FakeMode on, their key is in the thread's key set, so even these operators
// (which take no tensors) would dispatch to the mode's fallback first -- and a fallback that saves
// and restores thread state around the call would undo what they do. Direct kernels for both
// keys keep the control path out of the fallbacks.
namespace {
void control_kernels(torch::Library& m) {
  m.impl("enter_meta", &metaload::enter_meta);
  m.impl("enter_real", &metaload::enter_real);
  m.impl("exit_scope", &metaload::exit_scope);
  m.impl("is_forcing", &metaload::forcing);
  m.impl("forcing_stats", &metaload::stats);
  m.impl("reset_forcing_stats", &metaload::reset_stats);
  m.impl("random_draws_in_step", &metaload::draws_in_step);
  m.impl("note_skipped_draw", &metaload::skipped_draw);
  m.impl("note_reseeded", &metaload::reseeded);
  m.impl("random_draws_hint", &metaload::draws_hint);
  m.impl("mode_key_registered", &metaload::key_registered);
  m.impl("init", &metaload::init);
  m.impl("load_warnings", &metaload::load_warnings);
  m.impl("error_data", &metaload::error_data);
}
}  // namespace

METALOAD_LIBRARY_IMPL(DeferredInit, m) {
  control_kernels(m);
}

METALOAD_LIBRARY_IMPL(Fake, m) {
  control_kernels(m);
}
