#include "identity/dtypes.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "base/text.h"

namespace metaload {
namespace {

// torch's other names for a dtype (torch.float is torch.float32) and the dtypes torch has that the
// file format lacks; the dtypes both have, with their torch names, are the format layer's table.
struct TorchAlias {
  std::string_view name, canonical;
};
constexpr std::array<TorchAlias, 7> kAliases = {{
    {"float", "float32"},
    {"double", "float64"},
    {"half", "float16"},
    {"cfloat", "complex64"},
    {"short", "int16"},
    {"int", "int32"},
    {"long", "int64"},
}};
struct TorchOnly {
  std::string_view name;
  double bytes;
  std::string_view alias;
};
constexpr std::array<TorchOnly, 2> kTorchOnly = {
    {{"complex32", 4, "chalf"}, {"complex128", 16, "cdouble"}}};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<DTypeEntry> build_table() {
  std::vector<DTypeEntry> t;
  for (const auto& q : QUANTIZATIONS)
    t.push_back({q.name, q.bytes_per_element, DTypeKind::kQuantization, "", std::nullopt});
  // torch.<name> attributes that are dtypes, with torch's element sizes, each followed by its
  // aliases. Packed ones (float4_e2m1fn_x2: two values an element) are not sized by name here
  // (is_sub_byte_torch_int says why).
  for (DType d : all_dtypes()) {
    const char* attr = dtype_torch_attr(d);
    if (attr == nullptr || dtype_torch_values(d) != 1) continue;
    const std::string_view canonical = attr;
    t.push_back({canonical, dtype_bits(d) / 8.0, DTypeKind::kTorch, canonical, d});
    for (const auto& a : kAliases) {
      if (a.canonical == canonical)
        t.push_back({a.name, dtype_bits(d) / 8.0, DTypeKind::kTorch, canonical, d});
    }
  }
  for (const auto& o : kTorchOnly) {
    t.push_back({o.name, o.bytes, DTypeKind::kTorch, o.name, std::nullopt});
    t.push_back({o.alias, o.bytes, DTypeKind::kTorch, o.name, std::nullopt});
  }
  // The file format's own names, so a stored dtype printed by describe can be passed back.
  static const std::vector<std::string> lowered = [] {
    std::vector<std::string> v;
    for (DType d : all_dtypes()) v.push_back(lower(dtype_name(d)));
    return v;
  }();
  const auto& all = all_dtypes();
  for (size_t i = 0; i < all.size(); ++i) {
    DType d = all[i];
    if (lowered[i] == "bool") continue;  // same spelling as torch's
    const char* attr = dtype_torch_attr(d);
    const std::string_view canonical =
        attr != nullptr && dtype_torch_values(d) == 1 ? std::string_view(attr) : std::string_view();
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
