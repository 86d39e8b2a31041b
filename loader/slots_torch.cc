#include "loader/slots_torch.h"

#include <memory>

#include "loader/slots.h"
#include "loader/swap.h"

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

// The copy job of one spec, without its destination.
CopyJob job_for(const SlotSpec& s) {
  const uint64_t elem = c10::elementSize(s.stored_dtype);
  CopyJob job;
  job.name = s.name;
  job.file = s.file;
  job.unit = static_cast<uint32_t>(elem);
  apply_region(job, slice_region(s.stored_shape, elem, s.data_offset, s.slice, s.name));
  if (s.dtype != s.stored_dtype) {
    if (!float_format_of(s.stored_dtype, &job.from) || !float_format_of(s.dtype, &job.to)) {
      throw PlanError("tensor '" + s.name + "': cannot convert " +
                      std::string(c10::toString(s.stored_dtype)) + " to " +
                      std::string(c10::toString(s.dtype)) +
                      " (conversions exist among Float, Half and BFloat16)");
    }
    job.convert = true;
  }
  return job;
}

std::vector<int64_t> slot_shape(const SlotSpec& s) {
  return slice_region(s.stored_shape, 1, 0, s.slice, s.name).shape;
}

}  // namespace

SlotLoad load_slots(const std::vector<std::string>& files, const std::vector<SlotSpec>& specs,
                    at::Device device, const EngineOptions& options, DeviceOps* staged) {
  std::vector<CopyJob> jobs;
  jobs.reserve(specs.size());
  for (const SlotSpec& s : specs) jobs.push_back(job_for(s));

  SlotLoad out;
  out.tensors.reserve(specs.size());
  if (staged == nullptr && device.is_cpu()) {
    std::vector<SlotRequest> req;
    for (size_t i = 0; i < specs.size(); ++i) {
      SlotRequest r;
      r.bytes = jobs[i].dst_bytes();
      r.align = c10::elementSize(specs[i].dtype);
      r.file = jobs[i].file;
      r.file_offset = jobs[i].offset;
      r.read_direct =
          !jobs[i].convert && (jobs[i].rows == 1 || jobs[i].stride() == jobs[i].row_bytes);
      req.push_back(r);
    }
    uint64_t total = 0;
    const std::vector<uint64_t> offsets = layout_slots(req, &total);
    // The tensors hold the arena; if anything throws, `out` dies and with it the last reference.
    std::shared_ptr<HostArena> arena = HostArena::create(total);
    for (size_t i = 0; i < specs.size(); ++i) {
      jobs[i].dst = arena->data() + offsets[i];
      out.tensors.push_back(arena_tensor(arena, offsets[i], slot_shape(specs[i]), specs[i].dtype));
    }
    arena.reset();
    out.report = run_cpu_engine(files, jobs, options);
    return out;
  }

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
  for (size_t i = 0; i < specs.size(); ++i) {
    out.tensors.push_back(
        at::empty(slot_shape(specs[i]), at::TensorOptions().dtype(specs[i].dtype).device(device)));
    jobs[i].dst = out.tensors.back().data_ptr();
  }
  out.report = run_staged_engine(files, jobs, *ops, options);
  return out;
}

}  // namespace metaload
