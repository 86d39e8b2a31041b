#include "loader/load/plan.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "base/text.h"
#include "base/torch_library.h"
#include "loader/format/hf_cache.h"
#include "loader/load/dequant_load.h"
#include "loader/load/open_checkpoints.h"
#include "loader/load/progress_board.h"
#include "loader/load/swap.h"
#include "loader/tp/user_plan.h"

namespace metaload {

std::optional<at::ScalarType> torch_dtype_of(DType d) {
  // By name, so dtypes only newer libtorch releases have (float8, uint16, ...) need no version
  // checks: where this build lacks one, no ScalarType answers to its name.
  const char* name = dtype_scalar_name(d);
  if (name == nullptr) return std::nullopt;
  for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions); ++i) {
    const auto t = static_cast<at::ScalarType>(i);
    if (std::strcmp(name, c10::toString(t)) == 0) return t;
  }
  return std::nullopt;
}

namespace {

constexpr const char* kF4LastDim =
    "which torch.float4_e2m1fn_x2 cannot hold (it packs two values a byte along the last "
    "dimension, which must be even)";

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool convertible(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

std::string q(const std::string& name) {
  return quote_text(name, '\'');
}

// What does not fit, gathered over every target before plan_load throws one MismatchError.
struct Mismatches {
  std::vector<MismatchItem> missing, unexpected, mismatched;
  bool empty() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

// A target the checkpoint has no tensor for: missing under strict; otherwise left as it is and
// listed (LoadPlan::missing), as load_state_dict(strict=False) does.
void add_missing(const LoadOptions& opt, const std::string& name, const std::string& detail,
                 Mismatches& bad, LoadPlan& plan) {
  if (opt.strict) {
    bad.missing.push_back({name, detail});
  } else {
    plan.missing.push_back(name);
  }
}

// A meta target of the checkpoint tensor's whole shape takes its TP shard's shape in the swap
// (it holds no data; a real target must have the shard's shape already, as for a reload).
bool takes_shard_shape(const LoadTarget& t, const SlotSpec& spec) {
  return spec.shard && t.tensor.is_meta() && t.tensor.sizes().vec() == spec.stored_shape;
}

// The checkpoint tensor each target takes, by the family's renames (null: none of its own).
struct Sources {
  std::vector<const TensorInfo*> info;
  std::vector<size_t> file;
  std::vector<std::string> name;
};

// Step 1: the options make sense, and no two targets share a name.
std::unordered_map<std::string, size_t> index_targets(const std::vector<LoadTarget>& targets,
                                                      const LoadOptions& opt) {
  // Each argument on its own rule: tp_size first (it sets tp_rank's range), then tp_rank.
  if (opt.tp_size < 1) {
    throw PlanError("tp_size must be from 1 to 2^31-1, got " + std::to_string(opt.tp_size));
  }
  if (opt.tp_rank < 0 || opt.tp_rank >= opt.tp_size) {
    throw PlanError("tp_rank must be from 0 to tp_size - 1 (" + std::to_string(opt.tp_size - 1) +
                    "), got " + std::to_string(opt.tp_rank));
  }
  if (opt.dtype && !convertible(*opt.dtype)) {
    throw PlanError(
        std::string("dtype must be float32, float16 or bfloat16 (the dtype floating-point "
                    "checkpoint tensors load as), got ") +
        c10::toString(*opt.dtype));
  }
  if (opt.tp_size > 1 && !opt.names.tp_shard) {
    throw PlanError("tp_size " + std::to_string(opt.tp_size) +
                    " needs the model family's TP plan (LoadOptions::names.tp_shard)");
  }
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!by_name.emplace(targets[i].name, i).second) {
      throw PlanError("two targets are named " + q(targets[i].name));
    }
  }
  return by_name;
}

// The targets assembled from several checkpoint tensors (assembly.h), and which tensors those are.
struct Assembled {
  std::unordered_map<std::string, std::pair<size_t, size_t>> target;  // -> (assembly, output)
  std::unordered_map<std::string, size_t> leaf;                       // -> assembly
  std::map<size_t, AssemblyResult> result;                            // computed once each
};

// Only assemblies whose every target is loaded claim their tensors (the others' stay ordinary
// names: unexpected, under strict).
Assembled index_assemblies(const std::unordered_map<std::string, size_t>& by_name,
                           const LoadOptions& opt) {
  Assembled out;
  const std::vector<Assembly>& all = opt.names.assemblies;
  for (size_t a = 0; a < all.size(); ++a) {
    const bool loaded = std::all_of(all[a].targets.begin(), all[a].targets.end(),
                                    [&](const std::string& t) { return by_name.count(t) > 0; });
    if (!loaded) continue;
    for (size_t k = 0; k < all[a].targets.size(); ++k) {
      if (!out.target.emplace(all[a].targets[k], std::make_pair(a, k)).second)
        throw PlanError("two conversions assemble " + q(all[a].targets[k]));
    }
    for (const std::string& leaf : assembly_leaves(all[a])) {
      if (!out.leaf.emplace(leaf, a).second) {
        throw PlanError("checkpoint tensor " + q(leaf) + " is a source of two conversions (to " +
                        q(all[out.leaf[leaf]].targets[0]) + " and " + q(all[a].targets[0]) + ")");
      }
    }
  }
  return out;
}

// Step 2: each checkpoint tensor to the target its (renamed) name is; unexpected ones under
// strict, two tensors for one target a mismatch. An assembly's tensors are its own.
Sources match_sources(const std::vector<LoadTarget>& targets,
                      const std::unordered_map<std::string, size_t>& by_name,
                      const Checkpoint& ckpt, const LoadOptions& opt, const Assembled& assembled,
                      Mismatches& bad, std::vector<std::string>& not_read) {
  const size_t n_targets = targets.size();
  Sources src{std::vector<const TensorInfo*>(n_targets, nullptr), std::vector<size_t>(n_targets, 0),
              std::vector<std::string>(n_targets)};
  for (const std::string& cname : ckpt.tensor_names()) {
    if (assembled.leaf.count(cname)) continue;
    std::optional<std::string> mname = cname;
    if (opt.names.checkpoint_to_module) mname = opt.names.checkpoint_to_module(cname);
    if (!mname) continue;  // ignored by the family
    auto it = by_name.find(*mname);
    if (it != by_name.end() && targets[it->second].computed) it = by_name.end();  // never loaded
    const TensorRef& ref = ckpt.lookup.at(cname);
    if (it == by_name.end()) {
      if (opt.strict) {
        bad.unexpected.push_back(
            {cname, (*mname != cname ? " (as " + escape_text(*mname) + ")" : "") + " in " +
                        escape_text(base_name(ckpt.files[ref.file].path))});
      } else {
        not_read.push_back(cname);
      }
      continue;
    }
    if (src.info[it->second] != nullptr) {
      bad.mismatched.push_back({*mname, ": both " + q(src.name[it->second]) + " and " + q(cname) +
                                            " in the checkpoint map to it"});
      continue;
    }
    src.info[it->second] = &ckpt.tensor(ref);
    src.file[it->second] = ref.file;
    src.name[it->second] = cname;
  }
  return src;
}

// Step 3: ties -- targets that are one tensor object, and the family's tied groups. Returns each
// target's group (-1: undefined tensor) and, per group, a target with a checkpoint tensor.
std::map<int, size_t> tie_groups(const std::vector<LoadTarget>& targets,
                                 const std::unordered_map<std::string, size_t>& by_name,
                                 const Sources& src, const LoadOptions& opt,
                                 std::vector<int>& group) {
  group.assign(targets.size(), -1);
  std::unordered_map<const c10::TensorImpl*, int> impl_group;
  int groups = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].tensor.defined()) continue;
    auto [it, fresh] = impl_group.emplace(targets[i].tensor.unsafeGetTensorImpl(), groups);
    if (fresh) ++groups;
    group[i] = it->second;
  }
  for (const std::vector<std::string>& names : opt.names.tied) {
    int g = -1;
    for (const std::string& n : names) {
      auto it = by_name.find(n);
      if (it == by_name.end()) continue;
      if (g < 0) {
        g = group[it->second];
        continue;
      }
      const int old = group[it->second];
      for (int& x : group) x = x == old ? g : x;
    }
  }
  std::map<int, size_t> group_source;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (src.info[i] != nullptr && group[i] >= 0) group_source.emplace(group[i], i);
  }
  return group_source;
}

