#include "quant/layout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "base/checked.h"
#include "base/text.h"
#include "loader/format/file_io.h"

namespace metaload {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

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
             const TensorBytes& bytes)
      : c_(c), cfg_(cfg), config_path_(config_path), bytes_(bytes) {}

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
    if (out.modules.empty()) {
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
    for (const auto& f : c_.files) {
      for (const auto& t : f.tensors) {
        for (const auto& s : all) {
          if (s.kind == cfg_.kind) continue;
          for (auto suffix : s.suffixes) {
            if (!ends_with(t.name, suffix)) continue;
            if (std::find(own.begin(), own.end(), suffix) != own.end()) continue;
            fail(t.name, "foreign-tensor",
                 std::string("a ") + scheme_words(s.kind) + " tensor ('" + std::string(suffix) +
                     "'), but quantization_config says " + scheme_words(cfg_.kind));
          }
        }
      }
    }
  }

  void add_aux(QuantModule& m, const TensorInfo& t) const {
    m.aux_bytes = checked_add(m.aux_bytes, t.nbytes(), "quantization aux bytes");
    m.aux_tensors.push_back(t.name);
  }

  void set_weight(QuantModule& m, const TensorInfo& t, int64_t out, int64_t in) const {
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

  nlohmann::json blob_json(const TensorInfo& blob) const {
    if (blob.dtype != DType::U8 || blob.shape.size() != 1) {
      fail(blob.name, "quant-state-blob",
           "a quant_state blob is U8 of rank 1 (JSON bytes), not " +
               std::string(dtype_name(blob.dtype)) + " " + shape_text(blob.shape));
    }
    if (blob.nbytes() > kMaxQuantStateBytes) {
      fail(blob.name, "quant-state-blob",
           std::to_string(blob.nbytes()) + " bytes; a quant_state blob is at most " +
               std::to_string(kMaxQuantStateBytes));
    }
    const SafetensorsHeader* f = c_.file_of(blob.name);
    const std::string text = bytes_(*f, blob);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      fail(blob.name, "quant-state-blob", "not a JSON object: " + quote_text(text.substr(0, 60)));
    }
    return j;
  }

  static std::optional<int64_t> pos_int(const nlohmann::json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return std::nullopt;
    return it->get<int64_t>();
  }

  struct BlobInfo {
    std::vector<int64_t> shape;
    uint64_t n = 1;  // logical elements
    int64_t blocksize = 0;
    std::optional<int64_t> nested_blocksize;
  };

  // The quant_state blob of `name` (type = "nf4" | "fp4"), checked against its name and config.
  BlobInfo parse_blob(const std::string& name, const std::string& type) const {
    if (type != "nf4" && type != "fp4") {
      fail(name, "quant-state-blob", "quant type " + quote_text(type) + " is not nf4 or fp4");
    }
    const nlohmann::json j = blob_json(*c_.find(name));
    auto qt = j.find("quant_type");
    if (qt == j.end() || !qt->is_string() || qt->get<std::string>() != type) {
      fail(name, "quant-state-blob",
           "the blob's quant_type is " + (qt == j.end() ? std::string("missing") : qt->dump()) +
               ", its name says " + quote_text(type));
    }
    if (type != cfg_.quant_type) {
      fail(name, "quant-state-mismatch",
           "the blob says " + type + ", config.json's bnb_4bit_quant_type says " + cfg_.quant_type);
    }
    BlobInfo b;
    const auto blocksize = pos_int(j, "blocksize");
    if (!blocksize)
      fail(name, "quant-state-blob", "blocksize is missing or not a positive integer");
    b.blocksize = *blocksize;
    auto shape_it = j.find("shape");
    if (shape_it == j.end() || !shape_it->is_array() || shape_it->empty() || shape_it->size() > 8) {
      fail(name, "quant-state-blob", "shape is missing or not a list of 1 to 8 sizes");
    }
    for (const auto& d : *shape_it) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail(name, "quant-state-blob", "shape " + shape_it->dump() + " is not a list of sizes");
      }
      b.shape.push_back(d.get<int64_t>());
      b.n = checked_mul<uint64_t>(b.n, static_cast<uint64_t>(d.get<int64_t>()),
                                  "logical elements of " + name);
    }
    if (!j.contains("dtype") || !j["dtype"].is_string()) {
      fail(name, "quant-state-blob", "dtype is missing or not a string");
    }
    if (j.contains("nested_blocksize") || j.contains("nested_offset")) {
      b.nested_blocksize = pos_int(j, "nested_blocksize");
      if (!b.nested_blocksize) {
        fail(name, "quant-state-blob", "nested_blocksize is not a positive integer");
      }
    }
    return b;
  }

  // absmax (and double quantization's nested absmax and code book), quant_map.
  void bnb4_stats(const std::string& name, const std::string& w, const BlobInfo& b,
                  QuantModule& m) const {
    const uint64_t blocks = ceil_div(b.n, static_cast<uint64_t>(b.blocksize));
    const TensorInfo* nested = c_.find(w + ".nested_absmax");
    if ((nested != nullptr) != b.nested_blocksize.has_value()) {
      fail(nested ? nested->name : name, "quant-state-mismatch",
           nested ? "nested absmax stored, but the quant_state blob has no nested_blocksize"
                  : "the quant_state blob describes double quantization, but " +
                        quote_text(w + ".nested_absmax", '\'') + " is missing");
    }
    if ((nested != nullptr) != cfg_.double_quant) {
      fail(name, "quant-state-mismatch",
           std::string(nested ? "double-quantized" : "not double-quantized") +
               ", but config.json's bnb_4bit_use_double_quant is " +
               (cfg_.double_quant ? "true" : "false"));
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
      add_aux(m, *nested);
      add_aux(m, nq);
    } else {
      dtype_is(absmax, {DType::F32}, "the absmax");
      shape_is(absmax, {static_cast<int64_t>(blocks)}, "absmax-shape", blocks_why);
    }
    add_aux(m, absmax);
    const TensorInfo& qm = need(name, w + ".quant_map");
    dtype_is(qm, {DType::F32}, "the quant_map");
    shape_is(qm, {16}, "quant-map-shape", "a 4-bit code book");
    add_aux(m, qm);
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
    const BlobInfo b = parse_blob(name, name.substr(at + marker.size()));
    const TensorInfo& weight = need(name, w);
    dtype_is(weight, {cfg_.storage}, "the packed weight");
    // Two 4-bit values per byte of the storage dtype.
    const uint64_t per_elem = 2 * static_cast<uint64_t>(dtype_bits(cfg_.storage) / 8);
    const uint64_t packed = ceil_div(b.n, per_elem);
    if (static_cast<uint64_t>(weight.numel()) != packed) {
      fail(w, "packed-shape",
           "holds " + std::to_string(weight.numel()) + " elements; the logical shape " +
               shape_text(b.shape) + " packs into " + std::to_string(packed));
    }
    QuantModule m;
    m.name = module;
    const int64_t out = b.shape.size() >= 2 ? b.shape[0] : 1;
    set_weight(m, weight, out, out ? static_cast<int64_t>(b.n / static_cast<uint64_t>(out)) : 0);
    add_aux(m, *self);
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
    dtype_is(*self, {DType::F32}, "SCB");
    shape_is(*self, {weight.shape[0]}, "scale-shape", "one scale per output row");
    QuantModule m;
    m.name = module;
    set_weight(m, weight, weight.shape[0], weight.shape[1]);
    add_aux(m, *self);
    if (const TensorInfo* f = c_.find(module + ".weight_format")) {
      dtype_is(*f, {DType::U8}, "weight_format");
      add_aux(m, *f);
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
    const int64_t g = groups(in);
    shape_is(scales, {g, out}, "scale-shape",
             std::to_string(in) + " inputs in groups of " +
                 (cfg_.group_size > 0 ? std::to_string(cfg_.group_size) : "the whole row"));
    QuantModule m;
    m.name = module;
    set_weight(m, qw, out, in);
    add_aux(m, scales);
    const TensorInfo* zeros = c_.find(module + ".qzeros");
    if (!zeros && (!awq || cfg_.zero_point)) zeros = &need(name, module + ".qzeros");
    if (zeros) {
      dtype_is(*zeros, {DType::I32}, "qzeros");
      const int64_t out_bits = checked_mul<int64_t>(out, bits, "zero point bits of " + name);
      if (out_bits % 32 != 0) {
        fail(zeros->name, "zeros-shape",
             std::to_string(out) + " output features do not pack into int32 zero points");
      }
      shape_is(*zeros, {g, out_bits / 32}, "zeros-shape", "zero points packed along out");
      add_aux(m, *zeros);
    }
    if (const TensorInfo* gi = c_.find(module + ".g_idx")) {
      if (awq) fail(gi->name, "foreign-tensor", "AWQ stores no g_idx (a GPTQ tensor)");
      dtype_is(*gi, {DType::I32}, "g_idx");
      shape_is(*gi, {in}, "g-idx-shape", "one group index per input feature");
      add_aux(m, *gi);
    }
    return m;
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
    add_aux(m, *self);
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
    set_weight(m, wp, out, in);
    add_aux(m, ws);
    add_aux(m, sc);
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
      add_aux(m, *zp);
    }
    if (const TensorInfo* gi = c_.find(module + ".weight_g_idx")) {
      dtype_is(*gi, {DType::I32}, "weight_g_idx");
      shape_is(*gi, {in}, "g-idx-shape", "one group index per input feature");
      add_aux(m, *gi);
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
    set_weight(m, wp, out, in);
    add_aux(m, sc);
    add_aux(m, gs);
    if (const TensorInfo* ig = c_.find(module + ".input_global_scale")) {
      dtype_is(*ig, {DType::F32}, "input_global_scale");
      shape_is(*ig, {1}, "scale-shape", "one global scale");
      add_aux(m, *ig);
    }
    return m;
  }
};

