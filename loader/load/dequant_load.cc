#include "loader/load/dequant_load.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "base/checked.h"
#include "base/text.h"
#include "base/torch_library.h"
#include "kernels/dequant.h"
#include "loader/engine/page_copy.h"
#include "loader/load/swap.h"  // arena_tensor (HostArena, resolve_slot_pages, populate_pages)
#include "loader/tp/quant_split.h"

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

// One part read as a slice: [lo, hi) of dim `dim` of the part seen as `shape` (elements of its
// stored dtype, row-major; a flat part seen as a matrix where the slice is strided).
struct PartCut {
  std::vector<int64_t> shape;
  int dim = 0;
  int64_t lo = 0, hi = 0;
};

// A TP window read as slices of the parts: the kernel's view over those slices (its window is
// all of it), and the cut of each part that has the split dim (the others are read whole).
struct SlicedRead {
  QuantView view;
  std::map<std::string, PartCut> cuts;
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The groups [lo, hi) that inputs [a, b) fall in, when i / size - lo is the slice's own group
// of input a + i' (a on a group boundary, or the slice inside one group).
bool rebased_groups(int64_t a, int64_t b, int64_t size, int64_t* lo, int64_t* hi) {
  if (size <= 0) return false;
  *lo = a / size;
  *hi = ceil_div(b, size);
  return a % size == 0 || *hi - *lo == 1;
}

// A reader of one module's parts: its header shapes, and cuts that must fit them.
struct Cutter {
  const Checkpoint& ckpt;
  const QuantModule& m;
  SlicedRead& r;
  bool ok = true;

