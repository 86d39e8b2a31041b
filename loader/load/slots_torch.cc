#include "loader/load/slots_torch.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/checked.h"
#include "base/text.h"
#include "base/torch_library.h"
#include "loader/engine/page_cache.h"
#include "loader/engine/progress.h"
#include "loader/engine/slots.h"
#include "loader/load/swap.h"

namespace metaload {

bool float_format_of(at::ScalarType t, FloatFormat* out) {
  switch (t) {
    case at::kFloat:
      *out = FloatFormat::kF32;
      return true;
    case at::kHalf:
      *out = FloatFormat::kF16;
      return true;
    case at::kBFloat16:
      *out = FloatFormat::kBF16;
      return true;
    default:
      return false;
  }
}

namespace {

// The copy jobs of one spec (one per shard range), with destinations as byte offsets into the
// slot (stored in CopyJob::dst until the slot exists).
struct SpecPlan {
  std::vector<CopyJob> jobs;
  std::vector<int64_t> shape;
  bool padded = false;
};

// A job reading `name` (stored as `stored`) into a slot of `dtype`, converting where they differ.
CopyJob job_for(const std::string& name, size_t file, at::ScalarType stored, at::ScalarType dtype) {
  CopyJob base;
  base.name = name;
  base.file = file;
  base.unit = static_cast<uint32_t>(c10::elementSize(stored));
  if (dtype != stored) {
    if (!float_format_of(stored, &base.from) || !float_format_of(dtype, &base.to)) {
      throw PlanError("tensor " + quote_text(name, '\'') + ": cannot convert " +
                      std::string(c10::toString(stored)) + " to " +
                      std::string(c10::toString(dtype)) +
                      " (conversions exist among Float, Half and BFloat16)");
    }
    base.convert = true;
  }
  return base;
}

// An assembled slot: one job per part's copy, each checkpoint tensor read where it lies.
SpecPlan plan_assembled(const SlotSpec& s) {
  const uint64_t dst_elem = c10::elementSize(s.dtype);
  SpecPlan p;
  p.shape = s.assembled_shape;
  for (const SlotPart& part : s.parts) {
    const uint64_t elem = c10::elementSize(part.stored_dtype);
    CopyJob j = job_for(part.name, part.file, part.stored_dtype, s.dtype);
    const AssembledCopy& c = part.copy;
    j.offset = part.data_offset + c.src_offset * elem;
    j.rows = c.rows;
    j.row_bytes = c.row_elems * elem;
    j.row_stride = c.rows > 1 ? c.src_stride * elem : 0;
    j.dst = reinterpret_cast<void*>(static_cast<uintptr_t>(c.dst_offset * dst_elem));
    if (j.rows > 1) j.dst_row_stride = c.dst_stride * dst_elem;
    j.exact = s.exact;
    p.jobs.push_back(j);
  }
  return p;
}

SpecPlan plan_spec(const SlotSpec& s) {
  if (!s.parts.empty()) return plan_assembled(s);
  const uint64_t elem = c10::elementSize(s.stored_dtype);
  const uint64_t dst_elem = c10::elementSize(s.dtype);
  const CopyJob base = job_for(s.name, s.file, s.stored_dtype, s.dtype);
  const TpShard shard = s.shard ? *s.shard : even_shard(s.stored_shape, s.slice, s.name);
  SpecPlan p;
  p.shape = shard.dim < 0 ? s.stored_shape : shard.shape;
  p.padded = shard_has_padding(shard);
  for (const ShardCopy& c : shard_copies(s.stored_shape, elem, s.data_offset, shard, s.name)) {
    CopyJob j = base;
    apply_region(j, c.src);
    // A slice of a sharded tensor: the bytes around it (and between its rows) are other ranks'.
    j.exact = shard.dim >= 0 || s.exact;
    j.dst = reinterpret_cast<void*>(static_cast<uintptr_t>(c.dst_offset_elems * dst_elem));
    if (j.rows > 1) j.dst_row_stride = c.dst_row_stride_elems * dst_elem;
    p.jobs.push_back(j);
  }
  return p;
}

// Whether every file is leased (no writer changes it unseen) and a sample of the page cache finds
// at least kWarmShare of the ranges' pages cached. Then the load maps them lazily, as safetensors'
// does, and the pages missing are read ahead in the background: the whole-range count alone
// (cachestat) costs more than safetensors' entire warm load, and a VM's proactive reclaim keeps
// evicting a percent or two of idle cached pages. A colder load reads its missing pages now.
constexpr double kWarmShare = 0.95;
bool warm_and_leased(const std::vector<MappedRange>& ranges) {
  for (const MappedRange& r : ranges)
    if (r.map->guard() != MappingGuard::kLease) return false;
  const CacheSample s = sample_page_cache(ranges);
  if (!s.known || static_cast<double>(s.cached) < kWarmShare * static_cast<double>(s.pages))
    return false;
  if (s.cached < s.pages) prefetch_in_background(ranges);
  return true;
}

// The mapping of files[file], opened at its first use.
const std::shared_ptr<FileMapping>& mapping_for(size_t file, const std::vector<std::string>& files,
                                                std::vector<std::shared_ptr<FileMapping>>& maps,
                                                const EngineOptions& options) {
  if (!maps[file]) {
    // Through the descriptor its header was read through, when the caller holds one (then the
    // size is that file's: the path may name another by now).
    const int held = options.open_descriptor ? options.open_descriptor(files[file]) : -1;
    struct stat st {};
    std::error_code ec;
    const uint64_t size = held >= 0 ? (::fstat(held, &st) == 0 ? st.st_size : 0)
                                    : std::filesystem::file_size(files[file], ec);
    if (ec) throw ReadError(files[file] + ": " + ec.message());
    maps[file] = FileMapping::open(files[file], size, held);
  }
  return maps[file];
}

// Throws ReadError naming the file and the tensor when a job's bytes reach past the file's end.
void check_within(const FileMapping& map, const std::string& tensor, const CopyJob& j) {
  const uint64_t bytes = j.rows * j.row_bytes;
  if (j.offset + bytes > map.size()) {
    throw ReadError(escape_path(map.path()) + ": tensor " + quote_text(tensor, '\'') +
                    " ends at byte " + std::to_string(j.offset + bytes) +
                    " past the end of the file");
  }
}

// Whether a job copies one run of its file as it is, element-aligned, to one run of its slot.
bool one_run(const CopyJob& j, uint64_t elem) {
  const bool runs = j.rows == 1 || (j.stride() == j.row_bytes && j.dst_pitch() == j.row_bytes);
  return !j.convert && runs && j.offset % elem == 0;
}

// An assembled slot (the fused experts) as a view of its file (FileMapping::map_view): where
// every part is one run of the same file in the stored dtype. Undefined where it is not, or
// where no view could be had (pieces off the page residue of the others, an open-file budget
// spent, a detached mapping) or none is wanted (EngineOptions::map_views): the slot is then copied.
at::Tensor view_slot(const SlotSpec& spec, const SpecPlan& p, const std::vector<std::string>& files,
                     std::vector<std::shared_ptr<FileMapping>>& maps, const EngineOptions& options,
                     std::vector<MappedRange>& ranges) {
  if (!options.map_views) return at::Tensor();
  const uint64_t elem = c10::elementSize(spec.dtype);
  std::vector<ViewPiece> pieces;
  for (const CopyJob& j : p.jobs) {
    if (!one_run(j, elem) || j.file != p.jobs[0].file) return at::Tensor();
    pieces.push_back({reinterpret_cast<uintptr_t>(j.dst), j.offset, j.rows * j.row_bytes});
  }
  const std::shared_ptr<FileMapping>& map = mapping_for(p.jobs[0].file, files, maps, options);
  for (const CopyJob& j : p.jobs) check_within(*map, j.name, j);
  const uint64_t bytes =
      checked_product<uint64_t>(p.shape, elem, "slot bytes of tensor " + quote_text(spec.name));
  std::shared_ptr<MappedView> view = map->map_view(bytes, pieces);
  if (!view) return at::Tensor();
  for (const ViewPiece& piece : pieces)
    ranges.push_back({map, piece.file_offset, piece.length, view->data() + piece.offset});
  return at::from_blob(
      view->data(), p.shape, [view](void*) mutable { view.reset(); },
      at::TensorOptions().dtype(spec.dtype).device(at::kCPU));
}

// A slot that is one run of its file as a tensor over the file's mapping; undefined where not.
at::Tensor map_slot(const SlotSpec& spec, const SpecPlan& p, const std::vector<std::string>& files,
                    std::vector<std::shared_ptr<FileMapping>>& maps, const EngineOptions& options,
                    std::vector<MappedRange>& ranges) {
  const CopyJob& j = p.jobs[0];
  if (!one_run(j, c10::elementSize(spec.dtype))) return at::Tensor();
  std::shared_ptr<FileMapping> keep = mapping_for(j.file, files, maps, options);
  check_within(*keep, spec.name, j);
  ranges.push_back({keep, j.offset, j.rows * j.row_bytes});
  unsigned char* data = keep->data() + j.offset;
  return at::from_blob(
      data, p.shape, [keep](void*) mutable { keep.reset(); },
      at::TensorOptions().dtype(spec.dtype).device(at::kCPU));
}

// Faults the mapped ranges' pages in as EngineOptions::map_populate says (see map_slots), with
// the engine's threads.
void fault_in(const std::vector<MappedRange>& ranges, uint64_t bytes, const EngineOptions& options,
              std::chrono::steady_clock::time_point t0) {
  // Page-table work, no copy, in pieces of at most kPopulateChunk so that progress (the bar,
  // EngineOptions::progress) counts populated bytes as they come, about 10 times a second on this
  // thread, like the engines.
  constexpr uint64_t kPopulateChunk = 64ull << 20;
  const MapPopulate populate = options.map_populate;
  if (bytes == 0 || populate == MapPopulate::kLazy) return;
  if (populate == MapPopulate::kAuto && warm_and_leased(ranges)) {
    // Nothing to wait for: the progress ends full at once (and a cancel is still heard).
    ProgressRun run(options, bytes, "mapped bytes", t0);
    run.done = bytes;
    run.execute(0, [](int) {});
    if (run.error) std::rethrow_exception(run.error);
    return;
  }
  const std::vector<MappedRange> chunks = pieces_of(ranges, kPopulateChunk);
  ProgressRun run(options, bytes, "mapped bytes", t0);
  std::atomic<size_t> next{0};
  run.execute(std::min<int>(resolve_threads(options.threads), static_cast<int>(chunks.size())),
              [&](int) {
                for (size_t c; !run.should_stop() && (c = next++) < chunks.size();) {
                  const MappedRange& r = chunks[c];
                  if (populate == MapPopulate::kAlways || r.map->guard() != MappingGuard::kLease) {
                    r.map->populate(r.offset, r.length, r.at);
                  } else {
                    r.map->populate_uncached(r.offset, r.length, r.at);
                  }
                  run.done += r.length;
                }
              });
  if (run.error) std::rethrow_exception(run.error);
}

// The specs whose bytes can be used where they lie in the file: one contiguous run, stored dtype,
// no padding, element-aligned; and the assembled ones (the fused experts) whose every part is such
// a run of one file, as views (map_view: the file's pages side by side). Those become tensors over
// copy-on-write file mappings (the rest stay undefined here). Pages are faulted in before
// returning, in parallel, so read errors surface now (EngineOptions::map_populate: by default
// only those not cached, where a lease guards the file, and none when a sample finds the files
// warm: the few pages missing are read ahead meanwhile).
std::vector<at::Tensor> map_slots(const std::vector<std::string>& files,
                                  const std::vector<SlotSpec>& specs, std::vector<SpecPlan>& plans,
                                  const EngineOptions& options, LoadReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> out(specs.size());
  std::vector<std::shared_ptr<FileMapping>> maps(files.size());
  std::vector<MappedRange> ranges;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SpecPlan& p = plans[i];
    if (p.padded || p.jobs.empty()) continue;
    const size_t before = ranges.size();
    if (!specs[i].parts.empty() && p.jobs.size() > 1) {
      out[i] = view_slot(specs[i], p, files, maps, options, ranges);
    } else if (p.jobs.size() == 1) {
      out[i] = map_slot(specs[i], p, files, maps, options, ranges);
    }
    for (size_t r = before; r < ranges.size(); ++r) report->mapped_bytes += ranges[r].length;
  }
  // `out` (and with it every mapping) dies with a throw.
  fault_in(ranges, report->mapped_bytes, options, t0);
  // A file written in place while it was mapped and populated (no lease kept it whole): the
  // tensors would hold some of both versions.
  for (const auto& m : maps)
    if (m) m->check();
  report->bytes += report->mapped_bytes;
  report->slot_bytes += report->mapped_bytes;
  report->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// Turns the jobs' slot-relative destinations into addresses.
void place(SpecPlan& p, void* slot, std::vector<CopyJob>& all) {
  for (CopyJob& j : p.jobs) {
    j.dst = static_cast<unsigned char*>(slot) + reinterpret_cast<uintptr_t>(j.dst);
    all.push_back(j);
  }
}

}  // namespace

std::vector<std::shared_ptr<FileMapping>> mappings_of(const std::vector<at::Tensor>& tensors) {
  std::vector<std::shared_ptr<FileMapping>> out;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage() || !t.device().is_cpu()) continue;
    const void* p = t.storage().data_ptr().get();
    if (p == nullptr) continue;
    std::shared_ptr<FileMapping> m = FileMapping::containing(p);
    if (m && std::find(out.begin(), out.end(), m) == out.end()) out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::shared_ptr<FileMapping>> check_mapped(const std::vector<at::Tensor>& tensors) {
  std::vector<std::shared_ptr<FileMapping>> maps = mappings_of(tensors);
  for (const auto& m : maps) m->check();
  return maps;
}

namespace {

// Where each CPU slot goes in the arena: its size, alignment and file position, and whether it
// may share a read with its file neighbours.
std::vector<SlotRequest> slot_requests(const std::vector<SlotSpec>& specs,
                                       const std::vector<SpecPlan>& plans) {
  std::vector<SlotRequest> req;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SpecPlan& p = plans[i];
    SlotRequest r;
    r.bytes = checked_product<uint64_t>(p.shape, c10::elementSize(specs[i].dtype),
                                        "slot bytes of tensor " + quote_text(specs[i].name));
    r.align = c10::elementSize(specs[i].dtype);
    r.file = specs[i].file;
    r.file_offset = p.jobs.empty() ? 0 : p.jobs[0].offset;
    // One contiguous run copied as it is can share a read with its file neighbours.
    r.read_direct = p.jobs.size() == 1 && !p.jobs[0].convert &&
                    (p.jobs[0].rows == 1 || p.jobs[0].stride() == p.jobs[0].row_bytes);
    req.push_back(r);
  }
  return req;
}

// The CPU engine's run after a zero-copy mapping: progress continues from the mapped bytes
// (engine.h, Progress), and the report adds them.
LoadReport run_after_mapping(const std::vector<std::string>& files,
                             const std::vector<CopyJob>& jobs, const EngineOptions& options,
                             const LoadReport& mapping) {
  EngineOptions engine = options;
  if (options.progress && mapping.mapped_bytes > 0) {
    engine.progress = [&options, mapped = mapping.mapped_bytes](const Progress& p) {
      Progress q = p;
      q.bytes_done += mapped;
      q.bytes_total += mapped;
      options.progress(q);
    };
  }
  LoadReport report = run_cpu_engine(files, jobs, engine);
  report.mapped_bytes = mapping.mapped_bytes;
  report.bytes += mapping.bytes;
  report.slot_bytes += mapping.slot_bytes;
  report.seconds += mapping.seconds;
  if (mapping.mapped_bytes > 0) report.engine += "+mapped";
  return report;
}

SlotLoad load_cpu_slots(const std::vector<std::string>& files, const std::vector<SlotSpec>& specs,
                        std::vector<SpecPlan>& plans, const EngineOptions& options) {
  SlotLoad out;
  out.tensors.reserve(specs.size());
  // Zero-copy where asked and possible; those specs are then done.
  std::vector<at::Tensor> mapped = options.map_files
                                       ? map_slots(files, specs, plans, options, &out.report)
                                       : std::vector<at::Tensor>(specs.size());
  uint64_t total = 0;
  const std::vector<uint64_t> offsets = layout_slots(slot_requests(specs, plans), &total);
  // Fresh anonymous memory is zero, so shard padding needs no fill. The tensors hold the arena;
  // if anything throws, `out` dies and with it the last reference.
  std::shared_ptr<HostArena> arena =
      HostArena::create(total, resolve_slot_pages(options.slot_pages) == SlotPages::kHuge);
  std::vector<CopyJob> jobs;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (mapped[i].defined()) {
      out.tensors.push_back(std::move(mapped[i]));
      continue;
    }
    out.tensors.push_back(arena_tensor(arena, offsets[i], plans[i].shape, specs[i].dtype));
    place(plans[i], arena->data() + offsets[i], jobs);
  }
  EngineOptions fill = options;  // the arena is fresh: the engine may fill its pages directly
  fill.fresh_slots = arena->data();
  fill.fresh_slot_bytes = arena->size();
  arena.reset();
  out.report = run_after_mapping(files, jobs, fill, out.report);
  return out;
}

