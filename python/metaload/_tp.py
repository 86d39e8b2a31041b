"""The process group a tensor-parallel TransformersModel runs its collectives on: torch.distributed's
group, handed to the C++ model layer as the c10d ProcessGroup it is.

torch 2.x converts a group itself (`group.boxed()`: a torch.ScriptObject of class
c10d.ProcessGroup). torch 1.13 has no such conversion: metaload's bridge module
(libmetaload_c10d.so, built beside libmetaload.so against torch's Python library) does the same.
"""
import importlib.machinery
import importlib.util
import os

import torch

from . import _lib

_bridge_module = None
BRIDGE_NAME = "libmetaload_c10d"


def bridge_path():
    """libmetaload_c10d.so beside libmetaload.so, or in its distributed/ folder (Bazel's bazel-bin);
    METALOAD_C10D_LIB overrides."""
    env = os.environ.get("METALOAD_C10D_LIB")
    if env:
        return env
    here = os.path.dirname(_lib.library_path())
    candidates = [os.path.join(here, BRIDGE_NAME + ".so"),
                  os.path.join(here, "distributed", BRIDGE_NAME + ".so")]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def _bridge():
    global _bridge_module
    if _bridge_module is None:
        path = bridge_path()
        if not os.path.exists(path):
            raise _lib.error_class("DistributedError")(
                f"torch {torch.__version__} cannot hand a process group to C++ by itself and "
                f"metaload's bridge module {path} does not exist: build it (Bazel: "
                f"//distributed:libmetaload_c10d.so; CMake: the metaload_c10d target)")
        loader = importlib.machinery.ExtensionFileLoader(BRIDGE_NAME, path)
        spec = importlib.util.spec_from_file_location(BRIDGE_NAME, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _bridge_module = module
    return _bridge_module


def box(group):
    """`group` (a torch.distributed ProcessGroup) as a torch.ScriptObject of class
    c10d.ProcessGroup, which the library's operators take."""
    if isinstance(group, torch.ScriptObject):
        return group
    boxed = getattr(group, "boxed", None)
    if boxed is not None:
        return boxed()
    try:
        return _bridge().box(group)
    except TypeError as e:  # pybind11: not a ProcessGroup
        raise _lib.error_class("DistributedError")(
            f"process_group must be a torch.distributed ProcessGroup, got "
            f"{type(group).__name__}: {e}") from None


def resolve(tp_size, process_group):
    """The boxed group the model runs on, or None: an explicit group; else, for tp_size > 1, the
    default group when torch.distributed is initialised (a model without a group can scan and
    load its shard but not run). process_group=False: no group even under torch.distributed
    (a rank's shard only, as metaload._dist_load stages it)."""
    if process_group is False:
        return None
    if process_group is None:
        if tp_size <= 1:
            return None
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return None
        process_group = dist.distributed_c10d._get_default_group()
    return box(process_group)