// The dtype the slot gets: the module's, or opt.dtype among the convertible float types; nullopt
// (and a mismatch) when the stored dtype cannot become it.
std::optional<at::ScalarType> slot_dtype(const LoadTarget& t, at::ScalarType stored,
                                         const std::string& where, const LoadOptions& opt,
                                         Mismatches& bad) {
  at::ScalarType want = t.tensor.scalar_type();
  if (opt.dtype && convertible(stored)) want = *opt.dtype;
  if (opt.dtype && !convertible(stored)) want = stored;
  if (want != stored && !(convertible(want) && convertible(stored))) {
    bad.mismatched.push_back({t.name, std::string(": dtype ") + c10::toString(want) +
                                          " in the module but " + where + " is " +
                                          c10::toString(stored) +
                                          " (conversions exist among Float, Half and BFloat16)"});
    return std::nullopt;
  }
  return want;
}

// Under tensor parallelism, this rank's slice of the spec's tensor (spec.shard) and its shape;
// nullopt (and a mismatch) when the family has none for it.
std::optional<std::vector<int64_t>> slot_shape(const LoadTarget& t, SlotSpec& spec,
                                               const LoadOptions& opt, Mismatches& bad) {
  if (opt.tp_size <= 1) return spec.stored_shape;
  spec.exact = true;  // a rank reads its share and the replicated tensors, nothing between
  try {
    TpShard shard = opt.names.tp_shard(t.name, spec.stored_shape, opt.tp_rank, opt.tp_size);
    if (shard.dim < 0) return spec.stored_shape;
    shard_copies(spec.stored_shape, 1, 0, shard, spec.name);  // validates
    spec.shard = shard;
    return shard.shape;
  } catch (const std::exception& e) {
    bad.mismatched.push_back({t.name, ": no TP shard for rank " + std::to_string(opt.tp_rank) +
                                          " of " + std::to_string(opt.tp_size) + ": " +
                                          escape_text(e.what())});
    return std::nullopt;
  }
}

