// Model keys: "<class path>:<json>", the remote identity of a model. The JSON suffix is written
// exactly as Python's json.dumps writes it (", " and ": " separators, ensure_ascii \uXXXX escapes,
// keys repo_id then revision), so keys minted here and by nnsight are byte-identical:
//   metaload.TransformersModel:{"repo_id": "openai-community/gpt2", "revision": null}
//
// Keys may come from remote users (an inference server takes them in requests), so a key's repo_id
// is a Hugging Face Hub repo id and nothing else unless the caller opts in to local paths
// (KeyOptions::allow_local_paths): "/etc/passwd", "../x" or "org/.." are refused with a
// RepoIdError naming the key and the rule broken, and a Hub-style id is looked up in the hub
// cache only, never as a path (not even one relative to the working directory).
// Torch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "identity/errors.h"

namespace metaload {

struct KeyOptions {
  // Accept a repo_id that is not a Hub repo id: a local path (absolute, relative, with ".."),
  // resolved as a path first, as TransformersModel(ref) resolves a path it is given. Only a NUL
  // byte is still refused. For keys the caller itself minted from local checkpoints.
  bool allow_local_paths = false;
};

// Why `repo_id` is not a Hugging Face Hub repo id, or nullopt when it is one. The Hub's rules
// (huggingface_hub's validate_repo_id): "name" or "namespace/name"; letters, digits, '-', '_' and
// '.'; no "--" or ".."; no part beginning or ending with '-' or '.'; at most 96 characters per
// part; not ending in ".git". Rules, checked in this order: repo-id-empty, repo-id-absolute-path,
// repo-id-parent-dir, repo-id-parts, repo-id-character, repo-id-double-dash, repo-id-edge,
// repo-id-length, repo-id-git-suffix.
struct RepoIdProblem {
  std::string rule;
  std::string detail;  // what is wrong, in words
};
std::optional<RepoIdProblem> hub_repo_id_problem(std::string_view repo_id);

// Throws RepoIdError when the policy refuses `repo_id` (with allow_local_paths: only an empty one
// or one holding a NUL byte, rule repo-id-nul). `key`, when given, is named in the message.
void check_key_repo_id(std::string_view repo_id, const KeyOptions& options = {},
                       std::string_view key = {});

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

// Writes the key. Throws ModelKeyError for an empty class path, strings that are not valid UTF-8,
// and RepoIdError for a repo id the policy refuses (see KeyOptions).
std::string to_model_key(const ModelKey& key, const KeyOptions& options = {});

// Parses and validates a key: the class path must be registered (or an alias of a registered
// class), the JSON an object with a string repo_id the policy accepts (RepoIdError otherwise; see
// KeyOptions) and a string or null revision. Whitespace and key order in the JSON may differ from
// json.dumps'; to_model_key writes the canonical form.
ModelKey from_model_key(std::string_view key, const KeyOptions& options = {});

// Parses JSON text as Python's json.loads does for a key's fields: key order kept, and an integer
// of any size exact (one past 64 bits, which nlohmann would read as a double, is kept as its
// digits and written back by python_json_dumps as they were). FormatError (file `what`) for text
// parse_json_strict refuses: bad syntax, duplicate keys, nesting past kMaxJsonDepth, bytes that
// are not UTF-8.
nlohmann::ordered_json parse_key_json(std::string_view text, const std::string& what);

// The value as Python's json.dumps(value) writes it with default arguments: ensure_ascii strings,
// floats as repr writes them, integers of any size (parse_key_json) exact. ModelKeyError for a
// value json.dumps would write as no JSON (NaN, Infinity) or that JSON cannot hold (a binary).
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace metaload
