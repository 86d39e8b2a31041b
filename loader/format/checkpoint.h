// A checkpoint: one safetensors file or a sharded set with model.safetensors.index.json, found
// from a directory, a file or a Hugging Face repo id in the local cache. Opening reads headers only
// (plus the index); no tensor data is read. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/errors.h"
#include "loader/format/reference.h"
#include "loader/format/safetensors.h"

namespace metaload {

// model.safetensors.index.json.
struct SafetensorsIndex {
  std::string path;
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::vector<std::string> shards;                // distinct shard names, sorted
  std::optional<uint64_t> total_size;             // metadata.total_size when present
  nlohmann::json metadata = nlohmann::json::object();
};

// Validates index JSON: an object with "weight_map" (tensor -> plain shard file name: no '/', no
// '\\', not "." or "..", not empty) and an optional "metadata" object. Throws ShardError with
// rules "invalid-json", "duplicate-key", "duplicate-tensor", "index-not-object",
// "missing-weight-map", "invalid-weight-map", "empty-weight-map", "invalid-shard-name",
// "invalid-metadata".
SafetensorsIndex parse_safetensors_index(std::string_view json, const std::string& path);
SafetensorsIndex read_safetensors_index(const std::string& path);

// Where a tensor lives: files[file].tensors[index].
struct TensorRef {
  uint32_t file = 0;
  uint32_t index = 0;
};

struct Checkpoint {
  std::string ref;  // the reference as given
  std::string dir;  // directory holding the weight files
  std::vector<SafetensorsHeader> files;
  std::unordered_map<std::string, TensorRef> lookup;  // every tensor, exactly once
  std::optional<std::string> index_path;              // set for sharded checkpoints
  std::optional<std::string> config_path;  // config.json beside the weights, when present
  std::optional<std::string> revision;     // resolved commit hash (HF cache only)
  std::optional<std::string> repo_id;      // HF repo id when resolved from the cache
  std::optional<std::string> snapshot_of;  // HF repo dir when `dir` is a cache snapshot
  // The files' descriptors stay open (SafetensorsHeader::fd), for the first kKeptFilesMax: a load
  // then reads every byte through the descriptor its header was read through (one open per file,
  // and the data comes from the very file that was checked, even if the path is replaced).
  bool keep_files = false;

  const TensorInfo* find(std::string_view name) const;
  // The file holding `name`, or nullptr.
  const SafetensorsHeader* file_of(std::string_view name) const;
  const TensorInfo& tensor(const TensorRef& r) const { return files[r.file].tensors[r.index]; }
  size_t num_tensors() const { return lookup.size(); }
  // Sum of every tensor's bytes.
  uint64_t data_bytes() const;
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
};

// Opens `ref`, resolved by resolve_checkpoint_reference (reference.h):
//  1. an existing path: a .safetensors file, an .index.json file, or a directory holding
//     model.safetensors, else model.safetensors.index.json, else exactly one
//     *.safetensors.index.json, else exactly one *.safetensors;
//  2. a Hugging Face repo id in the local hub cache (see hf_cache.h) at `revision`.
// `revision` is for repo ids only; given with a local path it is an error (ResolveError).
// A candidate name that is there but is no regular file (a FIFO, directory, socket, device or link
// loop named model.safetensors, config.json, a shard, ...) is an error naming what it is
// ("not-a-file"), never passed over; nothing is opened in a way that could block.
// In a hub snapshot (resolved from a repo id, or a directory that is one) every file read must
// resolve into the repo's blobs/ or the snapshot itself ("link-outside-repo"); the file or index
// the user names directly may be a link anywhere.
// Throws ResolveError (listing every place looked), FormatError for a bad file, ShardError for a
// bad index, a missing shard ("missing-shard"), a shard outside the checkpoint directory
// ("shard-outside-directory"), an index that disagrees with its shards ("index-mismatch",
// "tensor-not-in-index") and a tensor in two shards ("duplicate-tensor").
// keep_files: Checkpoint::keep_files.
Checkpoint open_checkpoint(const std::string& ref,
                           const std::optional<std::string>& revision = std::nullopt,
                           bool keep_files = false);
// The same for a reference already resolved (reference.h: the resolution rules live there).
Checkpoint open_checkpoint(const CheckpointReference& ref, bool keep_files = false);

// The most descriptors one Checkpoint keeps open (and at most a quarter of the process's
// open-file limit, the engine's own bound).
inline constexpr size_t kKeptFilesMax = 256;

// Reads and parses config.json strictly (duplicate keys rejected, kMaxJsonDepth). Throws
// FormatError.
nlohmann::json read_config_json(const std::string& path);

}  // namespace metaload
