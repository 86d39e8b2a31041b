#include "loader/engine/page_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <utility>

namespace metaload {

namespace {

std::atomic<int64_t> g_running{0};

}  // namespace

std::vector<MappedRange> pieces_of(const std::vector<MappedRange>& ranges, uint64_t piece) {
  std::vector<MappedRange> out;
  for (const MappedRange& r : ranges)
    for (uint64_t o = 0; o < r.length; o += piece)
      out.push_back(
          {r.map, r.offset + o, std::min(piece, r.length - o), r.at ? r.at + o : nullptr});
  return out;
}

CacheSample sample_page_cache(const std::vector<MappedRange>& ranges) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t total = 0;
  for (const MappedRange& r : ranges) total += r.length;
  CacheSample out;
  if (total == 0) {
    out.known = true;
    return out;
  }
  const uint64_t n = std::clamp<uint64_t>(total / kSampleWindowBytes, 1, kSampleWindows);
  // The windows, by file: the w-th starts at byte w * total / n of the ranges taken in order.
  std::map<FileMapping*, std::vector<std::pair<uint64_t, uint64_t>>> windows;
  size_t r = 0;
  uint64_t before = 0;  // bytes of ranges [0, r)
  for (uint64_t w = 0; w < n; ++w) {
    const uint64_t at = static_cast<uint64_t>(static_cast<long double>(w) * total / n);
    while (before + ranges[r].length <= at) before += ranges[r++].length;
    const MappedRange& m = ranges[r];
    const uint64_t begin = (m.offset + (at - before)) / page * page;
    const uint64_t end = std::min({begin + kSampleWindowBytes, m.offset + m.length, m.map->size()});
    if (end <= begin) continue;
    windows[m.map.get()].emplace_back(begin, end - begin);
    out.pages += (end - begin + page - 1) / page;
  }
  for (const auto& [map, ws] : windows) {
    const int64_t cached = map->cached_pages(ws);
    if (cached < 0) return CacheSample{};
    out.cached += static_cast<uint64_t>(cached);
  }
  out.cached = std::min(out.cached, out.pages);
  out.known = true;
  return out;
}

bool prefetch_in_background(const std::vector<MappedRange>& ranges) {
  struct Weak {
    std::weak_ptr<FileMapping> map;
    uint64_t offset, length;
  };
  constexpr uint64_t kPiece = 64ull << 20;  // a freed mapping is noticed within one piece
  std::vector<Weak> pieces;
  for (const MappedRange& p : pieces_of(ranges, kPiece))
    pieces.push_back({p.map, p.offset, p.length});
  ++g_running;
  try {
    std::thread([pieces = std::move(pieces)] {
      for (const Weak& p : pieces)
        if (std::shared_ptr<FileMapping> m = p.map.lock()) m->prefetch_uncached(p.offset, p.length);
      --g_running;
    }).detach();
  } catch (...) {  // no thread: the pages arrive at first touch, as they would without a head start
    --g_running;
    return false;
  }
  return true;
}

int64_t background_prefetches() {
  return g_running.load();
}

}  // namespace metaload
