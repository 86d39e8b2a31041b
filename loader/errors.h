// Typed errors of the checkpoint format layer. Torch-free.
//
// FormatError and its subclass ShardError carry the file, the tensor (may be empty) and a short
// stable rule identifier ("size-mismatch", "missing-shard", ...) so tests and callers can tell
// rejections apart without parsing messages. The message reads
//   "<file>: tensor '<name>': <detail> (rule <rule>)".
#pragma once

#include <string>

#include "base/error.h"
#include "base/text.h"

namespace metaload {

class FormatError : public Error {
 public:
  FormatError(const std::string& file, const std::string& tensor, const std::string& rule,
              const std::string& detail)
      : FormatError("FormatError", file, tensor, rule, detail) {}

  const std::string& file() const noexcept { return file_; }
  const std::string& tensor() const noexcept { return tensor_; }
  const std::string& rule() const noexcept { return rule_; }
  // The message's detail alone (without file, tensor and rule).
  const std::string& detail() const noexcept { return detail_; }

 protected:
  FormatError(const char* kind, const std::string& file, const std::string& tensor,
              const std::string& rule, const std::string& detail)
      : Error(kind, compose(file, tensor, rule, detail)),
        file_(file),
        tensor_(tensor),
        rule_(rule),
        detail_(detail) {}

 private:
  static std::string compose(const std::string& file, const std::string& tensor,
                             const std::string& rule, const std::string& detail) {
    // File and tensor names come from users and from files: escaped and capped (base/text.h).
    std::string m = file.empty() ? std::string("<memory>") : escape_path(file);
    m += ": ";
    if (!tensor.empty()) m += "tensor " + quote_text(tensor, '\'') + ": ";
    m += detail + " (rule " + rule + ")";
    return m;
  }

  std::string file_, tensor_, rule_, detail_;
};

// A sharded checkpoint's index (model.safetensors.index.json) is wrong, or disagrees with its
// shards, or names a shard that is missing or lies outside the checkpoint directory.
class ShardError : public FormatError {
 public:
  ShardError(const std::string& file, const std::string& tensor, const std::string& rule,
             const std::string& detail)
      : FormatError("ShardError", file, tensor, rule, detail) {}
};

// A model reference (directory, file, HF repo id) could not be resolved; the message lists every
// place that was looked at.
METALOAD_DEFINE_ERROR(ResolveError, Error);

}  // namespace metaload
