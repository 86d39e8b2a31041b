#include "loader/engine/slots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <new>
#include <numeric>

#include "base/checked.h"

namespace metaload {

namespace {
std::atomic<int64_t> g_arenas{0};
std::atomic<int64_t> g_arena_bytes{0};
constexpr uint64_t kHuge = 2ull << 20;
}  // namespace

std::shared_ptr<HostArena> HostArena::create(uint64_t bytes, bool huge_pages) {
  const uint64_t size = std::max<uint64_t>(bytes, 1);
  const uint64_t rounded = checked_add(size, kHuge - 1, "bytes of a slot arena") / kHuge * kHuge;
  // One extra huge page so the start can be aligned to 2 MiB (THP needs aligned 2 MiB ranges).
  const uint64_t mapped = checked_add(rounded, huge_pages ? kHuge : 0, "bytes of a slot arena");
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  auto* b = static_cast<unsigned char*>(base);
  unsigned char* data = b;
  if (huge_pages) {
    data = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(b) + kHuge - 1) &
                                            ~static_cast<uintptr_t>(kHuge - 1));
    ::madvise(data, rounded, MADV_HUGEPAGE);  // advisory: ignored where THP is off
  }
  return std::shared_ptr<HostArena>(new HostArena(b, mapped, data, size));
}

HostArena::HostArena(unsigned char* base, uint64_t mapped, unsigned char* data, uint64_t size)
    : base_(base), mapped_(mapped), data_(data), size_(size) {
  ++g_arenas;
  g_arena_bytes += static_cast<int64_t>(size);
}

HostArena::~HostArena() {
  ::munmap(base_, mapped_);
  --g_arenas;
  g_arena_bytes -= static_cast<int64_t>(size_);
}

int64_t HostArena::live_count() {
  return g_arenas.load();
}
int64_t HostArena::live_bytes() {
  return g_arena_bytes.load();
}

bool free_page_reporting_active() {
  static const bool active = [] {
    // Feature bit 5 (VIRTIO_BALLOON_F_REPORTING) of any bound balloon device; the features file
    // is one '0'/'1' character per bit.
    std::error_code ec;
    const std::filesystem::path dir("/sys/bus/virtio/drivers/virtio_balloon");
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().filename().string().rfind("virtio", 0) != 0) continue;
      std::string bits;
      std::ifstream(e.path() / "features") >> bits;
      if (bits.size() > 5 && bits[5] == '1') return true;
    }
    return false;
  }();
  return active;
}

SlotPages resolve_slot_pages(SlotPages requested) {
  if (requested != SlotPages::kAuto) return requested;
  return free_page_reporting_active() ? SlotPages::kSmall : SlotPages::kHuge;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
void populate_pages(void* p, uint64_t n) {
  static std::atomic<bool> works{true};
  const uintptr_t page = 4096;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (b <= a || !works.load(std::memory_order_relaxed)) return;
  if (::madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
    works.store(false, std::memory_order_relaxed);  // older kernel: stop trying
  }
}

bool copies_slot_pages(const EngineOptions& opt) {
  const char* env = std::getenv("METALOAD_PAGE_COPY");
  return opt.page_copy && resolve_slot_pages(opt.slot_pages) == SlotPages::kSmall &&
         !(env != nullptr && std::string(env) == "0");
}

std::vector<uint64_t> layout_slots(const std::vector<SlotRequest>& requests, uint64_t* total) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const SlotRequest& x = requests[a];
    const SlotRequest& y = requests[b];
    return x.file != y.file ? x.file < y.file : x.file_offset < y.file_offset;
  });
  std::vector<uint64_t> offsets(requests.size(), 0);
  uint64_t cursor = 0;
  const SlotRequest* prev = nullptr;
  for (size_t i : order) {
    const SlotRequest& r = requests[i];
    const uint64_t align = std::max<uint64_t>(r.align, 1);
    // Every slot starts 64-byte aligned, as torch's own allocator gives: SIMD kernels (oneDNN in
    // torch 2.x) take other code paths on misaligned data and round differently.
    const bool follows = prev != nullptr && prev->read_direct && r.read_direct &&
                         prev->file == r.file && prev->file_offset + prev->bytes == r.file_offset &&
                         cursor % std::max<uint64_t>(align, 64) == 0;
    if (!follows)
      cursor = checked_add<uint64_t>(cursor, 63, "total slot bytes of the load") / 64 * 64;
    offsets[i] = cursor;
    cursor = checked_add(cursor, r.bytes, "total slot bytes of the load");
    prev = &r;
  }
  *total = cursor;
  return offsets;
}

}  // namespace metaload
