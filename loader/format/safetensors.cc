#include "loader/format/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "base/checked.h"
#include "base/text.h"
#include "loader/format/file_io.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

struct DTypeRow {
  DType dtype;
  const char* name;  // the format's
  int bits;
  const char* torch_attr;   // torch.<attr>; nullptr where no torch has the dtype
  const char* scalar_name;  // c10::toString of its at::ScalarType; nullptr likewise
  int torch_values;         // values one torch element holds (2: float4_e2m1fn_x2 packs two)
};

// The one table of the format's dtypes and their torch names (tests/python/test_one_copy.py
// fails on a second copy of a pair). Order must match the enum.
constexpr std::array<DTypeRow, kNumDTypes> kDTypes = {{
    {DType::BOOL, "BOOL", 8, "bool", "Bool", 1},
    {DType::U8, "U8", 8, "uint8", "Byte", 1},
    {DType::I8, "I8", 8, "int8", "Char", 1},
    {DType::I16, "I16", 16, "int16", "Short", 1},
    {DType::U16, "U16", 16, "uint16", "UInt16", 1},
    {DType::F16, "F16", 16, "float16", "Half", 1},
    {DType::BF16, "BF16", 16, "bfloat16", "BFloat16", 1},
    {DType::I32, "I32", 32, "int32", "Int", 1},
    {DType::U32, "U32", 32, "uint32", "UInt32", 1},
    {DType::F32, "F32", 32, "float32", "Float", 1},
    {DType::F64, "F64", 64, "float64", "Double", 1},
    {DType::I64, "I64", 64, "int64", "Long", 1},
    {DType::U64, "U64", 64, "uint64", "UInt64", 1},
    {DType::C64, "C64", 64, "complex64", "ComplexFloat", 1},
    {DType::F8_E4M3, "F8_E4M3", 8, "float8_e4m3fn", "Float8_e4m3fn", 1},
    {DType::F8_E5M2, "F8_E5M2", 8, "float8_e5m2", "Float8_e5m2", 1},
    {DType::F8_E8M0, "F8_E8M0", 8, "float8_e8m0fnu", "Float8_e8m0fnu", 1},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, "float8_e4m3fnuz", "Float8_e4m3fnuz", 1},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, "float8_e5m2fnuz", "Float8_e5m2fnuz", 1},
    {DType::F4, "F4", 4, "float4_e2m1fn_x2", "Float4_e2m1fn_x2", 2},
    {DType::F6_E2M3, "F6_E2M3", 6, nullptr, nullptr, 1},
    {DType::F6_E3M2, "F6_E3M2", 6, nullptr, nullptr, 1},
}};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(rows_in_enum_order(), "kDTypes rows must be in DType's order");

std::string accepted_dtype_list() {
  std::string s;
  for (const auto& r : kDTypes) {
    if (!s.empty()) s += ", ";
    s += r.name;
  }
  return s;
}

constexpr const char* kMetadataKey = "__metadata__";

// A SAX handler that validates the header while it is parsed: no DOM is built, so a header of a
// few MB with tens of thousands of tensors parses in a few ms. The first violation is recorded and
// parsing stops (every callback returns false from then on).
class HeaderSax {
 public:
  using json = nlohmann::json;

  explicit HeaderSax(const std::string& path) : path_(path) {}

  // The recorded failure, if any.
  bool failed() const { return failed_; }
  [[noreturn]] void rethrow() const {
    throw FormatError(path_, err_tensor_, err_rule_, err_detail_);
  }

  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;

