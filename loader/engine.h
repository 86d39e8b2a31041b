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
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/convert.h"

namespace metaload {

// Base of the engines' errors.
METALOAD_DEFINE_ERROR(LoadError, Error);
// A read failed, a file is shorter than its tensors need, or a file changed during the load.
METALOAD_DEFINE_ERROR(ReadError, LoadError);
// The load was cancelled through EngineOptions::cancel.
METALOAD_DEFINE_ERROR(LoadCancelled, LoadError);
// The CUDA runtime failed, or there is no CUDA device / no CUDA in this build.
METALOAD_DEFINE_ERROR(DeviceError, LoadError);
// A slot was not completely filled, or a check before the swap failed.
METALOAD_DEFINE_ERROR(VerifyError, LoadError);
// A job or an option is malformed (a bug in the caller, named precisely).
METALOAD_DEFINE_ERROR(PlanError, LoadError);

// One destination: `rows` runs of `row_bytes` bytes, `row_stride` bytes apart in file `file`,
// starting at absolute offset `offset`. A whole tensor or a dim-0 slice is one row (or rows with
// row_stride == row_bytes); a dim-1 slice has row_stride > row_bytes. Row r lands at
// dst + r * dst_pitch(): compact by default, wider when several jobs interleave into one slot (a
// fused q|k|v tensor's per-rank sections).
struct CopyJob {
  std::string name;  // for errors and progress
  size_t file = 0;   // index into the files given to the engine
  uint64_t offset = 0;
  uint64_t rows = 1;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;  // 0 means row_bytes (contiguous)
  // Source element size in bytes: reads split only at multiples of it. For a conversion it must
  // be float_format_size(from).
  uint32_t unit = 1;
  bool convert = false;  // false: the bytes are copied as they are
  FloatFormat from = FloatFormat::kF32;
  FloatFormat to = FloatFormat::kF32;
  void* dst = nullptr;          // host memory (CPU engine) or device memory (staged engine)
  uint64_t dst_row_stride = 0;  // bytes between destination rows; 0 = dst_row_bytes()
  // Read only this job's bytes: no read runs through a hole before or after it (merge_gap does
  // not apply). Set for a TP rank's contiguous slice, whose neighbouring holes are other ranks'
  // rows, so a rank reads only its own bytes on the staged (conversion, CUDA) path too.
  bool exact = false;