// Step 4: the slot of target t, read from its owner's checkpoint tensor; nullopt (and a
// mismatch) when dtype, TP shard or shape do not fit.
std::optional<SlotSpec> make_spec(const LoadTarget& t, size_t owner, const Sources& src,
                                  const Checkpoint& ckpt, const LoadOptions& opt, Mismatches& bad) {
  const TensorInfo& info = *src.info[owner];
  const std::string where =
      q(src.name[owner]) + " in " + escape_text(base_name(ckpt.files[src.file[owner]].path));
  const std::optional<at::ScalarType> stored = torch_dtype_of(info.dtype);
  if (!stored) {
    bad.mismatched.push_back({t.name, ": " + where + " is " + dtype_name(info.dtype) +
                                          ", which this libtorch has no dtype for"});
    return std::nullopt;
  }
  const std::optional<at::ScalarType> want = slot_dtype(t, *stored, where, opt, bad);
  if (!want) return std::nullopt;
  SlotSpec spec;
  spec.name = src.name[owner];
  spec.file = src.file[owner];
  spec.data_offset = ckpt.files[src.file[owner]].data_start + info.begin;
  const std::optional<std::vector<int64_t>> stored_shape = torch_shape_of(info.dtype, info.shape);
  if (!stored_shape) {
    bad.mismatched.push_back({t.name, ": " + where + " is " + dtype_name(info.dtype) + " " +
                                          shape_str(info.shape) + ", " + kF4LastDim});
    return std::nullopt;
  }
  spec.stored_shape = *stored_shape;
  spec.stored_dtype = *stored;
  spec.dtype = *want;
  const std::optional<std::vector<int64_t>> shape = slot_shape(t, spec, opt, bad);
  if (!shape) return std::nullopt;
  if (t.tensor.sizes().vec() != *shape && !takes_shard_shape(t, spec)) {
    bad.mismatched.push_back(
        {t.name, ": shape " + shape_str(t.tensor.sizes().vec()) + " in the module but " + where +
                     " gives " + shape_str(*shape) +
                     (opt.tp_size > 1 ? " (rank " + std::to_string(opt.tp_rank) + " of " +
                                            std::to_string(opt.tp_size) + ")"
                                      : "")});
    return std::nullopt;
  }
  return spec;
}

// The checkpoint tensors an assembly reads: their headers' entries, files and shapes.
struct Leaves {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const TensorInfo*> info;
  std::vector<size_t> file;
  std::vector<at::ScalarType> dtype;  // as stored (torch_dtype_of, once per leaf)
};

// False (and a missing or mismatched item) when a leaf is absent or of a dtype no slot takes.
bool find_leaves(const LoadTarget& t, const Assembly& a, const std::vector<std::string>& leaves,
                 const Checkpoint& ckpt, Mismatches& bad, Leaves& out) {
  for (const std::string& leaf : leaves) {
    auto it = ckpt.lookup.find(leaf);
    if (it == ckpt.lookup.end()) {
      bad.missing.push_back({leaf, " (a source of " + escape_text(t.name) + ", model type " +
                                       escape_text(a.model_type) + ")"});
      return false;
    }
    const TensorInfo& info = ckpt.tensor(it->second);
    const std::optional<at::ScalarType> dtype = torch_dtype_of(info.dtype);
    if (info.dtype == DType::F4 || !dtype) {
      bad.mismatched.push_back({t.name, ": its source " + q(leaf) + " is " +
                                            dtype_name(info.dtype) +
                                            ", which an assembled target cannot take"});
      return false;
    }
    out.info.push_back(&info);
    out.file.push_back(it->second.file);
    out.shapes.push_back(info.shape);
    out.dtype.push_back(*dtype);
  }
  return true;
}

// Under tensor parallelism, `out` becomes this rank's part of the assembled target (expert
// parallelism: its experts), read alone; false (and a mismatch) when the plan has none for it.
bool rank_part(const LoadTarget& t, const Assembly& a, size_t k,
               const std::vector<std::vector<int64_t>>& shapes, const LoadOptions& opt,
               Mismatches& bad, AssembledTarget& out) {
  std::optional<TpShard> window;
  try {
    TpShard shard = opt.names.tp_shard(t.name, out.shape, opt.tp_rank, opt.tp_size);
    if (shard.dim >= 0) window = shard;
  } catch (const std::exception& e) {
    bad.mismatched.push_back({t.name, ": no TP shard for rank " + std::to_string(opt.tp_rank) +
                                          " of " + std::to_string(opt.tp_size) + ": " +
                                          escape_text(e.what())});
    return false;
  }
  if (window) {
    std::vector<std::optional<TpShard>> windows(a.targets.size());
    windows[k] = window;
    out = assemble(a, shapes, {t.tensor.sizes().vec()}, windows).targets[k];
  }
  return true;
}

