"""The safetensors library's Python names, over metaload's own header reader, writer and loader:

    metaload.save_file({"w": w, "b": b}, "model.safetensors", metadata={"format": "pt"})
    data = metaload.save({"w": w})                                     # the same bytes, in memory
    tensors = metaload.load_file("model.safetensors", device="cpu")       # {name: tensor}
    tensors = metaload.load(data)                                      # {name: tensor} on cpu
    mapped = metaload.load_file("model.safetensors", mmap=True)   # views of a copy-on-write map
    with metaload.safe_open("model.safetensors", framework="pt") as f:     # reads the header only
        f.keys(), f.metadata()
        w = f.get_tensor("w")                                             # reads w's bytes only
        rows = f.get_slice("w")[:, 0:128]                         # reads what the slice selects

Files are the format's, read and written by both libraries alike; for the same tensors (and metadata
of at most one entry: safetensors keeps it in a hash map) save_file and save write the same bytes as
safetensors.torch.save_file and save (tests/python/test_safetensors_api.py checks both directions,
tests/python/test_safetensors_conformance.py runs safetensors' own cases against both libraries).

save_file and save refuse what safetensors refuses, with the exception types it raises: a value
that is not a dict of {str: Tensor} and a non-strided (sparse, ...) or non-contiguous tensor are a
FormatValueError (a metaload.FormatError that is also a ValueError), tensors whose memory overlaps
a FormatError (a RuntimeError, as safetensors'); checkpoint.save_safetensors still writes any
strides and stores tied tensors. F4 (torch.float4_e2m1fn_x2, two values a byte) is stored with the
logical shape in the header (the last dimension doubled), as safetensors does.

Differences: metadata() is None for a file whose metadata is absent or empty (safetensors tells
those apart); only framework="pt"; load(data) goes through a temporary file (the validating reader
reads files), and its tensors own their memory; a malformed file or bytes is a metaload.FormatError
(safetensors: its SafetensorError); messages are metaload's own.
"""
import functools
import json
import mmap
import os
import tempfile
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import torch

from . import _lib

PathLike = Union[str, "os.PathLike[str]"]
Device = Union[str, int, torch.device]


class FormatDType(NamedTuple):
    """One row of the library's dtype table (loader/format/safetensors.cc's kDTypes, the one copy):
    the format's name ("F8_E4M3"), torch's attribute ("float8_e4m3fn"; None where no torch has
    the dtype: F6_E2M3, F6_E3M2), bits a value, and values one torch element holds (2 for F4:
    torch.float4_e2m1fn_x2 packs two a byte along the last dimension)."""
    name: str
    torch: Optional[str]
    bits: int
    values_per_element: int


@functools.lru_cache(maxsize=None)
def format_dtypes() -> Tuple[FormatDType, ...]:
    """Every dtype the format (and safetensors 0.8) defines, in the library's order, read from the
    library once (torch.ops.metaload.safetensors_dtypes)."""
    return tuple(FormatDType(r["name"], r["torch"], r["bits"], r["values_per_element"])
                 for r in json.loads(_lib.load().safetensors_dtypes()))


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> Dict[str, torch.dtype]:
    """Format name -> the torch dtype of this torch; a dtype this torch lacks (1.13: the unsigned
    16-64 bit integers, float8, float4; every torch: F6_*) is absent."""
    return {d.name: getattr(torch, d.torch) for d in format_dtypes()
            if d.torch is not None and isinstance(getattr(torch, d.torch, None), torch.dtype)}


class FormatValueError(_lib.FormatError, ValueError):
    """A metaload.FormatError that is also a ValueError, for what safetensors raises a ValueError
    for (save_file / save of something that is not {str: Tensor}, of a non-strided or
    non-contiguous tensor): `except ValueError` and `except metaload.FormatError` both catch it.
    Not a C++ kind: the library never raises it."""


FormatValueError.__module__ = "metaload"


def _real():
    """Tensors made here are real even inside metaload.meta() or fake()."""
    from ._mode import real
    return real()


def _device(device: Device) -> torch.device:
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


def _lacking(path: str, dtype: str, tensor: str) -> "_lib.DTypeError":
    return _lib.DTypeError(f"{path}: tensor {_lib.quote(tensor)}: this torch ({torch.__version__}) "
                           f"has no dtype for the file's {dtype}")


def _torch_dtype(name: str, path: str, tensor: str) -> torch.dtype:
    dtype = _torch_dtypes().get(name)
    if dtype is None:
        raise _lacking(path, name, tensor)
    return dtype