SlotLoad load_staged_slots(const std::vector<std::string>& files,
                           const std::vector<SlotSpec>& specs, std::vector<SpecPlan>& plans,
                           at::Device device, const EngineOptions& options, DeviceOps* staged) {
  std::unique_ptr<DeviceOps> owned;
  DeviceOps* ops = staged;
  if (ops == nullptr) {
    if (!device.is_cuda()) {
      throw PlanError("cannot load onto device " + device.str() +
                      ": only cpu and cuda are supported");
    }
    owned = make_cuda_device_ops(device.has_index() ? device.index() : 0);
    ops = owned.get();
  }
  SlotLoad out;
  out.tensors.reserve(specs.size());
  std::vector<CopyJob> jobs;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto opts = at::TensorOptions().dtype(specs[i].dtype).device(device);
    // Padding rows (a vocabulary padded for TP) are zero, as the families' shards say.
    out.tensors.push_back(plans[i].padded ? at::zeros(plans[i].shape, opts)
                                          : at::empty(plans[i].shape, opts));
    place(plans[i], out.tensors.back().data_ptr(), jobs);
  }
  out.report = run_staged_engine(files, jobs, *ops, options);
  return out;
}

}  // namespace

SlotLoad load_slots(const std::vector<std::string>& files, const std::vector<SlotSpec>& specs,
                    at::Device device, const EngineOptions& options, DeviceOps* staged) {
  std::vector<SpecPlan> plans;
  plans.reserve(specs.size());
  for (const SlotSpec& s : specs) plans.push_back(plan_spec(s));
  if (staged == nullptr && device.is_cpu()) return load_cpu_slots(files, specs, plans, options);
  return load_staged_slots(files, specs, plans, device, options, staged);
}

namespace {

// Python: metaload.check_mapped_files(...) -> [{"path", "guard"}] of the files checked.
std::string check_mapped_op(at::TensorList tensors) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : check_mapped(tensors.vec()))
    out.push_back({{"path", m->path()}, {"guard", mapping_guard_name(m->guard())}});
  return out.dump();
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("check_mapped_files(Tensor[] tensors) -> str", &check_mapped_op);
}

}  // namespace metaload
