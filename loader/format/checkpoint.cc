#include "loader/format/checkpoint.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/text.h"
#include "loader/format/file_io.h"
#include "loader/format/hf_cache.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

using fileio::is_file;
using fileio::real_path;

constexpr uint64_t kMaxIndexSize = 256ull << 20;
constexpr uint64_t kMaxConfigSize = 64ull << 20;

bool strictly_under(const std::string& child, const std::string& root) {
  return !root.empty() && child.size() > root.size() && child.compare(0, root.size(), root) == 0 &&
         (root.back() == '/' || child[root.size()] == '/');
}

// Every entry named *<suffix>, whatever it is: one that is no regular file (a FIFO, a directory,
// a link loop) is reported as such when read, not skipped in silence.
std::vector<std::string> list_dir(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (ends_with(name, suffix)) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool valid_shard_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

// A file of the checkpoint directory (not a path the user named): in a hub snapshot it must
// resolve into the repo's blob store (or the snapshot itself).
void check_dir_file(const Checkpoint& c, const std::string& path) {
  if (c.snapshot_of) check_snapshot_file(path, c.dir, *c.snapshot_of);
}

// Reads the header of a file found in the checkpoint directory.
// Whether the next file's descriptor stays open (Checkpoint::keep_files): for the first
// kKeptFilesMax files, and at most a quarter of the process's open-file limit (the engine may hold
// as many duplicates again; the caller has descriptors of its own).
bool keep_next(const Checkpoint& c) {
  if (!c.keep_files) return false;
  struct rlimit rl;
  uint64_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) soft = rl.rlim_cur;
  return c.files.size() < std::min<uint64_t>(kKeptFilesMax, soft / 4);
}

SafetensorsHeader read_dir_header(const Checkpoint& c, const std::string& path) {
  fileio::File probe(path);  // not a regular file: say what it is before anything else
  check_dir_file(c, path);
  return read_safetensors_header(std::move(probe), keep_next(c));
}

void add_file(Checkpoint& c, SafetensorsHeader h) {
  const uint32_t fi = static_cast<uint32_t>(c.files.size());
  for (uint32_t i = 0; i < h.tensors.size(); ++i) {
    auto [it, inserted] = c.lookup.emplace(h.tensors[i].name, TensorRef{fi, i});
    if (!inserted) {
      throw ShardError(h.path, h.tensors[i].name, "duplicate-tensor",
                       "tensor is also stored in " + c.files[it->second.file].path +
                           "; every tensor must be in exactly one shard");
    }
  }
  c.files.push_back(std::move(h));
}

// `in_dir`: the index was found in c.dir rather than named by the user.
void load_indexed(Checkpoint& c, const std::string& index_path, bool in_dir) {
  if (in_dir) check_dir_file(c, index_path);
  SafetensorsIndex idx = read_safetensors_index(index_path);
  c.index_path = index_path;
  // Shards may resolve (through symlinks) only into the checkpoint directory itself, or into the
  // blobs store of the same hub repo when the directory is a cache snapshot.
  std::vector<std::string> roots = {real_path(c.dir)};
  if (c.snapshot_of) roots.push_back(real_path(*c.snapshot_of + "/blobs"));

  std::map<std::string, std::string> example;  // shard -> one tensor it should hold
  for (const auto& [name, shard] : idx.weight_map) example.emplace(shard, name);
  std::map<std::string, uint32_t> file_index;
  for (const auto& shard : idx.shards) {
    std::string path = c.dir + "/" + shard;
    if (!fileio::exists(path) || !is_file(path)) {
      const std::string kind = fileio::file_kind(path);
      const bool missing = kind == "nothing" || kind == "a dangling symbolic link";
      throw ShardError(
          index_path, example[shard], missing ? "missing-shard" : "not-a-file",
          "shard " + quote_str(shard) + " named by the index " +
              (kind == "nothing" ? std::string("does not exist")
                                 : "is " + kind + (missing ? "" : ", not a regular file,")) +
              " in " + c.dir);
    }
    std::string real = real_path(path);
    bool inside = false;
    for (const auto& r : roots) inside = inside || strictly_under(real, r);
    if (!inside) {
      throw ShardError(index_path, example[shard], "shard-outside-directory",
                       "shard " + quote_str(shard) + " resolves to " + real +
                           ", outside the checkpoint directory " + roots[0] +
                           (c.snapshot_of ? " and its hub blobs store" : ""));
    }
    file_index[shard] = static_cast<uint32_t>(c.files.size());
    add_file(c, read_safetensors_header(path, keep_next(c)));
  }
  // The shards' headers must hold exactly the tensors the index assigns to them.
  for (const auto& [name, shard] : idx.weight_map) {
    auto it = c.lookup.find(name);
    const std::string& expected = c.files[file_index.at(shard)].path;
    if (it == c.lookup.end()) {
      throw ShardError(
          expected, name, "index-mismatch",
          "the index maps this tensor to " + quote_str(shard) + " but no shard's header holds it");
    }
    if (it->second.file != file_index.at(shard)) {
      throw ShardError(
          c.files[it->second.file].path, name, "index-mismatch",
          "the index maps this tensor to " + quote_str(shard) + " but it is stored here");
    }
  }
  if (c.lookup.size() != idx.weight_map.size()) {
    for (const auto& f : c.files) {
      for (const auto& t : f.tensors) {
        if (!idx.weight_map.count(t.name)) {
          throw ShardError(f.path, t.name, "tensor-not-in-index",
                           "shard holds a tensor that " + index_path + " does not list");
        }
      }
    }
  }
}