// Step 4 for an assembled target: its slot filled from the assembly's checkpoint tensors, each
// read once into its place; nullopt (and a mismatch) when a tensor is absent, of a dtype the
// target cannot take, or the assembly's shape is not the target's.
// `by_name`: a checkpoint tensor that has the target's own name too (then both would fill it).
std::optional<SlotSpec> make_assembled_spec(const LoadTarget& t, const std::string& by_name,
                                            std::pair<size_t, size_t> which, Assembled& assembled,
                                            const Checkpoint& ckpt, const LoadOptions& opt,
                                            Mismatches& bad) {
  const Assembly& a = opt.names.assemblies[which.first];
  const std::vector<std::string> leaves = assembly_leaves(a);
  if (!by_name.empty()) {
    bad.mismatched.push_back({t.name, ": both " + q(by_name) +
                                          " in the checkpoint and the conversion of " +
                                          q(leaves[0]) + ", ... (model type " +
                                          escape_text(a.model_type) + ") make it"});
    return std::nullopt;
  }
  Leaves l;
  if (!find_leaves(t, a, leaves, ckpt, bad, l)) return std::nullopt;
  const std::vector<std::vector<int64_t>>& shapes = l.shapes;
  const std::vector<const TensorInfo*>& info = l.info;
  const std::vector<size_t>& file = l.file;
  auto r = assembled.result.find(which.first);
  if (r == assembled.result.end()) {
    std::vector<std::vector<int64_t>> target_shapes;
    target_shapes.push_back(t.tensor.sizes().vec());
    r = assembled.result.emplace(which.first, assemble(a, shapes, target_shapes)).first;
  }
  const std::string from = "the conversion of " + std::to_string(leaves.size()) +
                           " checkpoint tensors (model type " + escape_text(a.model_type) + ", " +
                           q(leaves[0]) + (leaves.size() > 1 ? ", ..." : "") + ")";
  if (!r->second.problem.empty()) {
    bad.mismatched.push_back({t.name, ": " + from + " does not fit: " + r->second.problem});
    return std::nullopt;
  }
  AssembledTarget out = r->second.targets[which.second];
  const std::vector<int64_t> whole = out.shape;
  if (opt.tp_size > 1 && !rank_part(t, a, which.second, shapes, opt, bad, out)) return std::nullopt;
  // A meta target of the whole assembled shape takes the rank's part in the swap, as a dense
  // one takes its shard's (takes_shard_shape); a real one must have the part's shape already.
  const bool takes_part =
      t.tensor.is_meta() && whole != out.shape && t.tensor.sizes().vec() == whole;
  if (t.tensor.sizes().vec() != out.shape && !takes_part) {
    bad.mismatched.push_back({t.name, ": shape " + shape_str(t.tensor.sizes().vec()) +
                                          " in the module but " + from + " gives " +
                                          shape_str(out.shape)});
    return std::nullopt;
  }
  SlotSpec spec;
  spec.name = t.name;
  spec.file = file[0];
  spec.assembled_shape = out.shape;
  spec.exact = opt.tp_size > 1;  // a rank reads its experts' bytes, nothing between
  std::optional<at::ScalarType> want;
  for (size_t i = 0; i < leaves.size(); ++i) {
    want = slot_dtype(t, l.dtype[i], q(leaves[i]) + " (a source)", opt, bad);
    if (!want) return std::nullopt;
  }
  spec.dtype = spec.stored_dtype = *want;
  for (const AssembledCopy& c : out.copies) {
    SlotPart part;
    part.name = leaves[c.leaf];
    part.file = file[c.leaf];
    part.data_offset = ckpt.files[file[c.leaf]].data_start + info[c.leaf]->begin;
    part.stored_dtype = l.dtype[c.leaf];
    part.copy = c;
    spec.parts.push_back(std::move(part));
  }
  return spec;
}

// A computed target (LoadTarget::computed) takes its values, which must be known and fit.
void plan_computed(const LoadTarget& t, size_t i, const LoadOptions& opt, LoadPlan& plan,
                   Mismatches& bad) {
  if (!t.values.defined()) {
    add_missing(opt, t.name,
                " " + shape_str(t.tensor.sizes().vec()) +
                    " (a non-persistent buffer: checkpoints do not hold it, and its values are "
                    "unknown; build the module under metaload.meta() or on a real device)",
                bad, plan);
  } else if (t.values.sizes() != t.tensor.sizes()) {
    bad.mismatched.push_back({t.name, ": shape " + shape_str(t.tensor.sizes().vec()) +
                                          " in the module but its values have " +
                                          shape_str(t.values.sizes().vec())});
  } else {
    plan.computed.push_back(i);
  }
}

