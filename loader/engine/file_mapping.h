// Checkpoint files mapped for zero-copy CPU loads, and the contract those mappings keep.
// Torch-free.
//
// A zero-copy load (EngineOptions::map_files) leaves tensors pointing into a copy-on-write
// (MAP_PRIVATE) mapping of the checkpoint file, or into a view of it (map_view: a fused target
// assembled from several tensors, the file's pages mapped again at fresh addresses, side by
// side). Writing a weight copies its page; the file never changes. What others may do to the file
// while tensors map it (README, "Reliability"):
//  - delete it, or replace it by rename (how the Hugging Face cache and most tools write): always
//    fine, the mapping keeps the old inode;
//  - truncate it or write it in place: never meant to happen. Where Linux grants a read lease
//    (fcntl F_SETLEASE: the file's owner or CAP_LEASE, a local filesystem, no writer has it open),
//    the writer's open() or truncate() waits while this process copies the mapped bytes into
//    private memory at the same addresses (detach); the tensors then keep the weights they
//    loaded and the writer proceeds, milliseconds later. Without a lease, the change is found at
//    the next check (check(): size and mtime of the mapped inode), which throws FileChangedError
//    naming the file: after every zero-copy load, before and after every TransformersModel
//    forward and generate, and wherever a caller asks (check_mapped in slots_torch.h). Between
//    checks, weights change silently, and a read past a truncated end raises SIGBUS: the process
//    then ends as it would, after one line on stderr naming the file and the offset.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loader/engine/engine.h"

namespace metaload {

// How a mapping is kept safe from changes to its file.
enum class MappingGuard {
  kLease,     // a read lease: a writer or truncate waits until the bytes are detached
  kChecked,   // no lease could be had: check() compares size and mtime
  kDetached,  // the bytes live in private memory now; the file no longer matters
};

// "lease", "checked", "detached".
const char* mapping_guard_name(MappingGuard g);

class MappedView;

// File bytes [file_offset, file_offset + length) placed at byte `offset` of a view.
struct ViewPiece {
  uint64_t offset = 0;
  uint64_t file_offset = 0;
  uint64_t length = 0;
};

class FileMapping : public std::enable_shared_from_this<FileMapping> {
 public:
  // Maps `path` whole. Throws ReadError naming the file when it cannot be opened or mapped, or
  // when its size is no longer `expected_size` (it changed since its header was read). Takes a
  // read lease where it can (see above); the file stays open while mapped unless this process
  // already holds a quarter of its open-file limit in mapped files (then it is checked by path).
  // held_fd: a descriptor already open on `path` (EngineOptions::open_descriptor), mapped through
  // a duplicate of it instead of opening the path again; -1: open the path.
  static std::shared_ptr<FileMapping> open(const std::string& path, uint64_t expected_size,
                                           int held_fd = -1);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  MappingGuard guard() const { return guard_.load(); }

  // Faults [offset, offset + length) in now, so that a read error surfaces here as a ReadError
  // rather than as SIGBUS later (MADV_POPULATE_READ; older kernels: one read per page).
  // `at`: where byte `offset` lies when a view maps the bytes (MappedView), rather than here.
  void populate(uint64_t offset, uint64_t length, unsigned char* at = nullptr) const;
  // populate() for the pages of [offset, offset + length) that are not in the page cache (mincore;
  // where it cannot tell, all of them). Returns the bytes it faulted in. The reads of all missing
  // runs start together (readahead), so scattered pages cost one wait, not one each.
  uint64_t populate_uncached(uint64_t offset, uint64_t length, unsigned char* at = nullptr) const;
  // Starts reading the pages of [offset, offset + length) that the page cache lacks (readahead)
  // and returns without waiting for them or mapping them. Returns the bytes asked for. Never
  // throws: a page that cannot be read fails when it is touched (SIGBUS, named; see above).
  uint64_t prefetch_uncached(uint64_t offset, uint64_t length) const;
  // How many pages of the file's byte windows {offset, length} the page cache holds, summed
  // (cachestat, one call each); -1 where the kernel cannot say (before Linux 6.5, detached).
  int64_t cached_pages(const std::vector<std::pair<uint64_t, uint64_t>>& windows) const;

  // Throws FileChangedError naming the file when it was truncated or written in place since it
  // was mapped (its size or mtime differ). A file deleted or replaced by rename is fine, and so is
  // anything once the mapping is detached.
  void check() const;

