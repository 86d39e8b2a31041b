"""The safetensors library's Python names, over metaload's own header reader, writer and loader:

    metaload.save_file({"w": w, "b": b}, "model.safetensors", metadata={"format": "pt"})
    tensors = metaload.load_file("model.safetensors", device="cpu")       # {name: tensor}
    mapped = metaload.load_file("model.safetensors", mmap=True)   # views of a copy-on-write map
    with metaload.safe_open("model.safetensors", framework="pt") as f:     # reads the header only
        f.keys(), f.metadata()
        w = f.get_tensor("w")                                             # reads w's bytes only
        rows = f.get_slice("w")[:, 0:128]                         # reads what the slice selects

Files are the format's, read and written by both libraries alike; for the same tensors (and metadata
of at most one entry: safetensors keeps it in a hash map) save_file writes the same bytes as
safetensors.torch.save_file (tests/python/test_safetensors_api.py checks both directions).

Differences: save_file stores every key, also tensors that share memory (safetensors refuses them;
save_safetensors stores ties once); metadata() is None for a file whose metadata is absent or
empty (safetensors tells those apart); only framework="pt".
"""
import json
import mmap
import os
from typing import Dict, List, Optional, Union

import torch

from . import _lib

PathLike = Union[str, "os.PathLike[str]"]
Device = Union[str, int, torch.device]

# Format dtype names -> torch dtypes this torch has (torch 1.13 lacks the unsigned 16-64 bit
# integers and the float8 types).
_DTYPES = {name: getattr(torch, attr) for name, attr in [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("U16", "uint16"),
    ("F16", "float16"), ("BF16", "bfloat16"), ("I32", "int32"), ("U32", "uint32"),
    ("F32", "float32"), ("F64", "float64"), ("I64", "int64"), ("U64", "uint64"),
    ("C64", "complex64"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
    ("F8_E8M0", "float8_e8m0fnu")] if hasattr(torch, attr)}


def _real():
    """Tensors made here are real even inside metaload.meta() or fake()."""
    from ._mode import real
    return real()


def _device(device: Device) -> torch.device:
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


def _torch_dtype(name: str, where: str) -> torch.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise _lib.DTypeError(f"{where}: this torch ({torch.__version__}) has no dtype for the "
                              f"file's {name}")
    return dtype


@_lib.typed_errors
def save_file(tensors: Dict[str, torch.Tensor], filename: PathLike,
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes `tensors` ({name: tensor}, any device, any strides) to `filename` as safetensors,
    with `metadata` ({str: str}) in the header. Written to a temporary file and renamed into
    place."""
    if not isinstance(tensors, dict):
        raise TypeError(f"save_file takes a dict of tensors, not {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise TypeError(f"save_file: {_lib.quote(name)} -> {type(t).__name__}: tensors must be "
                            "{str: torch.Tensor}")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in metadata.items()):
        raise TypeError("save_file: metadata must be {str: str}")
    md = json.dumps(metadata) if metadata else ""
    with _real():
        _lib.load().save_safetensors(os.fspath(filename), list(tensors),
                                     [t.detach() for t in tensors.values()], md)


@_lib.typed_errors
def load_file(filename: PathLike, device: Device = "cpu",
              mmap: bool = False) -> Dict[str, torch.Tensor]:
    """Every tensor of safetensors file `filename`, in file order, on `device` ("cpu", "cuda:0",
    an index, ...). Read by metaload's loader (threads; pinned staging for cuda).

    mmap=True (cpu): the tensors point into a copy-on-write mapping of the file, as safetensors'
    own load_file does, instead of being copied; the same contract as load_into(mmap=True)
    (check_mapped_files; pages the page cache lacks are read during the call)."""
    path = os.fspath(filename)
    with _real():
        names, tensors, lacking = _lib.load().load_file(path, _device(device), bool(mmap))
    if lacking:
        raise _lib.DTypeError(f"{path}: this torch ({torch.__version__}) has no dtype for the "
                              f"file's {lacking}")
    return dict(zip(names, tensors))


class safe_open:  # noqa: N801 (safetensors' name)
    """A safetensors file, opened lazily: the header is read at once (by metaload's validating
    reader, 8 + N bytes), tensor bytes only when get_tensor / get_slice asks for them (through a
    copy-on-write mapping of the file). A context manager; also usable without `with`."""

    def __init__(self, filename: PathLike, framework: str = "pt", device: Device = "cpu"):
        if framework not in ("pt", "torch"):
            raise ValueError(f"metaload.safe_open serves torch tensors: framework='pt', not "
                             f"{framework!r}")
        self._path = os.fspath(filename)
        self._device = _device(device)
        header = _lib.typed_errors(_lib.load().read_safetensors_header)(self._path)
        header = json.loads(header)
        self._data_start = header["data_start"]
        self._metadata = header["metadata"] or None
        self._tensors = {t["name"]: t for t in header["tensors"]}  # in file order
        self._map = None
        self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still held somewhere: the mapping goes with it
                pass
            self._file.close()
        self._map = self._file = None

    def keys(self) -> List[str]:
        """The tensor names, sorted (as safetensors' keys())."""
        return sorted(self._tensors)

    def offset_keys(self) -> List[str]:
        """The tensor names in file order."""
        return list(self._tensors)

    def metadata(self) -> Optional[Dict[str, str]]:
        return dict(self._metadata) if self._metadata else None

    def _entry(self, name: str):
        entry = self._tensors.get(name)
        if entry is None:
            raise KeyError(f"{_lib.quote(self._path)}: no tensor named {_lib.quote(name)}")
        return entry

    def _view(self, name: str) -> torch.Tensor:
        """The tensor's bytes in the file as a CPU tensor of its dtype and shape (no copy)."""
        t = self._entry(name)
        dtype = _torch_dtype(t["dtype"], self._path)
        shape = t["shape"]
        numel = 1
        for s in shape:
            numel *= s
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if self._map is None:
            self._file = open(self._path, "rb")
            # Copy-on-write: writable for torch.frombuffer, never written back, pages read on use.
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        return torch.frombuffer(self._map, dtype=dtype, count=numel,
                                offset=self._data_start + t["begin"]).reshape(shape)

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)  # owns its memory; the file may go
        return t if self._device.type == "cpu" else t.to(self._device)

    def get_tensor(self, name: str) -> torch.Tensor:
        """Tensor `name` on the device given to safe_open."""
        with _real():
            return self._out(self._view(name))

    def get_tensors(self) -> Dict[str, torch.Tensor]:
        return {name: self.get_tensor(name) for name in self._tensors}

    def get_slice(self, name: str) -> "SafeSlice":
        """A lazy slice of tensor `name`: get_shape(), get_dtype(), and [...] / [a:b] /
        [:, a:b] / ints, which read only what they select."""
        self._entry(name)
        return SafeSlice(self, name)


class SafeSlice:
    """safetensors' PySafeSlice: indexing reads and returns the selected part."""

    def __init__(self, owner: safe_open, name: str):
        self._owner = owner
        self._name = name
        self._entry = owner._entry(name)

    def get_shape(self) -> List[int]:
        return list(self._entry["shape"])

    def get_dtype(self) -> str:
        """The file's dtype name ("F32", "BF16", ...)."""
        return self._entry["dtype"]

    def __len__(self) -> int:
        shape = self._entry["shape"]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, key) -> torch.Tensor:
        with _real():
            return self._owner._out(self._owner._view(self._name)[key])
