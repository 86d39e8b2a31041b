// Guards opened from Python (MetaMode, RealGuard, FakeMode, ...) live on one per-thread stack:
// each `enter` returns a token (the depth) and `exit_scope(token)` must name the innermost one, so
// a mismatched exit is an error, never a silently corrupted state.
#pragma once

#include <cstdint>
#include <memory>

namespace metaload {

struct Scope {
  virtual ~Scope() = default;
};

template <typename Guard>
struct ScopeOf final : Scope {
  template <typename... Args>
  explicit ScopeOf(Args&&... args) : guard(std::forward<Args>(args)...) {}
  Guard guard;
};

// Pushes a scope on this thread's stack; returns its token.
int64_t push_scope(std::unique_ptr<Scope> scope);

// Closes the innermost scope; ModeError if `token` is not the innermost.
void pop_scope(int64_t token);

}  // namespace metaload