  bool null() {
    if (skip_value()) return true;
    if (state_ == State::kTopValue && key_is_metadata_) {
      state_ = State::kTop;  // "__metadata__": null is accepted as "no metadata"
      return true;
    }
    return scalar("null");
  }
  bool boolean(bool) { return skip_value() || scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (skip_value()) return true;
    if (state_ == State::kShape)
      return fail("invalid-shape", "shape has a negative dimension " + std::to_string(v));
    if (state_ == State::kOffsets)
      return fail("invalid-offsets", "data_offsets has a negative value " + std::to_string(v));
    return scalar("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (skip_value()) return true;
    if (state_ == State::kShape) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail("invalid-shape",
                    "shape dimension " + std::to_string(v) + " does not fit in int64");
      }
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (n_offsets_ >= 2) return fail("invalid-offsets", "data_offsets has more than 2 values");
      offsets_[n_offsets_++] = v;
      return true;
    }
    return scalar("a number");
  }
  bool number_float(json::number_float_t, const std::string& text) {
    if (skip_value()) return true;
    if (state_ == State::kShape)
      return fail("invalid-shape",
                  "shape dimension " + escape_text(text) + " is not a non-negative integer");
    if (state_ == State::kOffsets)
      return fail("invalid-offsets", "data_offsets value " + escape_text(text) +
                                         " is not a non-negative integer that fits in 64 bits");
    return scalar("a number");
  }
  bool string(std::string& s) {
    if (skip_value()) return true;
    switch (state_) {
      case State::kEntryValue:
        if (field_ == Field::kDType) {
          auto d = dtype_from_name(s);
          if (!d)
            return fail("unknown-dtype", "unknown dtype " + quote_str(s) +
                                             "; the format's dtypes are " + accepted_dtype_list());
          cur_.dtype = *d;
          state_ = State::kEntry;
          return true;
        }
        return scalar("a string");
      case State::kMetaValue:
        metadata.emplace(meta_key_, std::move(s));
        state_ = State::kMeta;
        return true;
      default:
        return scalar("a string");
    }
  }
  bool binary(json::binary_t&) { return fail("invalid-json", "binary value"); }

  bool start_object(std::size_t) {
    if (!enter()) return false;
    if (skip_value(+1)) return true;
    switch (state_) {
      case State::kStart:
        state_ = State::kTop;
        return true;
      case State::kTopValue:
        if (key_is_metadata_) {
          state_ = State::kMeta;
          meta_keys_.clear();
        } else {
          state_ = State::kEntry;
          cur_ = TensorInfo{};
          cur_.name = entry_name_;
          seen_dtype_ = seen_shape_ = seen_offsets_ = false;
        }
        return true;
      default:
        return scalar("an object");
    }
  }
  bool key(std::string& k) {
    if (skipping_) return true;
    switch (state_) {
      case State::kTop:
        if (!names_.insert(k).second) {
          if (k == kMetadataKey)
            return fail("duplicate-key", "\"__metadata__\" appears more than once");
          err_tensor_ = k;
          return fail("duplicate-tensor", "tensor name appears more than once in the header");
        }
        key_is_metadata_ = (k == kMetadataKey);
        entry_name_ = k;
        state_ = State::kTopValue;
        return true;
      case State::kEntry: {
        bool* seen = nullptr;
        if (k == "dtype") {
          field_ = Field::kDType;
          seen = &seen_dtype_;
        } else if (k == "shape") {
          field_ = Field::kShape;
          seen = &seen_shape_;
        } else if (k == "data_offsets") {
          field_ = Field::kOffsets;
          seen = &seen_offsets_;
        } else {
          // Unknown fields are ignored, as the reference implementation does.
          skipping_ = true;
          skip_depth_ = 0;
          return true;
        }
        if (*seen)
          return fail("duplicate-key", "field " + quote_str(k) + " appears more than once");
        *seen = true;
        state_ = State::kEntryValue;
        return true;
      }
      case State::kMeta:
        if (!meta_keys_.insert(k).second)
          return fail("duplicate-key",
                      "__metadata__ key " + quote_str(k) + " appears more than once");
        meta_key_ = k;
        state_ = State::kMetaValue;
        return true;
      default:
        return fail("invalid-json", "unexpected key " + quote_str(k));
    }
  }
  bool end_object() {
    --depth_;
    if (skip_value(-1)) return true;
    switch (state_) {
      case State::kTop:
        state_ = State::kDone;
        return true;
      case State::kMeta:
        state_ = State::kTop;
        return true;
      case State::kEntry:
        if (!finish_entry()) return false;
        state_ = State::kTop;
        return true;
      default:
        return fail("invalid-json", "unexpected end of object");
    }
  }
  bool start_array(std::size_t) {
    if (!enter()) return false;
    if (skip_value(+1)) return true;
    if (state_ == State::kEntryValue && field_ == Field::kShape) {
      state_ = State::kShape;
      cur_.shape.clear();
      return true;
    }
    if (state_ == State::kEntryValue && field_ == Field::kOffsets) {
      state_ = State::kOffsets;
      n_offsets_ = 0;
      return true;
    }
    return scalar("an array");
  }
  bool end_array() {
    --depth_;
    if (skip_value(-1)) return true;
    if (state_ == State::kShape) {
      state_ = State::kEntry;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (n_offsets_ != 2)
        return fail("invalid-offsets",
                    "data_offsets must hold exactly 2 values [begin, end), it holds " +
                        std::to_string(n_offsets_));
      cur_.begin = offsets_[0];
      cur_.end = offsets_[1];
      state_ = State::kEntry;
      return true;
    }
    return fail("invalid-json", "unexpected end of array");
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    if (failed_) return false;  // our own abort surfaces as a parse error too
    err_tensor_.clear();
    return fail("invalid-json",
                "header is not valid JSON at byte " + std::to_string(position) + ": " + ex.what());
  }

 private:
  enum class State {
    kStart,       // before the top-level object
    kTop,         // inside the top-level object, expecting a key
    kTopValue,    // after a top-level key
    kEntry,       // inside a tensor entry, expecting a field name
    kEntryValue,  // after a field name
    kShape,       // inside "shape": [...]
    kOffsets,     // inside "data_offsets": [...]
    kMeta,        // inside "__metadata__", expecting a key
    kMetaValue,   // after a metadata key
    kDone,
  };
  enum class Field { kDType, kShape, kOffsets };

  // One level deeper; an unknown field's value may nest (it is skipped), but no deeper than any
  // JSON metaload reads.
  bool enter() {
    if (++depth_ > kMaxJsonDepth) return fail("json-too-deep", json_too_deep_detail());
    return true;
  }

  // While an unknown field's value is being skipped, every event lands here. `delta` is +1 for a
  // container start, -1 for its end, 0 for a scalar.
  bool skip_value(int delta = 0) {
    if (!skipping_) return false;
    skip_depth_ += delta;
    if (skip_depth_ == 0) skipping_ = false;
    return true;
  }

  // A value of the wrong kind for the current position.
  bool scalar(const char* what) {
    switch (state_) {
      case State::kStart:
        return fail("header-not-object", std::string("header JSON is ") + what + ", not an object");
      case State::kTopValue:
        if (key_is_metadata_) {
          return fail("invalid-metadata",
                      std::string("__metadata__ is ") + what + ", not an object of strings");
        }
        err_tensor_ = entry_name_;
        return fail("entry-not-object", std::string("entry is ") + what +
                                            ", not an object {dtype, shape, data_offsets}");
      case State::kEntryValue:
        if (field_ == Field::kDType)
          return fail("unknown-dtype", std::string("dtype is ") + what + ", not a dtype name");
        if (field_ == Field::kShape)
          return fail("invalid-shape",
                      std::string("shape is ") + what + ", not an array of integers");
        return fail("invalid-offsets",
                    std::string("data_offsets is ") + what + ", not an array [begin, end]");
      case State::kShape:
        return fail("invalid-shape",
                    std::string("shape holds ") + what + ", not a non-negative integer");
      case State::kOffsets:
        return fail("invalid-offsets",
                    std::string("data_offsets holds ") + what + ", not a non-negative integer");
      case State::kMetaValue:
        return fail("invalid-metadata", "__metadata__ value of " + quote_str(meta_key_) + " is " +
                                            what + ", not a string");
      default:
        return fail("invalid-json", std::string("unexpected ") + what);
    }
  }

  bool finish_entry() {
    if (!seen_dtype_) return fail("missing-field", "entry has no \"dtype\"");
    if (!seen_shape_) return fail("missing-field", "entry has no \"shape\"");
    if (!seen_offsets_) return fail("missing-field", "entry has no \"data_offsets\"");
    if (cur_.end < cur_.begin) {
      return fail("offsets-reversed", "data_offsets [" + std::to_string(cur_.begin) + ", " +
                                          std::to_string(cur_.end) + ") end before they begin");
    }
    // Dims are >= 0 (rule invalid-shape); elements must fit torch's int64 sizes.
    const std::optional<int64_t> numel = product_or_none<int64_t>(cur_.shape);
    if (!numel) {
      return fail("size-overflow",
                  "shape " + shape_str(cur_.shape) + " has more elements than fit in 63 bits");
    }
    const std::optional<uint64_t> maybe_bits =
        mul_or_none<uint64_t>(static_cast<uint64_t>(*numel), dtype_bits(cur_.dtype));
    if (!maybe_bits) {
      return fail("size-overflow", "shape " + shape_str(cur_.shape) + " of " +
                                       dtype_name(cur_.dtype) + " needs more than 2^64 bits");
    }
    const uint64_t bits = *maybe_bits;
    if (bits % 8 != 0) {
      return fail("misaligned-size", "shape " + shape_str(cur_.shape) + " of " +
                                         dtype_name(cur_.dtype) + " is " + std::to_string(bits) +
                                         " bits, not a whole number of bytes");
    }
    if (cur_.end - cur_.begin != bits / 8) {
      return fail("size-mismatch", "data_offsets [" + std::to_string(cur_.begin) + ", " +
                                       std::to_string(cur_.end) + ") hold " +
                                       std::to_string(cur_.end - cur_.begin) + " bytes but shape " +
                                       shape_str(cur_.shape) + " of " + dtype_name(cur_.dtype) +
                                       " needs " + std::to_string(bits / 8));
    }
    tensors.push_back(std::move(cur_));
    return true;
  }

  bool fail(const char* rule, std::string detail) {
    if (!failed_) {
      failed_ = true;
      err_rule_ = rule;
      err_detail_ = std::move(detail);
      if (err_tensor_.empty() && (state_ == State::kEntry || state_ == State::kEntryValue ||
                                  state_ == State::kShape || state_ == State::kOffsets)) {
        err_tensor_ = cur_.name;
      }
    }
    return false;
  }

  const std::string& path_;
  State state_ = State::kStart;
  Field field_ = Field::kDType;
  bool key_is_metadata_ = false;
  std::string entry_name_, meta_key_;
  std::set<std::string> names_, meta_keys_;
  TensorInfo cur_;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  uint64_t offsets_[2] = {0, 0};
  int n_offsets_ = 0;
  bool skipping_ = false;
  int skip_depth_ = 0;
  int depth_ = 0;  // open arrays and objects

  bool failed_ = false;
  std::string err_rule_, err_detail_, err_tensor_;
};

}  // namespace

