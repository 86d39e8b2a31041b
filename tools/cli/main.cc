// metaload: the command-line tool. Exit codes: 0 success, 2 bad input (one line on stderr naming
// what is wrong), 1 anything unexpected.
#include <map>

#include "base/version.h"
#include "tools/cli/command.h"

int main(int argc, char** argv) {
  using metaload::cli::commands;
  using metaload::cli::kTorchCommands;
  // Subcommands that need libtorch parse their own arguments inside libmetaload.so.
  if (argc >= 2) {
    for (const auto& t : kTorchCommands)
      if (std::string(argv[1]) == t.name) return metaload::cli::run_torch_command(argc, argv);
  }
  CLI::App app{"metaload: checkpoints and models without loading them"};
  app.set_version_flag("--version", std::string("metaload ") + METALOAD_VERSION);
  app.require_subcommand(1);
  std::map<const CLI::App*, std::function<int()>> runners;
  for (const auto& c : commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(*sub);
  }
  for (const auto& t : kTorchCommands)  // listed in --help; never parsed here
    app.add_subcommand(t.name, std::string(t.help) + " (loads libmetaload.so)");
  return metaload::cli::parse_and_run(app, runners, argc, argv, "metaload");
}
