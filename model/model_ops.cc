// Python side of the model layer: torch.classes.metaload.TransformersModel and .Capture, wrapped
// by python/metaload/model.py. Structured results travel as JSON text, tensors as tensors.
#include <climits>

#include <fmt/format.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <nlohmann/json.hpp>

#include "base/text.h"
#include "base/torch_library.h"
#include "distributed/collectives.h"
#include "loader/load/progress_board.h"
#include "identity/dtypes.h"
#include "model/fixtures.h"
#include "identity/model_dtype.h"
#include "model/transformers_model.h"

namespace metaload {
namespace {

nlohmann::json opt_json(const std::optional<std::string>& s) {
  return s ? nlohmann::json(*s) : nlohmann::json();
}

nlohmann::json report_json(const LoadReport& r) {
  return nlohmann::json::parse(load_report_json(r));
}

std::string scan_json(const ModelScan& s) {
  const nlohmann::json modules = nlohmann::json::parse(s.modules_json());
  return nlohmann::json{
      {"device", s.device.str()}, {"seconds", s.seconds}, {"total_bytes", s.total_bytes()},
      {"tp_size", s.tp_size},     {"tp_rank", s.tp_rank}, {"weight_bytes", s.weight_bytes},
      {"modules", modules}}
      .dump();
}

struct CaptureHolder : torch::CustomClassHolder {
  explicit CaptureHolder(Capture c) : capture(std::move(c)) {}
  Capture capture;
};

struct ModelHolder : torch::CustomClassHolder {
  explicit ModelHolder(std::shared_ptr<TransformersModel> m) : model(std::move(m)) {}
  std::shared_ptr<TransformersModel> model;
};

c10::intrusive_ptr<ModelHolder> make_model(std::string ref, c10::optional<std::string> revision,
                                           std::string device, c10::optional<std::string> dtype,
                                           int64_t tp_rank, int64_t tp_size, int64_t threads,
                                           bool dispatch, bool progress_bar, int64_t progress_id,
                                           bool allow_local_paths, c10::IValue process_group,
                                           double collective_timeout) {
  ModelOptions o;
  o.keys.allow_local_paths = allow_local_paths;
  o.device = at::Device(device);
  if (dtype) o.dtype = model_scalar_type(*dtype);
  if (revision) o.revision = *revision;
  // Python ints arrive as int64: out of int range is an error naming the argument, not a wrap.
  if (tp_size < 1 || tp_size > INT_MAX)
    throw ModelError(fmt::format("tp_size must be from 1 to 2^31-1, got {}", tp_size));
  // With a process group, -1 takes the rank from the group (the handshake checks the rest).
  if (!process_group.isNone()) {
    o.process_group = process_group_from_ivalue(process_group);
    if (!(collective_timeout > 0) || collective_timeout > 1e9)
      throw DistributedError(fmt::format(
          "collective_timeout must be a positive number of seconds, got {}", collective_timeout));
    o.collective_timeout = std::chrono::milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(collective_timeout * 1000)));
  } else if (tp_rank < 0 || tp_rank >= tp_size) {
    throw ModelError(
        fmt::format("tp_rank must be from 0 to tp_size - 1 ({}), got {}", tp_size - 1, tp_rank));
  }
  if (tp_rank < -1 || tp_rank > INT_MAX)
    throw ModelError(fmt::format("tp_rank must be from 0 to 2^31-1, got {}", tp_rank));
  if (threads < 0 || threads > kMaxLoaderThreads)
    throw ModelError(fmt::format("threads must be 0 (one per core) or from 1 to {}, got {}",
                                 kMaxLoaderThreads, threads));
  o.tp_rank = static_cast<int>(tp_rank);
  o.tp_size = static_cast<int>(tp_size);
  o.threads = static_cast<int>(threads);
  o.dispatch = dispatch;
  o.engine.bar = progress_bar ? ProgressBar::kAuto : ProgressBar::kOff;
  // Dispatches post their progress for the Python package to poll (loader/load/progress_board.h).
  if (progress_id != 0) o.engine.progress = ProgressBoard::instance().writer(progress_id);
  return c10::make_intrusive<ModelHolder>(std::make_shared<TransformersModel>(ref, o));
}