  std::vector<int64_t> stored(const std::string& role) const {
    return ckpt.find(m.parts.at(role))->shape;
  }
  // Cuts `role` (if the module has it) on `dim` of `shape` (empty: the header's shape).
  void cut(const std::string& role, int dim, int64_t lo, int64_t hi,
           std::vector<int64_t> shape = {}) {
    if (!m.parts.count(role)) return;
    const TensorInfo& t = *ckpt.find(m.parts.at(role));
    if (shape.empty()) shape = t.shape;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    // A part whose bytes do not tile `shape`: read it whole and dequantize the window instead.
    if (dim >= static_cast<int>(shape.size()) || lo < 0 || hi <= lo || hi > shape[dim] ||
        static_cast<uint64_t>(n) * (dtype_bits(t.dtype) / 8) != t.nbytes()) {
      ok = false;
      return;
    }
    r.cuts[role] = PartCut{std::move(shape), dim, lo, hi};
  }
};

// GPTQ: qweight [in / pack, out], qzeros [groups, out / pack], scales [groups, out], g_idx [in].
void cut_gptq(Cutter& c, int dim, int64_t a, int64_t b) {
  QuantView& v = c.r.view;
  const int64_t pack = 32 / v.bits;
  if (dim == 0) {
    c.ok = a % pack == 0 && (b - a) % pack == 0;
    c.cut("q", 1, a, b);
    c.cut("scales", 1, a, b);
    c.cut("zeros", 1, a / pack, b / pack);
    v.out = b - a;
    return;
  }
  c.ok = a % pack == 0;
  c.cut("q", 0, a / pack, ceil_div(b, pack));
  v.in = b - a;
  if (c.m.parts.count("g_idx")) {
    // g_idx may name any group (act-order): its slice, with every group's scales and zeros.
    c.cut("g_idx", 0, a, b);
    return;
  }
  int64_t lo = 0, hi = 0;
  c.ok = c.ok && rebased_groups(a, b, v.group_size, &lo, &hi);
  c.cut("scales", 0, lo, hi);
  c.cut("zeros", 0, lo, hi);
  v.groups = hi - lo;
}

// AWQ: qweight [in, out / 8], qzeros [groups, out / 8], scales [groups, out].
void cut_awq(Cutter& c, int dim, int64_t a, int64_t b) {
  QuantView& v = c.r.view;
  if (dim == 0) {
    c.ok = a % 8 == 0 && (b - a) % 8 == 0;
    c.cut("q", 1, a / 8, b / 8);
    c.cut("zeros", 1, a / 8, b / 8);
    c.cut("scales", 1, a, b);
    v.out = b - a;
    return;
  }
  int64_t lo = 0, hi = 0;
  c.ok = rebased_groups(a, b, v.group_size, &lo, &hi);
  c.cut("q", 0, a, b);
  c.cut("zeros", 0, lo, hi);
  c.cut("scales", 0, lo, hi);
  v.in = b - a;
  v.groups = hi - lo;
}

// bitsandbytes 4-bit: the flattened weight, two codes a byte, one absmax per block (double
// quantization: u8 codes and one nested absmax per nested_block blocks).
void cut_bnb4(Cutter& c, int dim, int64_t a, int64_t b) {
  QuantView& v = c.r.view;
  const int64_t bs = v.group_size, in = v.in;
  if (bs <= 0) {
    c.ok = false;
    return;
  }
  if (dim == 0) {  // rows: one flat range
    const int64_t k0 = a * in, k1 = b * in, b0 = k0 / bs, b1 = ceil_div(k1, bs);
    const bool nested = c.m.parts.count("nested_scales") > 0;
    int64_t n0 = 0, n1 = 0;  // the nested absmax of those blocks
    c.ok = k0 % bs == 0 && k0 % 2 == 0 &&
           (!nested || rebased_groups(b0, b1, v.nested_block, &n0, &n1));
    if (!c.ok) return;
    c.cut("q", 0, k0 / 2, ceil_div(k1, 2), {c.stored("q")[0]});
    c.cut("scales", 0, b0, b1, {c.stored("scales")[0]});
    if (nested) c.cut("nested_scales", 0, n0, n1);
    v.out = b - a;
    return;
  }
  // Columns: rows of whole blocks; a nested absmax spans rows, so that layout reads whole.
  c.ok = !c.m.parts.count("nested_scales") && in % bs == 0 && a % bs == 0 && b % bs == 0;
  if (!c.ok) return;
  c.cut("q", 1, a / 2, b / 2, {v.out, in / 2});
  c.cut("scales", 1, a / bs, b / bs, {v.out, in / bs});
  v.in = b - a;
}

// int8: weight [out, in], SCB [out]. FP8: weight [out, in], scales [out / br, in / bc] blocks.
void cut_rows_cols(Cutter& c, int dim, int64_t a, int64_t b) {
  QuantView& v = c.r.view;
  c.cut("q", dim, a, b);
  if (v.scheme == QuantScheme::kBnb8) {
    if (dim == 0) c.cut("scales", 0, a, b);
  } else {  // FP8
    int64_t lo = 0, hi = 0;
    c.ok = c.ok && rebased_groups(a, b, dim == 0 ? v.group_size : v.block_in, &lo, &hi);
    c.cut("scales", dim, lo, hi);
  }
  (dim == 0 ? v.out : v.in) = b - a;
}

// compressed-tensors int: weight_packed [out, words] (a bit stream per row), weight_scale
// [out, groups], weight_zero_point [words down out, groups]. NVFP4: weight_packed [out, in / 2],
// weight_scale [out, groups].
void cut_ct(Cutter& c, int dim, int64_t a, int64_t b) {
  QuantView& v = c.r.view;
  const bool fp4 = v.scheme == QuantScheme::kNvfp4;
  const int64_t bits = fp4 ? 4 : v.bits;
  // The zero points run down out and the codes along in, as bit streams cut on word boundaries.
  const bool on_word = (a * bits) % 32 == 0;
  if (dim == 0) {
    c.ok = on_word || !c.m.parts.count("zeros");
    c.cut("q", 0, a, b);
    c.cut("scales", 0, a, b);
    c.cut("zeros", 0, a * bits / 32, ceil_div(b * bits, 32));
    v.out = b - a;
    return;
  }
  int64_t lo = 0, hi = 0;
  c.ok = (fp4 ? a % 2 == 0 : on_word) && rebased_groups(a, b, v.group_size, &lo, &hi);
  if (fp4) {
    c.ok = c.ok && (b - a) % 2 == 0;
    c.cut("q", 1, a / 2, b / 2);
  } else {
    c.cut("q", 1, a * bits / 32, ceil_div(b * bits, 32));
  }
  c.cut("scales", 1, lo, hi);
  c.cut("zeros", 1, lo, hi);
  v.in = b - a;
  v.groups = hi - lo;
}

// How a rank reads only its window: the slices of the parts and the view over them, or nothing
// (no window, or one the kernel's indexing cannot rebase: then the parts are read whole).
std::optional<SlicedRead> sliced_read(const Checkpoint& ckpt, const QuantModule& m,
                                      const QuantView& view, const DequantWindow& w) {
  const int dim = w.rows != m.out ? 0 : (w.cols != m.in ? 1 : -1);
  if (dim < 0) return std::nullopt;
  const int64_t a = dim == 0 ? w.row0 : w.col0;
  const int64_t b = a + (dim == 0 ? w.rows : w.cols);
  SlicedRead r{view, {}};
  Cutter c{ckpt, m, r};
  switch (view.scheme) {
    case QuantScheme::kGptq:
      cut_gptq(c, dim, a, b);
      break;
    case QuantScheme::kAwq:
      cut_awq(c, dim, a, b);
      break;
    case QuantScheme::kBnb4:
      cut_bnb4(c, dim, a, b);
      break;
    case QuantScheme::kBnb8:
    case QuantScheme::kFp8:
      cut_rows_cols(c, dim, a, b);
      break;
    case QuantScheme::kCtInt:
    case QuantScheme::kNvfp4:
      cut_ct(c, dim, a, b);
      break;
  }
  if (!c.ok) return std::nullopt;
  return r;
}

// The module's stored parts leave the plain load (plan.rest); those the kernels read become raw
// byte slots of the plan, each named in d.parts by its role; a part `cuts` names is read as that
// slice only (the bytes beside it are other ranks').
void add_parts(DequantPlan& plan, DequantTarget& d, const QuantModule& m, const Checkpoint& ckpt,
               const std::map<std::string, PartCut>& cuts) {
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
    if (auto c = cuts.find(role); c != cuts.end()) {
      TpShard shard;
      shard.dim = c->second.dim;
      shard.ranges = {{c->second.lo, c->second.hi}};
      shard.shape = c->second.shape;
      shard.shape[shard.dim] = c->second.hi - c->second.lo;
      s.stored_shape = c->second.shape;
      s.shard = std::move(shard);
    }
    d.parts.emplace_back(role, plan.parts.size());
    plan.parts.push_back(std::move(s));
  }
}

}  // namespace

