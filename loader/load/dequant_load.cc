#include "loader/load/dequant_load.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/text.h"
#include "base/torch_library.h"
#include "kernels/dequant.h"

namespace metaload {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << at::IntArrayRef(s);
  return o.str();
}

// Parts are read as raw bytes: a dtype of the element's size (1.13 has no float8 or uint32).
at::ScalarType raw_dtype(DType d) {
  switch (dtype_bits(d) / 8) {
    case 1:
      return at::kByte;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

// Roles that are read at plan time (the blob, weight_format), not loaded.
bool loaded_role(const std::string& role) {
  return role != "state" && role != "format";
}

}  // namespace

DequantPlan plan_dequant(const std::vector<LoadTarget>& targets, const Checkpoint& ckpt,
                         const LoadOptions& opt) {
  const at::ScalarType want = *opt.dequantize;
  if (want != at::kFloat && want != at::kHalf && want != at::kBFloat16) {
    throw PlanError(std::string("dequantize must be float32, float16 or bfloat16, not ") +
                    c10::toString(want));
  }
  if (opt.tp_size > 1 && !opt.names.tp_shard) {
    throw PlanError("tp_size " + std::to_string(opt.tp_size) +
                    " needs the model family's TP plan (LoadOptions::names.tp_shard)");
  }
  DequantPlan plan;
  plan.layout = find_quant_layout(ckpt);
  plan.dequantized.assign(targets.size(), false);
  plan.rest = ckpt;
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].computed) by_name.emplace(targets[i].name, i);
  }
  std::vector<MismatchItem> mismatched;
  for (size_t k = 0; k < plan.layout.weights.size(); ++k) {
    const QuantWeight& w = plan.layout.weights[k];
    std::optional<std::string> mname = w.weight;
    if (opt.names.checkpoint_to_module) mname = opt.names.checkpoint_to_module(w.weight);
    if (!mname) continue;
    auto it = by_name.find(*mname);
    if (it == by_name.end()) continue;  // no target: its parts stay, unexpected under strict
    const LoadTarget& t = targets[it->second];
    DequantTarget d;
    d.target = it->second;
    d.weight = k;
    const std::string where = quote_text(w.weight, '\'') + " (" + quant_scheme_name(w.scheme) +
                              ", " + shape_str({w.out, w.in}) + ")";
    std::optional<TpShard> shard;
    if (opt.tp_size > 1) {
      try {
        shard = opt.names.tp_shard(t.name, {w.out, w.in}, opt.tp_rank, opt.tp_size);
      } catch (const std::exception& e) {
        mismatched.push_back({t.name, ": no TP shard for rank " + std::to_string(opt.tp_rank) +
                                          " of " + std::to_string(opt.tp_size) + ": " +
                                          escape_text(e.what())});
        continue;
      }
    }
    d.window = dequant_window(ckpt, w, shard ? &*shard : nullptr, opt.tp_size);
    const std::vector<int64_t> shape = {d.window.rows, d.window.cols};
    if (!t.tensor.defined() || t.tensor.sizes().vec() != shape) {
      mismatched.push_back(
          {t.name, ": shape " + (t.tensor.defined() ? shape_str(t.tensor.sizes().vec()) : "?") +
                       " in the module but " + where + " dequantizes to " + shape_str(shape) +
                       (opt.tp_size > 1 ? " (rank " + std::to_string(opt.tp_rank) + " of " +
                                              std::to_string(opt.tp_size) + ")"
                                        : "")});
      continue;
    }
    for (const auto& [role, p] : w.parts) {
      plan.rest.lookup.erase(p.name);
      if (!loaded_role(role)) continue;
      SlotSpec s;
      s.name = p.name;
      s.file = p.file;
      s.data_offset = ckpt.files[p.file].data_start + p.info->begin;
      s.stored_shape = {static_cast<int64_t>(p.info->nbytes() / (dtype_bits(p.info->dtype) / 8))};
      s.stored_dtype = s.dtype = raw_dtype(p.info->dtype);
      d.parts.emplace_back(role, plan.parts.size());
      plan.parts.push_back(std::move(s));
    }
    plan.dequantized[d.target] = true;
    plan.targets.push_back(std::move(d));
  }
  if (!mismatched.empty()) {
    const std::string summary = "checkpoint " + quote_text(ckpt.ref, '\'') +
                                " does not fit: 0 missing, 0 unexpected, " +
                                std::to_string(mismatched.size()) + " mismatched";
    throw MismatchError(summary, {}, {}, std::move(mismatched));
  }
  return plan;
}

