// TransformersModel's scan: the model run on fake ids under fake_mode's scan(), whose result (every
// module's output, in order) becomes the ModelScan with class names.
#include <climits>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/checked.h"
#include "base/text.h"
#include "fake_mode/fake_tensor.h"
#include "model/family_load.h"
#include "model/transformers_model.h"
#include "model/transformers_model_impl.h"

namespace metaload {

std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

uint64_t ModuleShape::bytes() const {
  return checked_product<uint64_t>(sizes, c10::elementSize(dtype),
                                   path.empty()
                                       ? std::string("output bytes of the model")
                                       : "output bytes of module " + quote_text(path, '\''));
}

ModelScan ModelScan::from_result(const ScanResult& result, c10::Device device,
                                 const std::function<std::string(const std::string&)>& class_of) {
  ModelScan out;
  out.device = device;
  for (const std::string& path : result.order) {
    const ShapeInfo& s = result.modules.at(path);
    out.modules.push_back(ModuleShape{path, class_of(path), s.sizes, s.dtype, s.device, s.calls});
  }
  if (!result.outputs.empty()) out.logits = result.outputs.front();
  out.total_bytes();  // a total past 2^64-1 is an error now, not a wrapped number later
  return out;
}

const ModuleShape* ModelScan::find(const std::string& path) const {
  for (const ModuleShape& m : modules)
    if (m.path == path) return &m;
  return nullptr;
}

uint64_t ModelScan::total_bytes() const {
  uint64_t total = 0;
  const std::string what =
      "total output bytes of the scan (" + std::to_string(modules.size()) + " modules)";
  for (const ModuleShape& m : modules) total = checked_add(total, m.bytes(), what);
  return total;
}

std::string ModelScan::modules_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const ModuleShape& m : modules) {
    out.push_back({{"path", m.path},
                   {"class", m.class_name},
                   {"shape", m.sizes},
                   {"dtype", torch_dtype_name(m.dtype)},
                   {"device", m.device.str()},
                   {"calls", m.calls},
                   {"bytes", m.bytes()}});
  }
  return out.dump();
}

namespace {

// An activation too large for torch's sizes (int64 bytes) is torch's own check, typed here
// (batch x seq x vocab and the attention scores grow first). It comes as a c10::Error, or, where a
// meta kernel is written in Python (torch 2.x in a Python process), as the Python error's C++
// carrier. Other errors pass unchanged. `last`: the latest module that reported, "" for none.
[[noreturn]] void rethrow_scan_error(const std::exception& e, const at::Tensor& ids,
                                     const std::optional<std::string>& last) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string torch_msg = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (torch_msg.find("overflow") == std::string::npos) throw;
  const std::string after =
      last ? "after module " + quote_text(*last) : std::string("in the model's first module");
  throw SizeOverflowError(fmt::format(
      "bytes of an activation in the scan of ids [{}], {}: overflows (more than 2^63-1): {}",
      fmt::join(ids.sizes(), ", "), after, escape_text(torch_msg.substr(0, torch_msg.find('\n')))));
}

}  // namespace

ModelScan TransformersModel::scan(const std::vector<at::Tensor>& inputs,
                                  std::optional<at::Device> device, std::optional<int64_t> tp_size,
                                  int64_t tp_rank) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  return scan_locked(inputs, device, tp_size, tp_rank);
}

