#include "tools/cli/command.h"

namespace metaload {
namespace cli {

std::function<int()> setup_describe(CLI::App& sub);
std::function<int()> setup_estimate(CLI::App& sub);
std::function<int()> setup_key(CLI::App& sub);
std::function<int()> setup_tp(CLI::App& sub);

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"describe",
       "Size, parameter count, config and revision of a checkpoint, from its headers only",
       &setup_describe},
      {"estimate",
       "Exact bytes a quantization scheme would store for an unquantized checkpoint or config",
       &setup_estimate},
      {"key", "The model key of a Hugging Face repo id, or a model key parsed and checked",
       &setup_key},
      {"tp", "Tensor-parallel degrees a checkpoint's config allows", &setup_tp},
  };
  return table;
}

}  // namespace cli
}  // namespace metaload
