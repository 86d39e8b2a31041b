"""Finds and loads libmetaload.so, and turns its errors into metaload exception classes."""
import functools
import json
import mmap
import os
import re
import warnings

import torch

from ._error_kinds import KINDS

_loaded = None

QUOTE_MAX_CHARS = 200  # as base/text.h's kQuoteMaxChars


def _ascii_repr(text: str) -> str:
    """repr(text) with every non-ASCII character as its code point ("\\u00e9", "\\u0301",
    "\\U0001f600"), as base/text.h writes them: names that differ only in Unicode normalisation
    or in invisible characters never print alike, and a lone surrogate is shown, not encoded."""
    return "".join(c if ord(c) < 0x80 else
                   (f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
                   for c in repr(text))


def quote(value) -> str:
    """`value` quoted for a message, as base/text.h quotes user-supplied text in C++: repr's
    escapes (a NUL or newline is shown, never passed through), every non-ASCII character as its
    code point, and at most QUOTE_MAX_CHARS characters, then its full length."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= QUOTE_MAX_CHARS:
        return _ascii_repr(text)
    return f"{_ascii_repr(text[:QUOTE_MAX_CHARS])}... ({len(text)} characters)"


def check_utf8(kind, argument: str, values, rule: str = "") -> None:
    """Raises `kind` (a metaload error class) naming `argument` and the first string among
    `values` (a str, or an iterable of them; dict keys and values both) that cannot be encoded
    as UTF-8 -- a str holding a lone surrogate ("\\ud800", as os.fsdecode makes of a bad byte)
    -- before it reaches the library, whose schema would only say "Expected List[str]".
    `rule`: the rule the message ends with, for the kinds that carry one (FormatError)."""
    if isinstance(values, str):
        values = (values,)
    elif isinstance(values, dict):
        values = [x for kv in values.items() for x in kv]
    values = [v for v in values if isinstance(v, str)]
    try:
        "".join(values).encode("utf-8")  # one call for the common case: every name encodes
        return
    except UnicodeEncodeError:
        pass
    for v in values:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            fields = {"rule": rule} if rule else {}
            raise kind(f"{argument}: {quote(v)} cannot be encoded as UTF-8: character {e.start} "
                       f"is a lone surrogate \\u{ord(v[e.start]):04x} (names must be valid "
                       f"Unicode)" + (f" (rule {rule})" if rule else ""), **fields) from None


def is_fake(t):
    """Whether `t` is one of metaload's fake tensors (metaload.is_fake). Here, below every module
    that asks, so the scopes and the hooks share one definition."""
    return isinstance(t, torch.Tensor) and bool(load().is_fake(t))


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
    return _read_build_info(path or library_path())


@functools.lru_cache(maxsize=8)  # import reads it twice (the torch check, then __version__)
def _read_build_info(path):
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
        # Warnings of the library's load (a registration that failed, ...): calls through
        # torch.ops do not turn TORCH_WARN into Python warnings, so they come back as strings.
        for message in torch.ops.metaload.load_warnings():
            warnings.warn(message, UserWarning, stacklevel=2)
        _loaded = path
    return torch.ops.metaload


_classes = {}


class Error(RuntimeError):
    """Base of every error metaload raises; the C++ kind is the class name. An error the library
    raised carries its C++ data: its kind, its message, and the fields its class records
    (FormatError's `.file`, `.tensor`, `.rule`, `.detail`; RepoIdError's `.repo_id`, `.rule`;
    MismatchError's full `.missing`, `.unexpected`, `.mismatched`), read from the library's record
    of it (base/error.h), never from its text. One made in Python carries the fields its maker
    passes as keywords (`metaload.FormatError(message, rule="size-mismatch", file=path)`); a field
    nobody gave (or an error whose record is long gone) is None. Pickling keeps the data."""

    kind = "Error"
    _data = None  # {field: value} from the library's record or the maker's keywords, or None

    def __init__(self, *args, **fields):
        super().__init__(*args)
        if fields:
            self._data = dict(fields)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:  # the kinds below (not a user's own subclasses)
            cls.kind = cls.__name__
            cls.__module__ = "metaload"
            _classes[cls.__name__] = cls


Error.__module__ = "metaload"
_classes["Error"] = Error

def _field(name):
    def get(self):
        data = self._data
        return data.get(name) if data is not None else None

    def set_(self, value):
        self._data = dict(self._data or {}, **{name: value})

    return property(get, set_, doc=f"The error's {name} (None if unknown).")


class _DistributedError:
    """A load across ranks (metaload._dist_load) sets `.failures`: {group rank: what went wrong
    there}; every rank raises it and keeps its previous weights."""

    def __init__(self, message: str = "", failures=None, **fields):
        Error.__init__(self, message, **fields)
        self.failures = dict(failures or {})

    def __reduce__(self):
        return (type(self), (str(self), self.failures), self.__dict__)


# What a kind has in Python besides its C++ fields: its members and a note for its docstring.
_PYTHON_SIDE = {"DistributedError": _DistributedError}


def _make_kinds():
    """One class per C++ kind of _error_kinds.KINDS (tools/gen_error_kinds.py writes it from the
    C++ headers), under its C++ parent: `except metaload.LoadError` catches what
    `catch (const metaload::LoadError&)` catches."""
    for kind, parent, header, doc, fields in KINDS:
        members = {"__module__": __name__, "__qualname__": kind}
        doc = f"{doc} ({header})"
        if fields:
            doc += " Fields: " + ", ".join(f"`.{f}`" for f in fields) + "."
        extra = _PYTHON_SIDE.get(kind)
        if extra is not None:
            members.update({k: v for k, v in vars(extra).items()
                            if k not in ("__module__", "__qualname__", "__doc__", "__dict__",
                                         "__weakref__")})
            doc += " " + " ".join(extra.__doc__.split())
        members["__doc__"] = doc
        members.update({f: _field(f) for f in fields})
        globals()[kind] = type(kind, (_classes[parent],), members)


_make_kinds()


def error_kinds():
    """{kind: class} of every metaload error class (the C++ kinds and Error itself)."""
    return dict(_classes)


def error_class(kind):
    """The Python class for a C++ error kind; a kind this package does not know yet (a newer
    library) gets a class made on first use, derived from metaload.Error."""
    cls = _classes.get(kind)
    if cls is None:
        cls = type(kind, (Error,), {"__module__": __name__})
    return cls


def from_data(data):
    """The metaload exception for the library's record of an error ({"kind": ..., "message": ...,
    and its fields})."""
    err = error_class(data["kind"])(data["message"])
    err._data = {k: v for k, v in data.items() if k not in ("kind", "message")}
    return err


def _error_data(text):
    """The library's record of the error whose what() `text` holds, or None (an error made
    elsewhere, gone from the record, or a library without the operator)."""
    try:
        found = torch.ops.metaload.error_data(text)
    except (AttributeError, RuntimeError, UnicodeError):  # a text made in Python may not encode
        return None
    return None if found is None else json.loads(found)


_prefix = re.compile(r"\[metaload\.([A-Za-z]+)\] ")


def translate(exc):
    """The metaload exception for a RuntimeError raised by the extension, or None: from the
    library's record of it; from its text only when there is none."""
    text = str(exc)
    if "[metaload." not in text:
        return None
    data = _error_data(text)
    if data is not None:
        return from_data(data)
    m = _prefix.search(text)
    if m is None:
        return None
    return error_class(m.group(1))(text[m.end():].split("\nException raised from")[0])


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
