// Offline resolution of Hugging Face repo ids in the local hub cache. Torch-free.
//
// Layout (huggingface_hub): <root>/models--ORG--NAME/{refs/<REV>, snapshots/<HASH>/..., blobs/...}.
// refs/<REV> holds the commit hash a branch or tag points to; snapshot files are usually symlinks
// into ../../blobs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metaload {

struct HubCacheRoot {
  std::string path;
  std::string
      source;  // how it was chosen, e.g. "HF_HUB_CACHE", "HF_HOME/hub", "~/.cache/huggingface/hub"
};

// HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE (older name), else HF_HOME/hub, else
// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub -- the first that is set and
// non-empty, as huggingface_hub chooses.
HubCacheRoot hf_hub_cache_root();

// True when `ref` has the form of a hub repo id: NAME or ORG/NAME, of letters, digits, '-', '_'
// and '.', no "--" or "..", not beginning or ending with '-' or '.', at most 96 characters.
bool looks_like_repo_id(std::string_view ref);

// "models--ORG--NAME".
std::string hf_repo_folder_name(std::string_view repo_id);

// Whether `path` is (or links to) a blob of a Hugging Face hub cache: a file in
// `models--ORG--NAME/blobs/`. Blobs are content-addressed and written by rename, never rewritten
// in place, so tensors may map them.
bool is_hf_cache_blob(const std::string& path);

struct HubSnapshot {
  std::string repo_id;
  std::string repo_dir;      // <root>/models--ORG--NAME
  std::string snapshot_dir;  // <repo_dir>/snapshots/<commit>
  std::string commit;        // the resolved commit hash
  std::string revision;      // as asked ("main" when none was given)
};

// A snapshot's directory and files must stay inside their repo: <repo>/snapshots/<commit> may be
// a symbolic link only into <repo>/snapshots, and a snapshot file only into <repo>/blobs (or be a
// file of the snapshot itself, as caches written without symlinks hold them). A link anywhere
// else on the disk is refused.

// The repo directory (<root>/models--ORG--NAME) of a snapshot directory <repo>/snapshots/<hash>
// given by its real path; nullopt when `real_dir` is not inside a hub repo.
std::optional<std::string> hf_repo_of_snapshot(const std::string& real_dir);

// Throws FormatError(path, "", "link-outside-repo"), naming the link and where it leads, unless
// `path` resolves into <repo_dir>/blobs or into `snapshot_dir` itself. `path` must exist.
void check_snapshot_file(const std::string& path, const std::string& snapshot_dir,
                         const std::string& repo_dir);

// Resolves repo_id at `revision` (a branch, tag or commit hash; "main" when absent) without any
// network access. Throws ResolveError listing every place it looked (a refs file or snapshot that
// is there but is not a regular file / directory is named with what it is), or FormatError
// "link-outside-repo" for a snapshot directory that links out of <repo>/snapshots.
HubSnapshot resolve_hf_snapshot(const std::string& repo_id,
                                const std::optional<std::string>& revision);

// The same, without a ResolveError: nullopt when not found, with one line per place looked at (and
// why it did not do) appended to `looked`. A snapshot directory linking out of the repo still
// throws FormatError "link-outside-repo": it was found, and refused.
std::optional<HubSnapshot> try_resolve_hf_snapshot(const std::string& repo_id,
                                                   const std::optional<std::string>& revision,
                                                   std::vector<std::string>& looked);

}  // namespace metaload
