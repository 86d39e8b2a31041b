// The built-in configs: model/families/configs/*.json, the only copy, embedded at build time by
// configs/embed.py into builtin_configs.inc (a Bazel genrule, a CMake custom command).
#include "model/families/config.h"

#include <utility>

#include <fmt/format.h>

#include "base/text.h"

namespace metaload {
namespace {

const std::vector<std::pair<std::string, std::string>>& table() {
  static const std::vector<std::pair<std::string, std::string>> kConfigs = {
#include "model/families/builtin_configs.inc"
  };
  return kConfigs;
}

}  // namespace

const std::vector<std::string>& builtin_config_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& entry : table()) names.push_back(entry.first);
    return names;
  }();
  return kNames;
}

bool is_builtin_config(const std::string& name) {
  for (const auto& entry : table())
    if (entry.first == name) return true;
  return false;
}

const std::string& builtin_config_json(const std::string& name) {
  for (const auto& entry : table())
    if (entry.first == name) return entry.second;
  std::string known;
  for (const auto& entry : table()) known += (known.empty() ? "" : ", ") + entry.first;
  throw ConfigError(
      "", "", "config-not-found",
      fmt::format("unknown built-in config {} (known: {})", quote_text(name, '\''), known));
}

}  // namespace metaload
