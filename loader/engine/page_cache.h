// How much of a zero-copy load's bytes the page cache holds, told from a sample, and the missing
// pages read ahead in the background. Torch-free. Used by map_slots (loader/load/slots_torch.cc)
// to let a warm load return at once (EngineOptions::map_populate, kAuto).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loader/engine/file_mapping.h"

namespace metaload {

// Bytes [offset, offset + length) of a mapped file; `at`: where byte `offset` lies when a view
// maps them (MappedView; whoever holds the range keeps it alive), nullptr: in the file's mapping.
struct MappedRange {
  std::shared_ptr<FileMapping> map;
  uint64_t offset = 0, length = 0;
  unsigned char* at = nullptr;
};

// `ranges` cut into pieces of at most `piece` bytes, in order.
std::vector<MappedRange> pieces_of(const std::vector<MappedRange>& ranges, uint64_t piece);

// Pages sampled and how many of them the page cache holds.
struct CacheSample {
  uint64_t pages = 0, cached = 0;
  bool known = false;  // false: some file's cache could not be asked (no cachestat, detached)
};

// At most kSampleWindows windows of kSampleWindowBytes each (page-aligned), spread evenly over
// the ranges' bytes taken in order: cachestat per window, a few hundred microseconds for any size
// (the whole range's count walks every page: 16 ms for 2.5 GB of 4 KiB pages here).
inline constexpr int kSampleWindows = 256;
inline constexpr uint64_t kSampleWindowBytes = 64ull << 10;
CacheSample sample_page_cache(const std::vector<MappedRange>& ranges);

// Reads ahead the pages of `ranges` the page cache lacks (FileMapping::prefetch_uncached) on a
// thread of its own, and returns at once. The thread holds the mappings weakly: one freed before
// its turn is skipped. Never throws; returns false when no thread could be started.
bool prefetch_in_background(const std::vector<MappedRange>& ranges);

// Threads started by prefetch_in_background that have not finished (tests).
int64_t background_prefetches();

}  // namespace metaload