  uint64_t stride() const { return row_stride == 0 ? row_bytes : row_stride; }
  uint64_t dst_row_bytes() const {
    return convert ? row_bytes / float_format_size(from) * float_format_size(to) : row_bytes;
  }
  uint64_t dst_pitch() const { return dst_row_stride == 0 ? dst_row_bytes() : dst_row_stride; }
  // Bytes written into the slot.
  uint64_t dst_bytes() const { return rows * dst_row_bytes(); }
};

// A zero-copy CPU load (EngineOptions::map_files) reports the mapped bytes first, as their pages
// are populated, then those plus the engine's (bytes_done never goes back; bytes_total grows once).
struct Progress {
  uint64_t bytes_done = 0;   // file bytes read (or mapped and populated) so far
  uint64_t bytes_total = 0;  // file bytes the load will read (or map)
  double seconds = 0;
};

// Fault injection and test hooks; all optional.
struct EngineHooks {
  // Replaces pread(2): returns the bytes read, 0 at end of file, or -1 with errno set.
  std::function<ssize_t(int fd, void* buf, size_t n, uint64_t offset)> pread;
  // Called on the reader thread after each piece is read (before its bytes are delivered);
  // an exception here is an exception in a worker thread.
  std::function<void(size_t piece)> after_read;
  // Called once after every piece is delivered, before the final checks; throwing here is a
  // mismatch found late.
  std::function<void()> before_verify;
};

enum class ProgressBar { kAuto, kOn, kOff };

// How fresh CPU slot memory is faulted in:
//  kHuge: transparent huge pages, faulted by the reads themselves -- fastest where touching fresh
//         memory is cheap (bare metal, most VMs);
//  kSmall: 4 KiB pages, each read's destination pre-faulted with MADV_POPULATE_WRITE -- fastest in
//         a VM that hands freed memory back to its host (virtio-balloon free page reporting), where
//         fresh huge pages are the slowest of all to touch;
//  kAuto: kSmall when this kernel reports free pages to a hypervisor, else kHuge.
enum class SlotPages { kAuto, kHuge, kSmall };

// The most reader threads a load may ask for (EngineOptions::threads, LoadOptions::threads).
inline constexpr int kMaxLoaderThreads = 1024;

// `threads` as a loader thread count: 0 (one per core) or 1 to kMaxLoaderThreads; PlanError
// naming `argument` and that range otherwise.
int checked_loader_threads(int64_t threads, const char* argument = "threads");

struct EngineOptions {
  int threads = 0;                       // reader threads; 0 = the machine's cores
  uint64_t chunk_bytes = 16ull << 20;    // largest single read
  uint64_t staging_bytes = 64ull << 20;  // bound on all staging memory (CPU buffers or pinned ring)
  // Holes between needed byte ranges up to this size are read through instead of skipped (one
  // read beats many small ones), except next to an exact job (CopyJob::exact); strided slices
  // whose row gaps are larger are read row by row.
  uint64_t merge_gap = 64ull << 10;
  // CPU engine: rows of a strided slice (no conversion) at least this long are read one by one
  // straight into the slot; shorter ones are gathered through staging (bench/load measures both).
  uint64_t direct_row_min = 256ull << 10;
  // Staged engine: pinned buffers in the ring (staging_bytes / ring_buffers bytes each), and copy
  // streams (at least 2 so copies overlap, and at most ring_buffers: buffer b copies on stream
  // b % streams); PlanError otherwise.
  int ring_buffers = 4;
  int streams = 2;
  // How CPU slot memory gets its pages (slots.h has the measurements).
  SlotPages slot_pages = SlotPages::kAuto;
  // CPU, zero-copy: tensors stored as they are loaded (no dtype conversion, whole or a dim-0
  // slice) point into a copy-on-write mapping of the checkpoint file instead of being read into
  // fresh memory (FileMapping in slots.h). The rest goes through the engine as usual.
  bool map_files = false;
  // Called on the calling thread, about 10 times a second and once at the end.
  std::function<void(const Progress&)> progress;
  ProgressBar bar = ProgressBar::kAuto;  // kAuto: a bar on stderr when it is a terminal
  // Set it (from any thread) to stop the load.
  const std::atomic<bool>* cancel = nullptr;
  EngineHooks hooks;
};

struct FileReport {
  std::string path;
  uint64_t bytes = 0;  // bytes read from this file
  double seconds = 0;  // from its first read's start to its last read's end
};

struct LoadReport {
  uint64_t bytes = 0;       // file bytes read (holes read through included)
  uint64_t slot_bytes = 0;  // bytes written into slots
  double seconds = 0;
  uint64_t peak_staging_bytes = 0;         // host staging (CPU buffers or pinned ring) at its peak
  uint64_t peak_device_staging_bytes = 0;  // staged engine: device scratch for conversions
  uint64_t reads = 0;                      // read calls issued
  uint64_t direct_bytes = 0;               // bytes read straight into slots
  uint64_t mapped_bytes = 0;               // bytes served from file mappings (map_files)
  int threads = 0;
  std::string engine;  // "cpu", or "staged:<device>"
  std::vector<FileReport> files;
};

// The report as JSON (the Python package and the CLI read it): every field above, files as a list.
std::string load_report_json(const LoadReport& r);

// --- the plan both engines execute -------------------------------------------------------------

// One delivery out of a piece: rows x row_bytes at `src` (bytes from the piece start, rows
// src_pitch apart) to dst (rows dst_pitch apart), converted or copied.
struct PiecePart {
  size_t job = 0;
  uint64_t src = 0;
  uint64_t rows = 1;
  uint64_t row_bytes = 0;
  uint64_t src_pitch = 0;
  unsigned char* dst = nullptr;
  uint64_t dst_pitch = 0;
  uint64_t dst_bytes = 0;
};

// One read: [offset, offset + length) of a file. `direct`: the bytes land in `direct_dst` as they
// are (the parts are then only bookkeeping).
struct Piece {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool direct = false;
  unsigned char* direct_dst = nullptr;
  std::vector<PiecePart> parts;
};

struct PlanLimits {
  uint64_t direct_bytes = 0;  // largest direct read; 0 = no direct reads (staged engine)
  uint64_t staged_bytes = 0;  // largest read through staging
  uint64_t merge_gap = 0;
  // Rows of a strided copy (no conversion) at least this long are read one by one straight into
  // the slot instead of gathered through staging; 0 = never (staged engine).
  uint64_t direct_row_min = 0;
};

struct PlanFile {
  std::string path;
  uint64_t size = 0;
};

// Splits jobs into reads in (file, offset) order. Validates every job (PlanError names the job);
// a job reaching past its file's end is a ReadError naming the file, the tensor and the bytes.
std::vector<Piece> plan_pieces(const std::vector<CopyJob>& jobs, const std::vector<PlanFile>& files,
                               const PlanLimits& limits);

// --- engines ------------------------------------------------------------------------------------

class DeviceOps;  // engine_device.h

LoadReport run_cpu_engine(const std::vector<std::string>& files, const std::vector<CopyJob>& jobs,
                          const EngineOptions& options = {});

LoadReport run_staged_engine(const std::vector<std::string>& files,
                             const std::vector<CopyJob>& jobs, DeviceOps& device,
                             const EngineOptions& options = {});

}  // namespace metaload