def _torch_shape(dtype: str, shape: List[int], path: str, tensor: str) -> List[int]:
    """The torch shape of a stored tensor, by the library's rule (torch_shape_of in
    loader/format/safetensors.h): a packed torch dtype (F4's float4_e2m1fn_x2) holds
    values_per_element values an element along the last dimension."""
    row = next(d for d in format_dtypes() if d.name == dtype)
    per = row.values_per_element
    if per == 1:
        return list(shape)
    if not shape or shape[-1] % per:
        count, whole = ("two", "even") if per == 2 else (str(per), f"a multiple of {per}")
        raise _lib.FormatError(f"{path}: tensor {_lib.quote(tensor)}: {dtype} {list(shape)}, which "
                               f"torch.{row.torch} cannot hold (it packs {count} values a byte "
                               f"along the last dimension, which must be {whole}) "
                               "(rule unsupported-dtype)", file=path, tensor=tensor,
                               rule="unsupported-dtype")
    return list(shape[:-1]) + [shape[-1] // per]


def _storage_span(t: torch.Tensor):
    """(device, storage address, first byte, end byte) of the memory `t` covers, or None (meta,
    no storage, empty)."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    try:
        storage = t.untyped_storage()
    except AttributeError:  # torch 1.13
        storage = t.storage()
    base = storage.data_ptr()
    if base == 0:
        return None
    start = t.data_ptr()
    end = start + t.element_size()
    for size, stride in zip(t.shape, t.stride()):  # the farthest element covered
        end += (size - 1) * stride * t.element_size()
    return t.device, base, start, end


def _shared_groups(tensors: Dict[str, torch.Tensor]) -> List[List[str]]:
    """Names of tensors whose memory overlaps, by groups (disjoint parts of one storage are not
    shared: safetensors writes them)."""
    by_storage = {}
    for name, t in tensors.items():
        span = _storage_span(t)
        if span is not None:
            by_storage.setdefault(span[:2], []).append((span[2], span[3], name))
    groups = []
    for spans in by_storage.values():
        spans.sort()
        current, stop = [spans[0][2]], spans[0][1]
        for start, end, name in spans[1:]:
            if start < stop:
                current.append(name)
                stop = max(stop, end)
            else:
                groups.append(current)
                current, stop = [name], end
        groups.append(current)
    return [sorted(g) for g in groups if len(g) > 1]


def _check_for_save(fn: str, tensors, metadata) -> None:
    """What safetensors refuses, in its order and with its exception types."""
    if not isinstance(tensors, dict):
        raise FormatValueError(f"{fn}: expected a dict of {{str: torch.Tensor}}, not "
                               f"{type(tensors).__name__} (rule not-a-dict)", rule="not-a-dict")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise FormatValueError(f"{fn}: {_lib.quote(name)}: expected a torch.Tensor, not "
                                   f"{type(t).__name__} (rule not-a-tensor)", tensor=name,
                                   rule="not-a-tensor")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"{fn}: {_lib.quote(name)} ({type(name).__name__}): tensor names must "
                            "be str")
    not_strided = [n for n, t in tensors.items() if t.layout != torch.strided]
    if not_strided:
        raise FormatValueError(
            f"{fn}: {', '.join(map(_lib.quote, not_strided))}: only dense (strided) tensors can "
            "be saved; make them dense with .to_dense() first (rule unsupported-layout)",
            rule="unsupported-layout")
    shared = _shared_groups(tensors)
    if shared:
        raise _lib.FormatError(
            f"{fn}: tensors that share memory: "
            + "; ".join(", ".join(map(_lib.quote, g)) for g in shared)
            + " (each would be stored whole, and load untied): save one of each, or use "
              "metaload.save_safetensors, which stores tied tensors (rule shared-memory)",
            rule="shared-memory")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise FormatValueError(
                f"{fn}: {_lib.quote(name)}: a non-contiguous tensor (a view of another one, or "
                "transposed): save .contiguous() or the whole tensor (rule non-contiguous)",
                tensor=name, rule="non-contiguous")
    if metadata is not None and (not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise TypeError(f"{fn}: metadata must be {{str: str}}")


@_lib.typed_errors
def _write(fn: str, tensors, filename: str, metadata) -> None:
    _check_for_save(fn, tensors, metadata)
    md = json.dumps(metadata) if metadata else ""
    with _real():
        _lib.load().save_safetensors(filename, list(tensors),
                                     [t.detach() for t in tensors.values()], md)


def _as_bytes_error(e: "_lib.Error", path: str) -> "_lib.Error":
    """`e` naming "<bytes>" instead of the temporary file `path`, in its message and its data."""
    out = type(e)(str(e).replace(path, "<bytes>"))
    if e._data is not None:
        out._data = {k: v.replace(path, "<bytes>") if isinstance(v, str) else v
                     for k, v in e._data.items()}
    return out


def save_file(tensors: Dict[str, torch.Tensor], filename: PathLike,
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes `tensors` ({name: tensor}, any device, dense and contiguous, no two sharing memory)
    to `filename` as safetensors, with `metadata` ({str: str}) in the header. Written to a
    temporary file and renamed into place."""
    _write("save_file", tensors, os.fspath(filename), metadata)


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes save_file(tensors, ..., metadata) writes (safetensors.torch.save's), through a
    temporary file."""
    with tempfile.TemporaryDirectory(prefix="metaload-save-") as tmp:
        path = os.path.join(tmp, "tensors.safetensors")
        try:
            _write("save", tensors, path, metadata)
        except _lib.Error as e:
            raise _as_bytes_error(e, path) from None
        with open(path, "rb") as f:
            return f.read()


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of safetensors file bytes `data` (safetensors.torch.load's), on cpu, in file
    order, validated as load_file validates a file (through a temporary file); each owns its
    memory."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"load takes the bytes of a safetensors file, not {type(data).__name__}")
    with tempfile.TemporaryDirectory(prefix="metaload-load-") as tmp:
        path = os.path.join(tmp, "bytes.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        try:
            return load_file(path)
        except _lib.Error as e:
            raise _as_bytes_error(e, path) from None


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
        header = json.loads(_lib.load().read_safetensors_header(path))
        tensor = next(t["name"] for t in header["tensors"] if t["dtype"] == lacking)
        raise _lacking(path, lacking, tensor)
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
        dtype = _torch_dtype(t["dtype"], self._path, name)
        shape = _torch_shape(t["dtype"], t["shape"], self._path, name)
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
