#include "loader/format/quant_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "base/checked.h"
#include "base/text.h"
#include "loader/format/file_io.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

// Every tensor suffix a scheme stores beside (or instead of) a plain weight: a tensor with one of
// another scheme's suffixes contradicts the config.
struct SchemeSuffixes {
  QuantKind kind;
  std::vector<std::string_view> suffixes;
};
const std::vector<SchemeSuffixes>& scheme_suffixes() {
  static const std::vector<SchemeSuffixes> s = {
      {QuantKind::kBnb4,
       {".weight.absmax", ".weight.quant_map", ".weight.nested_absmax", ".weight.nested_quant_map",
        ".weight.quant_state.bitsandbytes__nf4", ".weight.quant_state.bitsandbytes__fp4"}},
      {QuantKind::kBnb8, {".SCB", ".weight_format"}},
      {QuantKind::kGptq, {".qweight", ".qzeros", ".scales", ".g_idx"}},
      {QuantKind::kAwq, {".qweight", ".qzeros", ".scales"}},
      {QuantKind::kFp8Block, {".weight_scale_inv"}},
      {QuantKind::kCtPacked,
       {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx"}},
      {QuantKind::kCtNvfp4,
       {".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale"}},
  };
  return s;
}

const char* scheme_words(QuantKind k) {
  switch (k) {
    case QuantKind::kBnb4:
      return "bitsandbytes 4-bit";
    case QuantKind::kBnb8:
      return "bitsandbytes int8";
    case QuantKind::kGptq:
      return "GPTQ";
    case QuantKind::kAwq:
      return "AWQ";
    case QuantKind::kFp8Block:
      return "FP8 block";
    case QuantKind::kCtPacked:
      return "compressed-tensors pack-quantized";
    case QuantKind::kCtNvfp4:
      return "compressed-tensors NVFP4";
  }
  return "?";
}

// The checks of one checkpoint, with the file of each tensor for messages.
class Recogniser {
 public:
  Recogniser(const Checkpoint& c, const QuantConfig& cfg, const std::string& config_path,
             const TensorBytes& bytes, bool require_modules)
      : c_(c),
        cfg_(cfg),
        config_path_(config_path),
        bytes_(bytes),
        require_modules_(require_modules) {}

  QuantLayout run() {
    check_foreign();
    QuantLayout out;
    out.config = cfg_;
    for (const std::string& name : c_.tensor_names()) {
      std::optional<QuantModule> m = module_for(name);
      if (!m) continue;
      out.weight_bytes = checked_add(out.weight_bytes, m->weight_bytes, "quantized weight bytes");
      out.aux_bytes = checked_add(out.aux_bytes, m->aux_bytes, "quantization aux bytes");
      out.n_quantized_params =
          checked_add(out.n_quantized_params, m->n_params, "quantized parameters");
      out.modules.push_back(std::move(*m));
    }
    if (out.modules.empty() && require_modules_) {
      throw QuantLayoutError(config_path_, "", "no-quantized-tensors",
                             std::string("quantization_config says ") + scheme_words(cfg_.kind) +
                                 ", but no tensor of the checkpoint is stored that way");
    }
    std::sort(out.modules.begin(), out.modules.end(),
              [](const QuantModule& a, const QuantModule& b) { return a.name < b.name; });
    return out;
  }

 private:
  const Checkpoint& c_;
  const QuantConfig& cfg_;
  std::string config_path_;
  const TensorBytes& bytes_;
  bool require_modules_;

  // Where the scheme came from, for messages.
  std::string says() const {
    return cfg_.inferred ? std::string("the checkpoint's other quantized tensors are ") +
                               scheme_words(cfg_.kind)
                         : std::string("quantization_config says ") + scheme_words(cfg_.kind) +
                               " (quant_method " + quote_text(cfg_.method, '\'') + ")";
  }

  std::string file(const std::string& name) const {
    const SafetensorsHeader* f = c_.file_of(name);
    return f ? f->path : c_.dir;
  }

  [[noreturn]] void fail(const std::string& tensor, const std::string& rule,
                         const std::string& detail) const {
    throw QuantLayoutError(file(tensor), tensor, rule, detail);
  }

  const TensorInfo& need(const std::string& owner, const std::string& name) const {
    const TensorInfo* t = c_.find(name);
    if (!t) {
      fail(owner, "missing-tensor",
           std::string(scheme_words(cfg_.kind)) + " needs " + quote_text(name, '\'') +
               " beside it; the checkpoint has no such tensor");
    }
    return *t;
  }

  void dtype_is(const TensorInfo& t, std::initializer_list<DType> ok, const char* what) const {
    if (std::find(ok.begin(), ok.end(), t.dtype) != ok.end()) return;
    std::string names;
    for (DType d : ok) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail(t.name, "wrong-dtype",
         std::string(what) + " is " + dtype_name(t.dtype) + ", " + scheme_words(cfg_.kind) +
             " stores " + names);
  }

  void shape_is(const TensorInfo& t, const std::vector<int64_t>& want, const char* rule,
                const std::string& why) const {
    if (t.shape == want) return;
    fail(t.name, rule,
         "shape " + shape_text(t.shape) + ", expected " + shape_text(want) + " (" + why + ")");
  }

  void check_foreign() const {
    const auto& all = scheme_suffixes();
    std::vector<std::string_view> own;
    for (const auto& s : all) {
      if (s.kind == cfg_.kind) own = s.suffixes;
    }
    // In name order, so that the tensor named does not depend on the files' layout.
    for (const std::string& name : c_.tensor_names()) {
      for (const auto& s : all) {
        if (s.kind == cfg_.kind) continue;
        for (auto suffix : s.suffixes) {
          if (!ends_with(name, suffix)) continue;
          if (std::find(own.begin(), own.end(), suffix) != own.end()) continue;
          fail(name, "foreign-tensor",
               std::string("a ") + scheme_words(s.kind) + " tensor ('" + std::string(suffix) +
                   "'), but " + says());
        }
      }
    }
  }

  // An aux tensor, and its role for a dequantizing load (none: describe's bytes only).
  void add_aux(QuantModule& m, const TensorInfo& t, const char* role = nullptr) const {
    m.aux_bytes = checked_add(m.aux_bytes, t.nbytes(), "quantization aux bytes");
    m.aux_tensors.push_back(t.name);
    if (role) m.parts[role] = t.name;
  }

  void set_weight(QuantModule& m, const TensorInfo& t, int64_t out, int64_t in) const {
    m.parts["q"] = t.name;
    m.weight_tensor = t.name;
    m.weight_bytes = t.nbytes();
    m.out = out;
    m.in = in;
    m.n_params = checked_mul<uint64_t>(static_cast<uint64_t>(out), static_cast<uint64_t>(in),
                                       "logical elements of " + t.name);
  }

  // The module a tensor anchors (its packed weight or its scheme's unique tensor), or nullopt.
  std::optional<QuantModule> module_for(const std::string& name) const {
    switch (cfg_.kind) {
      case QuantKind::kBnb4:
        return bnb4(name);
      case QuantKind::kBnb8:
        return bnb8(name);
      case QuantKind::kGptq:
        return gptq_awq(name, /*awq=*/false);
      case QuantKind::kAwq:
        return gptq_awq(name, /*awq=*/true);
      case QuantKind::kFp8Block:
        return fp8(name);
      case QuantKind::kCtPacked:
        return ct_packed(name);
      case QuantKind::kCtNvfp4:
        return ct_nvfp4(name);
    }
    return std::nullopt;
  }

  // ---- bitsandbytes 4-bit ----------------------------------------------------------------------

  struct BlobInfo {
    std::vector<int64_t> shape;  // [out, in]
    uint64_t n = 1;              // logical elements
    int64_t blocksize = 0;
    std::optional<int64_t> nested_blocksize;
    float nested_offset = 0;
  };

  // The quant_state blob `blob` (its name says `type`: "nf4" | "fp4"), as bitsandbytes writes it:
  // a JSON object with quant_type, blocksize, shape [out, in], dtype, and for double quantization
  // nested_blocksize and nested_offset. Rule "quant-state-blob" for anything else.
  BlobInfo parse_blob(const TensorInfo& blob, const std::string& type) const {
    auto bad = [&](const std::string& why) { fail(blob.name, "quant-state-blob", why); };
    if (type != "nf4" && type != "fp4")
      bad("quant type " + quote_text(type) + " is not nf4 or fp4");
    if (blob.dtype != DType::U8 || blob.shape.size() != 1) {
      bad("a quant_state blob is U8 of rank 1 (JSON bytes), not " +
          std::string(dtype_name(blob.dtype)) + " " + shape_text(blob.shape));
    }
    if (blob.nbytes() > kMaxQuantStateBytes) {
      bad(std::to_string(blob.nbytes()) + " bytes; a quant_state blob is at most " +
          std::to_string(kMaxQuantStateBytes));
    }
    const std::string text = bytes_(*c_.file_of(blob.name), blob);
    nlohmann::json j;
    try {
      j = parse_json_strict(text, file(blob.name));
    } catch (const FormatError& e) {
      bad("not JSON: " + e.detail());
    }
    if (!j.is_object()) bad("not a JSON object");
    auto need_int = [&](const char* key, int64_t lo) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_number_integer()) bad(std::string("no integer \"") + key + "\"");
      const int64_t v = it->get<int64_t>();
      if (v < lo) bad(std::string("\"") + key + "\" is " + std::to_string(v));
      return v;
    };
    auto qt = j.find("quant_type");
    if (qt == j.end() || !qt->is_string()) bad("no string \"quant_type\"");
    if (qt->get<std::string>() != type) {
      bad("\"quant_type\" is " + quote_text(qt->get<std::string>()) +
          " but the tensor's name says " + type);
    }
    BlobInfo b;
    b.blocksize = need_int("blocksize", 1);
    auto sh = j.find("shape");
    if (sh == j.end() || !sh->is_array() || sh->size() != 2) bad("\"shape\" is not [out, in]");
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("\"shape\" is not [out, in]");
      b.shape.push_back(d.get<int64_t>());
    }
    const auto n = mul_or_none(b.shape[0], b.shape[1]);
    if (!n || *n > (int64_t{1} << 62)) bad("\"shape\" is too large");
    b.n = static_cast<uint64_t>(*n);
    if (j.contains("dtype") && !j["dtype"].is_string()) bad("\"dtype\" is not a string");
    if (j.contains("nested_blocksize") || j.contains("nested_offset")) {
      b.nested_blocksize = need_int("nested_blocksize", 1);
      if (!j.contains("nested_offset") || !j["nested_offset"].is_number()) {
        bad("double quantization without a number \"nested_offset\"");
      }
      const double offset = j["nested_offset"].get<double>();
      // bitsandbytes stores it as a float32; past that range it would dequantize to inf.
      if (!(std::fabs(offset) <= std::numeric_limits<float>::max())) {
        bad("\"nested_offset\" is " + j["nested_offset"].dump() + ", outside float32's range");
      }
      b.nested_offset = static_cast<float>(offset);
    }
    return b;
  }

  // absmax (and double quantization's nested absmax and code book), quant_map.
  void bnb4_stats(const std::string& name, const std::string& w, const BlobInfo& b,
                  QuantModule& m) const {
    const uint64_t blocks = ceil_div(b.n, static_cast<uint64_t>(b.blocksize));
    const TensorInfo* nested = c_.find(w + ".nested_absmax");
    if ((nested != nullptr) != b.nested_blocksize.has_value()) {
      fail(name, "quant-state-mismatch",
           nested ? "no nested_blocksize / nested_offset, but " + w + ".nested_absmax exists"
                  : "the quant_state blob describes double quantization, but " +
                        quote_text(w + ".nested_absmax", '\'') + " is missing");
    }
    if ((nested != nullptr) != cfg_.double_quant) {
      fail(name, "quant-state-mismatch",
           std::string(nested ? "double-quantized" : "not double-quantized") + ", but " +
               (cfg_.inferred ? std::string("the checkpoint's other modules are ") +
                                    (cfg_.double_quant ? "" : "not ") + "double-quantized"
                              : std::string("config.json's bnb_4bit_use_double_quant is ") +
                                    (cfg_.double_quant ? "true" : "false")));
    }
    const TensorInfo& absmax = need(name, w + ".absmax");
    const std::string blocks_why =
        std::to_string(b.n) + " elements in blocks of " + std::to_string(b.blocksize);
    if (nested) {
      dtype_is(absmax, {DType::U8}, "a double-quantized absmax");
      shape_is(absmax, {static_cast<int64_t>(blocks)}, "absmax-shape", blocks_why);
      dtype_is(*nested, {DType::F32}, "the nested absmax");
      shape_is(*nested,
               {static_cast<int64_t>(ceil_div(blocks, static_cast<uint64_t>(*b.nested_blocksize)))},
               "absmax-shape",
               std::to_string(blocks) + " absmax values in blocks of " +
                   std::to_string(*b.nested_blocksize));
      const TensorInfo& nq = need(name, w + ".nested_quant_map");
      dtype_is(nq, {DType::F32}, "the nested quant_map");
      shape_is(nq, {256}, "quant-map-shape", "an 8-bit code book");
      add_aux(m, *nested, "nested_scales");
      add_aux(m, nq, "nested_code");
      m.nested = true;
      m.nested_block = *b.nested_blocksize;
      m.nested_offset = b.nested_offset;
    } else {
      dtype_is(absmax, {DType::F32}, "the absmax");
      shape_is(absmax, {static_cast<int64_t>(blocks)}, "absmax-shape", blocks_why);
    }
    add_aux(m, absmax, "scales");
    const TensorInfo& qm = need(name, w + ".quant_map");
    dtype_is(qm, {DType::F32}, "the quant_map");
    shape_is(qm, {16}, "quant-map-shape", "a 4-bit code book");
    add_aux(m, qm, "code");
  }

  std::optional<QuantModule> bnb4(const std::string& name) const {
    const std::string_view marker = ".weight.quant_state.bitsandbytes__";
    const size_t at = name.rfind(marker);
    const TensorInfo* self = c_.find(name);
    if (at == std::string::npos) {
      // A packed weight without its blob: the blob is what says it is packed.
      if (ends_with(name, ".weight") && self->dtype == cfg_.storage && self->shape.size() == 2 &&
          self->shape[1] == 1 && !c_.find(name + ".quant_state.bitsandbytes__nf4") &&
          !c_.find(name + ".quant_state.bitsandbytes__fp4") && c_.find(name + ".absmax")) {
        fail(name, "missing-tensor",
             "a packed 4-bit weight (it has an absmax) without its quant_state blob " +
                 quote_text(name + ".quant_state.bitsandbytes__" + cfg_.quant_type, '\''));
      }
      return std::nullopt;
    }
    const std::string module = name.substr(0, at);
    const std::string w = module + ".weight";
    const std::string type = name.substr(at + marker.size());
    const BlobInfo b = parse_blob(*self, type);
    // A config that does not name the type leaves it to the blobs (each names its own).
    if (type != cfg_.quant_type && (cfg_.quant_type_stated || cfg_.inferred)) {
      fail(name, "quant-state-mismatch",
           "the blob says " + type + ", " +
               (cfg_.inferred ? std::string("the checkpoint's other blobs say ")
                              : std::string("config.json's bnb_4bit_quant_type says ")) +
               cfg_.quant_type);
    }
    const TensorInfo& weight = need(name, w);
    dtype_is(weight, {cfg_.storage}, "the packed weight");
    // Two 4-bit values per byte of the storage dtype.
    const uint64_t per_elem = 2 * static_cast<uint64_t>(dtype_bits(cfg_.storage) / 8);
    const uint64_t packed = ceil_div(b.n, per_elem);
    if (static_cast<uint64_t>(weight.numel()) != packed) {
      fail(w, "packed-shape",
           "shape " + shape_text(weight.shape) + " holds " + std::to_string(weight.numel()) +
               " elements; the logical shape " + shape_text(b.shape) +
               " (quant_state) packs into " + std::to_string(packed));
    }
    QuantModule m;
    m.name = module;
    m.block = b.blocksize;
    set_weight(m, weight, b.shape[0], b.shape[1]);
    add_aux(m, *self, "state");
    bnb4_stats(name, w, b, m);
    return m;
  }

  // ---- bitsandbytes int8 -----------------------------------------------------------------------

  std::optional<QuantModule> bnb8(const std::string& name) const {
    const TensorInfo* self = c_.find(name);
    if (!ends_with(name, ".SCB")) {
      if (ends_with(name, ".weight") && self->dtype == DType::I8 &&
          !c_.find(name.substr(0, name.size() - 7) + ".SCB")) {
        fail(name, "missing-tensor",
             "an int8 weight without its row scales " +
                 quote_text(name.substr(0, name.size() - 7) + ".SCB", '\''));
      }
      return std::nullopt;
    }
    const std::string module = name.substr(0, name.size() - 4);
    const TensorInfo& weight = need(name, module + ".weight");
    dtype_is(weight, {DType::I8}, "the weight");
    if (weight.shape.size() != 2) {
      fail(weight.name, "packed-shape",
           "an int8 weight is [out, in], not " + shape_text(weight.shape));
    }
    dtype_is(*self, {DType::F32, DType::F16, DType::BF16}, "SCB");
    shape_is(*self, {weight.shape[0]}, "scale-shape", "one scale per output row");
    QuantModule m;
    m.name = module;
    set_weight(m, weight, weight.shape[0], weight.shape[1]);
    add_aux(m, *self, "scales");
    if (const TensorInfo* f = c_.find(module + ".weight_format")) {
      dtype_is(*f, {DType::U8}, "weight_format");
      add_aux(m, *f, "format");
    }
    return m;
  }

  // ---- GPTQ and AWQ ----------------------------------------------------------------------------

  int64_t groups(int64_t in) const {
    return cfg_.group_size > 0 ? static_cast<int64_t>(ceil_div(in, cfg_.group_size)) : 1;
  }

  std::optional<QuantModule> gptq_awq(const std::string& name, bool awq) const {
    if (!ends_with(name, ".qweight")) return std::nullopt;
    const std::string module = name.substr(0, name.size() - 8);
    const TensorInfo& qw = *c_.find(name);
    dtype_is(qw, {DType::I32}, "qweight");
    if (qw.shape.size() != 2)
      fail(name, "packed-shape", "qweight is 2-D, not " + shape_text(qw.shape));
    const int64_t bits = cfg_.bits;
    const TensorInfo& scales = need(name, module + ".scales");
    dtype_is(scales, {DType::F16, DType::BF16, DType::F32}, "scales");
    if (scales.shape.size() != 2) {
      fail(scales.name, "scale-shape",
           "scales are 2-D [groups, out], not " + shape_text(scales.shape));
    }
    int64_t in, out;
    if (!awq) {
      // Packed along the input dim: 32 / bits values per int32 of a column.
      const int64_t in_bits = checked_mul<int64_t>(qw.shape[0], 32, "input bits of " + name);
      if (in_bits % bits != 0) {
        fail(name, "packed-shape",
             std::to_string(qw.shape[0]) + " rows of " + std::to_string(bits) +
                 "-bit values are no whole input dim");
      }
      in = in_bits / bits;
      out = qw.shape[1];
      if (scales.shape[1] != out) {
        fail(name, "packed-shape",
             "GPTQ packs qweight along the input dim ([in*" + std::to_string(bits) +
                 "/32, out]): its " + std::to_string(out) + " columns disagree with the " +
                 std::to_string(scales.shape[1]) + " output features of " +
                 quote_text(scales.name, '\''));
      }
    } else {
      in = qw.shape[0];
      out = checked_mul<int64_t>(qw.shape[1], 32, "output bits of " + name) / bits;
      if (scales.shape[1] != out) {
        fail(name, "packed-shape",
             "AWQ GEMM packs qweight along the output dim ([in, out*" + std::to_string(bits) +
                 "/32]): " + std::to_string(qw.shape[1]) + " columns unpack to " +
                 std::to_string(out) + " output features, " + quote_text(scales.name, '\'') +
                 " has " + std::to_string(scales.shape[1]));
      }
    }
    if (!awq) blame_qweight(qw, scales, in, out);
    const int64_t g = groups(in);
    shape_is(scales, {g, out}, "scale-shape",
             std::to_string(in) + " inputs (" + std::to_string(qw.shape[0]) + " rows of " +
                 quote_text(qw.name, '\'') + ") in groups of " +
                 (cfg_.group_size > 0 ? std::to_string(cfg_.group_size) : "the whole row") +
                 (cfg_.inferred ? "" : " (config.json)"));
    QuantModule m;
    m.name = module;
    m.groups = g;
    set_weight(m, qw, out, in);
    add_aux(m, scales, "scales");
    add_zeros_and_g_idx(m, name, out, in, awq);
    return m;
  }

  // GPTQ: a qweight whose input dim g_idx (one entry per input) and the scales outvote is the one
  // to blame, with the shape they say. Otherwise the part that disagrees is named by its own
  // check below (the scales' message says the input dim came from qweight).
  void blame_qweight(const TensorInfo& qw, const TensorInfo& scales, int64_t in,
                     int64_t out) const {
    const int64_t bits = cfg_.bits;
    const TensorInfo* gi = c_.find(qw.name.substr(0, qw.name.size() - 8) + ".g_idx");
    if (!gi || gi->shape.size() != 1 || gi->shape[0] == in) return;
    const int64_t want = gi->shape[0];
    if (mul_or_none<int64_t>(want, bits).value_or(1) % 32 != 0) return;
    if (scales.shape[0] != groups(want)) return;
    shape_is(qw, {want * bits / 32, out}, "packed-shape",
             std::to_string(want) + " input rows (g_idx and the scales), " +
                 std::to_string(32 / bits) + " per int32, x " + std::to_string(out) + " outputs");
  }

  // qzeros (packed along out; AWQ without zero points may lack them) and GPTQ's g_idx.
  void add_zeros_and_g_idx(QuantModule& m, const std::string& name, int64_t out, int64_t in,
                           bool awq) const {
    const std::string& module = m.name;
    const TensorInfo* zeros = c_.find(module + ".qzeros");
    if (!zeros && (!awq || cfg_.zero_point)) zeros = &need(name, module + ".qzeros");
    if (zeros) {
      dtype_is(*zeros, {DType::I32}, "qzeros");
      const int64_t out_bits = checked_mul<int64_t>(out, cfg_.bits, "zero point bits of " + name);
      if (out_bits % 32 != 0) {
        fail(zeros->name, "zeros-shape",
             std::to_string(out) + " output features do not pack into int32 zero points");
      }
      shape_is(*zeros, {m.groups, out_bits / 32}, "zeros-shape", "zero points packed along out");
      add_aux(m, *zeros, "zeros");
    }
    if (const TensorInfo* gi = c_.find(module + ".g_idx")) {
      if (awq) fail(gi->name, "foreign-tensor", "AWQ stores no g_idx (a GPTQ tensor)");
      dtype_is(*gi, {DType::I32}, "g_idx");
      shape_is(*gi, {in}, "g-idx-shape", "one group index per input feature");
      add_aux(m, *gi, "g_idx");
    }
  }

  // ---- FP8 block -------------------------------------------------------------------------------

  std::optional<QuantModule> fp8(const std::string& name) const {
    const TensorInfo* self = c_.find(name);
    if (!ends_with(name, ".weight_scale_inv")) {
      if (ends_with(name, ".weight") && self->dtype == DType::F8_E4M3 &&
          !c_.find(name + "_scale_inv")) {
        fail(name, "missing-tensor",
             "an FP8 weight without its block scales " + quote_text(name + "_scale_inv", '\''));
      }
      return std::nullopt;
    }
    const std::string module = name.substr(0, name.size() - 17);
    const TensorInfo& w = need(name, module + ".weight");
    dtype_is(w, {DType::F8_E4M3}, "the weight");
    if (w.shape.size() != 2) fail(w.name, "packed-shape", "an FP8 weight is [out, in]");
    dtype_is(*self, {DType::F32, DType::BF16, DType::F16}, "weight_scale_inv");
    shape_is(*self,
             {static_cast<int64_t>(ceil_div(w.shape[0], cfg_.block_rows)),
              static_cast<int64_t>(ceil_div(w.shape[1], cfg_.block_cols))},
             "scale-shape",
             "one scale per " + std::to_string(cfg_.block_rows) + " x " +
                 std::to_string(cfg_.block_cols) + " block of " + shape_text(w.shape));
    QuantModule m;
    m.name = module;
    set_weight(m, w, w.shape[0], w.shape[1]);
    add_aux(m, *self, "scales");
    if (const TensorInfo* is = c_.find(module + ".input_scale")) add_aux(m, *is);
    return m;
  }

  // ---- compressed-tensors ----------------------------------------------------------------------

  std::optional<QuantModule> ct_packed(const std::string& name) const {
    if (!ends_with(name, ".weight_packed")) return std::nullopt;
    const std::string module = name.substr(0, name.size() - 14);
    const TensorInfo& wp = *c_.find(name);
    dtype_is(wp, {DType::I32}, "weight_packed");
    if (wp.shape.size() != 2)
      fail(name, "packed-shape", "weight_packed is 2-D, not " + shape_text(wp.shape));
    const TensorInfo& ws = need(name, module + ".weight_shape");
    dtype_is(ws, {DType::I64, DType::I32}, "weight_shape");
    shape_is(ws, {2}, "packed-shape", "the logical [out, in]");
    const std::string raw = bytes_(*c_.file_of(ws.name), ws);
    const size_t es = ws.dtype == DType::I64 ? 8 : 4;
    if (raw.size() != 2 * es) fail(ws.name, "packed-shape", "weight_shape's data is short");
    int64_t dims[2];
    for (int i = 0; i < 2; ++i) {
      int64_t v = 0;
      if (es == 8) {
        std::memcpy(&v, raw.data() + i * 8, 8);
      } else {
        int32_t v32;
        std::memcpy(&v32, raw.data() + i * 4, 4);
        v = v32;
      }
      if (v < 0) fail(ws.name, "packed-shape", "weight_shape holds a negative size");
      dims[i] = v;
    }
    const int64_t out = dims[0], in = dims[1];
    const int64_t cols = static_cast<int64_t>(
        ceil_div(checked_mul<uint64_t>(static_cast<uint64_t>(in), static_cast<uint64_t>(cfg_.bits),
                                       "packed bits of " + name),
                 32));
    if (wp.shape[0] != out || wp.shape[1] != cols) {
      fail(name, "packed-shape",
           "shape " + shape_text(wp.shape) + ", but weight_shape [" + std::to_string(out) + ", " +
               std::to_string(in) + "] packs into " + shape_text({out, cols}) + " (" +
               std::to_string(cfg_.bits) + "-bit values along the input dim)");
    }
    const TensorInfo& sc = need(name, module + ".weight_scale");
    dtype_is(sc, {DType::F16, DType::BF16, DType::F32}, "weight_scale");
    const int64_t g = groups(in);
    shape_is(sc, {out, g}, "scale-shape",
             cfg_.group_size > 0
                 ? std::to_string(in) + " inputs in groups of " + std::to_string(cfg_.group_size)
                 : std::string("one scale per output channel"));
    QuantModule m;
    m.name = module;
    m.groups = g;
    set_weight(m, wp, out, in);
    add_aux(m, ws, "shape");
    add_aux(m, sc, "scales");
    const TensorInfo* zp = c_.find(module + ".weight_zero_point");
    if (cfg_.zero_point && !zp) zp = &need(name, module + ".weight_zero_point");
    if (zp) {
      if (!cfg_.zero_point) {
        fail(zp->name, "foreign-tensor", "a zero point, but the scheme is symmetric");
      }
      dtype_is(*zp, {DType::I32}, "weight_zero_point");
      shape_is(
          *zp,
          {static_cast<int64_t>(ceil_div(
               checked_mul<uint64_t>(static_cast<uint64_t>(out), static_cast<uint64_t>(cfg_.bits),
                                     "zero point bits of " + name),
               32)),
           g},
          "zeros-shape", "zero points packed along the output dim");
      add_aux(m, *zp, "zeros");
    }
    if (const TensorInfo* gi = c_.find(module + ".weight_g_idx")) {
      dtype_is(*gi, {DType::I32}, "weight_g_idx");
      shape_is(*gi, {in}, "g-idx-shape", "one group index per input feature");
      add_aux(m, *gi, "g_idx");
    }
    return m;
  }

  std::optional<QuantModule> ct_nvfp4(const std::string& name) const {
    if (!ends_with(name, ".weight_packed")) return std::nullopt;
    const std::string module = name.substr(0, name.size() - 14);
    const TensorInfo& wp = *c_.find(name);
    dtype_is(wp, {DType::U8}, "weight_packed");
    if (wp.shape.size() != 2)
      fail(name, "packed-shape", "weight_packed is 2-D, not " + shape_text(wp.shape));
    const int64_t out = wp.shape[0], in = checked_mul<int64_t>(wp.shape[1], 2, "NVFP4 inputs");
    const TensorInfo& sc = need(name, module + ".weight_scale");
    dtype_is(sc, {DType::F8_E4M3}, "weight_scale");
    shape_is(sc, {out, groups(in)}, "scale-shape",
             std::to_string(in) + " inputs in groups of " + std::to_string(cfg_.group_size));
    const TensorInfo& gs = need(name, module + ".weight_global_scale");
    dtype_is(gs, {DType::F32}, "weight_global_scale");
    shape_is(gs, {1}, "scale-shape", "one global scale");
    QuantModule m;
    m.name = module;
    m.groups = groups(in);
    set_weight(m, wp, out, in);
    add_aux(m, sc, "scales");
    add_aux(m, gs, "global");
    if (const TensorInfo* ig = c_.find(module + ".input_global_scale")) {
      dtype_is(*ig, {DType::F32}, "input_global_scale");
      shape_is(*ig, {1}, "scale-shape", "one global scale");
      add_aux(m, *ig);
    }
    return m;
  }
};

}  // namespace

