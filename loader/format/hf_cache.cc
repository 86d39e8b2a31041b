#include "loader/format/hf_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "loader/errors.h"
#include "loader/format/file_io.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

using fileio::is_dir;
using fileio::is_file;
using fileio::real_path;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool is_commit_hash(std::string_view s) {
  if (s.size() != 40) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) ||
        std::isupper(static_cast<unsigned char>(c)))
      return false;
  }
  return true;
}

// A revision becomes a path under refs/: refuse anything that could climb out of it.
bool safe_revision(std::string_view rev) {
  if (rev.empty() || rev.front() == '/' || rev.back() == '/') return false;
  size_t start = 0;
  while (start <= rev.size()) {
    size_t end = rev.find('/', start);
    if (end == std::string_view::npos) end = rev.size();
    std::string_view part = rev.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  for (char c : rev) {
    if (c == '\0' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

std::string parent_dir(const std::string& p) {
  size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_name(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

bool strictly_under(const std::string& child, const std::string& root) {
  return !root.empty() && child.size() > root.size() && child.compare(0, root.size(), root) == 0 &&
         (root.back() == '/' || child[root.size()] == '/');
}

// "a symbolic link to T (resolving to R)", or "resolves to R" for a path whose own name is no
// link (a link further up).
std::string where_it_leads(const std::string& path, const std::string& real) {
  std::string target(4096, '\0');
  ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  if (n < 0) return "resolves to " + quote_str(real, 400);
  target.resize(static_cast<size_t>(n));
  return "is a symbolic link to " + quote_str(target, 400) + " (resolving to " +
         quote_str(real, 400) + ")";
}

// What is wrong with a refs file of `size` bytes whose first bytes are `head`, in words that
// quote none of its content but the one character at fault: a ref may hold anything (a path, a
// newline, megabytes), and its bytes are no business of a message.
std::string why_not_commit(std::string_view head, uint64_t size) {
  for (size_t i = 0; i < head.size() && i < 40; ++i) {
    const char c = head[i];
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) continue;
    return "byte " + std::to_string(i) + " is " + quote_str(std::string_view(&c, 1)) +
           (c == '/' || c == '.' ? " (a path is no commit)" : "") + ", not a lowercase hex digit";
  }
  if (size < 40) return "it is " + std::to_string(size) + " bytes long";
  return "byte 40 is " + quote_str(head.substr(40, 1)) + " after the hash (" +
         std::to_string(size) + " bytes in all)";
}

// The commit hash refs file `ref_file` holds, or nullopt with the reason appended to `looked`.
// Exactly the hash, as huggingface_hub writes and reads it (no strip): a ref with a newline or
// spaces is one the hub resolves nothing from (and scan_cache_dir calls corrupted). A refs file
// linking out of <repo>/refs is refused before a byte is read (FormatError link-outside-repo),
// so a ref can never show another file's content.
std::optional<std::string> read_ref(const std::string& ref_file, const std::string& repo_dir,
                                    std::vector<std::string>& looked) {
  const std::string real = real_path(ref_file);
  if (!strictly_under(real, real_path(repo_dir + "/refs"))) {
    throw FormatError(ref_file, "", "link-outside-repo",
                      "refs file " + where_it_leads(ref_file, real) + ", outside the repo's refs " +
                          repo_dir + "/refs");
  }
  fileio::File f(ref_file);
  const uint64_t size = f.regular_file_size();
  std::string head(std::min<uint64_t>(size, 41), '\0');
  f.pread_full(head.data(), head.size(), 0);
  if (size == 40 && is_commit_hash(head)) return head;
  looked.push_back(ref_file + ": does not hold exactly a 40-hex commit hash: " +
                   why_not_commit(head, size) + " (rule ref-not-commit)");
  return std::nullopt;
}

}  // namespace

HubCacheRoot hf_hub_cache_root() {
  if (const char* v = env("HF_HUB_CACHE")) return {v, "HF_HUB_CACHE"};
  if (const char* v = env("HUGGINGFACE_HUB_CACHE")) return {v, "HUGGINGFACE_HUB_CACHE"};
  if (const char* v = env("HF_HOME")) return {std::string(v) + "/hub", "HF_HOME/hub"};
  if (const char* v = env("XDG_CACHE_HOME")) {
    return {std::string(v) + "/huggingface/hub", "XDG_CACHE_HOME/huggingface/hub"};
  }
  const char* home = env("HOME");
  return {std::string(home ? home : "") + "/.cache/huggingface/hub", "~/.cache/huggingface/hub"};
}

bool looks_like_repo_id(std::string_view ref) {
  if (ref.empty() || ref.size() > 96) return false;
  size_t slash = ref.find('/');
  if (slash != std::string_view::npos && ref.find('/', slash + 1) != std::string_view::npos)
    return false;
  auto part_ok = [](std::string_view p) {
    if (p.empty() || p.front() == '-' || p.front() == '.' || p.back() == '-' || p.back() == '.')
      return false;
    if (p.find("--") != std::string_view::npos || p.find("..") != std::string_view::npos)
      return false;
    for (char c : p) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
        return false;
    }
    return true;
  };
  if (slash == std::string_view::npos) return part_ok(ref);
  return part_ok(ref.substr(0, slash)) && part_ok(ref.substr(slash + 1));
}

std::string hf_repo_folder_name(std::string_view repo_id) {
  std::string out = "models--";
  for (char c : repo_id) {
    if (c == '/') {
      out += "--";
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<HubSnapshot> try_resolve_hf_snapshot(const std::string& repo_id,
                                                   const std::optional<std::string>& revision,
                                                   std::vector<std::string>& looked) {
  HubCacheRoot root = hf_hub_cache_root();
  const std::string rev = revision.value_or("main");
  if (!looks_like_repo_id(repo_id)) {
    looked.push_back(quote_str(repo_id) + " is not a Hugging Face repo id (ORG/NAME)");
    return std::nullopt;
  }
  if (!safe_revision(rev)) {
    looked.push_back("revision " + quote_str(rev) + " is not a valid branch, tag or commit name");
    return std::nullopt;
  }
  const std::string where = " (HF cache from " + root.source + ")";
  if (!is_dir(root.path)) {
    looked.push_back(root.path + where + ": no such directory");
    return std::nullopt;
  }
  HubSnapshot s;
  s.repo_id = repo_id;
  s.revision = rev;
  s.repo_dir = root.path + "/" + hf_repo_folder_name(repo_id);
  if (!is_dir(s.repo_dir)) {
    looked.push_back(s.repo_dir + where + ": no such directory (repo not downloaded)");
    return std::nullopt;
  }
  // A branch or tag name goes through refs/; a commit hash may be used directly.
  std::string ref_file = s.repo_dir + "/refs/" + rev;
  if (fileio::exists(ref_file) && !is_file(ref_file)) {
    // A directory, FIFO (never opened: it would block), device or link loop is no ref.
    looked.push_back(ref_file + ": is " + fileio::file_kind(ref_file) + ", not a refs file");
    return std::nullopt;
  }
  if (is_file(ref_file)) {
    std::optional<std::string> commit = read_ref(ref_file, s.repo_dir, looked);
    if (!commit) return std::nullopt;
    s.commit = *commit;
  } else {
    looked.push_back(ref_file + ": no such file");
    if (!is_commit_hash(rev)) {
      looked.push_back("revision " + quote_str(rev) + " is not a 40-hex commit hash either");
      return std::nullopt;
    }
    s.commit = rev;
  }
  s.snapshot_dir = s.repo_dir + "/snapshots/" + s.commit;
  if (!is_dir(s.snapshot_dir)) {
    looked.push_back(s.snapshot_dir + ": " +
                     (fileio::exists(s.snapshot_dir)
                          ? "is " + fileio::file_kind(s.snapshot_dir) + ", not a directory"
                          : std::string("no such directory")));
    return std::nullopt;
  }
  const std::string real = real_path(s.snapshot_dir);
  if (!strictly_under(real, real_path(s.repo_dir + "/snapshots"))) {
    throw FormatError(s.snapshot_dir, "", "link-outside-repo",
                      "snapshot directory " + where_it_leads(s.snapshot_dir, real) +
                          ", outside the repo's snapshots " + s.repo_dir + "/snapshots");
  }
  return s;
}

HubSnapshot resolve_hf_snapshot(const std::string& repo_id,
                                const std::optional<std::string>& revision) {
  std::vector<std::string> looked;
  if (auto s = try_resolve_hf_snapshot(repo_id, revision, looked)) return *s;
  std::string msg = "cannot resolve " + quote_str(repo_id) + " at revision " +
                    quote_str(revision.value_or("main")) + " offline; looked at: ";
  for (size_t i = 0; i < looked.size(); ++i) msg += (i ? "; " : "") + looked[i];
  throw ResolveError(msg);
}

std::optional<std::string> hf_repo_of_snapshot(const std::string& real_dir) {
  std::string snapshots = parent_dir(real_dir);
  if (base_name(snapshots) != "snapshots") return std::nullopt;
  std::string repo = parent_dir(snapshots);
  if (base_name(repo).rfind("models--", 0) != 0 || !is_dir(repo + "/blobs")) return std::nullopt;
  return repo;
}

void check_snapshot_file(const std::string& path, const std::string& snapshot_dir,
                         const std::string& repo_dir) {
  const std::string real = real_path(path);
  if (real.empty()) {
    fileio::File f(path);  // throws what it is (a link loop, a dangling link, ...)
    throw FormatError(path, "", "unreadable", "cannot resolve its real path");
  }
  const std::string blobs = real_path(repo_dir + "/blobs");
  if (strictly_under(real, blobs) || strictly_under(real, real_path(snapshot_dir))) return;
  throw FormatError(path, "", "link-outside-repo",
                    "hub snapshot file " + where_it_leads(path, real) +
                        ", outside the repo's blob store " + repo_dir + "/blobs");
}

bool is_hf_cache_blob(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) return false;
  const std::filesystem::path dir = real.parent_path();
  return dir.filename() == "blobs" &&
         dir.parent_path().filename().string().rfind("models--", 0) == 0;
}

}  // namespace metaload
