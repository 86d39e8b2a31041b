// The metaload command line: every subcommand is one entry of the table in commands.cc, defined in
// its own file, so adding one (scan, run, make-checkpoint, ...) touches no other subcommand.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace metaload {
namespace cli {

// Adds a subcommand's options to `sub` and returns what runs it after parsing (its exit code).
using Setup = std::function<int()> (*)(CLI::App& sub);

struct Command {
  const char* name;
  const char* help;
  Setup setup;
};

// Every subcommand, in the order `metaload --help` lists them.
const std::vector<Command>& commands();

// Output helpers shared by the subcommands.
std::string with_commas(uint64_t n);        // 1234567 -> "1,234,567"
std::string gib_and_bytes(uint64_t bytes);  // "1.50 GiB (1,610,612,736 bytes)"
// Prints aligned "key   value" rows.
void print_rows(const std::vector<std::pair<std::string, std::string>>& rows);

}  // namespace cli
}  // namespace metaload
