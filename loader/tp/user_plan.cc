#include "loader/tp/user_plan.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <unordered_map>

#include "base/text.h"
#include "loader/errors.h"

namespace metaload {
namespace {

struct StyleDims {
  const char* name;
  int weight;  // the dim a module's weight (and every other leaf) splits on
  int bias;    // the dim its bias splits on; -1: whole
};
constexpr StyleDims kStyles[] = {{"colwise", 0, 0}, {"experts", 0, 0}, {"rowwise", 1, -1}};

const StyleDims* find_style(const std::string& style) {
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

int user_tp_dim(const UserTpPlan& plan, const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string module = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  const std::string pattern = generic(module);
  for (const auto& [key, style] : plan) {
    if (!names(key, module, pattern)) continue;
    const StyleDims* s = find_style(style);
    if (!s) return -1;  // checked by check_user_tp_plan before any use
    return leaf == "bias" ? s->bias : s->weight;
  }
  return -1;
}

std::vector<int64_t> user_tp_dims(const UserTpPlan& plan, const std::vector<std::string>& names) {
  check_user_tp_plan(plan);
  std::vector<int64_t> dims;
  dims.reserve(names.size());
  for (const auto& n : names) dims.push_back(user_tp_dim(plan, n));
  return dims;
}

std::function<TpShard(const std::string&, const std::vector<int64_t>&, int, int)> even_tp_shards(
    const std::vector<std::string>& names, const std::vector<int64_t>& dims) {
  if (dims.size() != names.size()) {
    throw PlanError(std::to_string(dims.size()) + " TP dims but " + std::to_string(names.size()) +
                    " names");
  }
  auto by_name = std::make_shared<std::unordered_map<std::string, int>>();
  for (size_t i = 0; i < names.size(); ++i) (*by_name)[names[i]] = static_cast<int>(dims[i]);
  return [by_name](const std::string& name, const std::vector<int64_t>& shape, int rank, int size) {
    TpShard s;
    auto it = by_name->find(name);
    if (it == by_name->end() || it->second < 0) return s;
    s.dim = it->second;
    if (s.dim >= static_cast<int>(shape.size()) || shape[s.dim] % size != 0) {
      throw SliceError("cannot split dim " + std::to_string(s.dim) + " of " + shape_str(shape) +
                       " into " + std::to_string(size) + " equal parts");
    }
    const int64_t chunk = shape[s.dim] / size;
    s.ranges = {{rank * chunk, (rank + 1) * chunk}};
    s.shape = shape;
    s.shape[s.dim] = chunk;
    return s;
  };
}

}  // namespace metaload
