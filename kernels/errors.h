// The kernels layer's error kinds (shape kernels, dtype conversion). Torch-free.
#pragma once

#include "base/error.h"

namespace metaload {

// A shape kernel rejected its arguments (wrong rank, mismatched channels, ...). The message names
// the op and what is wrong, like the real kernel's error does.
METALOAD_DEFINE_ERROR(ShapeError, Error);
// An operator name that the dispatcher does not know.
METALOAD_DEFINE_ERROR(UnknownOpError, Error);
// An unsupported conversion, or a CUDA launch that failed.
METALOAD_DEFINE_ERROR(ConversionError, Error);

}  // namespace metaload