std::string read_tensor_bytes(const SafetensorsHeader& file, const TensorInfo& t) {
  std::string out(t.nbytes(), '\0');
  if (!out.empty()) {
    // Through the descriptor the header was read through, when the checkpoint keeps it.
    const uint64_t at = file.data_start + t.begin;
    if (file.fd) {
      fileio::File(file.fd->get(), file.path).pread_full(out.data(), out.size(), at);
    } else {
      fileio::File(file.path).pread_full(out.data(), out.size(), at);
    }
    fileio::count_bytes_read(out.size());
  }
  return out;
}

QuantLayout recognise_quantized(const Checkpoint& c, const QuantConfig& config,
                                const std::string& config_path, const TensorBytes& bytes,
                                bool require_modules) {
  return Recogniser(c, config, config_path, bytes, require_modules).run();
}

std::optional<QuantConfig> infer_quant_config(const Checkpoint& c) {
  QuantConfig cfg;
  cfg.inferred = true;
  cfg.zero_point = false;
  for (const std::string& name : c.tensor_names()) {
    const TensorInfo& t = *c.find(name);
    const std::string_view blob = ".weight.quant_state.bitsandbytes__";
    if (ends_with(name, ".qweight") && t.shape.size() == 2) {
      const std::string module = name.substr(0, name.size() - 8);
      const TensorInfo* sc = c.find(module + ".scales");
      const TensorInfo* qz = c.find(module + ".qzeros");
      const TensorInfo* gi = c.find(module + ".g_idx");
      const bool two_d = sc && sc->shape.size() == 2 && sc->shape[0] > 0;
      // AWQ packs the output dim: qweight has out / 8 columns where the scales have out.
      const bool awq =
          two_d && !gi && mul_or_none<int64_t>(t.shape[1], 8) == sc->shape[1] && sc->shape[1] != 0;
      cfg.kind = awq ? QuantKind::kAwq : QuantKind::kGptq;
      cfg.bits = 4;
      if (!awq && two_d && qz && qz->shape.size() == 2 && qz->shape[1] > 0 &&
          sc->shape[1] % qz->shape[1] == 0) {
        const int64_t pack = sc->shape[1] / qz->shape[1];  // zero points per int32: 32 / bits
        if (pack == 4 || pack == 8 || pack == 16) cfg.bits = static_cast<int>(32 / pack);
      }
      // (A tensor with a zero dim may claim any size in the other: no unchecked products.)
      const int64_t in = gi && gi->shape.size() == 1 ? gi->shape[0]
                         : awq                       ? t.shape[0]
                               : mul_or_none<int64_t>(t.shape[0], 32 / cfg.bits).value_or(0);
      // The group size the scales' rows say (one row: the whole input dim, 0).
      cfg.group_size = two_d && sc->shape[0] > 1 && in % sc->shape[0] == 0 ? in / sc->shape[0] : 0;
      cfg.zero_point = qz != nullptr || !awq;
      return cfg;
    }
    if (const size_t at = name.rfind(blob); at != std::string::npos) {
      cfg.kind = QuantKind::kBnb4;
      cfg.quant_type = name.substr(at + blob.size());
      cfg.double_quant = c.find(name.substr(0, at) + ".weight.nested_absmax") != nullptr;
      return cfg;
    }
    if (ends_with(name, ".SCB")) {
      cfg.kind = QuantKind::kBnb8;
      cfg.bits = 8;
      return cfg;
    }
    if (ends_with(name, ".weight_scale_inv")) {
      cfg.kind = QuantKind::kFp8Block;
      cfg.bits = 8;
      cfg.block_rows = cfg.block_cols = 128;  // DeepSeek-V3 / Qwen3's blocks
      return cfg;
    }
    if (ends_with(name, ".weight_packed") && t.dtype == DType::U8) {
      cfg.kind = QuantKind::kCtNvfp4;
      cfg.group_size = 16;
      cfg.scale_dtype = DType::F8_E4M3;
      return cfg;
    }
  }
  return std::nullopt;
}