// 0 when the lcm does not fit (no slice can fall on it then).
int64_t lcm64(int64_t a, int64_t b) {
  return mul_or_none(a / std::gcd(a, b), b).value_or(0);
}

}  // namespace

std::string read_tensor_bytes(const SafetensorsHeader& file, const TensorInfo& t) {
  std::string out(t.nbytes(), '\0');
  if (!out.empty()) {
    fileio::File f(file.path);
    f.pread_full(out.data(), out.size(), file.data_start + t.begin);
    fileio::count_bytes_read(out.size());
  }
  return out;
}

QuantLayout recognise_quantized(const Checkpoint& c, const QuantConfig& config,
                                const std::string& config_path, const TensorBytes& bytes) {
  return Recogniser(c, config, config_path, bytes).run();
}

std::set<std::string> aux_tensor_names(const QuantLayout& layout) {
  std::set<std::string> out;
  for (const auto& m : layout.modules) out.insert(m.aux_tensors.begin(), m.aux_tensors.end());
  return out;
}

bool is_row_parallel(const std::string& module) {
  const size_t dot = module.find_last_of('.');
  const std::string leaf = dot == std::string::npos ? module : module.substr(dot + 1);
  static const char* kRow[] = {"o_proj",        "down_proj", "c_proj", "out_proj",
                               "dense_4h_to_h", "fc2",       "w2",     "wo"};
  for (const char* r : kRow) {
    if (leaf == r) return true;
  }
  return false;
}

