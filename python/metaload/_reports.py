"""What a load returns: LoadReport (load_into, TransformersModel.dispatch) and its FileReports.

Below both loaders (_load.py, _dist_load.py) and model.py, which all make them.
"""
import json
from typing import Any, Dict, List, NamedTuple, Optional


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
    # As torch's load_state_dict(strict=False) returns them: module names the checkpoint has no
    # tensor for (left as they were), and checkpoint names the module has no place for (not
    # read). Both empty after a strict load, which fails instead.
    missing_keys: List[str] = []
    unexpected_keys: List[str] = []
    # Non-persistent buffers (not in state_dict, so never in a checkpoint: rotary inv_freq, ...)
    # that the load set from the values their constructor computed (a meta tensor built under
    # metaload.meta() keeps them), or moved to `device` from where they were.
    computed_keys: List[str] = []
    # A load with a process group (metaload._dist_load.DistReport): the rank, its mode, the bytes
    # read, sent and received, and every rank's bytes; None otherwise.
    distributed: Any = None
    # load_into(dequantize=...): the weights filled by dequantizing a quantized checkpoint weight
    # (GPTQ, AWQ, bitsandbytes NF4/FP4/int8, FP8 blocks), by module name.
    dequantized_keys: List[str] = []
    # load_into(adapters=...): the adapters' tensors loaded into the module's LoRA layers, by
    # module name (their bytes and files are in bytes and files too).
    adapter_keys: List[str] = []

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def _report(text: str, missing_keys: Optional[List[str]] = None,
            unexpected_keys: Optional[List[str]] = None,
            computed_keys: Optional[List[str]] = None) -> LoadReport:
    d: Dict[str, Any] = json.loads(text)
    d["files"] = [FileReport(**f) for f in d["files"]]
    # The library's lists (a strict=False load), then the caller's (names it decided on itself).
    d["missing_keys"] = list(d.get("missing_keys", [])) + list(missing_keys or [])
    d["unexpected_keys"] = list(d.get("unexpected_keys", [])) + list(unexpected_keys or [])
    return LoadReport(**d, computed_keys=list(computed_keys or []))