// Loads the checkpoint in directory c.dir. A candidate name that is there but is no regular file
// (a FIFO, a directory, a link loop) is reported as what it is, not passed over.
void load_dir(Checkpoint& c) {
  const std::string& d = c.dir;
  if (fileio::exists(d + "/model.safetensors")) {
    add_file(c, read_dir_header(c, d + "/model.safetensors"));
    return;
  }
  if (fileio::exists(d + "/model.safetensors.index.json")) {
    load_indexed(c, d + "/model.safetensors.index.json", true);
    return;
  }
  auto indexes = list_dir(d, ".safetensors.index.json");
  if (indexes.size() == 1) {
    load_indexed(c, d + "/" + indexes[0], true);
    return;
  }
  auto singles = list_dir(d, ".safetensors");
  if (indexes.empty() && singles.size() == 1) {
    add_file(c, read_dir_header(c, d + "/" + singles[0]));
    return;
  }
  if (indexes.size() > 1 || singles.size() > 1) {
    const auto& many = indexes.size() > 1 ? indexes : singles;
    std::string names;
    for (const auto& n : many) names += (names.empty() ? "" : ", ") + n;
    throw ResolveError(
        "ambiguous checkpoint directory " + d +
        ": no model.safetensors or model.safetensors.index.json, and several candidates: " + names +
        "; pass one file");
  }
  std::string msg = "no safetensors weights in " + d +
                    ": looked for model.safetensors, model.safetensors.index.json, "
                    "*.safetensors.index.json, *.safetensors";
  if (is_file(d + "/pytorch_model.bin") || !list_dir(d, ".bin").empty()) {
    msg +=
        " (found PyTorch .bin weights: only safetensors checkpoints are supported; convert them)";
  }
  throw ResolveError(msg);
}

// config.json beside the weights, when there: a config.json that is no regular file, or that leaves
// a hub snapshot's repo, is an error rather than "no config".
void finish(Checkpoint& c) {
  const std::string path = c.dir + "/config.json";
  if (!fileio::exists(path)) return;
  fileio::File probe(path);
  check_dir_file(c, path);
  c.config_path = path;
}

}  // namespace

