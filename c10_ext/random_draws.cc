#include "c10_ext/random_draws.h"

#include <atomic>

namespace metaload {
namespace {
// One default CPU generator per process: one flag, whichever thread skipped or seeded.
std::atomic<bool> g_skipped{false};
}  // namespace

bool cpu_draws_in_step() {
  return !g_skipped.load(std::memory_order_relaxed);
}

void note_skipped_draw() {
  g_skipped.store(true, std::memory_order_relaxed);
}

void note_reseeded() {
  g_skipped.store(false, std::memory_order_relaxed);
}

std::string random_draws_hint() {
  if (cpu_draws_in_step()) return "";
  return " Small random tensors keep the values an eager run draws only until a draw is skipped "
         "(a weight's random init on meta draws nothing); since then none has values, until the "
         "generator is seeded again (torch.manual_seed).";
}

}  // namespace metaload