std::vector<at::Tensor> run_dequant(const DequantPlan& plan, const std::vector<std::string>& files,
                                    const LoadOptions& opt, const EngineOptions& engine,
                                    LoadReport* report) {
  std::vector<at::Tensor> out;
  if (plan.targets.empty()) return out;
  // The parts on the CPU, zero-copy where they lie aligned in the files (only packed bytes and
  // scales: a fraction of the weights).
  EngineOptions eo = engine;
  eo.map_files = true;
  SlotLoad parts = load_slots(files, plan.parts, at::kCPU, eo);
  report->bytes += parts.report.bytes;
  report->reads += parts.report.reads;
  report->direct_bytes += parts.report.direct_bytes;
  report->mapped_bytes += parts.report.mapped_bytes;
  report->seconds += parts.report.seconds;
  report->peak_staging_bytes =
      std::max(report->peak_staging_bytes, parts.report.peak_staging_bytes);

  const at::ScalarType dtype = *opt.dequantize;
  const int fmt = dtype == at::kFloat ? 0 : (dtype == at::kHalf ? 1 : 2);
  const bool cuda = opt.device.is_cuda();
  std::vector<at::Tensor> on_device;  // the parts copied to the GPU, freed on return
  for (const DequantTarget& d : plan.targets) {
    const QuantWeight& w = plan.layout.weights[d.weight];
    std::map<std::string, const void*> host, dev;
    for (const auto& [role, i] : d.parts) {
      host[role] = parts.tensors[i].data_ptr();
      if (cuda) {
        on_device.push_back(parts.tensors[i].to(opt.device));
        dev[role] = on_device.back().data_ptr();
      }
    }
    const QuantView hv = quant_view(w, host);
    try {
      check_g_idx(hv);
    } catch (const ShapeError& e) {
      const QuantPart& g = w.part("g_idx");
      throw DequantError(files[g.file], g.name, "g_idx-range", e.message());
    }
    at::Tensor t = at::empty({d.window.rows, d.window.cols},
                             at::TensorOptions().dtype(dtype).device(opt.device));
    DequantDst dst;
    dst.data = t.data_ptr();
    dst.format = fmt;
    dst.ld = d.window.cols;
    dst.row0 = d.window.row0;
    dst.rows = d.window.rows;
    dst.col0 = d.window.col0;
    dst.cols = d.window.cols;
    if (cuda) {
      dequant_cuda(quant_view(w, dev), dst, nullptr);
    } else {
      dequant_cpu(hv, dst);
    }
    report->slot_bytes += t.numel() * t.element_size();
    out.push_back(std::move(t));
  }
  if (cuda) dequant_cuda_sync(nullptr);
  return out;
}

}  // namespace metaload

namespace metaload {
namespace {

// Python: the quantized weights of checkpoint `ref` as JSON: {"method": config.json's
// quant_method or "", "weights": [{"weight", "scheme", "shape": [out, in], "parts": {role:
// name}}]}. Raises DequantError as a dequantizing load would.
std::string quant_layout_op(std::string ref, c10::optional<std::string> revision) {
  const QuantLayout layout = find_quant_layout(
      open_checkpoint(ref, revision ? std::optional<std::string>(*revision) : std::nullopt));
  nlohmann::json weights = nlohmann::json::array();
  for (const QuantWeight& w : layout.weights) {
    nlohmann::json parts = nlohmann::json::object();
    for (const auto& [role, p] : w.parts) parts[role] = p.name;
    weights.push_back({{"weight", w.weight},
                       {"scheme", quant_scheme_name(w.scheme)},
                       {"shape", {w.out, w.in}},
                       {"parts", parts}});
  }
  return nlohmann::json{{"method", layout.method}, {"weights", weights}}.dump();
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("quant_layout(str ref, str? revision=None) -> str", &quant_layout_op);
}

}  // namespace metaload
