"""metaload: build models with no weight memory, scan their shapes, stream their weights.

    import metaload
    with metaload.meta():              # every tensor lands on the meta device
        model = torchvision.models.resnet50()
        with metaload.real():          # ... except inside real()
            table = torch.arange(10)

The work happens in libmetaload.so (found through METALOAD_LIB or next to this package); this
package is a thin layer over torch.ops.metaload.
"""
from ._lib import Error, error_class, library_path, load
from ._mode import forcing_stats, is_forcing, meta, real, reset_forcing_stats

ops = load()
DataDependentError = error_class("DataDependentError")
ModeError = error_class("ModeError")

__all__ = [
    "DataDependentError",
    "Error",
    "ModeError",
    "forcing_stats",
    "is_forcing",
    "library_path",
    "meta",
    "ops",
    "real",
    "reset_forcing_stats",
]