std::string info(const c10::intrusive_ptr<ModelHolder>& self) {
  const TransformersModel& m = *self->model;
  const ModelOptions& o = m.options();
  return nlohmann::json{{"reference", m.reference()},
                        {"checkpoint", m.checkpoint()},
                        {"config_path", m.config_path()},
                        {"repo_id", opt_json(m.repo_id())},
                        {"revision", opt_json(m.revision())},
                        {"commit", opt_json(m.commit())},
                        {"dispatched", m.dispatched()},
                        {"build_seconds", m.build_seconds()},
                        {"class", m.module().name()},
                        {"device", o.device.str()},
                        {"dtype", torch_dtype_name(o.dtype.value_or(at::kFloat))},
                        {"tp_rank", o.tp_rank},
                        {"tp_size", o.tp_size},
                        {"process_group", m.collectives() != nullptr},
                        {"collective_timeout", o.collective_timeout.count() / 1000.0},
                        {"num_parameters", m.module().num_parameters()},
                        {"config", m.config().raw}}
      .dump();
}

template <typename Items>
std::vector<std::string> keys_of(const Items& items) {
  std::vector<std::string> out;
  for (const auto& item : items) out.push_back(item.key());
  return out;
}

template <typename Items>
std::vector<at::Tensor> values_of(const Items& items) {
  std::vector<at::Tensor> out;
  for (const auto& item : items) out.push_back(item.value());
  return out;
}

// make_checkpoint for tests and the Python package; returns FixtureResult as JSON.
std::string make_checkpoint_op(std::string arch, std::string config, std::string dtype,
                               int64_t shards, int64_t seed, std::string layout, bool buffers,
                               std::string hf_cache, std::string repo, std::string out) {
  FixtureOptions o;
  o.arch = arch;
  o.config = config;
  const DTypeEntry& e = resolve_dtype_name(dtype);
  if (!e.file_dtype)
    throw FixtureError(fmt::format("dtype {} has no safetensors dtype", quote_text(dtype, '\'')));
  o.dtype = *e.file_dtype;
  if (shards < 1 || shards > INT_MAX)
    throw FixtureError(fmt::format("shards must be from 1 to 2^31-1, got {}", shards));
  o.shards = static_cast<int>(shards);
  o.seed = static_cast<uint64_t>(seed);
  if (layout == "published") {
    o.layout = FixtureLayout::kPublished;
  } else if (layout == "saved") {
    o.layout = FixtureLayout::kSaved;
  } else {
    throw FixtureError(
        fmt::format("layout {} is neither 'published' nor 'saved'", quote_text(layout, '\'')));
  }
  o.buffers = buffers;
  o.hf_cache = hf_cache;
  o.repo = repo;
  const FixtureResult r = make_checkpoint(o, out);
  return nlohmann::json{{"dir", r.dir},
                        {"files", r.files},
                        {"commit", opt_json(r.commit)},
                        {"config_name", r.config_name},
                        {"n_tensors", r.n_tensors},
                        {"n_params", r.n_params},
                        {"data_bytes", r.data_bytes},
                        {"seconds", r.seconds}}
      .dump();
}