ModelScan TransformersModel::scan(int64_t batch, int64_t seq, std::optional<at::Device> device,
                                  std::optional<int64_t> tp_size, int64_t tp_rank) {
  if (batch < 1 || seq < 1)
    throw ModelError(
        fmt::format("scan: batch ({}) and sequence length ({}) must be >= 1", batch, seq));
  checked_product<int64_t>({batch, seq}, sizeof(int64_t), "bytes of the token ids [batch, seq]");
  const at::Tensor ids =
      at::zeros({batch, seq}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  std::lock_guard<std::recursive_mutex> g(mu_);
  return scan_locked({ids}, device, tp_size, tp_rank);
}

at::Device TransformersModel::scan_device_locked(const at::Tensor& ids,
                                                 std::optional<at::Device> device) const {
  if (device) return model_detail::normalized(*device);
  if (dispatched_) return module_->parameters().front().device();
  if (ids.defined() && is_fake(ids)) return claimed_device(ids);
  return options_.device;
}

namespace {

// Bytes of the module's parameters as they are now (a rank's shards during a TP scan), each
// tensor once.
uint64_t parameter_bytes(const CausalLM& module) {
  std::unordered_set<const void*> seen;
  uint64_t total = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    total = checked_add(total,
                        checked_product<uint64_t>(t.sizes().vec(), t.element_size(),
                                                  "bytes of parameter " + quote_text(item.key())),
                        "bytes of the parameters");
  }
  return total;
}

// Collectives that keep shapes only: a scan's tensors are fake, nothing is sent anywhere.
std::shared_ptr<const TensorParallel> shape_only_tp(int64_t rank, int64_t size) {
  auto tp = std::make_shared<TensorParallel>();
  tp->rank = rank;
  tp->size = size;
  tp->all_reduce = [](at::Tensor&) {};
  tp->all_gather_last = [size](const at::Tensor& t) {
    return at::cat(std::vector<at::Tensor>(static_cast<size_t>(size), t), -1);
  };
  return tp;
}

}  // namespace

ModelScan TransformersModel::scan_locked(const std::vector<at::Tensor>& inputs,
                                         std::optional<at::Device> device,
                                         std::optional<int64_t> tp_size, int64_t tp_rank) {
  const auto t0 = std::chrono::steady_clock::now();
  // The split the parameters are in: a dispatched rank's shards, or the whole model on meta.
  const int64_t held = dispatched_ ? options_.tp_size : 1;
  const int64_t size = tp_size.value_or(held);
  if (dispatched_ && held > 1 && tp_rank == 0) tp_rank = options_.tp_rank;
  if (size < 1 || size > INT_MAX || tp_rank < 0 || tp_rank >= size)
    throw ModelError(
        fmt::format("scan: tensor-parallel rank {} of {} does not exist", tp_rank, size));
  if (dispatched_ && (size != held || (held > 1 && tp_rank != options_.tp_rank)))
    throw ModelError(fmt::format(
        "scan: the weights are loaded as tensor-parallel rank {} of {}; scan that split, or scan "
        "another split on a model that is not dispatched",
        options_.tp_rank, held));
  if (inputs.size() != 1)
    throw ModelError(
        fmt::format("scan takes one input, the token ids [batch, seq]; got {}", inputs.size()));
  const at::Device where = scan_device_locked(inputs[0], device);
  std::optional<std::string> last;  // the latest module to report (named if a later one fails)
  // scan()'s own observer records every output; the captures see them too.
  auto attach = [&](ModuleObserver observer) {
    if (!observer) return install_observer({});
    install_observer([&last, observer](const std::string& path, const at::Tensor& t) {
      observer(path, t);
      last = path;
    });
  };
  // A split the parameters are not in yet: the skeleton takes the rank's shard shapes for the scan.
  std::optional<ShardShapes> shards;
  if (!dispatched_ && size > 1)
    shards.emplace(*module_, static_cast<int>(tp_rank), static_cast<int>(size), reference_);
  module_->set_tensor_parallel(size > 1 ? shape_only_tp(tp_rank, size) : nullptr);
  struct Restore {
    CausalLM& module;
    std::optional<ShardShapes>& shards;
    ~Restore() {
      module.set_tensor_parallel(nullptr);
      if (shards) shards->undo();
    }
  } restore{*module_, shards};
  const uint64_t weight_bytes = parameter_bytes(*module_);
  ScanResult result;
  try {
    result = metaload::scan(
        [this](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{module_->forward(in[0])};
        },
        inputs, where, attach);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_scan_error(e, inputs[0], last);
  }
  const auto& classes = classes_locked();
  ModelScan out = ModelScan::from_result(result, where, [&](const std::string& path) {
    const auto cls = classes.find(path);
    return cls == classes.end() ? std::string() : cls->second;
  });
  out.seconds = model_detail::seconds_since(t0);
  out.tp_size = size;
  out.tp_rank = tp_rank;
  out.weight_bytes = weight_bytes;
  return out;
}

}  // namespace metaload
