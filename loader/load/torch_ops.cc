// The loader's torch translation unit: the tensor adapters of the writer and the Python operators
// of the format layer (torch.ops.metaload.*).
#include <cstring>
#include <memory>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <nlohmann/json.hpp>

#include "base/torch_library.h"
#include "loader/format/checkpoint.h"
#include "loader/format/json_util.h"
#include "loader/load/torch_save.h"

namespace metaload {

std::optional<DType> safetensors_dtype_of(c10::ScalarType t) {
  // By name (the format layer's table), so dtypes only newer libtorch releases have (float8,
  // uint16, ...) need no version checks here.
  return dtype_from_scalar_name(c10::toString(t));
}

namespace {

struct Prepared {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  TensorSource source;
};

Prepared prepare(const std::string& file, const std::string& name, const at::Tensor& t) {
  if (!t.defined()) throw FormatError(file, name, "no-data", "tensor is undefined");
  if (t.is_meta()) {
    throw FormatError(file, name, "no-data",
                      "tensor is on the meta device: it has no data to save");
  }
  if (t.layout() != c10::kStrided) {
    throw FormatError(file, name, "unsupported-layout",
                      "only dense (strided) tensors can be saved");
  }
  auto d = safetensors_dtype_of(t.scalar_type());
  if (!d) {
    throw FormatError(
        file, name, "unsupported-dtype",
        std::string("dtype ") + c10::toString(t.scalar_type()) + " has no safetensors equivalent");
  }
  Prepared p{name, *d, t.sizes().vec(), {}};
  // The header counts values; a packed torch dtype (float4_e2m1fn_x2) holds several an element,
  // along the last dimension (torch_shape_of's rule, backwards).
  if (const int per = dtype_torch_values(*d); per != 1) {
    if (p.shape.empty()) {
      throw FormatError(file, name, "unsupported-dtype",
                        std::string("a 0-d ") + dtype_torch_attr(*d) +
                            " tensor has no last dimension to store its " +
                            (per == 2 ? std::string("two") : std::to_string(per)) + " " +
                            dtype_name(*d) + " values along");
    }
    p.shape.back() *= per;
  }
  // The CPU contiguous copy is made when the writer first asks for this tensor's bytes and dropped
  // after the last block, so only one tensor is ever copied at a time.
  auto cache = std::make_shared<at::Tensor>();
  const uint64_t nbytes = tensor_nbytes(*d, p.shape, file, name);
  at::Tensor src = t;
  p.source = [src, cache, nbytes](uint64_t off, void* dst, uint64_t n) {
    if (!cache->defined()) *cache = src.detach().to(at::kCPU).contiguous();
    std::memcpy(dst, static_cast<const char*>(cache->data_ptr()) + off, n);
    if (off + n == nbytes) cache->reset();
  };
  return p;
}

std::map<std::string, std::string> metadata_from_json(const std::string& text) {
  std::map<std::string, std::string> md;
  if (text.empty()) return md;
  nlohmann::json j = parse_json_strict(text, "<metadata>");
  if (j.is_null()) return md;
  if (!j.is_object())
    throw FormatError("<metadata>", "", "invalid-metadata",
                      "metadata must be a JSON object of strings");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) {
      throw FormatError("<metadata>", "", "invalid-metadata",
                        "metadata value of " + quote_str(it.key()) +
                            " is not a string (safetensors metadata is str -> str)");
    }
    md[it.key()] = it.value().get<std::string>();
  }
  return md;
}

std::vector<std::pair<std::string, at::Tensor>> zip(const std::string& where,
                                                    const std::vector<std::string>& names,
                                                    at::TensorList tensors) {
  if (names.size() != tensors.size()) {
    throw FormatError(
        where, "", "invalid-arguments",
        std::to_string(names.size()) + " names for " + std::to_string(tensors.size()) + " tensors");
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], tensors[i]);
  return out;
}

nlohmann::json header_to_json(const SafetensorsHeader& h) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : h.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"begin", t.begin},
                       {"end", t.end}});
  }
  return {{"path", h.path},           {"header_size", h.header_size}, {"data_start", h.data_start},
          {"file_size", h.file_size}, {"metadata", h.metadata},       {"tensors", tensors}};
}

