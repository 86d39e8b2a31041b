"""Finds and loads libmetaload.so, and turns its errors into metaload exception classes."""
import functools
import mmap
import os
import re

import torch

_loaded = None


def library_path():
    """METALOAD_LIB if set, else libmetaload.so next to this package (an installed copy)."""
    env = os.environ.get("METALOAD_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "libmetaload.so"), os.path.join(here, "..", "libmetaload.so")):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    raise ImportError(
        "metaload: libmetaload.so not found: set METALOAD_LIB to its path "
        "(bazel-bin/libmetaload.so or build/<dir>/libmetaload.so) or install it next to the package")


_BUILD_INFO = re.compile(rb"metaload-build-info: metaload=([^ ]+) torch=(\d+)\.(\d+)\.(\d+);")


def build_info(path=None):
    """(metaload version, torch version) the library at `path` was built for, read from its bytes
    (base/build_info.cc) without loading it."""
    path = path or library_path()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(b"metaload-build-info: ")
        match = _BUILD_INFO.match(m[at:at + 200]) if at >= 0 else None
    if match is None:
        raise ImportError(f"metaload: {path} is not a metaload library (no build information in it)")
    return match.group(1).decode(), ".".join(g.decode() for g in match.groups()[1:])


def check_torch_version(path, torch_version=None):
    """Refuses a library built for another torch (major.minor differ: the C++ ABI differs), with
    one message naming both, before loading it: never an undefined-symbol trace or a crash."""
    torch_version = torch_version or torch.__version__
    _, built = build_info(path)
    running = re.match(r"(\d+)\.(\d+)", torch_version)
    if running is None or running.groups() != tuple(built.split(".")[:2]):
        raise ImportError(
            f"metaload: {path} was built for torch {built}, but this Python runs torch "
            f"{torch_version}: rebuild metaload against this torch (pip install . --no-build-isolation, "
            f"or point METALOAD_LIB at a build made for it)")


def load():
    """Loads the extension once; returns torch.ops.metaload."""
    global _loaded
    if _loaded is None:
        path = library_path()
        check_torch_version(path)
        # Under LD_PRELOAD the library is already in the process; loading it again is harmless.
        torch.ops.load_library(path)
        # Kernels held back while the library was preloaded into this interpreter (LD_PRELOAD)
        # are registered now that torch's own Python kernels are in place.
        torch.ops.metaload.init()
        _loaded = path
    return torch.ops.metaload


class Error(RuntimeError):
    """Base of every error metaload raises; the C++ kind is the class name."""

    kind = "Error"


_classes = {"Error": Error}
_prefix = re.compile(r"\[metaload\.([A-Za-z]+)\] ")


def error_class(kind):
    """The Python class for a C++ error kind, made on first use (all derive from metaload.Error)."""
    cls = _classes.get(kind)
    if cls is None:
        cls = type(kind, (Error,), {"kind": kind, "__module__": "metaload"})
        _classes[kind] = cls
    return cls


def translate(exc):
    """The metaload exception for a RuntimeError raised by the extension, or None."""
    m = _prefix.search(str(exc))
    if m is None:
        return None
    msg = str(exc)[m.end():].split("\nException raised from")[0]
    return error_class(m.group(1))(msg)


def typed_errors(fn):
    """Decorator: re-raise the extension's errors as metaload.<Kind> exceptions."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            t = translate(e)
            if t is None:
                raise
            raise t from None

    return wrapper
