// metaload's version: the one place it is written. CMake, pyproject.toml (scikit-build-core's regex
// provider), the CLI's --version and the Python package's __version__ all read it from here.
#pragma once

#define METALOAD_VERSION "0.2.0"
