// metaload: the command-line tool. Exit codes: 0 success, 2 bad input (one line on stderr naming
// what is wrong), 1 anything unexpected.
#include <iostream>
#include <map>

#include "base/error.h"
#include "tools/cli/command.h"

namespace {

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  using metaload::cli::commands;
  using metaload::cli::kTorchCommands;
  // Subcommands that need libtorch parse their own arguments inside libmetaload.so.
  if (argc >= 2) {
    for (const auto& t : kTorchCommands)
      if (std::string(argv[1]) == t.name) return metaload::cli::run_torch_command(argc, argv);
  }
  CLI::App app{"metaload: checkpoints and models without loading them"};
  app.require_subcommand(1);
  std::map<const CLI::App*, std::function<int()>> runners;
  for (const auto& c : commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(*sub);
  }
  for (const auto& t : kTorchCommands)  // listed in --help; never parsed here
    app.add_subcommand(t.name, std::string(t.help) + " (loads libmetaload.so)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "metaload: error: " << one_line(e.what()) << " (see metaload --help)\n";
    return 2;
  }
  CLI::App* chosen = app.get_subcommands().front();
  try {
    return runners.at(chosen)();
  } catch (const metaload::Error& e) {
    std::cerr << "metaload " << chosen->get_name() << ": error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "metaload " << chosen->get_name() << ": internal error: " << one_line(e.what())
              << "\n";
    return 1;
  }
}