  // Copies the mapped bytes into private memory at the same addresses (the tensors keep their
  // pointers and their bytes) and lets go of the file and its lease. Idempotent. Runs on its own
  // when a lease breaks; a caller may detach any time to free the file.
  void detach();

  // A view of `size` bytes assembled from `pieces` of this file without copying them: the pages
  // wholly inside a piece are this file's, mapped copy-on-write at fresh addresses; the few
  // pages where two pieces meet (or the view begins or ends) are private, filled by a read. The
  // pieces must cover [0, size) exactly (else a PlanError naming the file). The view keeps this
  // mapping alive, and this mapping's contract holds for it: detach() copies its bytes in place
  // too, containing() finds it, a SIGBUS in it names this file and the file's byte. nullptr
  // (copy instead) where a view cannot be had: the pieces' offsets differ from their file
  // offsets by different amounts modulo the page size (so no placement lines up every piece's
  // pages with the file's), this mapping holds no descriptor or is detached, the views would
  // take more than their share of the process's memory maps (vm.max_map_count), or mmap fails.
  std::shared_ptr<MappedView> map_view(uint64_t size, std::vector<ViewPiece> pieces);

  // The live mapping whose bytes (or whose view's) hold `p`, or nullptr.
  static std::shared_ptr<FileMapping> containing(const void* p);
  static int64_t live_count();
  // Mappings detached since the process started (tests).
  static int64_t detached_count();

  struct Registry;  // file_mapping.cc

 private:
  FileMapping(std::string path, unsigned char* data, uint64_t size, int fd, const struct stat& st);
  // Whether the page cache holds every page of file bytes [start, end) (cachestat; false where
  // the kernel cannot say).
  bool all_cached(uint64_t start, uint64_t end, uint64_t n_pages) const;
  // The page-aligned runs of [offset, offset + length) the page cache lacks (all of it where the
  // kernel cannot say).
  std::vector<std::pair<uint64_t, uint64_t>> uncached_runs(uint64_t offset, uint64_t length) const;
  // A duplicate of the file's descriptor for cachestat (the caller closes it), or -1: no fd held,
  // or no cachestat in this kernel.
  int dup_fd() const;
  void detach_locked();  // the registry's mutex held
  // map_view's steps: the pieces' pages into the view's region (false where an mmap fails), and
  // the view made known (the registry's mutex held).
  bool fill_view(MappedView& v, const std::vector<ViewPiece>& pieces, int fd) const;
  std::shared_ptr<MappedView> register_view(std::shared_ptr<MappedView> v);
  friend class MappedView;
  std::string path_;
  unsigned char* data_;
  uint64_t size_;
  int fd_;  // -1 when not held (over the open-file budget, or detached)
  dev_t dev_;
  ino_t ino_;
  int64_t mtime_sec_, mtime_nsec_;
  std::atomic<MappingGuard> guard_{MappingGuard::kChecked};
  int signal_slot_ = -1;            // its entry in the SIGBUS handler's table, or -1
  std::vector<MappedView*> views_;  // live views of this file (the registry's mutex guards it)
};

// Fresh addresses holding pieces of one file side by side (FileMapping::map_view). Unmapped when
// the last owner lets go (a tensor's deleter holds it).
class MappedView {
 public:
  ~MappedView();
  MappedView(const MappedView&) = delete;
  MappedView& operator=(const MappedView&) = delete;

  unsigned char* data() const { return data_; }  // byte 0 of the view
  uint64_t size() const { return size_; }
  const std::shared_ptr<FileMapping>& mapping() const { return map_; }

 private:
  friend class FileMapping;
  MappedView() = default;
  // Copies the region into private memory at the same addresses; false where it could not.
  bool detach_locked();
  std::shared_ptr<FileMapping> map_;
  unsigned char* region_ = nullptr;  // page-aligned; data_ lies in its first page
  uint64_t region_bytes_ = 0;
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  int64_t maps_ = 0;               // memory maps it is counted for
  bool detached_ = false;          // the region holds private copies (the registry's mutex)
  std::vector<ViewPiece> runs_;    // file-mapped runs: offsets in the region, not in the view
  std::vector<int> signal_slots_;  // their entries in the SIGBUS handler's table
};

}  // namespace metaload