const char* dtype_name(DType d) {
  return kDTypes[static_cast<size_t>(d)].name;
}

int dtype_bits(DType d) {
  return kDTypes[static_cast<size_t>(d)].bits;
}

const char* dtype_torch_attr(DType d) {
  return kDTypes[static_cast<size_t>(d)].torch_attr;
}

const char* dtype_scalar_name(DType d) {
  return kDTypes[static_cast<size_t>(d)].scalar_name;
}

int dtype_torch_values(DType d) {
  return kDTypes[static_cast<size_t>(d)].torch_values;
}

std::optional<DType> dtype_from_scalar_name(const std::string& name) {
  for (const auto& r : kDTypes) {
    if (r.scalar_name != nullptr && name == r.scalar_name) return r.dtype;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_torch_attr(std::string_view attr) {
  for (const auto& r : kDTypes) {
    if (r.torch_attr != nullptr && attr == r.torch_attr) return r.dtype;
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> torch_shape_of(DType d, const std::vector<int64_t>& shape) {
  const int per = dtype_torch_values(d);
  if (per == 1) return shape;
  // A packed torch dtype holds `per` values an element, along the last dimension.
  if (shape.empty() || shape.back() % per != 0) return std::nullopt;
  std::vector<int64_t> packed = shape;
  packed.back() /= per;
  return packed;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& r : kDTypes) {
    if (name == r.name) return r.dtype;
  }
  return std::nullopt;
}

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> all = [] {
    std::vector<DType> v;
    for (const auto& r : kDTypes) v.push_back(r.dtype);
    return v;
  }();
  return all;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated by the parser not to overflow
  return n;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t i, std::string_view n) { return tensors[i].name < n; });
  if (it == by_name_.end() || tensors[*it].name != name) return nullptr;
  return &tensors[*it];
}

