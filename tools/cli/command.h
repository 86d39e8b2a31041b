// The metaload command line: every subcommand is one entry of the table in commands.cc, defined in
// its own file, so adding one touches no other subcommand. The tool itself links no libtorch
// (describe, key and tp start in milliseconds); the subcommands that need torch (kTorchCommands)
// live in libmetaload.so (tools/cli/torch/), which the tool loads only for them.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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

// The subcommands that run inside libmetaload.so: metaload_cli_torch_main(argc, argv) there, with
// argv[1] the subcommand.
struct TorchCommand {
  const char* name;
  const char* help;
};
inline constexpr TorchCommand kTorchCommands[] = {
    {"make-checkpoint",
     "Write a deterministic checkpoint (HF layout, optionally a hub cache tree) of a config"},
    {"scan", "Every module's output shape and activation bytes, without loading weights"},
    {"run", "Load a checkpoint and generate tokens greedily"},
    {"demo", "The main job: describe, key, TP, meta build, scan, dispatch, generate"},
    {"serve", "Serve nnsight's remote runs for model keys (python -m metaload.serve)"},
    {"place", "Give deployments their devices from the key alone (python -m metaload.serve.place)"},
};
// Loads libmetaload.so (METALOAD_LIB, else next to this program or one or two levels up, where
// the Bazel and CMake builds put it) and runs argv[1] there. Exit code 2 with one line on stderr
// when the library cannot be loaded.
int run_torch_command(int argc, char** argv);

// Parses argv into `app` and runs the chosen subcommand with the tool's exit codes: 0 success,
// 2 with one line on stderr for bad input (a parse error, any metaload::Error), 1 for anything
// unexpected. `usage` names the --help to point at ("metaload" or "metaload scan").
int parse_and_run(CLI::App& app, const std::map<const CLI::App*, std::function<int()>>& runners,
                  int argc, char** argv, const std::string& usage);

// `s` on one line (newlines become spaces), for one-line error messages.
std::string one_line(std::string s);

// Numbers (tools/cli/numbers.cc), read the same way by every subcommand: decimal digits only,
// never clamped, ranges said in words.
// "a whole number from 1 to 2^63-1".
std::string range_words(int64_t lo, int64_t hi);
// Accepts a whole number in [lo, hi] and hands CLI11 its canonical digits (so "010" is ten, not
// CLI11's octal eight): add it with ->transform(), not ->check(), which discards the rewrite.
// Anything else is a parse error (exit 2) that names the option, the value and the range.
CLI::Validator whole_number(int64_t lo, int64_t hi);
// Accepts a whole number in [0, 2^64-1] (seeds).
CLI::Validator whole_number_u64();
// Token ids "1,2,3" (several: sequences of one length separated by ';', "1,2;3,4"), each a whole
// number from 0 to 2^63-1; every separator separates (an empty item or sequence is an error,
// trailing separators included). Returns "" and fills *rows, or says what is wrong.
std::string parse_token_ids(const std::string& text, bool several,
                            std::vector<std::vector<int64_t>>* rows);
// parse_token_ids as a validator: bad ids are a parse error naming the option.
CLI::Validator token_ids(bool several);

// What every subcommand that names a model takes (tools/cli/model_args.cc): the reference, and
// --revision, --json and --allow-local-paths, spelled and explained once. A command's options
// derive from it.
struct ModelArgs {
  std::string ref, revision;
  bool json = false, allow_local_paths = false;
  CLI::Option* revision_opt = nullptr;
  // --revision when given.
  std::optional<std::string> requested_revision() const;
};
// Adds the required REF argument, described by `ref_help`.
void add_ref_argument(CLI::App& sub, ModelArgs& args, const std::string& ref_help);
// Adds --revision (described by `revision_help`).
void add_revision_option(CLI::App& sub, ModelArgs& args, const std::string& revision_help);
// Adds --json (described by `json_help`) and --allow-local-paths.
void add_output_and_key_flags(CLI::App& sub, ModelArgs& args,
                              const std::string& json_help = "print JSON instead of a table");

// Output helpers shared by the subcommands.
std::string with_commas(uint64_t n);        // 1234567 -> "1,234,567"
std::string gib_and_bytes(uint64_t bytes);  // "1.50 GiB (1,610,612,736 bytes)"
// Prints aligned "key   value" rows.
void print_rows(const std::vector<std::pair<std::string, std::string>>& rows);

}  // namespace cli
}  // namespace metaload
