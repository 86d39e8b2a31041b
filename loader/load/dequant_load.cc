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

// Roles read at plan time (the blob, weight_format, weight_shape), not loaded.
bool loaded_role(const std::string& role) {
  return role != "state" && role != "format" && role != "shape";
}

int float_format(DType d) {
  return d == DType::F32 ? 0 : (d == DType::F16 ? 1 : 2);
}

std::string file_of(const Checkpoint& ckpt, const std::string& tensor) {
  const SafetensorsHeader* f = ckpt.file_of(tensor);
  return f ? f->path : ckpt.dir;
}

[[noreturn]] void no_kernels(const Checkpoint& ckpt, const std::string& tensor,
                             const std::string& what) {
  throw DequantError(file_of(ckpt, tensor), tensor, "unsupported-scheme",
                     what + " has no dequantization kernels");
}

// The layouts quant/ knows and the kernels do not.
void check_kernels(const Checkpoint& ckpt, const QuantLayout& layout) {
  const QuantConfig& c = layout.config;
  for (const QuantModule& m : layout.modules) {
    const std::string& q = m.weight_tensor;
    switch (c.kind) {
      case QuantKind::kGptq:
        if (c.bits != 2 && c.bits != 4 && c.bits != 8) {
          no_kernels(ckpt, q, "GPTQ with " + std::to_string(c.bits) + " bits (2, 4 and 8 have)");
        }
        break;
      case QuantKind::kAwq:
        if (!m.parts.count("zeros")) no_kernels(ckpt, q, "AWQ without zero points");
        break;
      case QuantKind::kBnb4:
        if (c.storage != DType::U8) {
          no_kernels(ckpt, q,
                     std::string("bitsandbytes 4-bit stored as ") + dtype_name(c.storage) +
                         " (uint8 has)");
        }
        break;
      case QuantKind::kBnb8:
        if (auto f = m.parts.find("format"); f != m.parts.end()) {
          const TensorInfo& t = *ckpt.find(f->second);
          const std::string v =
              t.nbytes() == 1 ? read_tensor_bytes(*ckpt.file_of(t.name), t) : std::string();
          if (v.size() != 1 || v[0] != 0) {
            no_kernels(ckpt, t.name, "int8 weight_format other than 0 (row-major)");
          }
        }
        break;
      case QuantKind::kCtPacked:
        if (auto g = m.parts.find("g_idx"); g != m.parts.end()) {
          no_kernels(ckpt, g->second, "compressed-tensors activation ordering (weight_g_idx)");
        }
        break;
      case QuantKind::kFp8Block:
      case QuantKind::kCtNvfp4:
        break;
    }
  }
}

}  // namespace

QuantLayout dequant_layout(const Checkpoint& ckpt) {
  const std::string config_path = ckpt.config_path.value_or("");
  try {
    std::optional<QuantConfig> cfg;
    if (ckpt.config_path) {
      if (auto qc = find_quant_config(read_config_json(*ckpt.config_path))) {
        try {
          cfg = parse_quant_config(*qc, config_path);
        } catch (const QuantSchemeError& e) {
          if (e.rule() != "unknown-scheme") throw;
          auto m = qc->is_object() ? qc->find("quant_method") : qc->end();
          const std::string method =
              qc->is_object() && m != qc->end() && m->is_string() ? m->get<std::string>() : "";
          throw DequantError(config_path, "", "unknown-scheme",
                             "quantization_config.quant_method " + quote_text(method, '\'') +
                                 " cannot be dequantized (kernels exist for gptq, awq, "
                                 "bitsandbytes, fp8 and compressed-tensors): " +
                                 e.detail());
        }
      }
    }
    if (!cfg) cfg = infer_quant_config(ckpt);
    if (!cfg) return QuantLayout{};
    QuantLayout layout =
        recognise_quantized(ckpt, *cfg, config_path.empty() ? ckpt.dir : config_path,
                            read_tensor_bytes, /*require_modules=*/false);
    check_kernels(ckpt, layout);
    return layout;
  } catch (const DequantError&) {
    throw;
  } catch (const QuantLayoutError& e) {  // and QuantSchemeError: the same rejection, by a load
    throw DequantError(e);
  }
}