// Operator bodies. Errors propagate as metaload::Error; torch keeps what() in the RuntimeError.
void op_save(std::string path, std::vector<std::string> names, at::TensorList tensors,
             std::string metadata_json) {
  save_safetensors(path, zip(path, names, tensors), metadata_from_json(metadata_json));
}

std::string op_save_sharded(std::string dir, std::vector<std::string> names, at::TensorList tensors,
                            std::string metadata_json, int64_t max_shard_bytes, int64_t num_shards,
                            std::string prefix) {
  if (max_shard_bytes < 0)
    throw ShardError(dir, "", "invalid-options", "max_shard_bytes must not be negative");
  ShardOptions o;
  o.max_shard_bytes = static_cast<uint64_t>(max_shard_bytes);
  o.num_shards = static_cast<int>(num_shards);
  o.prefix = prefix.empty() ? "model" : prefix;
  o.metadata = metadata_from_json(metadata_json);
  ShardedWriteResult r = save_safetensors_sharded(dir, zip(dir, names, tensors), o);
  return nlohmann::json{
      {"files", r.files}, {"index_path", r.index_path}, {"total_size", r.total_size}}
      .dump();
}

std::string op_read_header(std::string path) {
  return header_to_json(read_safetensors_header(path)).dump();
}

std::string op_open_checkpoint(std::string ref, c10::optional<std::string> revision) {
  std::optional<std::string> rev;
  if (revision) rev = *revision;
  Checkpoint c = open_checkpoint(ref, rev);
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : c.files) files.push_back(f.path);
  auto opt = [](const std::optional<std::string>& s) {
    return s ? nlohmann::json(*s) : nlohmann::json();
  };
  return nlohmann::json{{"ref", c.ref},
                        {"dir", c.dir},
                        {"files", files},
                        {"num_tensors", c.num_tensors()},
                        {"data_bytes", c.data_bytes()},
                        {"index_path", opt(c.index_path)},
                        {"config_path", opt(c.config_path)},
                        {"revision", opt(c.revision)},
                        {"repo_id", opt(c.repo_id)}}
      .dump();
}

// The format layer's dtype table for Python (_safetensors.format_dtypes): each dtype's format
// name, torch attribute (null where no torch has it), bits a value and values a torch element.
std::string op_safetensors_dtypes() {
  nlohmann::json rows = nlohmann::json::array();
  for (DType d : all_dtypes()) {
    const char* attr = dtype_torch_attr(d);
    rows.push_back({{"name", dtype_name(d)},
                    {"torch", attr ? nlohmann::json(attr) : nlohmann::json()},
                    {"bits", dtype_bits(d)},
                    {"values_per_element", dtype_torch_values(d)}});
  }
  return rows.dump();
}

int64_t op_io_bytes_read() {
  return static_cast<int64_t>(io_bytes_read());
}
void op_reset_io_bytes_read() {
  reset_io_bytes_read();
}

}  // namespace

SafetensorsHeader save_safetensors(const std::string& path,
                                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, metadata);
  for (const auto& [name, t] : tensors) {
    Prepared p = prepare(path, name, t);
    w.add(p.name, p.dtype, p.shape, std::move(p.source));
  }
  return w.write();
}

ShardedWriteResult save_safetensors_sharded(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const ShardOptions& options) {
  ShardedSafetensorsWriter w(dir, options);
  for (const auto& [name, t] : tensors) {
    Prepared p = prepare(dir, name, t);
    w.add(p.name, p.dtype, p.shape, std::move(p.source));
  }
  return w.write();
}

}  // namespace metaload

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("save_safetensors(str path, str[] names, Tensor[] tensors, str metadata_json) -> ()",
        &metaload::op_save);
  m.def(
      "save_safetensors_sharded(str dir, str[] names, Tensor[] tensors, str metadata_json, "
      "int max_shard_bytes, int num_shards, str prefix) -> str",
      &metaload::op_save_sharded);
  m.def("read_safetensors_header(str path) -> str", &metaload::op_read_header);
  m.def("open_checkpoint(str ref, str? revision=None) -> str", &metaload::op_open_checkpoint);
  m.def("safetensors_dtypes() -> str", &metaload::op_safetensors_dtypes);
  m.def("io_bytes_read() -> int", &metaload::op_io_bytes_read);
  m.def("reset_io_bytes_read() -> ()", &metaload::op_reset_io_bytes_read);
}