// A target tied to one whose slot is planned already shares it; its shape must be the slot's.
void check_tied_shape(const LoadTarget& t, const LoadTarget& owner, const SlotSpec& s,
                      Mismatches& bad) {
  const std::vector<int64_t>& shape = s.shard ? s.shard->shape : s.stored_shape;
  if (t.tensor.sizes().vec() != shape && !takes_shard_shape(t, s)) {
    bad.mismatched.push_back({t.name, ": shape " + shape_str(t.tensor.sizes().vec()) +
                                          " but it is tied to " + q(owner.name) + " " +
                                          shape_str(shape)});
  }
}

}  // namespace

LoadPlan plan_load(const std::vector<LoadTarget>& targets, const Checkpoint& ckpt,
                   const LoadOptions& opt) {
  const std::unordered_map<std::string, size_t> by_name = index_targets(targets, opt);
  Mismatches bad;
  LoadPlan plan;
  Assembled assembled = index_assemblies(by_name, opt);
  const Sources src = match_sources(targets, by_name, ckpt, opt, assembled, bad, plan.unexpected);
  std::vector<int> group;
  const std::map<int, size_t> group_source = tie_groups(targets, by_name, src, opt, group);

  for (const SafetensorsHeader& f : ckpt.files) plan.files.push_back(f.path);
  plan.spec_of_target.assign(targets.size(), -1);
  std::map<size_t, int> spec_of_source;  // owner target -> spec
  for (size_t i = 0; i < targets.size(); ++i) {
    const LoadTarget& t = targets[i];
    // A name the mapping skips is in no checkpoint: left as it is, unless its values are given.
    if (opt.names.skip && opt.names.skip(t.name) && !(t.computed && t.values.defined())) continue;
    if (!t.tensor.defined()) {
      bad.mismatched.push_back({t.name, ": undefined tensor in the module"});
      continue;
    }
    if (t.computed) {
      plan_computed(t, i, opt, plan, bad);
      continue;
    }
    auto as = assembled.target.find(t.name);
    if (as != assembled.target.end()) {
      std::optional<SlotSpec> spec =
          make_assembled_spec(t, src.name[i], as->second, assembled, ckpt, opt, bad);
      if (!spec) continue;
      plan.spec_of_target[i] = static_cast<int>(plan.specs.size());
      plan.specs.push_back(std::move(*spec));
      continue;
    }
    size_t owner = i;
    if (src.info[i] == nullptr) {  // a target without its own tensor takes its group's
      auto g = group[i] >= 0 ? group_source.find(group[i]) : group_source.end();
      if (g == group_source.end()) {
        add_missing(opt, t.name, " " + shape_str(t.tensor.sizes().vec()), bad, plan);
        continue;
      }
      owner = g->second;
    }
    auto known = spec_of_source.find(owner);
    if (known != spec_of_source.end()) {
      plan.spec_of_target[i] = known->second;
      check_tied_shape(t, targets[owner], plan.specs[known->second], bad);
      continue;
    }
    std::optional<SlotSpec> spec = make_spec(t, owner, src, ckpt, opt, bad);
    if (!spec) continue;
    spec_of_source[owner] = static_cast<int>(plan.specs.size());
    plan.spec_of_target[i] = static_cast<int>(plan.specs.size());
    plan.specs.push_back(std::move(*spec));
  }
  if (!bad.empty()) {
    const std::string summary =
        "checkpoint " + q(ckpt.ref) + " does not fit: " + std::to_string(bad.missing.size()) +
        " missing, " + std::to_string(bad.unexpected.size()) + " unexpected, " +
        std::to_string(bad.mismatched.size()) + " mismatched";
    throw MismatchError(summary, std::move(bad.missing), std::move(bad.unexpected),
                        std::move(bad.mismatched));
  }
  return plan;
}

LoadReport load_tensors(const std::vector<LoadTarget>& targets, const std::string& ref,
                        const LoadOptions& opt) {
  checked_loader_threads(opt.threads);  // before any file is opened
  return load_tensors(targets, open_checkpoint(ref, opt.revision, /*keep_files=*/true), opt);
}

namespace {

// strict=false, dequantizing: a quantized weight no target takes is one unexpected name, its
// weight's ("P.weight", as the package lists the checkpoint's names), not its parts'.
std::vector<std::string> by_quantized_weight(const std::vector<std::string>& names,
                                             const QuantLayout& layout) {
  std::unordered_map<std::string, std::string> weight_of;
  for (const QuantModule& m : layout.modules) {
    for (const auto& [role, part] : m.parts) weight_of[part] = m.name + ".weight";
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& n : names) {
    auto it = weight_of.find(n);
    const std::string& name = it == weight_of.end() ? n : it->second;
    if (seen.insert(name).second) out.push_back(name);
  }
  return out;
}

// The descriptors `ckpt` holds (Checkpoint::keep_files), by path, for EngineOptions.
std::function<int(const std::string&)> held_descriptors(const Checkpoint& ckpt) {
  auto fds = std::make_shared<std::unordered_map<std::string, std::shared_ptr<const UniqueFd>>>();
  for (const SafetensorsHeader& f : ckpt.files) {
    if (f.fd) (*fds)[f.path] = f.fd;
  }
  if (fds->empty()) return nullptr;
  return [fds](const std::string& path) {
    auto it = fds->find(path);
    return it == fds->end() ? -1 : it->second->get();
  };
}

}  // namespace

