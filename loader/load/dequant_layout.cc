#include "loader/load/dequant_layout.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "loader/format/json_util.h"

namespace metaload {

namespace {

constexpr uint64_t kMaxQuantStateBytes = 1 << 16;  // bitsandbytes writes ~200 bytes

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int float_format(DType d) {
  return d == DType::F32 ? 0 : (d == DType::F16 ? 1 : 2);
}

// Looks parts up by name and raises the typed errors with file and tensor.
class Finder {
 public:
  Finder(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  std::optional<QuantPart> find(const std::string& name) const {
    auto it = ckpt_.lookup.find(name);
    if (it == ckpt_.lookup.end()) return std::nullopt;
    return QuantPart{name, &ckpt_.tensor(it->second), it->second.file};
  }
  std::string file(const QuantPart& p) const { return ckpt_.files[p.file].path; }

  [[noreturn]] void fail(const QuantPart& p, const std::string& rule,
                         const std::string& detail) const {
    throw DequantError(file(p), p.name, rule, detail);
  }

  // Adds part `name` as `role`; missing: "missing-part" naming what needs it.
  const QuantPart& need(QuantWeight& w, const std::string& role, const std::string& name,
                        const QuantPart& of, const char* scheme) const {
    std::optional<QuantPart> p = find(name);
    if (!p) {
      fail(of, "missing-part",
           std::string(scheme) + " weight without its '" + name + "' (" + role + ")");
    }
    return w.parts[role] = *p;
  }
  void dtype(const QuantPart& p, std::initializer_list<DType> ok, const char* what) const {
    if (std::find(ok.begin(), ok.end(), p.info->dtype) != ok.end()) return;
    std::string names;
    for (DType d : ok) names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
    fail(p, "dtype",
         std::string(what) + " is " + dtype_name(p.info->dtype) + ", expected " + names);
  }
  void shape(const QuantPart& p, const std::vector<int64_t>& want, const std::string& rule,
             const std::string& why) const {
    if (p.info->shape == want) return;
    fail(p, rule,
         "shape " + shape_str(p.info->shape) + ", expected " + shape_str(want) + " " + why);
  }
  void dims(const QuantPart& p, size_t n, const std::string& rule) const {
    if (p.info->shape.size() != n) {
      fail(p, rule,
           "shape " + shape_str(p.info->shape) + " has " + std::to_string(p.info->shape.size()) +
               " dims, expected " + std::to_string(n));
    }
  }
  std::string read(const QuantPart& p) const {
    const uint64_t n = p.info->nbytes();
    if (n > kMaxQuantStateBytes) {
      fail(p, "quant-state",
           std::to_string(n) + " bytes (at most " + std::to_string(kMaxQuantStateBytes) + ")");
    }
    std::string out(n, '\0');
    const std::string path = file(p);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ReadError(escape_path(path) + ": cannot open to read " + quote_text(p.name));
    const uint64_t at = ckpt_.files[p.file].data_start + p.info->begin;
    uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, &out[done], n - done, static_cast<off_t>(at + done));
      if (r <= 0) {
        ::close(fd);
        throw ReadError(escape_path(path) + ": short read of " + quote_text(p.name));
      }
      done += static_cast<uint64_t>(r);
    }
    ::close(fd);
    return out;
  }

