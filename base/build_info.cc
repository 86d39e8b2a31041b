// Which metaload and which libtorch this library was built for, as a plain string inside the .so.
// The Python package reads it from the file *before* loading the library, so a build for another
// torch is refused with a message naming both versions instead of an undefined-symbol trace.
#include "base/torch_compat.h"
#include "base/version.h"

extern "C" __attribute__((used, visibility("default"))) const char metaload_build_info[] =
    "metaload-build-info: metaload=" METALOAD_VERSION " torch=" METALOAD_TORCH_VERSION_STRING ";";