void SafetensorsHeader::index_names() {
  by_name_.resize(tensors.size());
  for (uint32_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](uint32_t a, uint32_t b) { return tensors[a].name < tensors[b].name; });
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t file_size,
                                           const std::string& path) {
  size_t bad = 0;
  if (!valid_utf8(json, &bad)) {
    throw FormatError(
        path, "", "header-not-utf8",
        "header is not valid UTF-8 (first bad byte at header offset " + std::to_string(bad) + ")");
  }
  // nlohmann's lexer stops at a NUL byte as if the input ended there, which would accept
  // "{}\0<anything>"; raw NULs are never valid JSON (padding must be spaces).
  if (size_t nul = json.find('\0'); nul != std::string_view::npos) {
    throw FormatError(path, "", "invalid-json",
                      "header holds a NUL byte at offset " + std::to_string(nul) +
                          " (JSON allows none; padding must be spaces)");
  }
  if (json.empty() || json.front() != '{') {
    throw FormatError(
        path, "", "header-not-object",
        json.empty() ? std::string("header is empty") : "header does not begin with '{'");
  }
  HeaderSax sax(path);
  bool ok = nlohmann::json::sax_parse(json.begin(), json.end(), &sax,
                                      nlohmann::json::input_format_t::json,
                                      /*strict=*/true, /*ignore_comments=*/false);
  if (sax.failed()) sax.rethrow();
  if (!ok) throw FormatError(path, "", "invalid-json", "header is not valid JSON");

  SafetensorsHeader h;
  h.path = path;
  h.header_size = json.size();
  h.data_start = 8 + json.size();
  h.file_size = file_size;
  h.metadata = std::move(sax.metadata);
  h.tensors = std::move(sax.tensors);
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  // The data must be one contiguous run: no gaps, no overlaps, and nothing after it.
  uint64_t expected = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != expected) {
      std::string what =
          t.begin > expected
              ? "leaves a gap of " + std::to_string(t.begin - expected) + " bytes"
              : "overlaps the previous tensor by " + std::to_string(expected - t.begin) + " bytes";
      throw FormatError(path, t.name, "offsets-not-contiguous",
                        "data_offsets begin at " + std::to_string(t.begin) +
                            " but the previous tensor ends at " + std::to_string(expected) + " (" +
                            what + ")");
    }
    expected = t.end;
  }
  uint64_t data_end;
  if (__builtin_add_overflow(expected, h.data_start, &data_end) || data_end > file_size) {
    throw FormatError(path, "", "data-truncated",
                      "tensor data ends at byte " + std::to_string(expected) +
                          " of the data, but the file holds only " +
                          std::to_string(file_size >= h.data_start ? file_size - h.data_start : 0) +
                          " data bytes");
  }
  if (data_end < file_size) {
    throw FormatError(
        path, "", "trailing-bytes",
        "file has " + std::to_string(file_size - data_end) + " bytes after the last tensor's data");
  }
  h.index_names();
  return h;
}

