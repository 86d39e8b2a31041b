// The metaload subcommands that need libtorch (make-checkpoint, scan, run, demo). They are built
// into libmetaload.so; the torch-free `metaload` tool loads it and calls
// metaload_cli_torch_main(argc, argv) for them (tools/cli/torch_bridge.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <CLI/CLI.hpp>

#include "base/error.h"
#include "tools/cli/command.h"

namespace metaload {

class TransformersModel;
struct ModelScan;
struct ModelOptions;

namespace cli {

// A bad command-line value that CLI11 cannot judge (device, dtype, id list); exit code 2.
METALOAD_DEFINE_ERROR(UsageError, Error);

// The torch subcommands' setups, by name (kTorchCommands has the names and help).
std::function<int()> setup_make_checkpoint(CLI::App& sub);
std::function<int()> setup_scan(CLI::App& sub);
std::function<int()> setup_run(CLI::App& sub);
std::function<int()> setup_demo(CLI::App& sub);

// Replaces this process with `python -m <module> <args...>` (the Python the library was built
// for, or METALOAD_PYTHON), with METALOAD_LIB and PYTHONPATH pointing at this library and its
// package; returns 1 with a line on stderr (naming `command`) only if that fails. `metaload run
// --tp`, `metaload serve` and `metaload place` hand off to Python this way.
int exec_python_module(const std::string& module, const std::vector<std::string>& args,
                       const std::string& command);

// "cpu", "cuda", "cuda:1"; UsageError naming the option otherwise.
c10::Device parse_device(const std::string& text, const char* option);
// A dtype name from the one table (identity/dtypes.h) that a model can run in.
c10::ScalarType parse_model_dtype(const std::string& text, const char* option);

// The arguments of the subcommands that build a model (scan, run): REF, --device, --dtype,
// --revision, --json and --allow-local-paths.
struct ModelBuildArgs : ModelArgs {
  std::string device = "cpu", dtype;
  CLI::Option* dtype_opt = nullptr;
  // The model options they ask for (UsageError for a bad device or dtype).
  ModelOptions model_options() const;
};
// Adds REF, --device (described by `device_help`) and --dtype.
void add_model_build_options(CLI::App& sub, ModelBuildArgs& args, const std::string& device_help);

// "1.50 GiB", "12.0 MiB", "512 B".
std::string human_bytes(uint64_t bytes);
// Resident set size of this process.
uint64_t rss_bytes();

// The scan as a table: module, class, output shape, dtype, bytes, then the total. depth >= 0
// shows only paths of at most that many components; collapse shows the first and the last of
// each run of numbered layers (the others are alike).
void print_scan_table(const ModelScan& scan, int depth, bool collapse, std::ostream& out);

}  // namespace cli
}  // namespace metaload
