// Fresh slot pages filled from the page cache (loader/engine/page_copy.h): every byte a fill
// covers equals the file's, every other byte stays zero, fills sharing a page (from two threads)
// both land, a file that shrank fails the fill instead of crashing, and the CPU engine takes
// this path for a fresh arena of 4 KiB pages with the same bytes as its reads.
#include "loader/engine/page_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "engine_test_util.h"
#include "loader/engine/slots.h"

namespace metaload {
namespace {

using testing_util::random_bytes;
using testing_util::TempDir;

constexpr uint64_t kArena = 96 * 4096;

struct Range {
  uint64_t dst, file, n;
};

// An anonymous page-aligned arena, never touched before the copier registers it.
struct Arena {
  unsigned char* p = static_cast<unsigned char*>(
      ::mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ~Arena() { ::munmap(p, kArena); }
};

struct MappedFile {
  int fd;
  uint64_t size;
  const unsigned char* map;
  explicit MappedFile(const std::string& path) : fd(::open(path.c_str(), O_RDONLY)) {
    size = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
    map = static_cast<const unsigned char*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
  }
  ~MappedFile() {
    ::munmap(const_cast<unsigned char*>(map), size);
    ::close(fd);
  }
};

TEST(PageCopy, FillsRangesAtAnyAlignmentAndLeavesEveryOtherByteZero) {
  TempDir dir;
  const std::vector<unsigned char> bytes = random_bytes(300000, 7);
  MappedFile file(dir.file("w.bin", bytes));
  Arena arena;
  auto copier = PageCopier::open(arena.p, kArena);
  if (!copier) GTEST_SKIP() << "userfaultfd unavailable here: loads read as before";
  // Mid-page starts, a neighbour sharing a page (and contiguous in the file), a page-aligned
  // destination from an odd file offset, a few bytes inside one page, a long run; gaps between.
  const std::vector<Range> ranges{{100, 7, 5000}, {5100, 5007, 20000},     {40960, 64001, 12288},
                                  {60000, 1, 10}, {77824, 100000, 180000}, {258000, 299000, 1000}};
  std::vector<bool> ok(ranges.size());
  auto run = [&](size_t first) {
    for (size_t i = first; i < ranges.size(); i += 2) {
      const Range& r = ranges[i];
      ok[i] = copier->fill(arena.p + r.dst, {file.fd, file.map, r.file}, r.n);
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_GT(copier->pages_copied(), 40u);
  copier.reset();  // unregistered: untouched pages now read as zeros
  std::vector<unsigned char> want(kArena, 0);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_TRUE(ok[i]) << "range " << i;
    std::memcpy(want.data() + ranges[i].dst, bytes.data() + ranges[i].file, ranges[i].n);
  }
  for (uint64_t k = 0; k < kArena; ++k) {
    ASSERT_EQ(arena.p[k], want[k]) << "byte " << k;
  }
}

TEST(PageCopy, FillsFromMemoryToo) {
  // Dequantized rows: a buffer of the caller's (fd -1), ranges sharing pages from two threads.
  const std::vector<unsigned char> bytes = random_bytes(200000, 5);
  Arena arena;
  auto copier = PageCopier::open(arena.p, kArena);
  if (!copier) GTEST_SKIP() << "userfaultfd unavailable here: loads read as before";
  const std::vector<Range> ranges{{10, 0, 70000}, {70010, 70000, 65000}, {200000, 1, 4096}};
  std::vector<bool> ok(ranges.size());
  auto run = [&](size_t first) {
    for (size_t i = first; i < ranges.size(); i += 2) {
      const Range& r = ranges[i];
      ok[i] = copier->fill(arena.p + r.dst, {-1, bytes.data(), r.file}, r.n);
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  copier.reset();
  std::vector<unsigned char> want(kArena, 0);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_TRUE(ok[i]) << "range " << i;
    std::memcpy(want.data() + ranges[i].dst, bytes.data() + ranges[i].file, ranges[i].n);
  }
  EXPECT_EQ(std::vector<unsigned char>(arena.p, arena.p + kArena), want);
}

TEST(PageCopy, AFileThatShrankFailsTheFillWithoutACrash) {
  TempDir dir;
  const std::string path = dir.file("w.bin", random_bytes(64 * 1024, 3));
  MappedFile file(path);
  Arena arena;
  auto copier = PageCopier::open(arena.p, kArena);
  if (!copier) GTEST_SKIP() << "userfaultfd unavailable here: loads read as before";
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  EXPECT_FALSE(copier->fill(arena.p + 8192, {file.fd, file.map, 8192}, 32768));  // whole pages
  EXPECT_FALSE(copier->fill(arena.p + 100, {file.fd, file.map, 5000}, 100));     // a shared page
  EXPECT_TRUE(copier->fill(arena.p + 50000, {file.fd, file.map, 10}, 100));      // still there
}

TEST(PageCopy, TheEngineFillsAFreshArenaOfSmallPagesWithTheBytesItWouldRead) {
  TempDir dir;
  const std::vector<unsigned char> bytes = random_bytes(5 << 20, 11);
  const std::string path = dir.file("w.bin", bytes);
  for (bool page_copy : {true, false}) {
    auto arena = HostArena::create(5 << 20, /*huge_pages=*/false);
    std::vector<CopyJob> jobs;
    // Three tensors: two neighbours in the file and the arena, one elsewhere at an odd offset.
    for (const Range& r : std::vector<Range>{
             {0, 8, 1 << 20}, {1 << 20, 8 + (1 << 20), 1000000}, {3 << 20, 3333333, 999999}}) {
      CopyJob j = testing_util::whole("t" + std::to_string(jobs.size()), 0, r.file, r.n, 1);
      j.dst = arena->data() + r.dst;
      jobs.push_back(j);
    }
    EngineOptions opt;
    opt.threads = 2;
    opt.chunk_bytes = 256 << 10;
    opt.bar = ProgressBar::kOff;
    opt.slot_pages = SlotPages::kSmall;
    opt.fresh_slots = arena->data();
    opt.fresh_slot_bytes = arena->size();
    opt.page_copy = page_copy;
    const uint64_t before = PageCopier::pages_copied_total();
    const LoadReport r = run_cpu_engine({path}, jobs, opt);
    const uint64_t copied = PageCopier::pages_copied_total() - before;
    if (page_copy && copied == 0) GTEST_SKIP() << "userfaultfd unavailable here";
    EXPECT_EQ(copied > 0, page_copy);
    EXPECT_EQ(r.slot_bytes, (1u << 20) + 1000000u + 999999u);
    for (const CopyJob& j : jobs) {
      EXPECT_EQ(std::memcmp(j.dst, bytes.data() + j.offset, j.row_bytes), 0) << j.name;
    }
    // The bytes between slots are zero (slot padding relies on fresh memory being zero).
    const unsigned char* gap = arena->data() + (1 << 20) + 1000000;
    EXPECT_EQ(std::count(gap, gap + 4096, 0), 4096);
  }
}

}  // namespace
}  // namespace metaload
