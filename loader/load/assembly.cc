#include "loader/load/assembly.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "base/text.h"
#include "loader/errors.h"

namespace metaload {

namespace {

// A box of one leaf inside a value: value coordinates [start, start + extent) per value dim; each
// value dim walks leaf dim src_dim (or none, -1: a dim a MergeModulelist added, extent 1), from
// src_start in the leaf.
struct Piece {
  size_t leaf = 0;
  std::vector<int64_t> start, extent;
  std::vector<int> src_dim;
  std::vector<int64_t> src_start;  // per leaf dim
};

// A tensor the operations pass along: its shape and the leaf boxes that tile it.
struct Value {
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
};

using Lists = std::vector<std::vector<Value>>;  // per source pattern, its tensors

std::string q(const std::string& s) {
  return quote_text(s, '\'');
}

[[noreturn]] void cannot(const Assembly& a, const AssemblyOp& op, const std::string& why) {
  throw PlanError("model type " + q(a.model_type) + ": operation " + op.op +
                  "(dim=" + std::to_string(op.dim) + ") of the conversion to " +
                  q(a.targets.empty() ? std::string() : a.targets[0]) + ": " + why);
}

// `dim` of a tensor with `rank` dims (negative counts from the end), or -1 when out of range.
int normal_dim(int dim, size_t rank) {
  const int r = static_cast<int>(rank);
  const int d = dim < 0 ? dim + r : dim;
  return d < 0 || d >= r ? -1 : d;
}

// Problems found while running the operations (the first one is reported).
struct Run {
  const Assembly& a;
  const std::vector<std::string>& leaves;
  std::string problem;
  bool fail(const std::string& p) {
    if (problem.empty()) problem = p;
    return false;
  }
};

// The experts of source `s` its names lack, below `count`.
std::vector<int64_t> lacking(const AssemblySource& s, int64_t count) {
  std::set<int64_t> have(s.indices.begin(), s.indices.end());
  std::vector<int64_t> out;
  for (int64_t k = 0; k < count; ++k)
    if (!have.count(k)) out.push_back(k);
  return out;
}

// The name of expert k of a source: its template with k for `*` (quoted), or "expert k".
std::string expert_name(const AssemblySource& s, int64_t k) {
  const size_t star = s.name_template.find('*');
  if (star == std::string::npos) return "expert " + std::to_string(k);
  std::string out = s.name_template;
  out.replace(star, 1, std::to_string(k));
  return q(out);
}

bool merge(Run& r, const AssemblyOp& op, Lists& lists) {
  // Every source's experts 0..n-1, n the most any source has: a checkpoint lacking one is named.
  int64_t count = 0;
  for (const AssemblySource& s : r.a.sources)
    for (int64_t k : s.indices) count = std::max(count, k + 1);
  for (const AssemblySource& s : r.a.sources) {
    if (s.indices.empty() || s.indices[0] < 0) continue;
    const std::vector<int64_t> gone = lacking(s, count);
    if (!gone.empty()) {
      return r.fail("the checkpoint lacks " + expert_name(s, gone[0]) +
                    (gone.size() > 1 ? " and " + std::to_string(gone.size() - 1) + " more" : "") +
                    " (pattern " + q(s.pattern) + " matched " + std::to_string(s.names.size()) +
                    " of " + std::to_string(count) + " experts)");
    }
  }
  size_t leaf_base = 0;
  for (size_t s = 0; s < lists.size(); ++s) {
    std::vector<Value>& list = lists[s];
    if (list.empty()) continue;
    const std::vector<int64_t>& shape = list[0].shape;
    const int d = normal_dim(op.dim, shape.size() + 1);
    if (d < 0) cannot(r.a, op, "dim out of range for " + shape_str(shape) + " tensors");
    Value out;
    out.shape = shape;
    out.shape.insert(out.shape.begin() + d, static_cast<int64_t>(list.size()));
    for (size_t k = 0; k < list.size(); ++k) {
      if (list[k].shape != shape) {
        return r.fail(q(r.leaves[leaf_base + k]) + " is " + shape_str(list[k].shape) + " where " +
                      q(r.leaves[leaf_base]) + " is " + shape_str(shape));
      }
      for (Piece p : list[k].pieces) {
        p.start.insert(p.start.begin() + d, static_cast<int64_t>(k));
        p.extent.insert(p.extent.begin() + d, 1);
        p.src_dim.insert(p.src_dim.begin() + d, -1);
        out.pieces.push_back(std::move(p));
      }
    }
    leaf_base += list.size();
    list = {std::move(out)};
  }
  return true;
}

bool concatenate(Run& r, const AssemblyOp& op, Lists& lists) {
  std::vector<Value> all;
  for (std::vector<Value>& list : lists)
    for (Value& v : list) all.push_back(std::move(v));
  if (all.empty()) cannot(r.a, op, "no tensor to concatenate");
  const std::vector<int64_t> first = all[0].shape;
  const int d = normal_dim(op.dim, first.size());
  if (d < 0) cannot(r.a, op, "dim out of range for " + shape_str(first) + " tensors");
  Value out;
  out.shape = first;
  out.shape[d] = 0;
  for (Value& v : all) {
    std::vector<int64_t> a = v.shape, b = first;
    if (a.size() == b.size()) a[d] = b[d] = 0;
    if (a != b) {
      return r.fail("cannot concatenate " + shape_str(v.shape) + " and " + shape_str(first) +
                    " along dim " + std::to_string(d) + " (from " + q(r.leaves[v.pieces[0].leaf]) +
                    " and " + q(r.leaves[all[0].pieces[0].leaf]) + ")");
    }
    for (Piece& p : v.pieces) {
      p.start[d] += out.shape[d];
      out.pieces.push_back(std::move(p));
    }
    out.shape[d] += v.shape[d];
  }
  lists = {{std::move(out)}};
  return true;
}

bool chunk(Run& r, const AssemblyOp& op, Lists& lists) {
  std::vector<Value> all;
  for (std::vector<Value>& list : lists)
    for (Value& v : list) all.push_back(std::move(v));
  if (all.size() != 1) cannot(r.a, op, "it splits one tensor, here " + std::to_string(all.size()));
  const Value& v = all[0];
  const int d = normal_dim(op.dim, v.shape.size());
  if (d < 0) cannot(r.a, op, "dim out of range for " + shape_str(v.shape));
  const int64_t n = static_cast<int64_t>(r.a.targets.size());
  if (n < 1 || v.shape[d] % n != 0) {
    return r.fail(q(r.leaves[v.pieces[0].leaf]) + " " + shape_str(v.shape) +
                  " does not split evenly into " + std::to_string(n) + " along dim " +
                  std::to_string(d));
  }
  const int64_t size = v.shape[d] / n;
  std::vector<Value> out(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    Value& o = out[static_cast<size_t>(c)];
    o.shape = v.shape;
    o.shape[d] = size;
    const int64_t lo = c * size, hi = lo + size;
    for (const Piece& p : v.pieces) {
      const int64_t b = std::max(p.start[d], lo), e = std::min(p.start[d] + p.extent[d], hi);
      if (b >= e) continue;
      Piece x = p;
      if (x.src_dim[d] >= 0) x.src_start[x.src_dim[d]] += b - p.start[d];
      x.start[d] = b - lo;
      x.extent[d] = e - b;
      o.pieces.push_back(std::move(x));
    }
  }
  lists = {std::move(out)};
  return true;
}

bool transpose(Run& r, const AssemblyOp& op, Lists& lists,
               const std::vector<std::vector<int64_t>>& target_shapes) {
  for (std::vector<Value>& list : lists) {
    for (Value& v : list) {
      const int d0 = normal_dim(op.dim, v.shape.size()), d1 = normal_dim(op.dim1, v.shape.size());
      if (d0 < 0 || d1 < 0) cannot(r.a, op, "dims out of range for " + shape_str(v.shape));
      // check_dims: a tensor already of the module's shape stays as it is.
      if (op.check_dims && !target_shapes.empty() && v.shape == target_shapes[0]) continue;
      std::swap(v.shape[d0], v.shape[d1]);
      for (Piece& p : v.pieces) {
        std::swap(p.start[d0], p.start[d1]);
        std::swap(p.extent[d0], p.extent[d1]);
        std::swap(p.src_dim[d0], p.src_dim[d1]);
      }
    }
  }
  return true;
}

// ErnieFuseAndSplitTextVisionExperts(stack_dim = dim, concat_dim = dim1): each source's experts
// split into as many groups as there are targets (ceil(n / targets) experts each, as transformers
// splits them), each group stacked along dim; target t is every source's group t concatenated
// along dim1 (Ernie 4.5 VL's text and vision experts out of one expert list).
bool split_and_fuse(Run& r, const AssemblyOp& op, Lists& lists) {
  const size_t n = r.a.targets.size();
  Lists groups;  // source s's group g at s * n + g
  for (std::vector<Value>& list : lists) {
    const size_t size = (list.size() + n - 1) / n;
    for (size_t g = 0; g < n; ++g) {
      std::vector<Value> part;
      for (size_t k = g * size; k < std::min(list.size(), (g + 1) * size); ++k)
        part.push_back(std::move(list[k]));
      if (part.empty()) cannot(r.a, op, "a source has fewer experts than targets");
      groups.push_back(std::move(part));
    }
  }
  if (!merge(r, AssemblyOp{"MergeModulelist", op.dim}, groups)) return false;
  std::vector<Value> out;
  for (size_t t = 0; t < n; ++t) {
    Lists parts;
    for (size_t s = 0; s < lists.size(); ++s) parts.push_back(std::move(groups[s * n + t]));
    if (!concatenate(r, AssemblyOp{"Concatenate", op.dim1}, parts)) return false;
    out.push_back(std::move(parts[0][0]));
  }
  lists = {std::move(out)};
  return true;
}

// Index in of dim d, in groups of `group` indices each viewed as [a, b] and transposed, goes to
// its place in the group's [b, a] (i * b + j -> j * a + i): every index of d becomes a piece of
// its own there. PermuteForRope does this to the rows of each head, Interleave to a whole dim.
void transpose_groups(Value& v, int d, int64_t group, int64_t a, int64_t b) {
  std::vector<Piece> out;
  for (const Piece& p : v.pieces) {
    for (int64_t t = 0; t < p.extent[d]; ++t) {
      const int64_t in = p.start[d] + t, h = in / group, i = (in % group) / b, j = in % b;
      Piece x = p;
      x.start[d] = h * group + j * a + i;
      x.extent[d] = 1;
      if (x.src_dim[d] >= 0) x.src_start[static_cast<size_t>(x.src_dim[d])] += t;
      out.push_back(std::move(x));
    }
  }
  v.pieces = std::move(out);
}

// Rotary's row order within each head of dim 0: a head's H rows viewed as [H/2, 2] ([2, H/2]
// inverse) and transposed, as transformers' PermuteForRope reshapes them.
bool permute_for_rope(Run& r, const AssemblyOp& op, Lists& lists) {
  size_t k = 0;
  for (std::vector<Value>& list : lists) {
    for (Value& v : list) {
      const bool applies = op.applies.empty() || (k < op.applies.size() && op.applies[k]);
      ++k;
      if (!applies) continue;
      const int64_t rows = v.shape.empty() ? 0 : v.shape[0];
      if (op.n_heads <= 0 || v.shape.empty() || v.shape.size() > 2 || rows % op.n_heads != 0 ||
          (rows / op.n_heads) % 2 != 0) {
        cannot(
            r.a, op,
            std::to_string(op.n_heads) + " heads of even size do not divide " + shape_str(v.shape));
      }
      const int64_t head = rows / op.n_heads;
      transpose_groups(v, 0, head, op.inverse ? 2 : head / 2, op.inverse ? head / 2 : 2);
    }
  }
  return true;
}

// transformers' Interleave(dim): the dim's N indices viewed as [N/2, 2] ([2, N/2] inverse) and
// transposed, so the even indices come first (or, inverse, interleave again). An odd dim is the
// checkpoint tensor's misfit (a mismatch naming it), not the operation's.
bool interleave(Run& r, const AssemblyOp& op, Lists& lists) {
  for (std::vector<Value>& list : lists) {
    for (Value& v : list) {
      const int d = normal_dim(op.dim, v.shape.size());
      if (d < 0) cannot(r.a, op, "dim out of range for " + shape_str(v.shape));
      const int64_t n = v.shape[static_cast<size_t>(d)];
      if (n % 2 != 0) {
        return r.fail(q(r.leaves[v.pieces.empty() ? 0 : v.pieces[0].leaf]) + " " +
                      shape_str(v.shape) + " has an odd dim " + std::to_string(d) +
                      ": Interleave splits it in halves");
      }
      transpose_groups(v, d, n, op.inverse ? 2 : n / 2, op.inverse ? n / 2 : 2);
    }
  }
  return true;
}

// The part of `v` a window holds: its ranges along its dim, concatenated (each piece clipped to
// each range, as Chunk clips). A window that does not fit the value is a PlanError naming it.
Value windowed(const Assembly& a, const std::string& target, const Value& v, const TpShard& w) {
  const int d = normal_dim(w.dim, v.shape.size());
  auto bad = [&](const std::string& why) {
    return PlanError("model type " + q(a.model_type) + ": the rank's part of " + q(target) + " " +
                     shape_str(v.shape) + ": " + why);
  };
  if (d < 0) throw bad("dim " + std::to_string(w.dim) + " out of range");
  Value out;
  out.shape = v.shape;
  out.shape[d] = 0;
  for (const auto& [lo, hi] : w.ranges) {
    if (lo < 0 || hi > v.shape[d] || lo >= hi) {
      throw bad("range [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of dim " +
                std::to_string(d));
    }
    for (const Piece& p : v.pieces) {
      const int64_t b = std::max(p.start[d], lo), e = std::min(p.start[d] + p.extent[d], hi);
      if (b >= e) continue;
      Piece x = p;
      if (x.src_dim[d] >= 0) x.src_start[x.src_dim[d]] += b - p.start[d];
      x.start[d] = out.shape[d] + b - lo;
      x.extent[d] = e - b;
      out.pieces.push_back(std::move(x));
    }
    out.shape[d] += hi - lo;
  }
  if (!w.shape.empty() && w.shape != out.shape) {
    throw bad("its ranges make " + shape_str(out.shape) + ", not " + shape_str(w.shape) +
              " (padding is not assembled)");
  }
  return out;
}

std::vector<uint64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<uint64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * static_cast<uint64_t>(shape[i]);
  return s;
}

struct Dim {
  uint64_t extent, src, dst;  // elements; strides
};

// The copies of one piece: its dims merged where both sides are contiguous across them; the
// innermost becomes the row, the next the rows, and any further dims separate copies.
void copies_of(const Assembly& a, const Piece& p, const std::vector<int64_t>& leaf_shape,
               const std::vector<int64_t>& shape, std::vector<AssembledCopy>& out) {
  const std::vector<uint64_t> ls = row_major(leaf_shape), ts = row_major(shape);
  uint64_t src0 = 0, dst0 = 0;
  for (size_t k = 0; k < leaf_shape.size(); ++k)
    src0 += static_cast<uint64_t>(p.src_start[k]) * ls[k];
  std::vector<Dim> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    dst0 += static_cast<uint64_t>(p.start[d]) * ts[d];
    if (p.extent[d] == 1) continue;
    dims.push_back(
        {static_cast<uint64_t>(p.extent[d]), p.src_dim[d] < 0 ? 0 : ls[p.src_dim[d]], ts[d]});
  }
  std::vector<Dim> merged;
  for (const Dim& d : dims) {
    if (!merged.empty()) {
      Dim& m = merged.back();
      if (m.src == d.extent * d.src && m.dst == d.extent * d.dst) {
        m = {m.extent * d.extent, d.src, d.dst};
        continue;
      }
    }
    merged.push_back(d);
  }
  if (merged.empty()) merged.push_back({1, 1, 1});
  // A conversion that moves the innermost dim (a transpose of the last dim: a router's [E, H]
  // gate stored [H, E]) has no contiguous run on both sides: its rows are single elements.
  // Correct at any size, fast only for small tensors (each element is a copy of its own).
  Dim row{1, 1, 1};
  if (merged.back().src == 1 && merged.back().dst == 1) {
    row = merged.back();
    merged.pop_back();
  }
  Dim rows{1, row.extent, row.extent};
  if (!merged.empty()) {
    rows = merged.back();
    merged.pop_back();
  }
  // The remaining outer dims, walked as counters.
  std::vector<uint64_t> at(merged.size(), 0);
  for (;;) {
    AssembledCopy c;
    c.leaf = p.leaf;
    c.src_offset = src0;
    c.dst_offset = dst0;
    for (size_t k = 0; k < merged.size(); ++k) {
      c.src_offset += at[k] * merged[k].src;
      c.dst_offset += at[k] * merged[k].dst;
    }
    c.rows = rows.extent;
    c.row_elems = row.extent;
    c.src_stride = rows.src;
    c.dst_stride = rows.dst;
    out.push_back(c);
    size_t k = merged.size();
    while (k > 0 && ++at[k - 1] == merged[k - 1].extent) at[--k] = 0;
    if (k == 0) break;
  }
}

