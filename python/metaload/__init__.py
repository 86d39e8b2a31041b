"""metaload: build models with no weight memory, scan their shapes, stream their weights.

    import metaload
    with metaload.meta():              # every tensor lands on the meta device
        model = torchvision.models.resnet50()
        with metaload.real():          # ... except inside real()
            table = torch.arange(10)

The work happens in libmetaload.so (found through METALOAD_LIB or next to this package); this
package is a thin layer over torch.ops.metaload.
"""
from ._lib import (ConfigError, ConversionError, DataDependentError, DequantError, DeviceError,
                   DistributedError, DTypeError, Error,
                   FamilyError, FileChangedError, FixtureError, FormatError, LoadCancelled, LoadError, MismatchError,
                   ModeError, ModelError, ModelKeyError, ModulePathError, PlanError,
                   QuantLayoutError, QuantSchemeError, ReadError,
                   RepoIdError, ResolveError, ScanError, ShapeError, ShardError, SizeOverflowError,
                   SliceError, SwapError, TPError, UnknownOpError, UsageError, VerifyError,
                   build_info, error_class, library_path)
from ._lib import load as _load_library
from ._fake import fake, is_fake
from ._scan import ModuleShape, Scan, scan
from ._load import FileReport, LoadReport, check_mapped_files, load_into, quant_layout
from ._dist_load import DistReport
from ._mode import forcing_stats, is_forcing, meta, real, reset_forcing_stats
from ._nnsight import disable_nnsight, enable_nnsight, nnsight_enabled
from ._quantized_modules import build_pretrained
from ._safetensors import FormatValueError, load, load_file, safe_open, save, save_file
from .model import TransformersModel, make_checkpoint
from . import checkpoint
from .checkpoint import (CheckpointInfo, QuantEstimate, bytes_per_element, describe,
                         describe_checkpoint, estimate, from_model_key, max_tp_size,
                         quant_presets, save_safetensors, to_model_key, tp_degree_for)

ops = _load_library()
__version__ = build_info()[0]

__all__ = [
    "__version__",
    "CheckpointInfo",
    "DistReport",
    "QuantEstimate",
    "FileReport",
    "LoadReport",
    "ModuleShape",
    "Scan",
    "TransformersModel",
    "build_pretrained",
    "bytes_per_element",
    "check_mapped_files",
    "checkpoint",
    "describe",
    "describe_checkpoint",
    "estimate",
    "disable_nnsight",
    "enable_nnsight",
    "fake",
    "forcing_stats",
    "from_model_key",
    "is_fake",
    "is_forcing",
    "library_path",
    "load",
    "load_file",
    "load_into",
    "make_checkpoint",
    "max_tp_size",
    "meta",
    "nnsight_enabled",
    "quant_presets",
    "ops",
    "quant_layout",
    "real",
    "reset_forcing_stats",
    "safe_open",
    "save",
    "save_file",
    "save_safetensors",
    "scan",
    "to_model_key",
    "tp_degree_for",
    # Errors: metaload.Error and every C++ kind, under its C++ parent (_lib.py).
    "Error",
    "ConfigError",
    "ConversionError",
    "DataDependentError",
    "DequantError",
    "DeviceError",
    "DistributedError",
    "DTypeError",
    "FamilyError",
    "FileChangedError",
    "FixtureError",
    "FormatError",
    "FormatValueError",
    "LoadCancelled",
    "LoadError",
    "MismatchError",
    "ModeError",
    "ModelError",
    "ModelKeyError",
    "ModulePathError",
    "PlanError",
    "QuantLayoutError",
    "QuantSchemeError",
    "ReadError",
    "RepoIdError",
    "ResolveError",
    "ScanError",
    "ShapeError",
    "ShardError",
    "SizeOverflowError",
    "SliceError",
    "SwapError",
    "TPError",
    "UnknownOpError",
    "UsageError",
    "VerifyError",
]
