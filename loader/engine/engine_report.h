// What a streaming engine reports after a load (engine.h has the overview). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace metaload {

struct FileReport {
  std::string path;
  uint64_t bytes = 0;  // bytes read from this file
  double seconds = 0;  // from its first read's start to its last read's end
};

struct LoadReport {
  uint64_t bytes = 0;       // file bytes read (holes read through included)
  uint64_t slot_bytes = 0;  // bytes written into slots
  double seconds = 0;
  uint64_t peak_staging_bytes = 0;         // host staging (CPU buffers or pinned ring) at its peak
  uint64_t peak_device_staging_bytes = 0;  // staged engine: device scratch for conversions
  uint64_t reads = 0;                      // read calls issued
  uint64_t direct_bytes = 0;               // bytes read straight into slots
  uint64_t mapped_bytes = 0;               // bytes served from file mappings (map_files)
  int threads = 0;
  std::string engine;  // "cpu", or "staged:<device>"
  std::vector<FileReport> files;
  // Dequantizing loads (load/plan.h LoadOptions::dequantize): the targets filled from a quantized
  // weight, by name. The engines leave it empty.
  std::vector<std::string> dequantized;
  // Loads with strict=false (load/plan.h LoadPlan): the targets left as they were, and the
  // checkpoint tensors not read. The engines leave them empty.
  std::vector<std::string> missing, unexpected;
};

// The report as JSON (the Python package and the CLI read it): every field above, files as a list.
std::string load_report_json(const LoadReport& r);

}  // namespace metaload