namespace {

// The window target `t` takes of module `m` (this rank's, under TP), or none: a mismatch added
// to `bad` (no TP shard for the name, a target of another shape).
std::optional<DequantWindow> window_of(const LoadTarget& t, const QuantModule& m,
                                       const Checkpoint& ckpt, const QuantConfig& config,
                                       const LoadOptions& opt, std::vector<MismatchItem>& bad) {
  const std::string rank =
      " (rank " + std::to_string(opt.tp_rank) + " of " + std::to_string(opt.tp_size) + ")";
  std::optional<TpShard> shard;
  if (opt.tp_size > 1) {
    try {
      shard = opt.names.tp_shard(t.name, {m.out, m.in}, opt.tp_rank, opt.tp_size);
    } catch (const std::exception& e) {
      bad.push_back({t.name, ": no TP shard for rank " + std::to_string(opt.tp_rank) + " of " +
                                 std::to_string(opt.tp_size) + ": " + escape_text(e.what())});
      return std::nullopt;
    }
  }
  const DequantWindow w = dequant_window(ckpt, config, m, shard ? &*shard : nullptr, opt.tp_size);
  const std::vector<int64_t> shape = {w.rows, w.cols}, whole = {m.out, m.in};
  // A meta target of the whole weight takes its window's shape in the swap, as a plain one
  // takes its shard's (plan.cc's takes_shard_shape).
  const bool defined = t.tensor.defined();
  if (defined && (t.tensor.sizes().vec() == shape ||
                  (opt.tp_size > 1 && t.tensor.is_meta() && t.tensor.sizes().vec() == whole))) {
    return w;
  }
  const std::string where = quote_text(m.name + ".weight", '\'') + " (" +
                            quant_scheme_name(dequant_scheme(config)) + ", " + shape_str(whole) +
                            ")";
  bad.push_back({t.name, ": shape " + (defined ? shape_str(t.tensor.sizes().vec()) : "?") +
                             " in the module but " + where + " dequantizes to " + shape_str(shape) +
                             (opt.tp_size > 1 ? rank : "")});
  return std::nullopt;
}

// d's kernel parameters and parts. A TP rank reads only its window's packed bytes and scales,
// where the kernels' indexing allows (sliced_read); otherwise the whole parts, of which it
// dequantizes the window.
void add_reads(DequantPlan& plan, DequantTarget& d, const QuantModule& m, const Checkpoint& ckpt) {
  d.view = quant_view(ckpt, plan.layout.config, m);
  std::map<std::string, PartCut> cuts;
  if (auto sliced = sliced_read(ckpt, m, d.view, d.window)) {
    d.view = sliced->view;
    d.window = DequantWindow{0, d.window.rows, 0, d.window.cols};
    cuts = std::move(sliced->cuts);
  }
  add_parts(plan, d, m, ckpt, cuts);
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
  std::vector<MismatchItem> bad;
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
    const std::optional<DequantWindow> w = window_of(t, m, ckpt, plan.layout.config, opt, bad);
    if (!w) continue;
    d.window = *w;
    add_reads(plan, d, m, ckpt);
    plan.dequantized[d.target] = true;
    plan.targets.push_back(std::move(d));
  }
  if (!bad.empty()) {
    const std::string summary = "checkpoint " + quote_text(ckpt.ref, '\'') +
                                " does not fit: 0 missing, 0 unexpected, " +
                                std::to_string(bad.size()) + " mismatched";
    throw MismatchError(summary, {}, {}, std::move(bad));
  }
  return plan;
}

