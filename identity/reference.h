// resolve_reference: the one resolver of what a user names as a model -- a checkpoint directory, a
// weights or index file, a Hugging Face repo id in the local hub cache at a revision, or a model
// key "<class>:<json>" (model_key.h). TransformersModel, describe_checkpoint, the CLI's `key` and
// `tp` all start here; the path rules themselves are the loader's (loader/format/reference.h),
// which open_checkpoint uses too. Stats paths and reads the hub cache's refs only. Torch-free.
#pragma once

#include <optional>
#include <string>

#include "loader/format/reference.h"
#include "identity/model_key.h"

namespace metaload {

struct ModelReference {
  CheckpointReference checkpoint;
  std::optional<ModelKey> key;  // set when the reference was a model key
  // The revision asked for, joined with the key's own (join_revision); what the checkpoint was
  // resolved at (null: the default branch, or a local path).
  std::optional<std::string> revision;
};

// Whether `ref` is read as a model key: no file or directory is there and it holds a ':'. A path
// that exists wins, so a checkpoint directory named "a:b" still opens.
bool is_model_key_reference(const std::string& ref);

// A key's own revision joined with the one asked for (either may be absent). ModelKeyError when
// both are given and differ: the key pins one revision and the caller asks for another.
std::optional<std::string> join_revision(const ModelKey& key,
                                         const std::optional<std::string>& requested);

// Resolves `ref`: a model key (is_model_key_reference) under the key policy `keys`, else a
// checkpoint reference (resolve_checkpoint_reference) at `revision`. Throws ResolveError (nothing
// found, a revision given for a local path), ModelKeyError (a bad key, or a key pinning another
// revision than `revision`) and RepoIdError (a repo id the policy refuses).
ModelReference resolve_reference(const std::string& ref,
                                 const std::optional<std::string>& revision = std::nullopt,
                                 const KeyOptions& keys = {});

// The checkpoint a parsed key names: its repo id in the local hub cache at the joined revision,
// never a path (a Hub-style id such as "gpt2" is not looked up in the working directory), so a key
// from a remote user reads nothing outside the hub cache. With keys.allow_local_paths, the repo id
// is resolved as any reference is (a path first). The key's repo id is checked against the policy
// here too (a ModelKey built by hand was never checked).
ModelReference resolve_reference(const ModelKey& key,
                                 const std::optional<std::string>& revision = std::nullopt,
                                 const KeyOptions& keys = {});

}  // namespace metaload