namespace {

// The length prefix rules; returns N.
uint64_t check_length_prefix(const unsigned char* len_bytes, uint64_t size,
                             const std::string& path) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian on every host
  if (n > kMaxHeaderSize) {
    throw FormatError(path, "", "header-too-large",
                      "header length " + std::to_string(n) + " exceeds the format's limit of " +
                          std::to_string(kMaxHeaderSize));
  }
  if (n + 8 > size) {
    throw FormatError(path, "", "header-truncated",
                      "header length " + std::to_string(n) + " runs past the end of the " +
                          std::to_string(size) + "-byte file");
  }
  return n;
}

void check_min_size(uint64_t size, const std::string& path) {
  if (size < 8) {
    throw FormatError(
        path, "", "file-too-small",
        "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_bytes(std::string_view file_bytes, const std::string& path) {
  check_min_size(file_bytes.size(), path);
  uint64_t n = check_length_prefix(reinterpret_cast<const unsigned char*>(file_bytes.data()),
                                   file_bytes.size(), path);
  return parse_safetensors_header(file_bytes.substr(8, n), file_bytes.size(), path);
}

SafetensorsHeader read_safetensors_header(const std::string& path, bool keep_open) {
  fileio::File f(path);
  return read_safetensors_header(std::move(f), keep_open);
}

SafetensorsHeader read_safetensors_header(fileio::File&& f, bool keep_open) {
  const std::string& path = f.path();
  uint64_t size = f.regular_file_size();
  check_min_size(size, path);
  unsigned char len_bytes[8];
  f.pread_full(len_bytes, 8, 0);
  uint64_t n = check_length_prefix(len_bytes, size, path);
  std::string json(n, '\0');
  f.pread_full(json.data(), n, 8);
  SafetensorsHeader h = parse_safetensors_header(json, size, path);
  if (keep_open) h.fd = std::make_shared<const UniqueFd>(f.take());
  return h;
}

}  // namespace metaload