bool tp_sliceable(const QuantConfig& cfg, const QuantModule& m, int64_t d, std::string* why) {
  const bool row = is_row_parallel(m.name);
  const int64_t dim = row ? m.in : m.out;
  const char* dim_name = row ? "input" : "output";
  auto no = [&](const std::string& boundary) {
    if (why) {
      *why = m.name + ": its " + dim_name + " dim " + std::to_string(dim) + " split " +
             std::to_string(d) + " ways does not fall on " + boundary;
    }
    return false;
  };
  if (d <= 0 || dim % d != 0) return no("whole features");
  const int64_t part = dim / d;
  const int64_t bits = cfg.bits;
  switch (cfg.kind) {
    case QuantKind::kBnb4:
      // The packed weight and absmax are flat over [out, in]: a slice must cover whole blocks.
      if (row) {
        if (m.in % cfg.blocksize != 0 || part % cfg.blocksize != 0) {
          return no("the " + std::to_string(cfg.blocksize) + "-element absmax blocks");
        }
      } else if (!mul_or_none(part, m.in) || *mul_or_none(part, m.in) % cfg.blocksize != 0) {
        return no("the " + std::to_string(cfg.blocksize) + "-element absmax blocks");
      }
      return true;
    case QuantKind::kBnb8:
      return true;
    case QuantKind::kGptq:
    case QuantKind::kAwq:
    case QuantKind::kCtPacked: {
      const bool packed_in = cfg.kind != QuantKind::kAwq;
      if (row) {
        int64_t g = cfg.group_size > 0 ? cfg.group_size : 1;
        if (packed_in) g = lcm64(g, 32 / std::gcd<int64_t>(32, bits));
        if (g <= 0 || part % g != 0) {
          return no(cfg.group_size > 0 && part % cfg.group_size != 0
                        ? "the groups of " + std::to_string(cfg.group_size)
                        : "the " + std::to_string(32 / std::gcd<int64_t>(32, bits)) +
                              "-value int32 packs");
        }
      } else {
        const bool packed_out = cfg.kind != QuantKind::kCtPacked || cfg.zero_point;
        const auto part_bits = mul_or_none(part, bits);
        if (packed_out && (!part_bits || *part_bits % 32 != 0)) {
          return no("the int32 packs of " + std::string(cfg.kind == QuantKind::kAwq
                                                            ? "qweight and qzeros"
                                                            : "the zero points"));
        }
      }
      return true;
    }
    case QuantKind::kFp8Block: {
      const int64_t b = row ? cfg.block_cols : cfg.block_rows;
      if (part % b != 0) return no("the " + std::to_string(b) + "-wide scale blocks");
      return true;
    }
    case QuantKind::kCtNvfp4:
      if (row && part % cfg.group_size != 0) {
        return no("the groups of " + std::to_string(cfg.group_size));
      }
      return true;
  }
  return true;
}

std::optional<int64_t> quant_max_tp_size(const QuantLayout& layout, std::optional<int64_t> base,
                                         std::string* limited_by) {
  if (limited_by) limited_by->clear();
  if (!base) return std::nullopt;
  for (int64_t d = *base; d >= 1; --d) {
    if (*base % d != 0) continue;
    bool ok = true;
    for (const auto& m : layout.modules) {
      std::string why;
      if (!tp_sliceable(layout.config, m, d, &why)) {
        if (limited_by && limited_by->empty()) *limited_by = why;
        ok = false;
        break;
      }
    }
    if (ok) return d > 1 ? std::optional<int64_t>(d) : std::nullopt;
  }
  return std::nullopt;
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