// make_checkpoint and the Capture class: the small registrations beside TransformersModel.
void register_fixture_and_capture(torch::Library& m) {
  m.def(
      "make_checkpoint(str arch, str config, str dtype='float32', int shards=1, int seed=0, "
      "str layout='published', bool buffers=False, str hf_cache='', str repo='', str out='') -> "
      "str",
      &make_checkpoint_op);

  m.class_<CaptureHolder>("Capture")
      .def("path",
           [](const c10::intrusive_ptr<CaptureHolder>& self) { return self->capture.path(); })
      .def("has_value",
           [](const c10::intrusive_ptr<CaptureHolder>& self) { return self->capture.has_value(); })
      .def("value",
           [](const c10::intrusive_ptr<CaptureHolder>& self) { return self->capture.value(); })
      .def("count",
           [](const c10::intrusive_ptr<CaptureHolder>& self) { return self->capture.count(); })
      .def("reset", [](const c10::intrusive_ptr<CaptureHolder>& self) { self->capture.reset(); });
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  register_fixture_and_capture(m);
  m.class_<ModelHolder>("TransformersModel")
      .def(torch::init(&make_model))
      .def("info", &info)
      .def("to_model_key",
           [](const c10::intrusive_ptr<ModelHolder>& self, c10::optional<bool> allow_local_paths) {
             // None: the key policy the model was made with.
             return allow_local_paths ? self->model->to_model_key(KeyOptions{*allow_local_paths})
                                      : self->model->to_model_key();
           })
      .def("dispatched",
           [](const c10::intrusive_ptr<ModelHolder>& self) { return self->model->dispatched(); })
      .def("dispatch",
           [](const c10::intrusive_ptr<ModelHolder>& self) {
             return report_json(self->model->dispatch()).dump();
           })
      .def("dispatch_from",
           [](const c10::intrusive_ptr<ModelHolder>& self, std::vector<std::string> names,
              std::vector<at::Tensor> tensors,
              bool check_only) { self->model->dispatch_from(names, tensors, check_only); })
      .def("load_report",
           [](const c10::intrusive_ptr<ModelHolder>& self) -> std::string {
             auto r = self->model->load_report();
             return r ? report_json(*r).dump() : "";
           })
      .def("scan",
           [](const c10::intrusive_ptr<ModelHolder>& self, int64_t batch, int64_t seq,
              c10::optional<std::string> device, c10::optional<int64_t> tp_size, int64_t tp_rank) {
             std::optional<at::Device> d;
             if (device) d = at::Device(*device);
             std::optional<int64_t> tp;
             if (tp_size) tp = *tp_size;
             return scan_json(self->model->scan(batch, seq, d, tp, tp_rank));
           })
      .def("scan_ids",
           [](const c10::intrusive_ptr<ModelHolder>& self, at::Tensor ids,
              c10::optional<std::string> device, c10::optional<int64_t> tp_size, int64_t tp_rank) {
             std::optional<at::Device> d;
             if (device) d = at::Device(*device);
             std::optional<int64_t> tp;
             if (tp_size) tp = *tp_size;
             return scan_json(self->model->scan({ids}, d, tp, tp_rank));
           })
      .def("forward", [](const c10::intrusive_ptr<ModelHolder>& self,
                         at::Tensor ids) { return self->model->forward(ids); })
      .def("generate", [](const c10::intrusive_ptr<ModelHolder>& self, at::Tensor ids,
                          int64_t n) { return self->model->generate(ids, n); })
      .def("parameter_names",
           [](const c10::intrusive_ptr<ModelHolder>& self) {
             return keys_of(self->model->module().named_parameters(/*recurse=*/true));
           })
      .def("parameters",
           [](const c10::intrusive_ptr<ModelHolder>& self) {
             return values_of(self->model->module().named_parameters(/*recurse=*/true));
           })
      .def("buffer_names",
           [](const c10::intrusive_ptr<ModelHolder>& self) {
             return keys_of(self->model->module().named_buffers(/*recurse=*/true));
           })
      .def("buffers",
           [](const c10::intrusive_ptr<ModelHolder>& self) {
             return values_of(self->model->module().named_buffers(/*recurse=*/true));
           })
      .def("parameter", [](const c10::intrusive_ptr<ModelHolder>& self,
                           std::string name) { return self->model->parameter(name); })
      .def("module_paths",
           [](const c10::intrusive_ptr<ModelHolder>& self) { return self->model->module_paths(); })
      .def("module_class", [](const c10::intrusive_ptr<ModelHolder>& self,
                              std::string path) { return self->model->at(path)->name(); })
      .def("capture", [](const c10::intrusive_ptr<ModelHolder>& self, std::string path) {
        return c10::make_intrusive<CaptureHolder>(self->model->capture(path));
      });
}

}  // namespace metaload
