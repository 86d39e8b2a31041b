// The safetensors format: dtypes, the validated header, and reading it. Torch-free.
//
// File layout: u64 little-endian N; N bytes of UTF-8 JSON (an object, padded with spaces); the
// data. Every JSON entry but "__metadata__" is a tensor {dtype, shape, data_offsets [begin, end)}
// with offsets relative to the data start. The parser enforces every rule of the reference
// implementation (see notes/loaders.md) and reports duplicate keys as duplicates.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"
#include "loader/errors.h"
#include "loader/format/file_io.h"

namespace metaload {

// Every dtype of the format. Sub-byte types (F4, F6_*) are legal only where the tensor's total bit
// count is a whole number of bytes.
enum class DType : uint8_t {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  C64,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  F4,
  F6_E2M3,
  F6_E3M2,
};
inline constexpr int kNumDTypes = 22;

// The format's name ("BF16", "F8_E4M3", ...).
const char* dtype_name(DType d);
// Exact (case-sensitive) format name -> dtype; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);
// Bits per element: 4 for F4, 6 for F6_*, 8..64 otherwise.
int dtype_bits(DType d);
// Every dtype, in enum order (for listing accepted names).
const std::vector<DType>& all_dtypes();

// The dtype's torch names, as strings (this layer is torch-free): the torch.<attribute>
// ("float8_e4m3fn", "float4_e2m1fn_x2") and c10's ScalarType name ("Float8_e4m3fn"); nullptr where
// no torch has the dtype (F6_*). A given libtorch may lack a dtype all the same (1.13: float8,
// float4, uint16-64): the callers look its ScalarType up by this name.
const char* dtype_torch_attr(DType d);
const char* dtype_scalar_name(DType d);
// c10's ScalarType name -> dtype; nullopt where the format has none ("ComplexDouble", "QInt8").
std::optional<DType> dtype_from_scalar_name(const std::string& name);
// torch's attribute name ("bfloat16") -> dtype; nullopt where the format has none ("complex128").
std::optional<DType> dtype_from_torch_attr(std::string_view attr);
// Values one torch element of the dtype holds: 2 for F4 (float4_e2m1fn_x2 packs two values a
// byte along the last dimension), 1 otherwise.
int dtype_torch_values(DType d);
// The shape of the torch tensor holding a stored tensor of dtype `d` and `shape`: the same, except
// for a packed dtype (F4), whose last dimension is divided by dtype_torch_values; nullopt where
// that dimension is missing or not a multiple of it. The one copy of the rule (Python's
// safe_open asks for it through torch.ops.metaload.safetensors_dtypes).
std::optional<std::vector<int64_t>> torch_shape_of(DType d, const std::vector<int64_t>& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the data start

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::string path;
  uint64_t header_size = 0;  // N, the JSON length (including padding)
  uint64_t data_start = 0;   // 8 + N
  uint64_t file_size = 0;
  std::vector<TensorInfo> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
  // The read-only descriptor the header was read through, when kept (read_safetensors_header's
  // keep_open; open_checkpoint's keep_files): the loader reads the tensor data through it, from
  // the very file whose header was checked, and never opens the path a second time.
  std::shared_ptr<const UniqueFd> fd;

  // Lookup by name (binary search over a name index built by the parser); nullptr if absent.
  const TensorInfo* find(std::string_view name) const;
  // Rebuilds the name index; call after editing `tensors` by hand.
  void index_names();

  // Bytes of tensor data (file_size - data_start).
  uint64_t data_size() const { return file_size - data_start; }

 private:
  std::vector<uint32_t> by_name_;  // indices into tensors, sorted by name
};

// The largest header the format allows (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderSize = 100'000'000;

// Reads and validates the header of a safetensors file: exactly 8 + N bytes are read with pread,
// the data is neither mapped nor read. Throws FormatError (file, tensor, rule) on any violation.
// keep_open: the header keeps the descriptor (SafetensorsHeader::fd).
SafetensorsHeader read_safetensors_header(const std::string& path, bool keep_open = false);
// The same through a file already open (fileio::File: opened once, checked for what it is).
SafetensorsHeader read_safetensors_header(fileio::File&& file, bool keep_open = false);

// Validates header JSON (the N bytes after the length prefix) for a file of `file_size` bytes.
// For fuzzers and tests; read_safetensors_header ends here.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t file_size,
                                           const std::string& path);

// Validates a whole file held in memory (length prefix, header, data extent): the same rules as
// read_safetensors_header, for fuzzers and tests. Only the first 8 + N bytes are looked at.
SafetensorsHeader parse_safetensors_bytes(std::string_view file_bytes, const std::string& path);

// Process-wide count of bytes read from files by the format layer (headers, index files,
// config.json). Lets tests assert that describing a checkpoint reads headers only.
uint64_t io_bytes_read();
void reset_io_bytes_read();

}  // namespace metaload
