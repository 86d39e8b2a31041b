// Slot memory for CPU loads. Torch-free.
//
// Whoever allocates the slots decides the speed of a fresh load: every page must be faulted in
// and zeroed before the bytes land. One anonymous mapping holds all slots of a load (HostArena),
// laid out in file order so that tensors adjacent in a file are adjacent in memory and share one
// pread. How its pages come in is EngineOptions::slot_pages:
//   - where the kernel reports free pages to a hypervisor (virtio-balloon free page reporting),
//     memory untouched for a couple of seconds is "cold": the host took it back, so every touch
//     faults in the host too, and huge pages are then slower than 4 KiB pages pre-faulted per
//     read with MADV_POPULATE_WRITE;
//   - elsewhere (bare metal, most clouds) memory is always "hot" and transparent huge pages
//     faulted by the reads are the clear choice (torch 1.13's allocator never asks for them).
// kAuto picks by that. The measurements behind this choice are in bench/RESULTS.md ("What bounds
// a fresh load here").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/file_mapping.h"  // FileMapping: the zero-copy CPU path

namespace metaload {

class HostArena {
 public:
  // Maps `bytes` (rounded up to 2 MiB) of anonymous memory and asks for transparent huge pages.
  // Throws std::bad_alloc when the mapping fails.
  static std::shared_ptr<HostArena> create(uint64_t bytes, bool huge_pages = true);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

  // Arenas alive in this process and their bytes: lets tests check that a failed load freed
  // everything.
  static int64_t live_count();
  static int64_t live_bytes();

 private:
  HostArena(unsigned char* base, uint64_t mapped, unsigned char* data, uint64_t size);
  unsigned char* base_;
  uint64_t mapped_;
  unsigned char* data_;
  uint64_t size_;
};

// One slot to place: its size, the alignment it needs, and where its bytes start in which file
// (so that file neighbours become memory neighbours).
struct SlotRequest {
  uint64_t bytes = 0;
  uint64_t align = 64;
  size_t file = 0;
  uint64_t file_offset = 0;
  bool read_direct = false;  // its bytes are copied as they are (may share a read with a neighbour)
};

// Offsets into one arena for every request, and the arena's total size. Each slot is aligned to
// 64 bytes; a slot read directly which follows the previous direct slot in the same file byte for
// byte is placed right after it when that keeps it 64-byte aligned, so both come in one read.
// True when a virtio-balloon device with free page reporting is bound (fresh huge pages are then
// slow to touch, see above). Read once from /sys.
bool free_page_reporting_active();

// kAuto made concrete for this machine.
SlotPages resolve_slot_pages(SlotPages requested);

// MADV_POPULATE_WRITE (Linux 5.14) on the whole pages of [p, p + n): fresh 4 KiB slot pages
// faulted in with one call before they are written, instead of one fault per page. Pages only
// partly in the range fault normally; a kernel without it says EINVAL once, then nothing is tried.
void populate_pages(void* p, uint64_t n);

// Whether fresh CPU slot memory under `opt` is filled by the kernel's page copies
// (page_copy.h) rather than populated and then written: 4 KiB slot pages, opt.page_copy, and
// METALOAD_PAGE_COPY not 0. The copier itself may still be unavailable (PageCopier::open).
bool copies_slot_pages(const EngineOptions& opt);

std::vector<uint64_t> layout_slots(const std::vector<SlotRequest>& requests, uint64_t* total);

}  // namespace metaload
