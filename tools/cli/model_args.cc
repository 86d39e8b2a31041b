// The arguments every subcommand that names a model shares (command.h, ModelArgs).
#include "tools/cli/command.h"

namespace metaload {
namespace cli {

std::optional<std::string> ModelArgs::requested_revision() const {
  if (revision_opt && *revision_opt) return revision;
  return std::nullopt;
}

void add_ref_argument(CLI::App& sub, ModelArgs& args, const std::string& ref_help) {
  sub.add_option("ref", args.ref, ref_help)->required();
}

void add_revision_option(CLI::App& sub, ModelArgs& args, const std::string& revision_help) {
  args.revision_opt = sub.add_option("--revision", args.revision, revision_help);
}

void add_output_and_key_flags(CLI::App& sub, ModelArgs& args, const std::string& json_help) {
  sub.add_flag("--json", args.json, json_help);
  sub.add_flag("--allow-local-paths", args.allow_local_paths,
               "a model key may name a local path (keys name Hugging Face Hub repos otherwise)");
}

}  // namespace cli
}  // namespace metaload
