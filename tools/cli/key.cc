// metaload key REF [--revision R] [--class C] [--json]
//   REF a repo id: prints its model key. REF a model key: checks it and prints its parts.
#include <iostream>
#include <memory>

#include "loader/format/hf_cache.h"
#include "loader/format/json_util.h"
#include "identity/model_key.h"
#include "identity/reference.h"
#include "identity/registry.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

struct Options : ModelArgs {
  std::string class_path = kTransformersModel;
};

int run(const Options& o) {
  ModelKey key;
  if (o.ref.find(':') != std::string::npos) {
    key = from_model_key(o.ref, KeyOptions{o.allow_local_paths});
    key.revision = join_revision(key, o.requested_revision());
  } else {
    if (!o.allow_local_paths && !looks_like_repo_id(o.ref)) {
      throw ModelKeyError(
          quote_str(o.ref) +
          " is neither a Hugging Face repo id (ORG/NAME) nor a model key (CLASS:JSON)");
    }
    canonical_model_class(o.class_path);  // an unknown class is an error here too
    key = ModelKey{o.class_path, o.ref, o.requested_revision(), {}};
  }
  const std::string text = to_model_key(key, KeyOptions{o.allow_local_paths});
  if (o.json) {
    nlohmann::json j = {
        {"key", text},
        {"class_path", key.class_path},
        {"canonical_class", canonical_model_class(key.class_path)},
        {"repo_id", key.repo_id},
        {"revision", key.revision ? nlohmann::json(*key.revision) : nlohmann::json()}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << text << "\n";
  return 0;
}

}  // namespace

std::function<int()> setup_key(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_ref_argument(sub, *o, "an HF repo id (ORG/NAME), or a model key to check");
  add_revision_option(sub, *o, "pin a branch, tag or commit hash");
  sub.add_option("--class", o->class_path, "wrapper class path of the key")->capture_default_str();
  add_output_and_key_flags(sub, *o, "print the key and its parts as JSON");
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