SafetensorsIndex parse_safetensors_index(std::string_view json, const std::string& path) {
  nlohmann::json j;
  try {
    j = parse_json_strict(json, path, [&](const std::string& parent, const std::string& key) {
      if (parent == "weight_map") {
        throw ShardError(path, key, "duplicate-tensor",
                         "tensor is listed more than once in weight_map");
      }
    });
  } catch (const ShardError&) {
    throw;
  } catch (const FormatError& e) {
    throw ShardError(path, e.tensor(), e.rule(), e.detail());
  }
  if (!j.is_object()) throw ShardError(path, "", "index-not-object", "index is not a JSON object");
  SafetensorsIndex idx;
  idx.path = path;
  auto wm = j.find("weight_map");
  if (wm == j.end())
    throw ShardError(path, "", "missing-weight-map", "index has no \"weight_map\"");
  if (!wm->is_object())
    throw ShardError(path, "", "invalid-weight-map", "\"weight_map\" is not an object");
  if (wm->empty())
    throw ShardError(path, "", "empty-weight-map", "\"weight_map\" lists no tensors");
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      throw ShardError(path, it.key(), "invalid-weight-map",
                       "shard of this tensor is not a string file name");
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!valid_shard_name(shard)) {
      throw ShardError(path, it.key(), "invalid-shard-name",
                       "shard name " + quote_str(shard) +
                           " is not a plain file name inside the checkpoint directory (no '/', "
                           "'\\\\', '.' or '..')");
    }
    shards.insert(shard);
    idx.weight_map.emplace(it.key(), shard);
  }
  idx.shards.assign(shards.begin(), shards.end());
  if (auto md = j.find("metadata"); md != j.end() && !md->is_null()) {
    if (!md->is_object())
      throw ShardError(path, "", "invalid-metadata", "\"metadata\" is not an object");
    if (auto ts = md->find("total_size"); ts != md->end() && !ts->is_null()) {
      // Some writers store it as a float (e.g. 1.0e10); accept any exact non-negative integer.
      if (ts->is_number_unsigned()) {
        idx.total_size = ts->get<uint64_t>();
      } else if (ts->is_number_float() && ts->get<double>() >= 0 && ts->get<double>() < 1.8e19 &&
                 ts->get<double>() ==
                     static_cast<double>(static_cast<uint64_t>(ts->get<double>()))) {
        idx.total_size = static_cast<uint64_t>(ts->get<double>());
      } else {
        throw ShardError(path, "", "invalid-metadata",
                         "\"metadata.total_size\" is not a non-negative integer");
      }
    }
    idx.metadata = *md;
  }
  return idx;
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  std::string text;
  try {
    text = fileio::read_small_file(path, kMaxIndexSize, "index file");
  } catch (const FormatError& e) {
    throw ShardError(path, "", e.rule(), e.detail());
  }
  return parse_safetensors_index(text, path);
}

nlohmann::json read_config_json(const std::string& path) {
  return parse_json_strict(fileio::read_small_file(path, kMaxConfigSize, "config.json"), path);
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = lookup.find(std::string(name));
  return it == lookup.end() ? nullptr : &tensor(it->second);
}

const SafetensorsHeader* Checkpoint::file_of(std::string_view name) const {
  auto it = lookup.find(std::string(name));
  return it == lookup.end() ? nullptr : &files[it->second.file];
}

uint64_t Checkpoint::data_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files) {
    for (const auto& t : f.tensors) n += t.nbytes();
  }
  return n;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(lookup.size());
  for (const auto& [name, ref] : lookup) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

Checkpoint open_checkpoint(const CheckpointReference& r, bool keep_files) {
  Checkpoint c;
  c.keep_files = keep_files;
  c.ref = r.ref;
  c.dir = r.dir;
  c.snapshot_of = r.snapshot_of;
  c.repo_id = r.repo_id;
  c.revision = r.commit;
  switch (r.kind) {
    case ReferenceKind::kDirectory:
    case ReferenceKind::kRepoId:
      load_dir(c);
      break;
    case ReferenceKind::kIndex:
      load_indexed(c, r.path, false);
      break;
    case ReferenceKind::kFile:
      for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".pkl"}) {
        if (ends_with(r.path, ext)) {
          throw ResolveError(escape_path(r.path) +
                             " is a PyTorch pickle checkpoint; only safetensors checkpoints are "
                             "supported (convert it)");
        }
      }
      add_file(c, read_safetensors_header(r.path, keep_next(c)));
      break;
  }
  finish(c);
  return c;
}

Checkpoint open_checkpoint(const std::string& ref, const std::optional<std::string>& revision,
                           bool keep_files) {
  return open_checkpoint(resolve_checkpoint_reference(ref, revision), keep_files);
}

}  // namespace metaload
