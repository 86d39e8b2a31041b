#include "loader/tp/user_plan.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <unordered_map>

#include "base/text.h"
#include "loader/errors.h"

namespace metaload {
namespace {

// A style's split of a tensor of ndim dims: weight is every leaf but a bias.
struct Style {
  const char* name;
  UserTpSplit (*split)(int ndim, bool bias);
};

UserTpSplit whole(int, bool) {
  return {};
}
UserTpSplit colwise(int ndim, bool) {
  return {ndim >= 2 ? ndim - 2 : 0, 1};
}
UserTpSplit rowwise(int ndim, bool bias) {
  return bias ? UserTpSplit{} : UserTpSplit{ndim - 1, 1};
}
UserTpSplit packed_colwise(int ndim, bool) {
  return {ndim >= 2 ? ndim - 2 : 0, 2};
}
UserTpSplit packed_rowwise(int ndim, bool bias) {
  return bias || ndim < 2 ? UserTpSplit{} : UserTpSplit{ndim - 1, 2};
}
UserTpSplit rows(int, bool) {
  return {0, 1};
}

constexpr Style kStyles[] = {
    {"all_reduce", whole},
    {"colwise", colwise},
    {"colwise_gather_output", colwise},
    {"colwise_rep", colwise},
    {"embedding_rowwise", rows},
    {"ep_router", whole},
    {"experts", rows},
    {"grouped_gemm", rows},
    {"moe_identity_expert", whole},
    {"moe_tp_experts", whole},
    {"packed_colwise", packed_colwise},
    {"packed_rowwise", packed_rowwise},
    {"replicated_with_grad_allreduce", whole},
    {"rowwise", rowwise},
    {"rowwise_rep", rowwise},
    {"rowwise_split_input", rowwise},
    {"sequence_parallel", whole},
};

const Style* find_style(const std::string& style) {
  for (const auto& s : kStyles) {
    if (style == s.name) return &s;
  }
  return nullptr;
}

// "model.layers.12.mlp" -> "model.layers.*.mlp": every run of digits a "*".
std::string generic(const std::string& module) {
  std::string out;
  for (size_t i = 0; i < module.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(module[i]))) {
      out += '*';
      while (i + 1 < module.size() && std::isdigit(static_cast<unsigned char>(module[i + 1]))) ++i;
    } else {
      out += module[i];
    }
  }
  return out;
}

bool names(const std::string& key, const std::string& module, const std::string& pattern) {
  return key == module || key == pattern || ends_with(pattern, "." + key) ||
         ends_with(module, "." + key);
}

std::string quoted_styles() {
  std::string out = "[";
  for (const auto& s : user_tp_styles()) out += (out.size() > 1 ? ", '" : "'") + s + "'";
  return out + "]";
}

}  // namespace

const std::vector<std::string>& user_tp_styles() {
  static const std::vector<std::string> styles = [] {
    std::vector<std::string> v;
    for (const auto& s : kStyles) v.emplace_back(s.name);
    std::sort(v.begin(), v.end());
    return v;
  }();
  return styles;
}

void check_user_tp_plan(const UserTpPlan& plan) {
  for (const auto& [module, style] : plan) {
    if (!find_style(style)) {
      throw PlanError("tp_plan style '" + style + "' of '" + module + "' is not one of " +
                      quoted_styles());
    }
  }
}

UserTpSplit user_tp_split(const UserTpPlan& plan, const std::string& name, int ndim) {
  const size_t dot = name.rfind('.');
  const std::string module = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  const std::string whole_pattern = generic(name), module_pattern = generic(module);
  // The tensor named itself (fused experts' parameters), then its module.
  for (const bool itself : {true, false}) {
    for (const auto& [key, style] : plan) {
      if (!(itself ? names(key, name, whole_pattern) : names(key, module, module_pattern)))
        continue;
      const Style* s = find_style(style);
      if (!s) return {};  // checked by check_user_tp_plan before any use
      return s->split(ndim, !itself && leaf == "bias");
    }
  }
  return {};
}

std::function<TpShard(const std::string&, const std::vector<int64_t>&, int, int)> user_tp_shards(
    const UserTpPlan& plan) {
  check_user_tp_plan(plan);
  return [plan](const std::string& name, const std::vector<int64_t>& shape, int rank, int size) {
    TpShard s;
    const UserTpSplit split = user_tp_split(plan, name, static_cast<int>(shape.size()));
    if (split.dim < 0) return s;
    s.dim = split.dim;
    const int64_t len = s.dim < static_cast<int>(shape.size()) ? shape[s.dim] : 0;
    if (len == 0 || len % (int64_t{split.packs} * size) != 0) {
      throw SliceError(name + ": cannot split dim " + std::to_string(s.dim) + " of " +
                       shape_str(shape) + " into " + std::to_string(size) + " equal parts" +
                       (split.packs > 1
                            ? " of each of its " + std::to_string(split.packs) + " packed parts"
                            : ""));
    }
    const int64_t part = len / split.packs, chunk = part / size;
    for (int p = 0; p < split.packs; ++p) {
      s.ranges.push_back({p * part + rank * chunk, p * part + (rank + 1) * chunk});
    }
    s.shape = shape;
    s.shape[s.dim] = chunk * split.packs;
    return s;
  };
}

}  // namespace metaload
