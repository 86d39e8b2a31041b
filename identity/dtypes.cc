#include "identity/dtypes.h"

#include <algorithm>
#include <cctype>

#include "base/text.h"

namespace metaload {
namespace {

std::vector<DTypeEntry> build_table() {
  std::vector<DTypeEntry> t;
  for (const auto& q : QUANTIZATIONS)
    t.push_back({q.name, q.bytes_per_element, DTypeKind::kQuantization, "", std::nullopt});
  auto torch = [&](std::string_view name, double bpe, std::string_view canonical,
                   std::optional<DType> file) {
    t.push_back({name, bpe, DTypeKind::kTorch, canonical, file});
  };
  // torch.<name> attributes that are dtypes, with torch's element sizes.
  torch("float32", 4, "float32", DType::F32);
  torch("float", 4, "float32", DType::F32);
  torch("float64", 8, "float64", DType::F64);
  torch("double", 8, "float64", DType::F64);
  torch("float16", 2, "float16", DType::F16);
  torch("half", 2, "float16", DType::F16);
  torch("bfloat16", 2, "bfloat16", DType::BF16);
  torch("complex32", 4, "complex32", std::nullopt);
  torch("chalf", 4, "complex32", std::nullopt);
  torch("complex64", 8, "complex64", DType::C64);
  torch("cfloat", 8, "complex64", DType::C64);
  torch("complex128", 16, "complex128", std::nullopt);
  torch("cdouble", 16, "complex128", std::nullopt);
  torch("uint8", 1, "uint8", DType::U8);
  torch("int8", 1, "int8", DType::I8);  // shadowed by the quantization of the same name
  torch("int16", 2, "int16", DType::I16);
  torch("short", 2, "int16", DType::I16);
  torch("int32", 4, "int32", DType::I32);
  torch("int", 4, "int32", DType::I32);
  torch("int64", 8, "int64", DType::I64);
  torch("long", 8, "int64", DType::I64);
  torch("uint16", 2, "uint16", DType::U16);
  torch("uint32", 4, "uint32", DType::U32);
  torch("uint64", 8, "uint64", DType::U64);
  torch("bool", 1, "bool", DType::BOOL);
  torch("float8_e4m3fn", 1, "float8_e4m3fn", DType::F8_E4M3);
  torch("float8_e4m3fnuz", 1, "float8_e4m3fnuz", DType::F8_E4M3FNUZ);
  torch("float8_e5m2", 1, "float8_e5m2", DType::F8_E5M2);
  torch("float8_e5m2fnuz", 1, "float8_e5m2fnuz", DType::F8_E5M2FNUZ);
  torch("float8_e8m0fnu", 1, "float8_e8m0fnu", DType::F8_E8M0);
  // The file format's own names, so a stored dtype printed by describe can be passed back.
  static const std::vector<std::string> lowered = [] {
    std::vector<std::string> v;
    for (DType d : all_dtypes()) {
      std::string s = dtype_name(d);
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      v.push_back(s);
    }
    return v;
  }();
  const auto& all = all_dtypes();
  for (size_t i = 0; i < all.size(); ++i) {
    DType d = all[i];
    if (lowered[i] == "bool") continue;  // same spelling as torch's
    std::string_view canonical;
    for (const auto& e : t) {
      if (e.kind == DTypeKind::kTorch && e.file_dtype == d) {
        canonical = e.torch_name;
        break;
      }
    }
    t.push_back({lowered[i], dtype_bits(d) / 8.0, DTypeKind::kFile, canonical, d});
  }
  return t;
}

bool is_sub_byte_torch_int(std::string_view n) {
  // torch.int1..int7, torch.uint1..uint7 and float4_* (bit-packed types whose 1-byte element size
  // is not the size of one value).
  if (n.size() == 4 && n.substr(0, 3) == "int") return n[3] >= '1' && n[3] <= '7';
  if (n.size() == 5 && n.substr(0, 4) == "uint") return n[4] >= '1' && n[4] <= '7';
  return n.rfind("float4_", 0) == 0;  // float4_e2m1fn_x2: two elements per byte
}

std::string accepted_list() {
  std::string s;
  for (const auto& n : accepted_dtype_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

const std::vector<DTypeEntry>& dtype_table() {
  static const std::vector<DTypeEntry> table = build_table();
  return table;
}

const DTypeEntry& resolve_dtype_name(std::string_view name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n.rfind("torch.", 0) == 0) n = n.substr(6);
  // The first match wins: quantizations come first in the table.
  for (const auto& e : dtype_table()) {
    if (e.name == n) return e;
  }
  if (is_sub_byte_torch_int(n)) {
    throw DTypeError(
        "torch." + n +
        " is a sub-byte dtype whose element size is not its storage size; size it with a "
        "quantization name (nf4, int4, 4bit, fp4 = 0.5 bytes) instead; accepted: " +
        accepted_list());
  }
  throw DTypeError("unknown dtype or quantization " + quote_text(name) +
                   "; accepted (any case, "
                   "optional \"torch.\" prefix): " +
                   accepted_list());
}

double bytes_per_element(std::string_view name) {
  return resolve_dtype_name(name).bytes_per_element;
}

std::vector<std::string> accepted_dtype_names() {
  std::vector<std::string> v;
  for (const auto& e : dtype_table()) {
    if (std::find(v.begin(), v.end(), e.name) == v.end()) v.emplace_back(e.name);
  }
  return v;
}

const DTypeEntry& resolve_model_dtype(std::string_view name) {
  const DTypeEntry& e = resolve_dtype_name(name);
  if (std::find(MODEL_DTYPES.begin(), MODEL_DTYPES.end(), e.torch_name) != MODEL_DTYPES.end())
    return e;
  std::string runnable;
  for (std::string_view n : MODEL_DTYPES)
    runnable += (runnable.empty() ? "" : ", ") + std::string(n);
  throw DTypeError(quote_text(name, '\'') + " is not a dtype a model can run in (" + runnable +
                   ")");
}

}  // namespace metaload
