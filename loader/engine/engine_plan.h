// The plan both streaming engines execute (engine.h has the overview): jobs split into reads
// ("pieces") in (file, offset) order, each delivering into one or more slots. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loader/engine/engine_job.h"

namespace metaload {

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

// A range of a file, [offset, offset + length).
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One read: [offset, offset + length) of a file. `direct`: the bytes land in `direct_dst` as they
// are (the parts are then only bookkeeping). A packed piece (`extents` not empty: the rows of
// exact strided slices, CopyJob::exact) reads each extent on its own, back to back into the
// buffer, and never the holes between them (other ranks' bytes); `offset` is then its first
// extent's and `length` their sum.
struct Piece {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool direct = false;
  unsigned char* direct_dst = nullptr;
  std::vector<PiecePart> parts;
  std::vector<Extent> extents;
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

}  // namespace metaload
