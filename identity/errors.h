// Every error kind of the identity layer (identity/: keys, references, dtypes, describe, TP
// degrees, config.json), in one place. Torch-free, header-only. Each derives from metaload::Error
// (base/error.h); python/metaload/_lib.py mirrors the tree class for class.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "base/error.h"

namespace metaload {

// ---- keys, dtypes, TP degrees (model_key.h, dtypes.h, tp_degree.h) --------------------------

// A malformed model key (no colon, unknown class, bad JSON, no repo_id, ...); the message says
// which.
METALOAD_DEFINE_ERROR(ModelKeyError, Error);

// A key's repo_id that the key policy refuses. rule() is a stable identifier of the rule broken
// (the repo-id-* rules of hub_repo_id_problem, model_key.h); the message names the key (or the
// repo id, when no key text exists yet), the rule and how to opt in to local paths.
class RepoIdError : public ModelKeyError {
 public:
  RepoIdError(const std::string& message, std::string repo_id, std::string rule)
      : ModelKeyError("RepoIdError", message),
        repo_id_(std::move(repo_id)),
        rule_(std::move(rule)) {
    record_field("repo_id", repo_id_);
    record_field("rule", rule_);
  }
  const std::string& repo_id() const noexcept { return repo_id_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  std::string repo_id_, rule_;
};

// An unknown or unsupported dtype / quantization name; the message lists the accepted names.
METALOAD_DEFINE_ERROR(DTypeError, Error);

// A TP degree the model cannot be split into (a config field that is no size: ConfigError).
METALOAD_DEFINE_ERROR(TPError, Error);

// ---- config.json (config_fields.h: the one reader) ---------------------------------------------

// A config.json field that is missing, of the wrong type or out of range, or a config no reader
// can use (unsupported model_type, sizes that contradict each other, no such file). file() is the
// config (a path, "builtin:NAME" or "config.json" for a document without one), field() the
// field's dotted path inside it ("rope_scaling.factor", "text_config.num_attention_heads"; empty
// for the whole document), rule() a stable identifier of the rule broken (the config-* rules of
// config_fields.h; a file or JSON rule of loader/errors.h when the text could not be read). All
// three are in the error's record too (base/error.h): Python's .file, .field, .rule.
class ConfigError : public Error {
 public:
  ConfigError(const std::string& file, const std::string& field, const std::string& rule,
              const std::string& detail)
      : Error("ConfigError", compose(file, field, rule, detail)),
        file_(file),
        field_(field),
        rule_(rule) {
    record_field("file", file);
    record_field("field", field);
    record_field("rule", rule);
  }
  const std::string& file() const noexcept { return file_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  // "<file>: field '<field>' <detail> (rule <rule>)"; no file, no "<file>: ".
  static std::string compose(const std::string& file, const std::string& field,
                             const std::string& rule, const std::string& detail) {
    std::string m = file.empty() ? std::string() : escape_path(file) + ": ";
    if (!field.empty()) m += "field '" + field + "' ";
    return m + detail + " (rule " + rule + ")";
  }
  std::string file_, field_, rule_;
};

// The most layers a config may name: no model has a hundredth of it, and the per-layer tables and
// tensor lists would otherwise be sized by a hostile number (rule config-too-large).
inline constexpr int64_t kMaxConfigLayers = int64_t{1} << 16;
// The largest integer any other config field may hold (sizes, heads, experts, positions): larger
// is no model's, and keeps every product of two fields inside int64 (rule config-too-large).
inline constexpr int64_t kMaxConfigInt = (int64_t{1} << 31) - 1;
}  // namespace metaload
