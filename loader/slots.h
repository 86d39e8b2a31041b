// Slot memory for CPU loads. Torch-free.
//
// Whoever allocates the slots decides the speed of a fresh load: the pages must be faulted in and
// zeroed by the kernel before the bytes can land. Measured here (2 cores, a shared Firecracker VM,
// warm page cache, 2.3 GB, 2 reader threads; bench/RESULTS.md): fresh 4 KiB pages (what
// torch.empty / malloc give) load at ~0.6-1 GB/s; one anonymous mapping, 2 MiB aligned, with
// MADV_HUGEPAGE (THP is in "madvise" mode here and torch 1.13's allocator never asks) at
// ~1.3-4.7 GB/s, faulted by the reads themselves; pre-faulting each piece with
// MADV_POPULATE_WRITE just before its read was slower in most runs (0.3-2.4 GB/s), so it is an
// option (EngineOptions::prefault), off by default. Much of the spread is the VM: a guest page
// touched for the first time costs a fault in the host too. So a CPU load allocates all its slots
// in one HostArena with huge pages, laid out in file order so that tensors adjacent in a file are
// adjacent in memory and are read with one pread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
// 64 bytes, except that a slot read directly which follows the previous direct slot in the same
// file byte for byte is placed right after it (if its own alignment allows), so both come in one
// read.
std::vector<uint64_t> layout_slots(const std::vector<SlotRequest>& requests, uint64_t* total);

}  // namespace metaload
