// How a streaming engine runs (engine.h has the overview): EngineOptions, its progress callback
// and test hooks, and how slot memory gets its pages. Torch-free.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace metaload {

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

// When a zero-copy load (EngineOptions::map_files) faults its mapped pages in.
//  kAuto: where the mapping holds a read lease (no writer can change the file unseen, see
//    file_mapping.h), only the pages not in the page cache, in parallel (a cold load reads now,
//    and its read errors surface as ReadError now); cached pages map lazily at first touch, as
//    safetensors' and torch.load(mmap=True)'s do. When a sample of the page cache
//    (page_cache.h) finds at least 95% of the pages cached, nothing waits: the load returns at
//    once and a background thread reads the few missing pages ahead (a read error among those is
//    then a SIGBUS naming the file, at first touch). Without a lease, every page (kAlways).
//  kAlways: every page, in parallel, before the load returns.
//  kLazy: none: each page at first touch (a read error is then a SIGBUS naming the file).
enum class MapPopulate { kAuto, kAlways, kLazy };

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
  // read beats many small ones), except next to or inside an exact job (CopyJob::exact: a TP
  // slice); strided slices whose row gaps are larger are read row by row.
  uint64_t merge_gap = 64ull << 10;
  // CPU engine: rows of a strided slice (no conversion) at least this long are read one by one
  // straight into the slot; shorter ones are gathered through staging (bench/load measures both).
  uint64_t direct_row_min = 256ull << 10;
  // Staged engine: pinned buffers in the ring (staging_bytes / ring_buffers bytes each), and copy
  // streams (at least 2 so copies overlap, and at most ring_buffers: buffer b copies on stream
  // b % streams); PlanError otherwise.
  int ring_buffers = 4;
  int streams = 2;
  // How CPU slot memory gets its pages (slots.h says how kAuto chooses).
  SlotPages slot_pages = SlotPages::kAuto;
  // CPU: the fresh slot arena (slots.h HostArena: page-aligned, untouched, nobody else's) every
  // job writes into, or nullptr. With 4 KiB slot pages, its pages are then filled from the page
  // cache by the kernel (page_copy.h: no zeroing pass) where every read lands in it as it is;
  // page_copy false (or METALOAD_PAGE_COPY=0) reads as usual.
  void* fresh_slots = nullptr;
  uint64_t fresh_slot_bytes = 0;
  bool page_copy = true;
  // CPU, zero-copy: tensors stored as they are loaded (no dtype conversion, whole or a dim-0
  // slice) point into a copy-on-write mapping of the checkpoint file instead of being read into
  // fresh memory (FileMapping in slots.h). The rest goes through the engine as usual.
  bool map_files = false;
  // With map_files: assembled slots (fused experts) become views of the file's pages too
  // (FileMapping::map_view). Their data then sits at the file's alignment, and CPU matmul kernels
  // sum in an order that follows their operands' alignment: outputs may differ in the last bit
  // from those of a copy in fresh (64-byte aligned) memory, as from_pretrained makes. False
  // copies them.
  bool map_views = true;
  MapPopulate map_populate = MapPopulate::kAuto;
  // Called on the calling thread, about 10 times a second and once at the end.
  std::function<void(const Progress&)> progress;
  ProgressBar bar = ProgressBar::kAuto;  // kAuto: a bar on stderr when it is a terminal
  // Set it (from any thread) to stop the load.
  const std::atomic<bool>* cancel = nullptr;
  EngineHooks hooks;
  // A descriptor already open on `path` (the one its header was read through:
  // SafetensorsHeader::fd), or -1. The engine and the file mappings read through a duplicate of
  // it instead of opening the path again: one open per file per load, and the bytes come from
  // the very file whose header was checked even if the path was replaced meanwhile.
  std::function<int(const std::string& path)> open_descriptor;
};

}  // namespace metaload
