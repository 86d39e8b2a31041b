// The arguments of the subcommands that build a model (torch_cli.h, ModelBuildArgs).
#include "model/transformers_model.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace cli {

ModelOptions ModelBuildArgs::model_options() const {
  ModelOptions mo;
  mo.device = parse_device(device, "--device");
  if (dtype_opt && *dtype_opt) mo.dtype = parse_model_dtype(dtype, "--dtype");
  mo.revision = requested_revision();
  mo.keys.allow_local_paths = allow_local_paths;
  return mo;
}

void add_model_build_options(CLI::App& sub, ModelBuildArgs& args, const std::string& device_help) {
  add_ref_argument(sub, args, "checkpoint directory, HF repo id, or model key");
  sub.add_option("--device", args.device, device_help)->capture_default_str();
  args.dtype_opt = sub.add_option("--dtype", args.dtype, "model dtype (default float32)");
}

}  // namespace cli
}  // namespace metaload
