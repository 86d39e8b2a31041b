// Model keys: "<class path>:<json>", the remote identity of a model. The JSON suffix is written
// exactly as Python's json.dumps writes it (", " and ": " separators, ensure_ascii \uXXXX escapes,
// keys repo_id then revision), so keys minted here and by nnsight are byte-identical:
//   metaload.TransformersModel:{"repo_id": "openai-community/gpt2", "revision": null}
// Torch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace metaload {

// A malformed model key (no colon, unknown class, bad JSON, no repo_id, ...); the message says
// which.
METALOAD_DEFINE_ERROR(ModelKeyError, Error);

struct ModelKey {
  std::string class_path;  // as written in the key (an alias is kept; see canonical_model_class)
  std::string repo_id;
  std::optional<std::string> revision;  // null: unpinned
  // Further JSON fields after revision, in key order (e.g. nnsight's "task").
  std::vector<std::pair<std::string, nlohmann::ordered_json>> extra;

  bool operator==(const ModelKey& o) const {
    return class_path == o.class_path && repo_id == o.repo_id && revision == o.revision &&
           extra == o.extra;
  }
};

// Writes the key. Throws ModelKeyError for an empty class path or repo id, or strings that are not
// valid UTF-8.
std::string to_model_key(const ModelKey& key);

// Parses and validates a key: the class path must be registered (or an alias of a registered
// class), the JSON an object with a non-empty string repo_id and a string or null revision.
// Whitespace and key order in the JSON may differ from json.dumps'; to_model_key writes the
// canonical form.
ModelKey from_model_key(std::string_view key);

// The value as Python's json.dumps(value) writes it with default arguments.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace metaload