 private:
  const Checkpoint& ckpt_;
};

// config.json's quantization_config, or null.
nlohmann::json quant_config(const Checkpoint& ckpt) {
  if (!ckpt.config_path) return nullptr;
  nlohmann::json cfg = read_config_json(*ckpt.config_path);
  if (!cfg.is_object() || !cfg.contains("quantization_config")) return nullptr;
  const nlohmann::json& q = cfg["quantization_config"];
  if (!q.is_object()) {
    throw DequantError(*ckpt.config_path, "", "quant-config",
                       "quantization_config is not an object");
  }
  return q;
}

std::optional<int64_t> config_int(const nlohmann::json& qc, const char* key,
                                  const std::string& path) {
  if (!qc.is_object() || !qc.contains(key) || qc[key].is_null()) return std::nullopt;
  if (!qc[key].is_number_integer()) {
    throw DequantError(path, "", "quant-config",
                       std::string("quantization_config.") + key + " is not an integer");
  }
  return qc[key].get<int64_t>();
}

std::string scheme_method(QuantScheme s) {
  switch (s) {
    case QuantScheme::kGptq:
      return "gptq";
    case QuantScheme::kAwq:
      return "awq";
    case QuantScheme::kFp8:
      return "fp8";
    default:
      return "bitsandbytes";
  }
}

struct Ctx {
  const Checkpoint& ckpt;
  const Finder& f;
  const nlohmann::json& qc;
  std::string method;
  std::string config_path;
};

void contradiction(const Ctx& c, const QuantPart& p, const std::string& what) {
  c.f.fail(p, "config-contradiction",
           what + ", but " + escape_path(c.config_path) + " says quant_method '" + c.method + "'");
}

// GPTQ: bits (config.json, else the zeros' packing), the logical input dim (g_idx, else the packed
// rows) and qweight's shape. Returns values per int32.
int64_t gptq_dims(const Ctx& c, const std::string& prefix, const QuantPart& qw, const QuantPart& qz,
                  QuantWeight& w) {
  const Finder& f = c.f;
  const int64_t out = w.out;
  int64_t pack = 8;
  std::optional<int64_t> bits = config_int(c.qc, "bits", c.config_path);
  if (bits) {
    if (*bits != 2 && *bits != 4 && *bits != 8) {
      f.fail(qw, "unsupported",
             "GPTQ with " + std::to_string(*bits) + " bits (2, 4 and 8 have kernels)");
    }
    pack = 32 / *bits;
  } else {  // without config.json: the zeros' packing says
    pack = qz.info->shape[1] > 0 ? out / qz.info->shape[1] : 0;
    if (pack != 4 && pack != 8 && pack != 16) {
      f.fail(qz, "zeros-shape",
             "shape " + shape_str(qz.info->shape) + " packs " + prefix + ".scales' " +
                 std::to_string(out) + " columns into no 2, 4 or 8-bit fields");
    }
  }
  w.bits = static_cast<int>(32 / pack);
  // The logical input dim: g_idx has one entry per input row; else the packed rows say.
  std::optional<QuantPart> g = f.find(prefix + ".g_idx");
  if (g) {
    w.parts["g_idx"] = *g;
    f.dtype(*g, {DType::I32}, "g_idx");
    f.dims(*g, 1, "g_idx-shape");
    w.in = g->info->shape[0];
  } else {
    w.in = qw.info->shape[0] * pack;
  }
  if (w.in % pack != 0 || out % pack != 0) {
    f.fail(qw, "packed-shape",
           "logical shape " + shape_str({out, w.in}) + " does not pack into int32 words of " +
               std::to_string(pack) + " " + std::to_string(w.bits) + "-bit values");
  }
  f.shape(qw, {w.in / pack, out}, "packed-shape",
          "(" + std::to_string(w.in) + " input rows, " + std::to_string(pack) + " per int32, x " +
              std::to_string(out) + " outputs)");
  return pack;
}

// AWQ: only the GEMM layout with zero points, 4 bits; qweight packs out 8 to an int32.
void awq_dims(const Ctx& c, const std::string& prefix, const QuantPart& qw, QuantWeight& w) {
  const Finder& f = c.f;
  const int64_t out = w.out, cols = qw.info->shape[1];
  if (c.qc.is_object()) {
    if (std::optional<int64_t> bits = config_int(c.qc, "bits", c.config_path); bits && *bits != 4) {
      f.fail(qw, "unsupported", "AWQ with " + std::to_string(*bits) + " bits (4 has kernels)");
    }
    const std::string version = c.qc.contains("version") && c.qc["version"].is_string()
                                    ? lower(c.qc["version"].get<std::string>())
                                    : "gemm";
    if (version != "gemm") {
      f.fail(qw, "unsupported",
             "AWQ version '" + escape_text(version) + "' (the GEMM layout has kernels)");
    }
    if (c.qc.contains("zero_point") && c.qc["zero_point"] == false) {
      f.fail(qw, "unsupported", "AWQ without zero points");
    }
  }
  if (out % 8 != 0 || cols * 8 != out) {
    f.fail(qw, "packed-shape",
           "shape " + shape_str(qw.info->shape) + ": AWQ's qweight packs the " +
               std::to_string(out) + " output columns of " + prefix + ".scales 8 to an int32");
  }
  w.in = qw.info->shape[0];
}

// GPTQ and AWQ: P.qweight, P.qzeros, P.scales (+ P.g_idx for GPTQ).
QuantWeight packed_int(const Ctx& c, const std::string& prefix, const QuantPart& qw) {
  const Finder& f = c.f;
  QuantWeight w;
  w.weight = prefix + ".weight";
  w.parts["q"] = qw;
  f.dtype(qw, {DType::I32}, "qweight");
  f.dims(qw, 2, "packed-shape");
  const QuantPart& sc = f.need(w, "scales", prefix + ".scales", qw, "GPTQ/AWQ");
  f.dtype(sc, {DType::F16, DType::BF16, DType::F32}, "scales");
  f.dims(sc, 2, "scale-shape");
  const QuantPart& qz = f.need(w, "zeros", prefix + ".qzeros", qw, "GPTQ/AWQ");
  f.dtype(qz, {DType::I32}, "qzeros");
  f.dims(qz, 2, "zeros-shape");
  // scales are [groups, out] in both layouts; GPTQ's qweight has `out` columns, AWQ's out / 8.
  const int64_t cols = qw.info->shape[1], out = sc.info->shape[1];
  QuantScheme s;
  const bool gptq_shape = cols == out, awq_shape = cols * 8 == out;
  if (c.method == "gptq" || c.method == "awq") {
    s = c.method == "gptq" ? QuantScheme::kGptq : QuantScheme::kAwq;
    // Shapes that fit only the other layout: the config is what is wrong.
    if (s == QuantScheme::kGptq && awq_shape && !gptq_shape) s = QuantScheme::kAwq;
    if (s == QuantScheme::kAwq && gptq_shape && !awq_shape) s = QuantScheme::kGptq;
  } else if (gptq_shape) {
    s = QuantScheme::kGptq;
  } else if (awq_shape) {
    s = QuantScheme::kAwq;
  } else {
    f.fail(qw, "packed-shape",
           "shape " + shape_str(qw.info->shape) + " packs neither GPTQ's [in / pack, " +
               std::to_string(out) + "] nor AWQ's [in, " + std::to_string(out / 8) + "] for " +
               prefix + ".scales " + shape_str(sc.info->shape));
  }
  if (!c.method.empty() && c.method != scheme_method(s)) {
    contradiction(c, qw, "the tensors are " + scheme_method(s) + "'s");
  }
  w.scheme = s;
  w.out = out;
  const bool gptq = s == QuantScheme::kGptq;
  const int64_t pack = gptq ? gptq_dims(c, prefix, qw, qz, w) : 8;
  if (!gptq) awq_dims(c, prefix, qw, w);
  // Groups: config.json's group_size (-1: one group), else what the scales' rows imply.
  std::optional<int64_t> gs = config_int(c.qc, "group_size", c.config_path);
  const int64_t rows = sc.info->shape[0];
  if (gs) {
    w.group_size = *gs > 0 ? *gs : std::max<int64_t>(w.in, 1);
  } else {
    if (rows < 1 || w.in % rows != 0) {
      f.fail(sc, "scale-shape",
             "shape " + shape_str(sc.info->shape) + ": " + std::to_string(w.in) +
                 " input rows do not divide into " + std::to_string(rows) + " groups");
    }
    w.group_size = std::max<int64_t>(w.in / rows, 1);
  }
  w.groups = ceil_div(w.in, w.group_size);
  f.shape(sc, {w.groups, out}, "scale-shape",
          "(" + std::to_string(w.in) + " input rows in groups of " + std::to_string(w.group_size) +
              (gs ? " (config.json)" : "") + " x " + std::to_string(out) + " outputs)");
  f.shape(qz, {w.groups, out / pack}, "zeros-shape",
          "(groups x " + std::to_string(out) + " outputs / " + std::to_string(pack) + ")");
  if (gptq) {
    std::string format = "gptq";
    if (c.qc.is_object() && c.qc.contains("checkpoint_format") &&
        c.qc["checkpoint_format"].is_string()) {
      format = c.qc["checkpoint_format"].get<std::string>();
    }
    if (format != "gptq" && format != "gptq_v2") {
      f.fail(
          qw, "unsupported",
          "GPTQ checkpoint_format '" + escape_text(format) + "' (gptq and gptq_v2 have kernels)");
    }
    w.zero_offset = format == "gptq" ? 1 : 0;
  }
  return w;
}

// bitsandbytes 4-bit: the quant_state blob `p` (name `name`) and the parts it describes.
QuantWeight bnb4_weight(const Ctx& c, const std::string& name, const QuantPart& p) {
  const Finder& f = c.f;
  const std::string qt = name.substr(name.size() - 3);
  const std::string base = name.substr(0, name.size() - 30);  // "P.weight"
  QuantWeight w;
  w.scheme = QuantScheme::kBnb4;
  w.weight = base;
  w.parts["state"] = p;
  f.dtype(p, {DType::U8}, "quant_state");
  parse_quant_state(f.read(p), qt, f.file(p), name, w);
  const QuantPart& q = f.need(w, "q", base, p, "bitsandbytes 4-bit");
  f.dtype(q, {DType::U8}, "the packed weight");
  if (q.info->numel() != ceil_div(w.out * w.in, 2)) {
    f.fail(q, "packed-shape",
           "shape " + shape_str(q.info->shape) + " holds " + std::to_string(q.info->numel()) +
               " bytes, but " + shape_str({w.out, w.in}) + " (quant_state) packs into " +
               std::to_string(ceil_div(w.out * w.in, 2)));
  }
  const int64_t blocks = ceil_div(w.out * w.in, w.group_size);
  const QuantPart& am = f.need(w, "scales", base + ".absmax", q, "bitsandbytes 4-bit");
  f.dtype(am, {w.nested ? DType::U8 : DType::F32}, "absmax");
  f.shape(am, {blocks}, "scale-shape", "(one per " + std::to_string(w.group_size) + " elements)");
  const QuantPart& qm = f.need(w, "code", base + ".quant_map", q, "bitsandbytes 4-bit");
  f.dtype(qm, {DType::F32}, "quant_map");
  f.shape(qm, {16}, "scale-shape", "(16 codes)");
  if (w.nested) {
    const QuantPart& na =
        f.need(w, "nested_scales", base + ".nested_absmax", q, "double-quantized");
    f.dtype(na, {DType::F32}, "nested_absmax");
    f.shape(na, {ceil_div(blocks, w.nested_block)}, "scale-shape",
            "(one per " + std::to_string(w.nested_block) + " blocks)");
    const QuantPart& nq =
        f.need(w, "nested_code", base + ".nested_quant_map", q, "double-quantized");
    f.dtype(nq, {DType::F32}, "nested_quant_map");
    f.shape(nq, {256}, "scale-shape", "(256 codes)");
  } else if (f.find(base + ".nested_absmax")) {
    f.fail(p, "quant-state",
           "no nested_blocksize / nested_offset, but " + base + ".nested_absmax exists");
  }
  return w;
}

// bitsandbytes int8: P.SCB (`p`) and P.weight.
QuantWeight bnb8_weight(const Ctx& c, const std::string& name, const QuantPart& p) {
  const Finder& f = c.f;
  const std::string prefix = name.substr(0, name.size() - 4);
  QuantWeight w;
  w.scheme = QuantScheme::kBnb8;
  w.weight = prefix + ".weight";
  w.parts["scales"] = p;
  const QuantPart& q = f.need(w, "q", w.weight, p, "bitsandbytes int8");
  f.dtype(q, {DType::I8}, "the int8 weight");
  f.dims(q, 2, "packed-shape");
  w.out = q.info->shape[0];
  w.in = q.info->shape[1];
  f.dtype(p, {DType::F32, DType::F16, DType::BF16}, "SCB");
  f.shape(p, {w.out}, "scale-shape", "(one per output row)");
  if (std::optional<QuantPart> fmt = f.find(prefix + ".weight_format")) {
    w.parts["format"] = *fmt;
    f.dtype(*fmt, {DType::U8}, "weight_format");
    const std::string v = fmt->info->nbytes() == 1 ? f.read(*fmt) : std::string();
    if (v.size() != 1 || v[0] != 0) {
      f.fail(*fmt, "unsupported", "weight_format other than 0 (row-major)");
    }
  }
  return w;
}

// FP8: P.weight_scale_inv (`p`) and P.weight; the block from config.json, else 128 x 128.
QuantWeight fp8_weight(const Ctx& c, const std::string& name, const QuantPart& p) {
  const Finder& f = c.f;
  const nlohmann::json& qc = c.qc;
  const std::string prefix = name.substr(0, name.size() - 17);
  QuantWeight w;
  w.scheme = QuantScheme::kFp8;
  w.weight = prefix + ".weight";
  w.parts["scales"] = p;
  const QuantPart& q = f.need(w, "q", w.weight, p, "FP8");
  if (q.info->dtype == DType::F8_E5M2) f.fail(q, "unsupported", "FP8 e5m2 (e4m3 has kernels)");
  f.dtype(q, {DType::F8_E4M3}, "the FP8 weight");
  f.dims(q, 2, "packed-shape");
  w.out = q.info->shape[0];
  w.in = q.info->shape[1];
  f.dtype(p, {DType::F32, DType::BF16, DType::F16}, "weight_scale_inv");
  w.group_size = w.block_in = 128;
  if (qc.is_object() && qc.contains("weight_block_size")) {
    const nlohmann::json& b = qc["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() < 1 || b[1].get<int64_t>() < 1) {
      throw DequantError(c.config_path, "", "quant-config",
                         "quantization_config.weight_block_size is not [rows, cols]");
    }
    w.group_size = b[0].get<int64_t>();
    w.block_in = b[1].get<int64_t>();
  }
  f.shape(
      p, {ceil_div(w.out, w.group_size), ceil_div(w.in, w.block_in)}, "scale-shape",
      "(one per " + std::to_string(w.group_size) + " x " + std::to_string(w.block_in) + " block)");
  return w;
}

}  // namespace