// Per source, each leaf as a value of its own (one piece: the whole leaf).
Lists leaf_values(const Assembly& a, const std::vector<std::vector<int64_t>>& leaf_shapes) {
  Lists lists;
  size_t leaf = 0;
  for (const AssemblySource& s : a.sources) {
    if (!s.indices.empty() && s.indices.size() != s.names.size()) {
      throw PlanError("assembly of " + q(a.targets[0]) + ": pattern " + q(s.pattern) + " has " +
                      std::to_string(s.names.size()) + " names but " +
                      std::to_string(s.indices.size()) + " indices");
    }
    std::vector<Value> list;
    for (size_t k = 0; k < s.names.size(); ++k, ++leaf) {
      const std::vector<int64_t>& shape = leaf_shapes[leaf];
      Piece p;
      p.leaf = leaf;
      p.start.assign(shape.size(), 0);
      p.extent = shape;
      p.src_start.assign(shape.size(), 0);
      for (size_t d = 0; d < shape.size(); ++d) p.src_dim.push_back(static_cast<int>(d));
      list.push_back({shape, {p}});
    }
    lists.push_back(std::move(list));
  }
  return lists;
}

}  // namespace

std::vector<std::string> assembly_leaves(const Assembly& a) {
  std::vector<std::string> out;
  for (const AssemblySource& s : a.sources) out.insert(out.end(), s.names.begin(), s.names.end());
  return out;
}

