// Torch adapters of the safetensors writer: save named at::Tensors (a module's state) as a
// safetensors file or a sharded checkpoint. Tensors on any device are copied to the CPU one at a
// time while they are written, so saving never holds a second copy of the whole model.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "loader/format/safetensors.h"
#include "loader/format/writer.h"

namespace metaload {

// The file-format dtype of a torch dtype; nullopt for those the format cannot hold (complex128,
// quantized types, ...).
std::optional<DType> safetensors_dtype_of(c10::ScalarType t);

// Writes `tensors` in the given names to `path`. Throws FormatError for a tensor without data
// ("no-data": meta tensors), a non-strided layout ("unsupported-layout"), a dtype the format cannot
// hold ("unsupported-dtype"), and every rule the writer enforces (duplicate names, ...).
SafetensorsHeader save_safetensors(const std::string& path,
                                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                   const std::map<std::string, std::string>& metadata = {});

// Writes a sharded checkpoint into `dir` (shards + model.safetensors.index.json) as ShardOptions
// says; a single model.safetensors when everything fits one shard and no index was asked for.
ShardedWriteResult save_safetensors_sharded(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const ShardOptions& options);

}  // namespace metaload
