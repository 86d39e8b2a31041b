// Every error kind of the model layer (model/ and model/families/), in one place, above the
// identity layer's (identity/errors.h). Torch-free,
// header-only. Each derives from metaload::Error (base/error.h); python/metaload/_lib.py mirrors
// the tree class for class.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "base/error.h"
#include "identity/errors.h"

namespace metaload {

// ---- fixtures (fixtures.h) ---------------------------------------------------------------------

// A fixture request that cannot be met (architecture and config disagree, unsupported dtype, bad
// repo id, shard count, ...); the message names the option.
METALOAD_DEFINE_ERROR(FixtureError, Error);

// ---- families (families/config.h, families/family.h) -------------------------------------------

// (A config.json the families cannot use is a ConfigError, identity/errors.h.)

// A family cannot do what was asked at run time (bad input ids, too long a sequence, a TP size that
// does not divide the heads, unknown parameter name, ...).
METALOAD_DEFINE_ERROR(FamilyError, Error);

// ---- TransformersModel (transformers_model.h) --------------------------------------------------

// The model cannot do what was asked in its current state (forward of a TP shard, a module tree
// given as a skeleton with nothing to load, no repo id for a key, ...).
METALOAD_DEFINE_ERROR(ModelError, Error);
// A dotted module path that does not exist; the message lists the closest existing ones.
METALOAD_DEFINE_ERROR(ModulePathError, ModelError);

}  // namespace metaload
