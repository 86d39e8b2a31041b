"""metaload: build models with no weight memory, scan their shapes, stream their weights.

    import metaload
    with metaload.meta():              # every tensor lands on the meta device
        model = torchvision.models.resnet50()
        with metaload.real():          # ... except inside real()
            table = torch.arange(10)

The work happens in libmetaload.so (found through METALOAD_LIB or next to this package); this
package is a thin layer over torch.ops.metaload.
"""
from ._lib import Error, build_info, error_class, library_path, load
from ._fake import fake, is_fake, scan
from ._load import FileReport, LoadReport, load_into
from ._mode import forcing_stats, is_forcing, meta, real, reset_forcing_stats
from .model import TransformersModel, make_checkpoint
from . import checkpoint
from .checkpoint import (CheckpointInfo, bytes_per_element, describe_checkpoint, from_model_key,
                         max_tp_size, save_safetensors, to_model_key, tp_degree_for)

ops = load()
__version__ = build_info()[0]
DataDependentError = error_class("DataDependentError")
ModeError = error_class("ModeError")
MismatchError = error_class("MismatchError")
LoadError = error_class("LoadError")

__all__ = [
    "__version__",
    "CheckpointInfo",
    "DataDependentError",
    "Error",
    "FileReport",
    "LoadError",
    "LoadReport",
    "MismatchError",
    "ModeError",
    "TransformersModel",
    "bytes_per_element",
    "checkpoint",
    "describe_checkpoint",
    "from_model_key",
    "load_into",
    "make_checkpoint",
    "max_tp_size",
    "save_safetensors",
    "to_model_key",
    "tp_degree_for",
    "fake",
    "forcing_stats",
    "is_fake",
    "is_forcing",
    "library_path",
    "meta",
    "ops",
    "real",
    "reset_forcing_stats",
    "scan",
]