void parse_quant_state(const std::string& blob, const std::string& quant_type,
                       const std::string& file, const std::string& tensor, QuantWeight& w) {
  auto bad = [&](const std::string& why) { throw DequantError(file, tensor, "quant-state", why); };
  nlohmann::json j;
  try {
    j = parse_json_strict(blob, file);
  } catch (const FormatError& e) {
    bad("not JSON: " + e.detail());
  }
  if (!j.is_object()) bad("not a JSON object");
  auto need_int = [&](const char* key, int64_t lo) {
    if (!j.contains(key) || !j[key].is_number_integer())
      bad(std::string("no integer \"") + key + "\"");
    const int64_t v = j[key].get<int64_t>();
    if (v < lo) bad(std::string("\"") + key + "\" is " + std::to_string(v));
    return v;
  };
  if (!j.contains("quant_type") || !j["quant_type"].is_string()) bad("no string \"quant_type\"");
  const std::string qt = j["quant_type"].get<std::string>();
  if (qt != quant_type) {
    bad("\"quant_type\" is \"" + escape_text(qt) + "\" but the tensor's name says " + quant_type);
  }
  w.group_size = need_int("blocksize", 1);
  if (!j.contains("shape") || !j["shape"].is_array() || j["shape"].size() != 2) {
    bad("\"shape\" is not [out, in]");
  }
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("\"shape\" is not [out, in]");
  }
  w.out = j["shape"][0].get<int64_t>();
  w.in = j["shape"][1].get<int64_t>();
  if (w.in > 0 && w.out > (int64_t{1} << 62) / w.in) bad("\"shape\" is too large");
  if (j.contains("dtype") && !j["dtype"].is_string()) bad("\"dtype\" is not a string");
  w.nested = j.contains("nested_blocksize") || j.contains("nested_offset");
  if (w.nested) {
    w.nested_block = need_int("nested_blocksize", 1);
    if (!j.contains("nested_offset") || !j["nested_offset"].is_number()) {
      bad("double quantization without a number \"nested_offset\"");
    }
    w.offset = j["nested_offset"].get<float>();
  }
}