LoadReport load_tensors(const std::vector<LoadTarget>& targets, const Checkpoint& ckpt,
                        const LoadOptions& opt) {
  checked_loader_threads(opt.threads);
  // Dequantizing: the quantized weights' targets are planned apart (dequant_load.h); the plain
  // plan sees the other targets and the checkpoint without those weights' parts.
  std::optional<DequantPlan> dq;
  std::vector<LoadTarget> rest;
  if (opt.dequantize && !opt.names.assemblies.empty()) {
    throw PlanError("dequantize: " + q(opt.names.assemblies[0].targets[0]) +
                    " is assembled from several checkpoint tensors (fused experts), which "
                    "dequantizing loads do not assemble yet");
  }
  if (opt.dequantize) {
    dq = plan_dequant(targets, ckpt, opt);
    for (size_t i = 0; i < targets.size(); ++i)
      if (!dq->dequantized[i]) rest.push_back(targets[i]);
  }
  const std::vector<LoadTarget>& plain = dq ? rest : targets;
  const LoadPlan plan = plan_load(plain, dq ? dq->rest : ckpt, opt);
  EngineOptions eo = opt.engine;
  if (!eo.open_descriptor) eo.open_descriptor = held_descriptors(ckpt);
  if (opt.threads > 0) eo.threads = opt.threads;
  if (opt.staging_bytes > 0) eo.staging_bytes = opt.staging_bytes;
  if (opt.progress) eo.progress = opt.progress;
  eo.map_files = opt.map_files.value_or(
      eo.map_files || std::all_of(plan.files.begin(), plan.files.end(), is_hf_cache_blob));
  SlotLoad slots;
  std::vector<at::Tensor> dequantized;
  {
    // Slots must be real memory even when a meta mode is active on this thread (a DeferredInit
    // or Fake key included): exclude both while they are made.
    c10::impl::ExcludeDispatchKeyGuard real(
        c10::DispatchKeySet({c10::DispatchKey::DeferredInit, c10::DispatchKey::Fake}));
    slots = load_slots(plan.files, plan.specs, opt.device, eo, opt.staged);
    if (dq) dequantized = run_dequant(*dq, plan.files, opt, eo, &slots.report);
  }
  std::vector<at::Tensor> dst, src;
  std::vector<std::string> names;
  for (size_t i = 0; i < plain.size(); ++i) {
    if (plan.spec_of_target[i] < 0) continue;
    dst.push_back(plain[i].tensor);
    src.push_back(slots.tensors[plan.spec_of_target[i]]);
    names.push_back(plain[i].name);
  }
  for (size_t k = 0; k < dequantized.size(); ++k) {
    const LoadTarget& t = targets[dq->targets[k].target];
    dst.push_back(t.tensor);
    src.push_back(dequantized[k]);
    names.push_back(t.name);
    slots.report.dequantized.push_back(t.name);
  }
  {
    c10::impl::ExcludeDispatchKeyGuard real(
        c10::DispatchKeySet({c10::DispatchKey::DeferredInit, c10::DispatchKey::Fake}));
    for (size_t i : plan.computed) {
      const LoadTarget& t = plain[i];
      // A fresh copy: the values may be another tensor's (the buffer itself, built on a device).
      dst.push_back(t.tensor);
      src.push_back(t.values.to(opt.device, t.tensor.scalar_type(), /*non_blocking=*/false,
                                /*copy=*/true));
      names.push_back(t.name);
    }
  }
  swap_in(dst, src, names, /*meta_takes_shape=*/opt.tp_size > 1);
  slots.report.missing = plan.missing;
  slots.report.unexpected = dq ? by_quantized_weight(plan.unexpected, dq->layout) : plan.unexpected;
  return slots.report;
}

namespace {

std::map<std::string, NameMappingSource>& name_mapping_sources() {
  static auto* sources = new std::map<std::string, NameMappingSource>;  // filled at load time
  return *sources;
}

}  // namespace

void register_name_mapping_source(const std::string& name, NameMappingSource source) {
  name_mapping_sources()[name] = source;
}

NameMapping name_mapping_from(const std::string& name, const Checkpoint& checkpoint) {
  const auto& sources = name_mapping_sources();
  auto it = sources.find(name);
  if (it == sources.end()) {
    std::string known;
    for (const auto& kv : sources) known += (known.empty() ? "" : ", ") + q(kv.first);
    throw PlanError("name_mapping " + q(name) + " is not one of the registered mappings (" +
                    (known.empty() ? std::string("none") : known) + ")");
  }
  return it->second(checkpoint);
}

