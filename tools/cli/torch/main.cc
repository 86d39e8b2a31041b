// metaload_cli_torch_main: the torch subcommands of the metaload tool, run inside libmetaload.so.
// Same conventions as tools/cli/main.cc: exit 0 on success, 2 with one line on stderr for bad
// input, 1 for anything unexpected.
#include <iostream>
#include <map>

#include "tools/cli/torch/torch_cli.h"

extern "C" __attribute__((visibility("default"))) int metaload_cli_torch_main(int argc,
                                                                              char** argv) {
  using namespace metaload::cli;
  CLI::App app{"metaload: checkpoints and models without loading them"};
  app.name("metaload");
  app.require_subcommand(1);
  const std::map<std::string, Setup> setups = {{"make-checkpoint", &setup_make_checkpoint},
                                               {"scan", &setup_scan},
                                               {"run", &setup_run},
                                               {"demo", &setup_demo}};
  std::map<const CLI::App*, std::function<int()>> runners;
  for (const auto& t : kTorchCommands) {
    CLI::App* sub = app.add_subcommand(t.name, t.help);
    runners[sub] = setups.at(t.name)(*sub);
  }
  const std::string sub = argc > 1 ? argv[1] : "";
  return parse_and_run(app, runners, argc, argv, "metaload " + sub);
}
