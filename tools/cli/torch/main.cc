// metaload_cli_torch_main: the torch subcommands of the metaload tool, run inside libmetaload.so.
// Same conventions as tools/cli/main.cc: exit 0 on success, 2 with one line on stderr for bad
// input, 1 for anything unexpected.
#include <iostream>
#include <map>
#include <string>
#include <vector>

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
  // serve and place are Python (metaload.serve): every argument, --help included, goes there.
  const std::map<std::string, std::string> python = {{"serve", "metaload.serve"},
                                                     {"place", "metaload.serve.place"}};
  const std::string sub = argc > 1 ? argv[1] : "";
  if (const auto it = python.find(sub); it != python.end())
    return exec_python_module(it->second, std::vector<std::string>(argv + 2, argv + argc),
                              "metaload " + sub);
  std::map<const CLI::App*, std::function<int()>> runners;
  for (const auto& t : kTorchCommands) {
    if (!setups.count(t.name)) continue;
    CLI::App* command = app.add_subcommand(t.name, t.help);
    runners[command] = setups.at(t.name)(*command);
  }
  return parse_and_run(app, runners, argc, argv, "metaload " + sub);
}
