// The exit-code conventions every metaload subcommand shares (the torch-free tool and the torch
// subcommands inside libmetaload.so alike).
#include <iostream>

#include "base/error.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

int parse_and_run(CLI::App& app, const std::map<const CLI::App*, std::function<int()>>& runners,
                  int argc, char** argv, const std::string& usage) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);  // the version on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    std::cerr << usage << ": error: " << one_line(e.what()) << " (see " << usage << " --help)\n";
    return 2;
  }
  CLI::App* chosen = app.get_subcommands().front();
  try {
    return runners.at(chosen)();
  } catch (const metaload::Error& e) {
    std::cerr << "metaload " << chosen->get_name() << ": error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    // torch's errors carry a C++ backtrace of several KB after their message: one line without.
    std::string what = e.what();
    what = what.substr(0, what.find("Exception raised from"));
    if (what.size() > 2000) what = what.substr(0, 2000) + "...";
    std::cerr << "metaload " << chosen->get_name() << ": internal error: " << one_line(what)
              << "\n";
    return 1;
  }
}

}  // namespace cli
}  // namespace metaload
