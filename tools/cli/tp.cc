// metaload tp REF [--want N] [--expert-parallel] [--revision R] [--json]
//   REF: a checkpoint reference or model key (its config.json is used), or a config.json file.
#include <sys/stat.h>

#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "identity/reference.h"
#include "identity/tp_degree.h"
#include "loader/format/checkpoint.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

struct Options : ModelArgs {
  int64_t want = 0;
  bool expert_parallel = false;
  CLI::Option* want_opt = nullptr;
};

// The config and its path (named in a ConfigError).
std::pair<nlohmann::json, std::string> load_config(const Options& o) {
  struct stat st;
  const bool exists = ::stat(o.ref.c_str(), &st) == 0;
  if (exists && S_ISREG(st.st_mode) && o.ref.size() >= 5 &&
      o.ref.substr(o.ref.size() - 5) == ".json" && o.ref.find(".index.json") == std::string::npos) {
    return {read_config_json(o.ref), o.ref};
  }
  // A key's repo id is looked up in the hub cache only, unless local paths are allowed.
  const Checkpoint c = open_checkpoint(
      resolve_reference(o.ref, o.requested_revision(), KeyOptions{o.allow_local_paths}).checkpoint);
  if (!c.config_path)
    throw ResolveError("checkpoint " + c.dir + " has no config.json: the TP degree depends on it");
  return {read_config_json(*c.config_path), *c.config_path};
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "1" : s;
}

int run(const Options& o) {
  const auto [config, file] = load_config(o);
  // The first reader of the fields: a broken one is a ConfigError naming the file.
  auto max = max_tp_size(config, o.expert_parallel, file);
  auto degrees = tp_degrees(config, o.expert_parallel);
  std::optional<int64_t> chosen;
  if (*o.want_opt) chosen = tp_degree_for(config, o.want, o.expert_parallel);
  if (o.json) {
    nlohmann::json j = {{"max_tp_size", max ? nlohmann::json(*max) : nlohmann::json()},
                        {"degrees", degrees.empty() ? std::vector<int64_t>{1} : degrees},
                        {"expert_parallel", o.expert_parallel}};
    if (chosen) {
      j["want"] = o.want;
      j["tp_degree"] = *chosen;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("max TP degree", max ? std::to_string(*max) : "none (cannot be split)");
  rows.emplace_back("degrees that work", join(degrees));
  if (o.expert_parallel) rows.emplace_back("expert parallel", "yes");
  if (chosen) rows.emplace_back("degree for " + std::to_string(o.want), std::to_string(*chosen));
  print_rows(rows);
  return 0;
}

}  // namespace

std::function<int()> setup_tp(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_ref_argument(sub, *o, "checkpoint reference, model key, or config.json");
  o->want_opt = sub.add_option("--want", o->want, "the smallest working degree >= N")
                    ->transform(whole_number(1, INT_MAX));
  add_revision_option(sub, *o, "branch, tag or commit hash of an HF repo id");
  sub.add_flag("--expert-parallel", o->expert_parallel,
               "split experts too (expert count joins the gcd)");
  add_output_and_key_flags(sub, *o);
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