AssemblyResult assemble(const Assembly& a, const std::vector<std::vector<int64_t>>& leaf_shapes,
                        const std::vector<std::vector<int64_t>>& target_shapes,
                        const std::vector<std::optional<TpShard>>& windows) {
  const std::vector<std::string> leaves = assembly_leaves(a);
  if (a.sources.empty() || a.targets.empty() || a.ops.empty()) {
    throw PlanError("model type " + q(a.model_type) +
                    ": a conversion needs sources, targets and operations");
  }
  if (leaf_shapes.size() != leaves.size()) {
    throw PlanError("assembly of " + q(a.targets[0]) + ": " + std::to_string(leaves.size()) +
                    " checkpoint tensors but " + std::to_string(leaf_shapes.size()) + " shapes");
  }
  Lists lists = leaf_values(a, leaf_shapes);
  Run run{a, leaves, {}};
  for (const AssemblyOp& op : a.ops) {
    bool ok = true;
    if (op.op == "MergeModulelist") {
      ok = merge(run, op, lists);
    } else if (op.op == "Concatenate") {
      ok = concatenate(run, op, lists);
    } else if (op.op == "Chunk") {
      ok = chunk(run, op, lists);
    } else if (op.op == "Transpose") {
      ok = transpose(run, op, lists, target_shapes);
    } else if (op.op == "PermuteForRope") {
      ok = permute_for_rope(run, op, lists);
    } else if (op.op == "Interleave") {
      ok = interleave(run, op, lists);
    } else if (op.op == "ErnieFuseAndSplitTextVisionExperts") {
      ok = split_and_fuse(run, op, lists);
    } else {
      throw PlanError("model type " + q(a.model_type) + ": operation " + op.op +
                      " of the conversion to " + q(a.targets[0]) +
                      " is not one this loader can do (it streams MergeModulelist, Concatenate, "
                      "Chunk, Transpose, PermuteForRope, Interleave and "
                      "ErnieFuseAndSplitTextVisionExperts)");
    }
    if (!ok) return {{}, run.problem};
  }
  std::vector<Value> values;
  for (std::vector<Value>& list : lists)
    for (Value& v : list) values.push_back(std::move(v));
  if (values.size() != a.targets.size()) {
    throw PlanError("model type " + q(a.model_type) + ": the conversion to " + q(a.targets[0]) +
                    " makes " + std::to_string(values.size()) + " tensors for " +
                    std::to_string(a.targets.size()) + " targets");
  }
  AssemblyResult out;
  for (size_t k = 0; k < values.size(); ++k) {
    if (k < windows.size() && windows[k] && windows[k]->dim >= 0)
      values[k] = windowed(a, a.targets[k], values[k], *windows[k]);
    const Value& v = values[k];
    AssembledTarget t;
    t.shape = v.shape;
    uint64_t covered = 0, numel = 1;
    for (int64_t s : v.shape) numel *= static_cast<uint64_t>(s);
    for (const Piece& p : v.pieces) {
      copies_of(a, p, leaf_shapes[p.leaf], v.shape, t.copies);
      uint64_t n = 1;
      for (int64_t e : p.extent) n *= static_cast<uint64_t>(e);
      covered += n;
    }
    if (covered != numel) {  // the operations tile their output; anything else is a bug here
      throw PlanError("assembly of " + q(a.targets[0]) + ": its pieces cover " +
                      std::to_string(covered) + " of " + std::to_string(numel) + " elements");
    }
    out.targets.push_back(std::move(t));
  }
  return out;
}

