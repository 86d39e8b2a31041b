// Targets assembled from several checkpoint tensors: the fused experts transformers 5 builds
// (Mixtral's `experts.gate_up_proj` [E, 2I, H] from every expert's w1 and w3 [I, H]) out of the
// per-expert tensors the Hub's checkpoints store. Torch-free geometry.
//
// An Assembly is one of transformers' WeightConverters applied to one layer: the checkpoint
// tensors each source pattern matched (in expert order), the operations in order, and the module
// tensors they produce. `assemble` runs the operations on shapes only and says, per target, which
// rows of which checkpoint tensor land where: the loader then reads each checkpoint tensor once,
// straight into its place in the fused slot, with no per-expert tensor in between.
//
// Operations (transformers.core_model_loading): MergeModulelist(dim) stacks each source's list
// along a new dim; Concatenate(dim) joins the values in source order; Chunk(dim) splits the one
// value evenly into the targets; Transpose(dim0, dim1) swaps two dims (rows copy as runs where the
// innermost dim stays innermost, element by element where it moves: fine for a router's gate);
// PermuteForRope(n_heads, inverse) reorders the rows of the values it applies to (q and k) within
// each head, as rotary's interleaved and split halves differ (each row then copies on its own);
// Interleave(dim, inverse) does the same to a whole dim (even indices first);
// ErnieFuseAndSplitTextVisionExperts(stack_dim, concat_dim) splits each source's experts among
// the targets and fuses them. Anything else is a PlanError naming the operation and the model
// type: never a wrong tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/tp/shard.h"  // TpShard: a rank's part of an assembled target

namespace metaload {

struct AssemblyOp {
  std::string op;  // MergeModulelist, Concatenate, Chunk, Transpose, PermuteForRope, ...
  int dim = 0;
  int dim1 = 1;             // Transpose's second dim; Ernie's concat_dim (dim: stack_dim)
  bool check_dims = false;  // Transpose: a tensor already of the target's shape stays as it is
  // PermuteForRope: the heads dim 0 holds (the config's num_attention_heads), the direction (also
  // Interleave's), and per value (in target order) whether it is permuted (its name holds one of
  // the layer names).
  int64_t n_heads = 0;
  bool inverse = false;
  std::vector<bool> applies;
};

struct AssemblySource {
  std::string pattern;             // the converter's source pattern (for errors)
  std::vector<std::string> names;  // checkpoint tensors it matched, in expert order
  // The expert index (the pattern's `*`) of each name, -1 where the pattern has none: a
  // MergeModulelist names the experts a checkpoint lacks from these.
  std::vector<int64_t> indices;
  std::string name_template;  // a name with its expert index as `*`: the name of a lacking expert
};

struct Assembly {
  std::string model_type;  // for errors
  std::vector<AssemblySource> sources;
  std::vector<AssemblyOp> ops;
  std::vector<std::string> targets;  // module tensor names, in the order the ops produce them
};

// `rows` runs of `row_elems` elements: from a checkpoint tensor (its `leaf`, counted over every
// source's names in order) at src_offset, rows src_stride apart, to the target at dst_offset, rows
// dst_stride apart. Offsets and strides in elements.
struct AssembledCopy {
  size_t leaf = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t rows = 1;
  uint64_t row_elems = 0;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
};

struct AssembledTarget {
  std::vector<int64_t> shape;
  std::vector<AssembledCopy> copies;  // together they write every element exactly once
};

struct AssemblyResult {
  std::vector<AssembledTarget> targets;  // one per Assembly::targets, when `problem` is empty
  // Why the checkpoint's tensors do not fit the operations (a mismatch line, naming the tensor);
  // empty when they do.
  std::string problem;
};

// Every leaf's stored shape, in the order of AssembledCopy::leaf; the targets' shapes in the
// module (for Transpose's check_dims; may be empty); per target, the part of it this rank holds
// (windows[k], a TpShard of the assembled shape: the concatenation of its ranges along its dim;
// none: the whole), e.g. expert parallelism's experts [r E/n, (r+1) E/n) along dim 0. The
// copies then read only the checkpoint rows inside the window. Throws PlanError for an
// operation this loader cannot stream (naming it and the model type), or an assembly that is
// malformed (no source, names and indices of different lengths, targets the ops do not produce).
AssemblyResult assemble(const Assembly& a, const std::vector<std::vector<int64_t>>& leaf_shapes,
                        const std::vector<std::vector<int64_t>>& target_shapes = {},
                        const std::vector<std::optional<TpShard>>& windows = {});

// The leaves of `a` in AssembledCopy::leaf order.
std::vector<std::string> assembly_leaves(const Assembly& a);

// Parses load_into's `assemblies` argument: a JSON array of {"model_type", "targets": [...],
// "sources": [{"pattern", "names": [...], "indices": [...], "template"}],
// "ops": [{"op", "dim", "dim1", "check_dims"}]}.
// Throws PlanError naming what is wrong.
std::vector<Assembly> parse_assemblies(const std::string& json);

}  // namespace metaload
