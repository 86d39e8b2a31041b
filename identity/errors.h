// Every error kind of the identity layer (identity/: keys, references, dtypes, describe, TP
// degrees), in one place. Torch-free, header-only. Each derives from metaload::Error
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
        rule_(std::move(rule)) {}
  const std::string& repo_id() const noexcept { return repo_id_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  std::string repo_id_, rule_;
};

// An unknown or unsupported dtype / quantization name; the message lists the accepted names.
METALOAD_DEFINE_ERROR(DTypeError, Error);

// A config field of the wrong type, or a TP degree the model cannot be split into.
METALOAD_DEFINE_ERROR(TPError, Error);

// The most layers a config may name. Both config readers (families/config.cc: ConfigError,
// checkpoint_shapes.cc: FormatError) refuse more, naming the field: no model has a hundredth of it,
// and the per-layer tables and tensor lists would otherwise be sized by a hostile number.
inline constexpr int64_t kMaxConfigLayers = int64_t{1} << 16;
}  // namespace metaload
