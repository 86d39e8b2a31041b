// The one table of dtype and quantization names that sizing (describe) and loading accept.
// Torch-free: torch dtypes are known here by name and element size.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loader/format/safetensors.h"
#include "identity/errors.h"

namespace metaload {

struct Quantization {
  std::string_view name;
  double bytes_per_element;
};

// Weight quantizations by the names users give them (as nnsight's QUANTIZATIONS): looked up before
// dtype names.
inline constexpr std::array<Quantization, 7> QUANTIZATIONS = {{
    {"nf4", 0.5},
    {"int4", 0.5},
    {"4bit", 0.5},
    {"fp4", 0.5},
    {"int8", 1.0},
    {"8bit", 1.0},
    {"fp8", 1.0},
}};

enum class DTypeKind { kQuantization, kTorch, kFile };

struct DTypeEntry {
  std::string_view name;  // the accepted spelling, lower case
  double bytes_per_element;
  DTypeKind kind;
  std::string_view torch_name;      // canonical torch dtype ("bfloat16"); empty when torch has none
  std::optional<DType> file_dtype;  // the safetensors dtype with the same bits, if any
};

// Every accepted name: QUANTIZATIONS, then torch dtype names (with aliases: "float", "half", ...),
// then the safetensors names lower-cased ("bf16", "f8_e4m3", ...).
const std::vector<DTypeEntry>& dtype_table();

// Normalises a name as nnsight does ("torch." prefix dropped, any case) and looks it up.
// Throws DTypeError for sub-byte torch dtypes (int1..int7, uint1..uint7: their element size is
// not their storage size) and unknown names, listing the accepted names.
const DTypeEntry& resolve_dtype_name(std::string_view name);

// Bytes per element of a dtype or quantization name: 0.5 for nf4, 2 for "torch.bfloat16", ...
double bytes_per_element(std::string_view name);

// The accepted names in table order.
std::vector<std::string> accepted_dtype_names();

// The dtypes a model runs in (TransformersModel's dtype, the CLI's --dtype), by torch name.
inline constexpr std::array<std::string_view, 4> MODEL_DTYPES = {{
    "float32",
    "float16",
    "bfloat16",
    "float64",
}};

// Any accepted spelling of one of MODEL_DTYPES ("half", "torch.bfloat16", "bf16", "double") -> its
// table entry. DTypeError naming MODEL_DTYPES for other names of the table; resolve_dtype_name's
// error for unknown ones. identity/model_dtype.h maps the entry to a torch ScalarType.
const DTypeEntry& resolve_model_dtype(std::string_view name);

}  // namespace metaload
