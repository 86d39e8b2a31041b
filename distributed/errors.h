// The error kind of the distributed layer (dist/). Torch-free, header-only. Derives from
// metaload::Error (base/error.h); python/metaload/_lib.py mirrors it.
#pragma once

#include "base/error.h"

namespace metaload {

// A collective failed or did not complete in time (a rank died, hangs, or never joined), or the
// ranks of a tensor-parallel group disagree (tp_size, rank, model). The message names the
// operation, this rank, the group size and the timeout, or every rank's differing values.
METALOAD_DEFINE_ERROR(DistributedError, Error);

}  // namespace metaload
