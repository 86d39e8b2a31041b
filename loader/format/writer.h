// Streaming safetensors writers (single file and sharded with model.safetensors.index.json).
// Torch-free: tensor bytes come from callbacks, so the writer never holds a whole model in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loader/format/safetensors.h"

namespace metaload {

// Fills `dst` with `n` bytes of a tensor's data starting at byte `offset` of that tensor.
// An empty Source means "all zeros": the writer leaves a hole (sparse file) instead of writing.
using TensorSource = std::function<void(uint64_t offset, void* dst, uint64_t n)>;

// Bytes of data of a tensor; throws FormatError(file, name, rule) for a negative dimension
// ("invalid-shape"), an overflow ("size-overflow") or a bit count that is not whole bytes
// ("misaligned-size").
uint64_t tensor_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& file,
                       const std::string& name);

struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  uint64_t nbytes() const;  // tensor_nbytes(dtype, shape, "", name)
};

// The order the safetensors library writes in, so that files are byte-identical to its
// save_file's for the same tensors (and metadata of at most one entry, which it keeps in a hash
// map): by its Dtype enum descending -- larger dtypes first, so every tensor stays aligned to its
// element size; same-size dtypes U64 I64 F64 C64, F32 U32 I32, BF16 F16 U16 I16, ... -- then by
// name (bytewise).
void sort_for_writing(std::vector<TensorSpec>& specs);

// Writes one safetensors file. Usage: add() every tensor, then write() once.
//   SafetensorsWriter w(path, {{"format", "pt"}});
//   w.add("a", DType::F32, {2, 3}, source);
//   SafetensorsHeader h = w.write();
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata = {});

  // Throws FormatError for a duplicate name, a name that is not UTF-8 or is "__metadata__", a
  // negative dimension or a size that is not a whole number of bytes.
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           TensorSource source);
  // Convenience: bytes from memory that must stay valid until write() returns.
  void add_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 const void* data);

  // Writes header and data to `path`.tmp-<pid> in large blocks, then renames it into place, so
  // readers never see a half-written file. Returns the header as a reader would parse it.
  SafetensorsHeader write();

  // Block size of the data writes (default 16 MiB).
  void set_block_size(uint64_t bytes) { block_size_ = bytes ? bytes : 1; }

  // The JSON header for tensors in the given (already sorted) order, padded with spaces so that
  // 8 + its length is a multiple of 8.
  static std::string header_json(const std::vector<TensorSpec>& ordered,
                                 const std::map<std::string, std::string>& metadata);

 private:
  struct Entry {
    TensorSpec spec;
    TensorSource source;
  };
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> names_;
  uint64_t block_size_ = 16ull << 20;
  bool written_ = false;
};

// How to split tensors into shards: at most max_shard_bytes of tensor data per shard (a single
// larger tensor gets a shard of its own), or exactly num_shards shards balanced by bytes. With
// neither (both 0) everything goes into one file.
struct ShardOptions {
  uint64_t max_shard_bytes = 0;
  int num_shards = 0;
  // File prefix: shards are <prefix>-00001-of-0000N.safetensors, the index
  // <prefix>.safetensors.index.json, a single file <prefix>.safetensors.
  std::string prefix = "model";
  // Write an index even when everything fits into one file (as num_shards=1 asks for).
  bool always_index = false;
  std::map<std::string, std::string> metadata;  // __metadata__ of every shard
};

struct ShardedWriteResult {
  std::vector<std::string> files;  // written safetensors files, in shard order
  std::string index_path;          // empty when a single file without index was written
  uint64_t total_size = 0;         // bytes of tensor data (the index's metadata.total_size)
};

// Writes tensors (in the given order: shards are filled in that order, as transformers does) into
// `dir`, which must exist. Tensors are kept whole; each shard is written by a SafetensorsWriter.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(std::string dir, ShardOptions options);
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           TensorSource source);
  ShardedWriteResult write();

 private:
  std::string dir_;
  ShardOptions options_;
  std::vector<TensorSpec> specs_;
  std::vector<TensorSource> sources_;
  std::map<std::string, size_t> names_;
};

// Splits sizes (in order) into contiguous groups as ShardOptions asks; returns each group's first
// index. Exposed for tests.
std::vector<size_t> plan_shards(const std::vector<uint64_t>& sizes, const ShardOptions& options);

}  // namespace metaload