LoadReport load(torch::nn::Module& module, const std::string& ref, const LoadOptions& opt) {
  std::vector<LoadTarget> targets;
  for (const auto& kv : module.named_parameters(/*recurse=*/true)) {
    targets.push_back({kv.key(), kv.value()});
  }
  for (const auto& kv : module.named_buffers(/*recurse=*/true)) {
    targets.push_back({kv.key(), kv.value()});
  }
  return load_tensors(targets, ref, opt);
}

namespace {

// Python: the styles load_into's tp_plan may name.
std::vector<std::string> tp_plan_styles_op() {
  return user_tp_styles();
}

// load_into's tp_plan as Python hands it over: (name pattern, style, name pattern, style, ...).
UserTpPlan user_plan_of(const std::vector<std::string>& flat) {
  if (flat.size() % 2 != 0) throw PlanError("tp_plan must come as (module, style) pairs");
  UserTpPlan plan;
  for (size_t i = 0; i < flat.size(); i += 2) plan.emplace_back(flat[i], flat[i + 1]);
  return plan;
}

// The shards of load_into's tp_plan, which names modules: target names[i] matched as
// tp_names[i] (the module's own name where a key mapping renamed it; default: names[i]).
std::function<TpShard(const std::string&, const std::vector<int64_t>&, int, int)> plan_shards(
    const std::vector<std::string>& flat, const std::vector<std::string>& names,
    const c10::optional<std::vector<std::string>>& tp_names) {
  auto shards = user_tp_shards(user_plan_of(flat));
  if (!tp_names) return shards;
  if (tp_names->size() != names.size()) {
    throw PlanError(std::to_string(tp_names->size()) + " tp_names but " +
                    std::to_string(names.size()) + " names");
  }
  auto as = std::make_shared<std::unordered_map<std::string, std::string>>();
  for (size_t i = 0; i < names.size(); ++i) (*as)[names[i]] = (*tp_names)[i];
  return
      [shards, as](const std::string& name, const std::vector<int64_t>& shape, int rank, int size) {
        const auto it = as->find(name);
        return shards(it == as->end() ? name : it->second, shape, rank, size);
      };
}

// Python: torch.ops.metaload.load_into(targets, names, ref, ...) -> JSON report. The Python
// package passes module.state_dict(keep_vars=True): the Parameters and persistent buffers
// themselves, so they change in place; and as `computed` the non-persistent buffers to set from
// their values (computed_values[i]: None when unknown, LoadTarget::computed).
std::string load_into_op(at::TensorList targets, std::vector<std::string> names, std::string ref,
                         c10::optional<std::string> revision, c10::optional<at::Device> device,
                         c10::optional<at::ScalarType> dtype, int64_t tp_rank, int64_t tp_size,
                         int64_t threads, int64_t staging_bytes, bool strict, bool progress_bar,
                         c10::optional<bool> map_files, int64_t progress_id,
                         c10::optional<at::TensorList> computed_opt,
                         c10::optional<std::vector<std::string>> computed_names_opt,
                         const c10::optional<c10::List<c10::optional<at::Tensor>>>& values_opt,
                         c10::optional<at::ScalarType> dequantize,
                         c10::optional<std::vector<std::string>> tp_plan,
                         c10::optional<std::vector<std::string>> tp_names,
                         c10::optional<std::string> assemblies, int64_t checkpoint,
                         c10::optional<std::string> name_mapping, bool map_views) {
  if (targets.size() != names.size()) {
    throw PlanError(std::to_string(targets.size()) + " tensors but " +
                    std::to_string(names.size()) + " names");
  }
  const at::TensorList computed = computed_opt.value_or(at::TensorList());
  const std::vector<std::string> computed_names =
      computed_names_opt.value_or(std::vector<std::string>());
  const c10::List<c10::optional<at::Tensor>> computed_values =
      values_opt.value_or(c10::List<c10::optional<at::Tensor>>());
  if (computed.size() != computed_names.size() || computed.size() != computed_values.size()) {
    throw PlanError(std::to_string(computed.size()) + " computed tensors but " +
                    std::to_string(computed_names.size()) + " names and " +
                    std::to_string(computed_values.size()) + " values");
  }
  // Python ints arrive as int64: out-of-range values are errors naming the argument, never
  // clamped, wrapped or read as "the default".
  if (staging_bytes < 0) {
    throw PlanError("staging_bytes must be 0 (the default, " +
                    std::to_string(EngineOptions().staging_bytes >> 20) +
                    " MiB) or a positive number of bytes, got " + std::to_string(staging_bytes));
  }
  if (tp_size < 1 || tp_size > INT_MAX) {
    throw PlanError("tp_size must be from 1 to 2^31-1, got " + std::to_string(tp_size));
  }
  if (tp_rank < 0 || tp_rank >= tp_size) {
    throw PlanError("tp_rank must be from 0 to tp_size - 1 (" + std::to_string(tp_size - 1) +
                    "), got " + std::to_string(tp_rank));
  }
  std::vector<LoadTarget> t;
  for (size_t i = 0; i < targets.size(); ++i) t.push_back({names[i], targets[i]});
  for (size_t i = 0; i < computed.size(); ++i) {
    const c10::optional<at::Tensor> v = computed_values.get(i);
    t.push_back({computed_names[i], computed[i], /*computed=*/true, v ? *v : at::Tensor()});
  }
  LoadOptions opt;
  if (device) opt.device = *device;
  if (dtype) opt.dtype = *dtype;
  if (revision) opt.revision = *revision;
  opt.tp_rank = static_cast<int>(tp_rank);
  opt.tp_size = static_cast<int>(tp_size);
  opt.threads = checked_loader_threads(threads);
  opt.staging_bytes = static_cast<uint64_t>(staging_bytes);
  opt.strict = strict;
  opt.engine.bar = progress_bar ? ProgressBar::kAuto : ProgressBar::kOff;
  if (map_files) opt.map_files = *map_files;
  opt.engine.map_views = map_views;
  if (progress_id != 0) opt.progress = ProgressBoard::instance().writer(progress_id);
  if (dequantize) opt.dequantize = *dequantize;
  if (assemblies) opt.names.assemblies = parse_assemblies(*assemblies);
  if (tp_plan) opt.names.tp_shard = plan_shards(*tp_plan, names, tp_names);
  // A checkpoint the package opened for this load (open_checkpoints.h), else `ref` opened now.
  std::shared_ptr<const Checkpoint> ckpt = checkpoint != 0
                                               ? held_checkpoint(checkpoint)
                                               : std::make_shared<const Checkpoint>(open_checkpoint(
                                                     ref, opt.revision, /*keep_files=*/true));
  if (name_mapping) {
    // A registered mapping (the family's names, ties and TP plan); the assemblies stay.
    if (tp_plan) throw PlanError("name_mapping and tp_plan cannot both be given");
    std::vector<Assembly> assembled = std::move(opt.names.assemblies);
    opt.names = name_mapping_from(*name_mapping, *ckpt);
    opt.names.assemblies = std::move(assembled);
  }
  return load_report_json(load_tensors(t, *ckpt, opt));
}

// Python: metaload.load_file(path, device, mmap): every tensor of one safetensors file, in file
// order, loaded (mapped where `map_files`) into fresh targets made here from one header read, with
// no Python pass over the header. The third result names the file's first dtype this libtorch
// has none for (then nothing is loaded: Python raises DTypeError), else "".
std::tuple<std::vector<std::string>, std::vector<at::Tensor>, std::string> load_file_op(
    std::string path, at::Device device, bool map_files) {
  const SafetensorsHeader header = read_safetensors_header(path);
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  std::vector<LoadTarget> t;
  for (const TensorInfo& info : header.tensors) {
    const std::optional<at::ScalarType> dtype = torch_dtype_of(info.dtype);
    if (!dtype) return {{}, {}, dtype_name(info.dtype)};
    const std::optional<std::vector<int64_t>> shape = torch_shape_of(info.dtype, info.shape);
    if (!shape) {
      throw FormatError(
          path, info.name, "unsupported-dtype",
          std::string(dtype_name(info.dtype)) + " " + shape_str(info.shape) + ": " + kF4LastDim);
    }
    names.push_back(info.name);
    tensors.push_back(at::empty(*shape, at::TensorOptions().dtype(*dtype).device(at::kMeta)));
    t.push_back({info.name, tensors.back()});
  }
  if (t.empty()) return {names, tensors, ""};
  LoadOptions opt;
  opt.device = device;
  opt.map_files = map_files;
  opt.engine.bar = ProgressBar::kOff;
  load_tensors(t, path, opt);
  return {names, tensors, ""};
}

// Python: the latest {bytes_done, bytes_total} of a load started with `progress_id` (see
// loader/load/progress_board.h), or [] before its first report.
std::vector<int64_t> load_progress_op(int64_t progress_id, bool release) {
  return ProgressBoard::instance().read(progress_id, release);
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "load_into(Tensor(a!)[] targets, str[] names, str ref, str? revision=None, "
      "Device? device=None, ScalarType? dtype=None, int tp_rank=0, int tp_size=1, int threads=0, "
      "int staging_bytes=0, bool strict=True, bool progress_bar=True, bool? map_files=None, "
      "int progress_id=0, Tensor(b!)[]? computed=None, str[]? computed_names=None, "
      "Tensor?[]? computed_values=None, ScalarType? dequantize=None, str[]? tp_plan=None, str[]? "
      "tp_names=None, "
      "str? assemblies=None, int checkpoint=0, str? name_mapping=None, bool map_views=True) -> "
      "str",
      &load_into_op);
  m.def("load_file(str path, Device device, bool map_files) -> (str[], Tensor[], str)",
        &load_file_op);
  m.def("load_progress(int progress_id, bool release=False) -> int[]", &load_progress_op);
  m.def("tp_plan_styles() -> str[]", &tp_plan_styles_op);
}

}  // namespace metaload