std::string QuantWeight::file_of(const Checkpoint& ckpt) const {
  return ckpt.files[parts.at("q").file].path;
}

QuantLayout find_quant_layout(const Checkpoint& ckpt) {
  Finder f(ckpt);
  nlohmann::json qc = quant_config(ckpt);
  QuantLayout out;
  if (qc.is_object()) {
    if (!qc.contains("quant_method") || !qc["quant_method"].is_string()) {
      throw DequantError(*ckpt.config_path, "", "unknown-scheme",
                         "quantization_config has no string quant_method");
    }
    out.method = lower(qc["quant_method"].get<std::string>());
    static const std::set<std::string> known = {"gptq", "awq", "bitsandbytes", "fp8"};
    if (!known.count(out.method)) {
      throw DequantError(*ckpt.config_path, "", "unknown-scheme",
                         "quantization_config.quant_method '" + escape_text(out.method) +
                             "' cannot be dequantized (kernels exist for gptq, awq, bitsandbytes "
                             "and fp8)");
    }
  }
  const Ctx c{ckpt, f, qc, out.method, ckpt.config_path.value_or("")};
  for (const std::string& name : ckpt.tensor_names()) {
    const QuantPart p = *f.find(name);
    std::optional<QuantWeight> w;
    if (ends_with(name, ".qweight")) {
      w = packed_int(c, name.substr(0, name.size() - 8), p);
    } else if (ends_with(name, ".weight.quant_state.bitsandbytes__nf4") ||
               ends_with(name, ".weight.quant_state.bitsandbytes__fp4")) {
      w = bnb4_weight(c, name, p);
    } else if (ends_with(name, ".SCB")) {
      w = bnb8_weight(c, name, p);
    } else if (ends_with(name, ".weight_scale_inv")) {
      w = fp8_weight(c, name, p);
    }
    if (!w) continue;
    if (!out.method.empty() && out.method != scheme_method(w->scheme)) {
      contradiction(c, w->parts.begin()->second,
                    "the tensors are " + scheme_method(w->scheme) + "'s");
    }
    out.weights.push_back(std::move(*w));
  }
  return out;
}

