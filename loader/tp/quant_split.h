// Tensor parallelism of a quantized checkpoint: which dim each quantized module splits on, the
// granularity its packs, groups and blocks allow a slice (tp_unit), and the largest degree every
// module allows. The quantized part of the tree's shard rules (loader/tp/README.md): the
// dequantizing load (loader/load/dequant_load.h) cuts its windows by them, describe and estimate
// report the degrees. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loader/format/quant_layout.h"

namespace metaload {

// True for modules tensor parallelism splits along the input dim (o_proj, down_proj, c_proj,
// out_proj, dense_4h_to_h, fc2, w2, wo); the others are split along the output dim.
bool is_row_parallel(const std::string& module);

// The granularity of a tensor-parallel slice of `m` along `dim` (0: output rows, 1: input
// columns): a slice must start and end on multiples of it (or end at the dim's size), so that it
// falls on whole int32 packs, groups and blocks. *boundary describes them ("input columns on groups
// of 128 and int32 packs of 8"). 0 when no split of that dim works (bitsandbytes 4-bit rows that
// do not start on a block); *boundary then says why.
int64_t tp_unit(const QuantConfig& config, const QuantModule& m, int dim, std::string* boundary);

// True for modules tensor parallelism keeps whole on every rank: the low-rank down projections of
// multi-head latent attention (DeepSeek-V2/V3's q_a_proj and kv_a_proj_with_mqa, replicated by
// vLLM and SGLang), whose output (1536, 576 rows) is no multiple of the heads.
bool is_replicated_in_tp(const std::string& module);

// Whether `m` can be split into `degree` slices that fall on its pack and group boundaries (a
// replicated module always can); *why says which boundary does not when it cannot.
bool tp_sliceable(const QuantConfig& config, const QuantModule& m, int64_t degree,
                  std::string* why);

// The largest divisor of `base` (the unquantized max TP degree) for which every module is
// sliceable; nullopt when base is. *limited_by names the first module and boundary that ruled out
// a larger degree (empty when none did).
std::optional<int64_t> quant_max_tp_size(const QuantLayout& layout, std::optional<int64_t> base,
                                         std::string* limited_by);

}  // namespace metaload
