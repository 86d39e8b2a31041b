// metaload tp REF [--want N] [--expert-parallel] [--revision R] [--json]
//   REF: a checkpoint reference or model key (its config.json is used), or a config.json file.
#include <sys/stat.h>

#include <iostream>
#include <memory>

#include "loader/checkpoint.h"
#include "model/describe.h"
#include "model/model_key.h"
#include "model/tp.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

struct Options {
  std::string ref, revision;
  int64_t want = 0;
  bool expert_parallel = false, json = false, allow_local_paths = false;
  CLI::Option* want_opt = nullptr;
  CLI::Option* revision_opt = nullptr;
};

nlohmann::json load_config(const Options& o) {
  struct stat st;
  const bool exists = ::stat(o.ref.c_str(), &st) == 0;
  if (exists && S_ISREG(st.st_mode) && o.ref.size() >= 5 &&
      o.ref.substr(o.ref.size() - 5) == ".json" && o.ref.find(".index.json") == std::string::npos) {
    return read_config_json(o.ref);
  }
  std::optional<std::string> rev;
  if (*o.revision_opt) rev = o.revision;
  Checkpoint c;
  if (!exists && o.ref.find(':') != std::string::npos) {
    const KeyOptions keys{o.allow_local_paths};
    ModelKey k = from_model_key(o.ref, keys);
    if (k.revision) {
      if (rev && *rev != *k.revision)
        throw ResolveError("the key pins revision \"" + *k.revision + "\" but --revision is \"" +
                           *rev + "\"");
      rev = k.revision;
    }
    c = open_key_checkpoint(k, rev, keys);  // the hub cache only, unless local paths are allowed
  } else {
    c = open_checkpoint(o.ref, rev);
  }
  if (!c.config_path)
    throw ResolveError("checkpoint " + c.dir + " has no config.json: the TP degree depends on it");
  return read_config_json(*c.config_path);
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "1" : s;
}

int run(const Options& o) {
  nlohmann::json config = load_config(o);
  auto max = max_tp_size(config, o.expert_parallel);
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
  sub.add_option("ref", o->ref, "checkpoint reference, model key, or config.json")->required();
  o->want_opt = sub.add_option("--want", o->want, "the smallest working degree >= N")
                    ->transform(whole_number(1, INT_MAX));
  o->revision_opt =
      sub.add_option("--revision", o->revision, "branch, tag or commit hash of an HF repo id");
  sub.add_flag("--expert-parallel", o->expert_parallel,
               "split experts too (expert count joins the gcd)");
  sub.add_flag("--json", o->json, "print JSON instead of a table");
  sub.add_flag("--allow-local-paths", o->allow_local_paths,
               "a model key may name a local path (keys name Hugging Face Hub repos otherwise)");
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