QuantScheme dequant_scheme(const QuantConfig& c) {
  switch (c.kind) {
    case QuantKind::kGptq:
      return QuantScheme::kGptq;
    case QuantKind::kAwq:
      return QuantScheme::kAwq;
    case QuantKind::kBnb4:
      return QuantScheme::kBnb4;
    case QuantKind::kBnb8:
      return QuantScheme::kBnb8;
    case QuantKind::kFp8Block:
      return QuantScheme::kFp8;
    case QuantKind::kCtPacked:
      return QuantScheme::kCtInt;
    case QuantKind::kCtNvfp4:
      return QuantScheme::kNvfp4;
  }
  return QuantScheme::kGptq;
}

DequantWindow dequant_window(const Checkpoint& ckpt, const QuantConfig& config,
                             const QuantModule& m, const TpShard* shard, int tp_size) {
  DequantWindow win{0, m.out, 0, m.in};
  if (shard == nullptr || shard->dim < 0) return win;
  auto fail = [&](const std::string& why) {
    throw DequantError(file_of(ckpt, m.weight_tensor), m.name + ".weight", "tp-boundary", why);
  };
  if (shard->dim > 1 || shard->ranges.size() != 1) {
    fail("a tensor-parallel shard of a quantized weight must be one range of dim 0 or 1");
  }
  const int dim = shard->dim;
  const int64_t len = dim == 0 ? m.out : m.in;
  const std::string dim_name = dim == 0 ? "the output dim" : "the input dim";
  std::string boundary;
  const int64_t unit = tp_unit(config, m, dim, &boundary);
  if (unit <= 0) fail("cannot split " + dim_name + " on " + boundary);
  const int64_t a = shard->ranges[0].first, b = shard->ranges[0].second;
  if (a < 0 || b < a || b > len) fail("shard range outside the weight");
  if (a % unit != 0 || (b % unit != 0 && b != len)) {
    std::string ok;
    int n_ok = 0;
    for (int64_t n = 1; n <= std::min<int64_t>(len, 1024); ++n) {
      if (len % n == 0 && (len / n) % unit == 0) ok += (n_ok++ ? ", " : "") + std::to_string(n);
    }
    fail("tensor-parallel degree " + std::to_string(tp_size) + " splits " + dim_name + " (" +
         std::to_string(len) + ") at " + std::to_string(a % unit != 0 ? a : b) + ", off the " +
         quant_scheme_name(dequant_scheme(config)) + " boundaries: " + boundary +
         "; degrees that split it on boundaries: " + (ok.empty() ? "none" : ok));
  }
  if (dim == 0) {
    win.row0 = a;
    win.rows = b - a;
  } else {
    win.col0 = a;
    win.cols = b - a;
  }
  return win;
}

QuantView quant_view(const Checkpoint& ckpt, const QuantConfig& c, const QuantModule& m) {
  QuantView v;
  v.scheme = dequant_scheme(c);
  v.out = m.out;
  v.in = m.in;
  v.bits = c.bits;
  v.groups = m.groups;
  if (auto s = m.parts.find("scales");
      s != m.parts.end() && c.kind != QuantKind::kBnb4 && c.kind != QuantKind::kCtNvfp4) {
    v.scales_format = float_format(ckpt.find(s->second)->dtype);
  }
  const int64_t whole = std::max<int64_t>(m.in, 1);  // one group per row
  switch (c.kind) {
    case QuantKind::kGptq:
      v.group_size = c.group_size > 0 ? c.group_size : whole;
      v.zero_offset = c.gptq_v2 ? 0 : 1;
      break;
    case QuantKind::kAwq:
    case QuantKind::kCtPacked:
    case QuantKind::kCtNvfp4:
      v.group_size = c.group_size > 0 ? c.group_size : whole;
      break;
    case QuantKind::kBnb4:
      v.group_size = m.block;
      v.nested_block = m.nested_block;
      v.offset = m.nested_offset;
      break;
    case QuantKind::kBnb8:
      break;
    case QuantKind::kFp8Block:
      v.group_size = c.block_rows;
      v.block_in = c.block_cols;
      break;
  }
  return v;
}

QuantView with_data(QuantView v, const std::map<std::string, const void*>& data) {
  auto get = [&](const char* role) -> const void* {
    auto it = data.find(role);
    return it == data.end() ? nullptr : it->second;
  };
  v.q = get("q");
  v.zeros = get("zeros");
  v.scales = get("scales");
  v.g_idx = get("g_idx");
  v.code = get("code");
  v.nested_scales = get("nested_scales");
  v.nested_code = get("nested_code");
  v.global_scale = get("global");
  return v;
}

