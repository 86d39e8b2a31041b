// resolve_checkpoint_reference: what a checkpoint reference names -- an existing directory, a
// weights file, an index file, or a Hugging Face repo id in the local hub cache -- and where its
// weights and config.json are. Stats paths and reads the hub cache's refs only; opens no weight
// file. The one place the path rules live: open_checkpoint (checkpoint.h) and the model layer's
// resolve_reference (identity/reference.h, which adds model keys) both start here. Torch-free.
#pragma once

#include <optional>
#include <string>

#include "loader/errors.h"

namespace metaload {

enum class ReferenceKind {
  kDirectory,  // an existing directory
  kIndex,      // an existing regular file named *.index.json
  kFile,    // another existing regular file (a .safetensors, or a format open_checkpoint refuses)
  kRepoId,  // a repo id resolved to a snapshot of the local hub cache
};

struct CheckpointReference {
  std::string ref;  // as given
  ReferenceKind kind = ReferenceKind::kDirectory;
  // The existing path as given (a directory without trailing '/'), or a repo id's snapshot
  // directory.
  std::string path;
  // The directory of the weights and config.json: `path` itself for a directory or snapshot, the
  // file's parent directory (as given, not through links) otherwise.
  std::string dir;
  std::optional<std::string> repo_id;      // kRepoId
  std::optional<std::string> commit;       // kRepoId: the resolved commit hash
  std::optional<std::string> snapshot_of;  // the hub repo directory when `dir` is a snapshot
};

// Resolves `ref`, in this order:
//  1. an existing path (unless `hub_only`): a directory, an *.index.json file or another regular
//     file; anything else there (a FIFO, socket, device) is a ResolveError naming what it is;
//  2. a Hugging Face repo id in the local hub cache (hf_cache.h) at `revision`.
// `revision` is for repo ids only; given with a local path it is a ResolveError. `hub_only`: the
// reference is a Hub repo id and never a path, not even one relative to the working directory
// (model keys from other users). Throws ResolveError for an empty reference, one with a NUL byte,
// or one found nowhere (listing every place looked), and FormatError "link-outside-repo" for a
// snapshot that links out of its repo.
CheckpointReference resolve_checkpoint_reference(const std::string& ref,
                                                 const std::optional<std::string>& revision,
                                                 bool hub_only = false);

}  // namespace metaload