namespace {

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where, T fallback) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw PlanError("assemblies: " + where + ": field " + q(key) + " has the wrong type");
  }
}

}  // namespace

std::vector<Assembly> parse_assemblies(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw PlanError(std::string("assemblies: not JSON: ") + e.what());
  }
  if (!j.is_array()) throw PlanError("assemblies: a JSON array of conversions expected");
  std::vector<Assembly> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& x = j[i];
    const std::string where = "conversion " + std::to_string(i);
    if (!x.is_object()) throw PlanError("assemblies: " + where + " is not an object");
    Assembly a;
    a.model_type = field<std::string>(x, "model_type", where, "");
    a.targets = field<std::vector<std::string>>(x, "targets", where, {});
    for (const nlohmann::json& s :
         field<nlohmann::json>(x, "sources", where, nlohmann::json::array())) {
      if (!s.is_object()) throw PlanError("assemblies: " + where + ": a source is not an object");
      AssemblySource src;
      src.pattern = field<std::string>(s, "pattern", where, "");
      src.name_template = field<std::string>(s, "template", where, "");
      src.names = field<std::vector<std::string>>(s, "names", where, {});
      src.indices = field<std::vector<int64_t>>(s, "indices", where, {});
      a.sources.push_back(std::move(src));
    }
    for (const nlohmann::json& o :
         field<nlohmann::json>(x, "ops", where, nlohmann::json::array())) {
      if (!o.is_object()) throw PlanError("assemblies: " + where + ": an op is not an object");
      AssemblyOp op;
      op.op = field<std::string>(o, "op", where, "");
      op.dim = field<int>(o, "dim", where, 0);
      op.dim1 = field<int>(o, "dim1", where, 1);
      op.check_dims = field<bool>(o, "check_dims", where, false);
      op.n_heads = field<int64_t>(o, "n_heads", where, 0);
      op.inverse = field<bool>(o, "inverse", where, false);
      op.applies = field<std::vector<bool>>(o, "applies", where, {});
      a.ops.push_back(std::move(op));
    }
    if (a.targets.empty() || a.sources.empty() || a.ops.empty()) {
      throw PlanError("assemblies: " + where + " needs targets, sources and ops");
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace metaload
