"""Streaming a checkpoint into an existing torch.nn.Module: load_into.

    with metaload.meta():
        model = torchvision.models.resnet50()
    report = metaload.load_into(model, "resnet50.safetensors", device="cpu")

The module's own Parameter and buffer objects take the data (references held elsewhere see it;
requires_grad is kept); nothing changes unless every tensor was read and checked, and any problem
with the checkpoint (missing, unexpected, mismatched tensors) is one metaload.MismatchError listing
them all.
"""
import contextlib
import json
from typing import Any, Dict, List, NamedTuple, Optional, Union

import torch

from . import _lib


class FileReport(NamedTuple):
    path: str
    bytes: int
    seconds: float


class LoadReport(NamedTuple):
    bytes: int  # file bytes read
    slot_bytes: int  # bytes written into the tensors
    seconds: float
    peak_staging_bytes: int
    peak_device_staging_bytes: int
    reads: int
    direct_bytes: int  # bytes read straight into the tensors (no staging copy)
    mapped_bytes: int  # bytes served from copy-on-write file mappings (mmap=True)
    threads: int
    engine: str
    files: List[FileReport]

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def _report(text: str) -> LoadReport:
    d: Dict[str, Any] = json.loads(text)
    d["files"] = [FileReport(**f) for f in d["files"]]
    return LoadReport(**d)


@_lib.typed_errors
def load_into(module: torch.nn.Module, ref: str, device: Union[str, torch.device, None] = None,
              dtype: Optional[torch.dtype] = None, *, tp_rank: int = 0, tp_size: int = 1,
              threads: int = 0, staging_bytes: int = 0, strict: bool = True,
              revision: Optional[str] = None, progress: bool = True,
              mmap: Optional[bool] = None) -> LoadReport:
    """Loads checkpoint `ref` (a safetensors file, an index, a directory or a Hugging Face repo id
    in the local cache) into `module`'s parameters and persistent buffers, by state_dict names.

    device: where the tensors go (default cpu). dtype: floating-point tensors load as this dtype
    (default: each tensor keeps the module's dtype; float32/float16/bfloat16 convert). progress: a
    bar on stderr when it is a terminal. mmap: on cpu, tensors stored as they are loaded point
    into copy-on-write mappings of the checkpoint files instead of being copied (no fresh memory;
    the files must not be rewritten in place while the model lives); default: on for checkpoints
    in the Hugging Face cache (immutable blobs), off for other files. Returns a LoadReport.
    """
    ops = _lib.load()
    try:  # the meta mode (metaload.meta()) would turn the call's device into meta
        from ._mode import real
    except ImportError:
        real = contextlib.nullcontext
    state = module.state_dict(keep_vars=True)  # the Parameters themselves; ties appear twice
    names = list(state.keys())
    tensors = list(state.values())
    dev = torch.device(device) if device is not None else None
    with real():
        out = ops.load_into(tensors, names, str(ref), revision, dev, dtype, tp_rank, tp_size,
                            threads, staging_bytes, strict, progress, mmap)
    return _report(out)