// The boundary a slice of `dim` must start and end on (an end at the dim's size is always fine)
// and its description; a message instead where no slice of `dim` can work.
static std::string boundary(const QuantWeight& w, int dim, int64_t& unit, std::string& rule) {
  unit = 1;
  switch (w.scheme) {
    case QuantScheme::kGptq: {
      const int64_t pack = 32 / w.bits;
      if (dim == 0) {
        unit = pack;
        rule = "output rows in packs of " + std::to_string(pack) + " (qzeros holds " +
               std::to_string(pack) + " " + std::to_string(w.bits) + "-bit zeros per int32)";
      } else {
        unit = std::max(pack, w.group_size);
        if (unit % pack != 0) unit *= pack;
        rule = "input columns on groups of " + std::to_string(w.group_size) + " and packs of " +
               std::to_string(pack);
      }
      break;
    }
    case QuantScheme::kAwq:
      unit = dim == 0 ? 8 : w.group_size;
      rule = dim == 0 ? "output rows in packs of 8 (AWQ packs 8 output columns per int32)"
                      : "input columns on groups of " + std::to_string(w.group_size);
      break;
    case QuantScheme::kBnb4:
      // Blocks run over the flattened weight: a row slice stays on blocks when rows * in does;
      // a column slice needs every row to start on a block.
      if (dim == 0) {
        unit = w.group_size / std::gcd(w.group_size, std::max<int64_t>(w.in, 1));
        rule = "blocks of " + std::to_string(w.group_size) + " elements of the flattened weight (" +
               std::to_string(unit) + " rows of " + std::to_string(w.in) + ")";
      } else {
        unit = w.group_size;
        rule = "blocks of " + std::to_string(w.group_size) + " elements in every row";
        if (w.in % w.group_size != 0 && w.out > 1) {
          return std::string("cannot split the input dim: rows of " + std::to_string(w.in) +
                             " elements do not start on blocks of " + std::to_string(w.group_size) +
                             " (split the output dim instead)");
        }
      }
      break;
    case QuantScheme::kFp8:
      unit = dim == 0 ? w.group_size : w.block_in;
      rule = std::string(dim == 0 ? "rows" : "columns") + " on blocks of " + std::to_string(unit);
      break;
    case QuantScheme::kBnb8:
      break;
  }
  return "";
}

