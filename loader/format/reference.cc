#include "loader/format/reference.h"

#include <sys/stat.h>

#include <vector>

#include "base/text.h"
#include "loader/format/file_io.h"
#include "loader/format/hf_cache.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

std::string parent_dir(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

CheckpointReference local_reference(const std::string& ref, const struct stat& st,
                                    const std::optional<std::string>& revision) {
  if (revision) {
    throw ResolveError("revision " + quote_str(*revision) + " given for the local path " +
                       escape_path(ref) +
                       "; revisions select snapshots of Hugging Face repo ids only");
  }
  CheckpointReference r;
  r.ref = ref;
  r.path = ref;
  if (S_ISDIR(st.st_mode)) {
    r.kind = ReferenceKind::kDirectory;
    while (r.path.size() > 1 && r.path.back() == '/') r.path.pop_back();
    r.dir = r.path;
  } else if (S_ISREG(st.st_mode)) {
    r.kind = ends_with(ref, ".index.json") ? ReferenceKind::kIndex : ReferenceKind::kFile;
    r.dir = parent_dir(ref);
  } else {
    throw ResolveError(escape_path(ref) + " is " + fileio::file_kind(ref) +
                       ", neither a regular file nor a directory");
  }
  r.snapshot_of = hf_repo_of_snapshot(fileio::real_path(r.dir));
  return r;
}

CheckpointReference hub_reference(const std::string& ref, const HubSnapshot& snap) {
  CheckpointReference r;
  r.ref = ref;
  r.kind = ReferenceKind::kRepoId;
  r.path = snap.snapshot_dir;
  r.dir = snap.snapshot_dir;
  r.repo_id = ref;
  r.commit = snap.commit;
  r.snapshot_of = snap.repo_dir;
  return r;
}

}  // namespace

CheckpointReference resolve_checkpoint_reference(const std::string& ref,
                                                 const std::optional<std::string>& revision,
                                                 bool hub_only) {
  if (ref.empty()) throw ResolveError("empty checkpoint reference");
  // The system calls below would read the path only up to a NUL: refuse rather than open another.
  if (ref.find('\0') != std::string::npos)
    throw ResolveError("checkpoint reference " + quote_str(ref) + " contains a NUL byte");
  if (hub_only) {
    if (!looks_like_repo_id(ref))
      throw ResolveError(quote_str(ref) + " is not a Hugging Face repo id (ORG/NAME)");
    return hub_reference(ref, resolve_hf_snapshot(ref, revision));  // ResolveError if absent
  }
  struct stat st;
  if (::stat(ref.c_str(), &st) == 0) return local_reference(ref, st, revision);
  std::vector<std::string> looked;
  // A dangling link or a link loop is there, but leads nowhere: say which.
  looked.push_back(escape_path(ref) + ": " +
                   (fileio::exists(ref) ? "is " + fileio::file_kind(ref)
                                        : std::string("no such file or directory")));
  if (looks_like_repo_id(ref)) {
    if (auto snap = try_resolve_hf_snapshot(ref, revision, looked))
      return hub_reference(ref, *snap);
  } else {
    looked.push_back(quote_str(ref) + " is not a Hugging Face repo id (ORG/NAME) either");
  }
  std::string msg = "cannot resolve checkpoint " + quote_str(ref) +
                    (revision ? " at revision " + quote_str(*revision) : std::string()) +
                    "; looked at: ";
  for (size_t i = 0; i < looked.size(); ++i) msg += (i ? "; " : "") + looked[i];
  throw ResolveError(msg);
}

}  // namespace metaload