namespace {

// The module's stored parts leave the plain load (plan.rest); those the kernels read become raw
// byte slots of the plan, each named in d.parts by its role.
void add_parts(DequantPlan& plan, DequantTarget& d, const QuantModule& m, const Checkpoint& ckpt) {
  for (const auto& [role, name] : m.parts) {
    plan.rest.lookup.erase(name);
    if (!loaded_role(role)) continue;
    const TensorRef& r = ckpt.lookup.at(name);
    const TensorInfo& info = ckpt.tensor(r);
    SlotSpec s;
    s.name = name;
    s.file = r.file;
    s.data_offset = ckpt.files[r.file].data_start + info.begin;
    s.stored_shape = {static_cast<int64_t>(info.nbytes() / (dtype_bits(info.dtype) / 8))};
    s.stored_dtype = s.dtype = raw_dtype(info.dtype);
    d.parts.emplace_back(role, plan.parts.size());
    plan.parts.push_back(std::move(s));
  }
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
  plan.layout = dequant_layout(ckpt);
  plan.dequantized.assign(targets.size(), false);
  plan.rest = ckpt;
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].computed) by_name.emplace(targets[i].name, i);
  }
  std::vector<MismatchItem> mismatched;
  for (size_t k = 0; k < plan.layout.modules.size(); ++k) {
    const QuantModule& m = plan.layout.modules[k];
    const std::string weight = m.name + ".weight";
    std::optional<std::string> mname = weight;
    if (opt.names.checkpoint_to_module) mname = opt.names.checkpoint_to_module(weight);
    if (!mname) continue;
    auto it = by_name.find(*mname);
    if (it == by_name.end()) continue;  // no target: its parts stay, unexpected under strict
    const LoadTarget& t = targets[it->second];
    DequantTarget d;
    d.target = it->second;
    d.module = k;
    const std::string where = quote_text(weight, '\'') + " (" +
                              quant_scheme_name(dequant_scheme(plan.layout.config)) + ", " +
                              shape_str(std::vector<int64_t>{m.out, m.in}) + ")";
    std::optional<TpShard> shard;
    if (opt.tp_size > 1) {
      try {
        shard = opt.names.tp_shard(t.name, {m.out, m.in}, opt.tp_rank, opt.tp_size);
      } catch (const std::exception& e) {
        mismatched.push_back({t.name, ": no TP shard for rank " + std::to_string(opt.tp_rank) +
                                          " of " + std::to_string(opt.tp_size) + ": " +
                                          escape_text(e.what())});
        continue;
      }
    }
    d.window = dequant_window(ckpt, plan.layout.config, m, shard ? &*shard : nullptr, opt.tp_size);
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
    d.view = quant_view(ckpt, plan.layout.config, m);
    add_parts(plan, d, m, ckpt);
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
    std::map<std::string, const void*> host, dev;
    for (const auto& [role, i] : d.parts) {
      host[role] = parts.tensors[i].data_ptr();
      if (cuda) {
        on_device.push_back(parts.tensors[i].to(opt.device));
        dev[role] = on_device.back().data_ptr();
      }
    }
    const QuantView hv = with_data(d.view, host);
    try {
      check_g_idx(hv);
    } catch (const ShapeError& e) {
      for (const auto& [role, i] : d.parts) {
        if (role == "g_idx") {
          throw DequantError(files[plan.parts[i].file], plan.parts[i].name, "g_idx-range",
                             e.message());
        }
      }
      throw;
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
      dequant_cuda(with_data(d.view, dev), dst, nullptr);
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
  const QuantLayout layout = dequant_layout(
      open_checkpoint(ref, revision ? std::optional<std::string>(*revision) : std::nullopt));
  nlohmann::json weights = nlohmann::json::array();
  for (const QuantModule& m : layout.modules) {
    weights.push_back({{"weight", m.name + ".weight"},
                       {"scheme", quant_scheme_name(dequant_scheme(layout.config))},
                       {"shape", {m.out, m.in}},
                       {"parts", m.parts}});
  }
  return nlohmann::json{{"method", layout.config.method}, {"weights", weights}}.dump();
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("quant_layout(str ref, str? revision=None) -> str", &quant_layout_op);
}

}  // namespace metaload