DequantWindow dequant_window(const Checkpoint& ckpt, const QuantWeight& w, const TpShard* shard,
                             int tp_size) {
  DequantWindow win{0, w.out, 0, w.in};
  if (shard == nullptr || shard->dim < 0) return win;
  const QuantPart& q = w.part("q");
  auto fail = [&](const std::string& why) {
    throw DequantError(ckpt.files[q.file].path, w.weight, "tp-boundary", why);
  };
  if (shard->dim > 1 || shard->ranges.size() != 1) {
    fail("a tensor-parallel shard of a quantized weight must be one range of dim 0 or 1");
  }
  const int dim = shard->dim;
  const int64_t len = dim == 0 ? w.out : w.in;
  int64_t unit = 1;
  std::string rule;
  if (std::string no = boundary(w, dim, unit, rule); !no.empty()) fail(no);
  const int64_t a = shard->ranges[0].first, b = shard->ranges[0].second;
  if (a < 0 || b < a || b > len) fail("shard range outside the weight");
  if (a % unit != 0 || (b % unit != 0 && b != len)) {
    std::string ok;
    int n_ok = 0;
    for (int64_t n = 1; n <= std::min<int64_t>(len, 1024); ++n) {
      if (len % n == 0 && (len / n) % unit == 0) ok += (n_ok++ ? ", " : "") + std::to_string(n);
    }
    fail("tensor-parallel degree " + std::to_string(tp_size) + " splits " +
         std::string(dim == 0 ? "the output dim (" : "the input dim (") + std::to_string(len) +
         ") at " + std::to_string(a % unit != 0 ? a : b) + ", off the " + scheme_method(w.scheme) +
         " boundaries: " + rule +
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

QuantView quant_view(const QuantWeight& w, const std::map<std::string, const void*>& data) {
  auto get = [&](const char* role) -> const void* {
    auto it = data.find(role);
    return it == data.end() ? nullptr : it->second;
  };
  QuantView v;
  v.scheme = w.scheme;
  v.out = w.out;
  v.in = w.in;
  v.q = get("q");
  v.zeros = get("zeros");
  v.scales = get("scales");
  if (w.has("scales") && w.scheme != QuantScheme::kBnb4) {
    v.scales_format = float_format(w.part("scales").info->dtype);
  }
  v.g_idx = get("g_idx");
  v.code = get("code");
  v.nested_scales = w.nested ? get("nested_scales") : nullptr;
  v.nested_code = get("nested_code");
  v.offset = w.offset;
  v.bits = w.bits;
  v.group_size = w.group_size;
  v.block_in = w.block_in;
  v.nested_block = w.nested_block;
  v.groups = w.groups;
  v.zero_offset = w.zero_offset;
  return v;
}

}  // namespace metaload
