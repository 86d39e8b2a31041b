// Checkpoints held open across the calls of one Python load_into (torch.ops.metaload
// checkpoint_open / checkpoint_names / checkpoint_close, and load_into's `checkpoint`): the
// package opens the checkpoint once, asks its names as often as its renames need (a retry after a
// MismatchError included) and loads from it, so every header is read once and every file opened
// once (Checkpoint::keep_files: the data is read through the descriptors the headers were read
// through).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loader/format/checkpoint.h"

namespace metaload {

// Holds `c` until close_checkpoint; returns its handle (> 0, never reused in the process).
int64_t hold_checkpoint(Checkpoint c);
// The checkpoint held under `handle`; PlanError naming the handle when none is (closed, or never
// opened). A load keeps it alive while it runs even if it is closed meanwhile.
std::shared_ptr<const Checkpoint> held_checkpoint(int64_t handle);
// Lets it go (its descriptors close when the last load using it ends). Closing twice is harmless.
void close_checkpoint(int64_t handle);

// The checkpoint's tensor names, file by file in offset order; `dequantized`: a quantized weight's
// parts stand as one name, its weight's ("P.weight", after the rest: dequant_load.h's layout), as
// a dequantizing load sees them.
std::vector<std::string> checkpoint_names(const Checkpoint& c, bool dequantized);

}  // namespace metaload
