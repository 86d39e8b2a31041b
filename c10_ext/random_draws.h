// Which random tensors made under MetaMode may carry values: those an eager run draws the same.
//
// A constructor that draws a small random tensor and computes with its values (a buffer made with
// torch.linalg.qr(torch.randn(8, 8))) needs those values under MetaMode too. A small random tensor
// on cpu is therefore drawn for real from the default CPU generator -- the numbers an eager run of
// the same program draws, in the same order -- as long as that generator is where the eager run's
// would be. It stops being so at the first draw MetaMode skips (a weight's init on a meta tensor
// draws nothing where the eager run advances the generator): from then on random tensors get no
// values (reading one is a DataDependentError, never a number the eager run would not have drawn),
// until the generator is seeded again (torch.manual_seed: the Python package reports it here).
#pragma once

#include <string>

namespace metaload {

// Whether the default CPU generator is still in step with an eager run (no skipped draw since it
// was last seeded, as far as this process was told).
bool cpu_draws_in_step();

// A random op ran on meta and drew nothing where an eager run would have drawn.
void note_skipped_draw();

// The default CPU generator was seeded: its state is the eager run's again.
void note_reseeded();

// For a message about a missing value: why random tensors have none now ("" while in step).
std::string random_draws_hint();

}  // namespace metaload