namespace {

// The kernels' view of target `d` over the parts in `host`; a g_idx naming a group that does not
// exist is the load's DequantError (g_idx-range) naming its tensor.
QuantView checked_view(const DequantPlan& plan, const std::vector<std::string>& files,
                       const DequantTarget& d, const std::map<std::string, const void*>& host) {
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
  return hv;
}

DequantDst window_dst(const DequantWindow& w, int fmt, void* data) {
  DequantDst dst;
  dst.data = data;
  dst.format = fmt;
  dst.ld = w.cols;
  dst.row0 = w.row0;
  dst.rows = w.rows;
  dst.col0 = w.col0;
  dst.cols = w.cols;
  return dst;
}

// CPU: the outputs share one arena, as the copying load's slots do, with its page policy (huge
// pages, or 4 KiB pages populated just before they are written), and the load's engine threads
// run the kernels, taking tiles of rows of every weight in turn.
std::vector<at::Tensor> dequant_on_cpu(const DequantPlan& plan, const std::vector<QuantView>& views,
                                       at::ScalarType dtype, int fmt, const EngineOptions& engine) {
  const uint64_t es = fmt == 0 ? 4 : 2;
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const DequantTarget& d : plan.targets) {
    offsets.push_back(total);
    const uint64_t bytes = static_cast<uint64_t>(d.window.rows) * d.window.cols * es;
    total = checked_add(total, (bytes + 63) / 64 * 64, "bytes of the dequantized weights");
  }
  const bool small = resolve_slot_pages(engine.slot_pages) == SlotPages::kSmall;
  const std::shared_ptr<HostArena> arena = HostArena::create(total, !small);
  std::vector<at::Tensor> out;
  std::vector<DequantJob> jobs;
  for (size_t k = 0; k < plan.targets.size(); ++k) {
    const DequantWindow& w = plan.targets[k].window;
    out.push_back(arena_tensor(arena, offsets[k], {w.rows, w.cols}, dtype));
    jobs.push_back({views[k], window_dst(w, fmt, arena->data() + offsets[k])});
  }
  // 4 KiB pages: filled in one pass from each tile's buffer where userfaultfd allows (as the
  // copying load fills its slots, loader/engine/page_copy.h), else populated, then written.
  std::unique_ptr<PageCopier> copier;
  if (copies_slot_pages(engine)) copier = PageCopier::open(arena->data(), arena->size());
  if (copier) {
    std::atomic<bool> failed{false};
    dequant_cpu_jobs(jobs, engine.threads, nullptr, [&](void* dst, const void* src, size_t n) {
      const PageCopier::Source from{-1, static_cast<const unsigned char*>(src), 0};
      if (!copier->fill(static_cast<unsigned char*>(dst), from, n)) failed = true;
    });
    copier.reset();
    if (failed) throw ConversionError("dequantized rows could not be placed in their slots");
  } else {
    dequant_cpu_jobs(jobs, engine.threads, small ? DequantTouch(populate_pages) : DequantTouch());
  }
  return out;
}

}  // namespace

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
  std::vector<QuantView> views;  // every target checked before any is written
  for (const DequantTarget& d : plan.targets) {
    std::map<std::string, const void*> host;
    for (const auto& [role, i] : d.parts) host[role] = parts.tensors[i].data_ptr();
    views.push_back(checked_view(plan, files, d, host));
  }
  if (!opt.device.is_cuda()) {
    out = dequant_on_cpu(plan, views, dtype, fmt, engine);
  } else {
    std::vector<at::Tensor> on_device;  // the parts copied to the GPU, freed on return
    for (const DequantTarget& d : plan.targets) {
      std::map<std::string, const void*> dev;
      for (const auto& [role, i] : d.parts) {
        on_device.push_back(parts.tensors[i].to(opt.device));
        dev[role] = on_device.back().data_ptr();
      }
      at::Tensor t = at::empty({d.window.rows, d.window.cols},
                               at::TensorOptions().dtype(dtype).device(opt.device));
      dequant_cuda(with_data(d.view, dev), window_dst(d.window, fmt, t.data_ptr()), nullptr);
      out.push_back(std::move(t));
    }
    dequant_cuda_sync(nullptr);
  }
  for (const at::Tensor& t : out) report->slot_bytes += t.numel() * t.element_size();
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
