// The streaming engines: checkpoint bytes into preallocated destination memory ("slots").
//
// Torch-free. A caller (the planner) describes every destination as a CopyJob -- which bytes of
// which file, how they are laid out (a whole tensor, a dim-0 slice, or a strided dim-1 slice),
// whether they need a dtype conversion, and where they go -- and one engine moves them:
//
//  * run_cpu_engine: N reader threads, large pread()s in file-offset order, straight into the slot
//    when the bytes need no conversion or gathering (neighbouring tensors whose slots are adjacent
//    are coalesced into one read); otherwise through a bounded per-thread staging buffer and the
//    conversion kernels (kernels/convert.h).
//  * run_staged_engine: the CUDA engine. Reader threads fill a bounded ring of pinned buffers;
//    each buffer's bytes go to the device with asynchronous copies on >= 2 streams, conversion runs
//    on the device, and an event per buffer says when it may be refilled. The device is a
//    DeviceOps (engine_device.h): CUDA where a GPU exists, or the simulated twin the tests run.
//
// Both engines share one plan (plan_pieces) and one rule: every byte of every slot is accounted
// for and the files are re-checked before they return; any failure (I/O error, short file, file
// changed, cancellation, an exception in any thread, a device error) throws after every thread has
// stopped and every staging buffer is freed. The slots themselves belong to the caller, who frees
// them on failure (slots.h, swap.h).
//
// This header is the umbrella: the engines' parts each have their own header, included here.
//   engine_job.h      CopyJob and the engines' errors
//   engine_options.h  EngineOptions, progress, hooks, slot pages
//   engine_report.h   LoadReport and its JSON
//   engine_plan.h     the plan both engines execute (plan_pieces)
#pragma once

#include <string>
#include <vector>

#include "loader/engine/engine_job.h"
#include "loader/engine/engine_options.h"
#include "loader/engine/engine_plan.h"
#include "loader/engine/engine_report.h"

namespace metaload {

// --- engines ------------------------------------------------------------------------------------

class DeviceOps;  // engine_device.h

LoadReport run_cpu_engine(const std::vector<std::string>& files, const std::vector<CopyJob>& jobs,
                          const EngineOptions& options = {});

LoadReport run_staged_engine(const std::vector<std::string>& files,
                             const std::vector<CopyJob>& jobs, DeviceOps& device,
                             const EngineOptions& options = {});

}  // namespace metaload