std::set<std::string> aux_tensor_names(const QuantLayout& layout) {
  std::set<std::string> out;
  for (const auto& m : layout.modules) out.insert(m.aux_tensors.begin(), m.aux_tensors.end());
  return out;
}

nlohmann::json config_json(const QuantConfig& c) {
  nlohmann::json j = {
      {"scheme", quant_kind_name(c.kind)}, {"quant_method", c.method}, {"bits", c.bits}};
  if (c.group_size > 0) j["group_size"] = c.group_size;
  if (c.kind == QuantKind::kBnb4) {
    j["quant_type"] = c.quant_type;
    j["double_quant"] = c.double_quant;
    j["blocksize"] = c.blocksize;
  }
  if (c.kind == QuantKind::kFp8Block) j["weight_block_size"] = {c.block_rows, c.block_cols};
  if (c.kind == QuantKind::kGptq || c.kind == QuantKind::kAwq || c.kind == QuantKind::kCtPacked) {
    j["zero_point"] = c.zero_point;
  }
  return j;
}

nlohmann::json to_json(const QuantLayout& layout) {
  nlohmann::json j = config_json(layout.config);
  nlohmann::json mods = nlohmann::json::array();
  for (const auto& m : layout.modules) {
    mods.push_back({{"module", m.name},
                    {"shape", {m.out, m.in}},
                    {"n_params", m.n_params},
                    {"weight_bytes", m.weight_bytes},
                    {"aux_bytes", m.aux_bytes}});
  }
  j["n_modules"] = layout.modules.size();
  j["n_quantized_params"] = layout.n_quantized_params;
  j["weight_bytes"] = layout.weight_bytes;
  j["aux_bytes"] = layout.aux_bytes;
  j["modules"] = std::move(mods);
  return j;
}

}  // namespace metaload
