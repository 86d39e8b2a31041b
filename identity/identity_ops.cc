// Python operators of the remote identity: describe, model keys, TP degrees, dtype table.
// The only torch translation unit of the identity code; the logic lives in torch-free files.
#include <torch/library.h>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "base/torch_library.h"
#include "identity/describe.h"
#include "identity/dtypes.h"
#include "identity/errors.h"
#include "identity/model_key.h"
#include "identity/reference.h"
#include "identity/registry.h"
#include "identity/tp_degree.h"
#include "loader/errors.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

std::optional<std::string> opt(const c10::optional<std::string>& s) {
  return s ? std::optional<std::string>(*s) : std::nullopt;
}

nlohmann::json config_arg(const std::string& text) {
  try {
    return parse_json_strict(text, "<config>");
  } catch (const FormatError& e) {
    throw ConfigError("<config>", "", e.rule(), "is not valid JSON: " + e.detail());
  }
}

std::string op_describe(std::string ref, c10::optional<std::string> dtype,
                        c10::optional<std::string> revision, bool allow_local_paths) {
  return to_json(describe_checkpoint(ref, opt(dtype), opt(revision), KeyOptions{allow_local_paths}))
      .dump();
}

// extra_json: a JSON object of further fields, written after revision in its order (nnsight's
// "task").
std::string op_to_model_key(std::string class_path, std::string repo_id,
                            c10::optional<std::string> revision, bool allow_local_paths,
                            std::string extra_json) {
  nlohmann::ordered_json extra;
  try {
    extra = parse_key_json(extra_json, "extra");  // integers of any size kept exact
  } catch (const FormatError& e) {
    throw ModelKeyError("the extra fields of a model key are not valid JSON: " + e.detail() +
                        " (rule " + e.rule() + ")");
  }
  if (!extra.is_object()) {
    throw ModelKeyError("the extra fields of a model key must be a JSON object, not " +
                        quote_text(extra_json));
  }
  ModelKey key{class_path, repo_id, opt(revision), {}};
  for (const auto& [name, value] : extra.items()) {
    if (name == "repo_id" || name == "revision") {
      throw ModelKeyError("extra field " + quote_text(name) + " of a model key is a main field");
    }
    key.extra.emplace_back(name, value);
  }
  return to_model_key(key, KeyOptions{allow_local_paths});
}

std::string op_from_model_key(std::string key, bool allow_local_paths) {
  ModelKey k = from_model_key(key, KeyOptions{allow_local_paths});
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  for (const auto& [name, value] : k.extra) extra[name] = value;
  nlohmann::ordered_json out = {
      {"class_path", k.class_path},
      {"canonical_class", canonical_model_class(k.class_path)},
      {"repo_id", k.repo_id},
      {"revision", k.revision ? nlohmann::ordered_json(*k.revision) : nlohmann::ordered_json()}};
  // The extra fields as json.dumps writes them: an integer past 64 bits reaches Python exact.
  std::string text = out.dump();
  text.pop_back();
  return text + ",\"extra\":" + python_json_dumps(extra) + "}";
}

// -1 stands for "none": optional int returns are not supported by every libtorch release.
int64_t op_max_tp_size(std::string config_json, bool expert_parallel) {
  auto m = max_tp_size(config_arg(config_json), expert_parallel);
  return m ? *m : -1;
}

int64_t op_tp_degree_for(std::string config_json, int64_t n, bool expert_parallel) {
  return tp_degree_for(config_arg(config_json), n, expert_parallel);
}

double op_bytes_per_element(std::string name) {
  return bytes_per_element(name);
}

std::string op_dtype_table() {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : dtype_table()) {
    const char* kind = e.kind == DTypeKind::kQuantization ? "quantization"
                       : e.kind == DTypeKind::kTorch      ? "torch"
                                                          : "file";
    rows.push_back({{"name", std::string(e.name)},
                    {"bytes_per_element", e.bytes_per_element},
                    {"kind", kind},
                    {"torch_name", std::string(e.torch_name)}});
  }
  return rows.dump();
}

// Where a reference's checkpoint is, without opening it: {"key": whether `ref` is a model key,
// "dir": the directory of its weights, "repo_id", "commit"}. load_into resolves a model key here
// (hub cache only, identity/reference.h) and loads the snapshot directory, never a path the key's
// repo id would name in the working directory.
std::string op_resolve_reference(std::string ref, c10::optional<std::string> revision,
                                 bool allow_local_paths) {
  const ModelReference r = resolve_reference(ref, opt(revision), KeyOptions{allow_local_paths});
  const CheckpointReference& c = r.checkpoint;
  auto maybe = [](const std::optional<std::string>& s) {
    return s ? nlohmann::json(*s) : nlohmann::json();
  };
  nlohmann::json out = {{"key", r.key.has_value()},
                        {"dir", c.dir},
                        {"path", c.path},
                        {"repo_id", maybe(c.repo_id)},
                        {"commit", maybe(c.commit)}};
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::string> op_model_classes() {
  return known_model_classes();
}

}  // namespace
}  // namespace metaload

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "describe_checkpoint(str ref, str? dtype=None, str? revision=None, "
      "bool allow_local_paths=False) -> str",
      &metaload::op_describe);
  m.def(
      "to_model_key(str class_path, str repo_id, str? revision=None, "
      "bool allow_local_paths=False, str extra_json='{}') -> str",
      &metaload::op_to_model_key);
  m.def("from_model_key(str key, bool allow_local_paths=False) -> str",
        &metaload::op_from_model_key);
  m.def("max_tp_size(str config_json, bool expert_parallel=False) -> int",
        &metaload::op_max_tp_size);
  m.def("tp_degree_for(str config_json, int n, bool expert_parallel=False) -> int",
        &metaload::op_tp_degree_for);
  m.def("bytes_per_element(str name) -> float", &metaload::op_bytes_per_element);
  m.def("dtype_table() -> str", &metaload::op_dtype_table);
  m.def("model_classes() -> str[]", &metaload::op_model_classes);
  m.def("resolve_reference(str ref, str? revision=None, bool allow_local_paths=False) -> str",
        &metaload::op_resolve_reference);
}
