// Fresh slot pages filled straight from the page cache. A read into fresh anonymous memory first
// gets each page zeroed (a fault, or MADV_POPULATE_WRITE) and then copies the file's bytes over
// it: two passes over the memory. userfaultfd's UFFDIO_COPY has the kernel allocate the page and
// copy the bytes into it in one (measured on 2.47 GB in the page cache, 2 threads, 4 KiB pages:
// bench/RESULTS.md). Torch-free; Linux only.
//
// The range must be memory nobody else touches while the copier lives (a fresh slot arena): a
// page of it that is still missing cannot be written by plain stores until the copier is gone
// (the kernel refuses: UFFD_USER_MODE_ONLY, UFFD_FEATURE_SIGBUS). The copier writes every page at
// most once through the kernel; a page two fills share goes in from a zeroed bounce page holding
// only the first fill's bytes, and the later fill writes its bytes over the then present page, so
// bytes no fill covers stay zero (shard padding relies on it).
#pragma once

#include <cstdint>
#include <memory>

#include "base/unique_fd.h"

namespace metaload {

class PageCopier {
 public:
  // A copier for [base, base + bytes) (page-aligned base), or nullptr where userfaultfd is
  // unavailable (old kernel, seccomp, no permission) or the kernel cannot copy from a source
  // that is not page-aligned (a probe at open): the caller then reads as usual.
  static std::unique_ptr<PageCopier> open(void* base, uint64_t bytes);
  ~PageCopier();  // unregisters the range: its missing pages fault in as zeros again
  PageCopier(const PageCopier&) = delete;
  PageCopier& operator=(const PageCopier&) = delete;

  // Where a fill's bytes come from: `offset` of the file open as `fd`, also mapped read-only
  // (shared) at `map` (the whole file from offset 0); or, with fd -1, memory at map + offset
  // (a buffer the caller computed: dequantized rows).
  struct Source {
    int fd = -1;
    const unsigned char* map = nullptr;
    uint64_t offset = 0;
  };

  // Fills dst[0, n) (inside the range) with the source's n bytes: whole pages copied by the
  // kernel from the mapping, shared pages through pread. Thread-safe across disjoint byte
  // ranges. Returns false when the file could not be read (it shrank under its mapping): the
  // caller fails the load.
  bool fill(unsigned char* dst, Source src, uint64_t n);

  // Pages the kernel filled: by this copier, and by every copier of the process (tests).
  uint64_t pages_copied() const;
  static uint64_t pages_copied_total();

 private:
  PageCopier(UniqueFd fd, void* base, uint64_t bytes);
  // UFFDIO_COPY of whole pages [dst, dst + n) from src; returns bytes copied before a page that
  // was already present (EEXIST) or -1 when the source faulted without progress.
  int64_t copy_pages(unsigned char* dst, const unsigned char* src, uint64_t n);
  bool fill_partial_page(unsigned char* page, unsigned char* dst, const Source& src, uint64_t n);

  UniqueFd fd_;
  void* base_;
  uint64_t bytes_;
  struct Counter;
  std::unique_ptr<Counter> copied_;
};

}  // namespace metaload
