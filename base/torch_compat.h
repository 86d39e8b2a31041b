// Every difference between the libtorch versions metaload builds against (Debian's 1.13 here,
// pip's 2.x elsewhere) lives here, behind TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR checks.
#pragma once

#include <torch/version.h>

#define METALOAD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
