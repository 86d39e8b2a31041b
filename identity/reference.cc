#include "identity/reference.h"

#include <sys/stat.h>

#include "base/text.h"

namespace metaload {

bool is_model_key_reference(const std::string& ref) {
  struct stat st;
  return ref.find(':') != std::string::npos && ref.find('\0') == std::string::npos &&
         ::stat(ref.c_str(), &st) != 0;
}

std::optional<std::string> join_revision(const ModelKey& key,
                                         const std::optional<std::string>& requested) {
  if (key.revision && requested && *key.revision != *requested)
    throw ModelKeyError("the key pins revision " + quote_text(*key.revision) + " but revision " +
                        quote_text(*requested) + " was asked for");
  return key.revision ? key.revision : requested;
}

ModelReference resolve_reference(const ModelKey& key, const std::optional<std::string>& revision,
                                 const KeyOptions& keys) {
  check_key_repo_id(key.repo_id, keys);
  ModelReference r;
  r.key = key;
  r.revision = join_revision(key, revision);
  r.checkpoint =
      resolve_checkpoint_reference(key.repo_id, r.revision, /*hub_only=*/!keys.allow_local_paths);
  return r;
}

ModelReference resolve_reference(const std::string& ref, const std::optional<std::string>& revision,
                                 const KeyOptions& keys) {
  if (is_model_key_reference(ref))
    return resolve_reference(from_model_key(ref, keys), revision, keys);
  ModelReference r;
  r.revision = revision;
  r.checkpoint = resolve_checkpoint_reference(ref, revision);
  return r;
}

}  // namespace metaload
