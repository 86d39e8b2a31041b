"""Finds and loads libmetaload.so, and turns its errors into metaload exception classes."""
import functools
import json
import mmap
import os
import re
import warnings

import torch

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
            raise kind(f"{argument}: {quote(v)} cannot be encoded as UTF-8: character {e.start} "
                       f"is a lone surrogate \\u{ord(v[e.start]):04x} (names must be valid "
                       f"Unicode)" + (f" (rule {rule})" if rule else "")) from None


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
    """Base of every error metaload raises; the C++ kind is the class name."""

    kind = "Error"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:  # the kinds below (not a user's own subclasses)
            cls.kind = cls.__name__
            cls.__module__ = "metaload"
            _classes[cls.__name__] = cls


Error.__module__ = "metaload"
_classes["Error"] = Error


# The C++ error kinds, each under the parent it has in C++ (METALOAD_DEFINE_ERROR(Kind, Parent) or a
# class written out, in each layer's one error header: base/error.h, kernels/errors.h,
# loader/errors.h, model/errors.h, ...):
# `except metaload.LoadError` catches what `catch (const metaload::LoadError&)` catches.
# tests/python/test_api.py checks this table against the headers.
class ModeError(Error):
    """A mode entered or left in the wrong order, or on the wrong thread (base/error.h)."""


class DataDependentError(Error):
    """A read of values that a meta or fake tensor does not have (base/error.h)."""


class SizeOverflowError(Error):
    """A size computed from inputs (a checkpoint, a config, a batch) that does not fit in 64 bits;
    the message names the quantity (base/error.h)."""


class ShapeError(Error):
    """A shape kernel rejected its inputs (kernels/errors.h)."""


class UnknownOpError(Error):
    """An operator with no shape kernel reached a meta or fake tensor (kernels/errors.h)."""


class ConversionError(Error):
    """A dtype conversion metaload cannot do (kernels/errors.h)."""


class ScanError(Error):
    """A module tree that cannot be scanned (fake_mode/scan_module.h)."""


class FormatError(Error):
    """A malformed safetensors file or index; `.rule` is the stable rule identifier
    ("size-mismatch", ...) listed in loader/README.md (loader/errors.h)."""

    @property
    def rule(self):
        m = re.search(r"\(rule ([A-Za-z0-9_-]+)\)\s*$", str(self))
        return m.group(1) if m else None


class ShardError(FormatError):
    """A sharded checkpoint's index disagrees with its shards (loader/errors.h)."""


class QuantLayoutError(FormatError):
    """A quantized checkpoint whose tensors contradict its quantization_config or each other (a
    packed shape that does not match the logical shape, scales of the wrong shape, a malformed
    quant_state blob, ...); names the file, the tensor and the rule (quant/errors.h). The base of
    every quantization error: QuantSchemeError and DequantError derive from it."""


class QuantSchemeError(QuantLayoutError):
    """A quantization scheme metaload does not know or cannot size: an unknown quant_method, an
    unknown preset name, a field of the wrong type (quant/errors.h)."""


class DequantError(QuantLayoutError):
    """Whatever a dequantizing load rejects: the layout and scheme errors of the checkpoint (same
    rules as QuantLayoutError / QuantSchemeError), a layout without kernels (unsupported-scheme), a
    GPTQ g_idx out of range (g_idx-range), a TP degree that splits a pack or group (tp-boundary);
    `.rule` names the rule (quant/errors.h)."""


class ResolveError(Error):
    """A checkpoint reference that names nothing; the message lists where it looked."""


class LoadError(Error):
    """Base of the errors of loading weights (loader/errors.h)."""


class ReadError(LoadError):
    """A checkpoint file could not be read (loader/errors.h)."""


class FileChangedError(ReadError):
    """A file loaded zero-copy was truncated or written in place while tensors map it; the message
    names it (loader/errors.h)."""


class LoadCancelled(LoadError):
    """The load was cancelled (loader/errors.h)."""


class DeviceError(LoadError):
    """The target device failed or does not exist (loader/errors.h)."""


class VerifyError(LoadError):
    """Loaded bytes failed their final check (loader/errors.h)."""


class PlanError(LoadError):
    """An impossible load request (loader/errors.h)."""


class SliceError(LoadError):
    """A tensor-parallel slice that does not exist (loader/errors.h)."""


class SwapError(LoadError):
    """The loaded tensors could not take the targets' place (loader/errors.h)."""


class MismatchError(LoadError):
    """The checkpoint does not fit the module (loader/errors.h). The message lists the problems one
    per line (names escaped; at most 20 of each kind, then how many more); `.missing` (module names
    the checkpoint lacks), `.unexpected` (checkpoint names the module lacks) and `.mismatched`
    (module names whose shape, dtype or TP shard does not fit) are the full lists of names, as
    given."""

    def __init__(self, *args):
        super().__init__(*args)
        self.missing, self.unexpected, self.mismatched = _mismatch_names(
            str(args[0]) if args else "")


class DTypeError(Error):
    """A dtype or quantization name that is not known (model/errors.h)."""


class ModelKeyError(Error):
    """A malformed model key (model/errors.h)."""


class RepoIdError(ModelKeyError):
    """A model key whose repo_id the key policy refuses: not a Hugging Face Hub repo id, and local
    paths were not allowed (model/errors.h). `.rule` is the rule broken ("repo-id-parent-dir",
    ...)."""

    @property
    def rule(self):
        m = re.search(r"\(rule ([A-Za-z0-9_-]+)\)\s*$", str(self))
        return m.group(1) if m else None


class TPError(Error):
    """A tensor-parallel degree the model cannot be split into (model/errors.h)."""


class ConfigError(Error):
    """A config.json a model family cannot use (model/errors.h)."""


class FamilyError(Error):
    """A model family's rule that does not apply (model/errors.h)."""


class FixtureError(Error):
    """A fixture checkpoint that cannot be made as asked (model/errors.h)."""


class ModelError(Error):
    """A TransformersModel request that cannot be served (model/errors.h)."""


class ModulePathError(ModelError):
    """A module path a model does not have; the message lists the closest
    (model/errors.h)."""


class DistributedError(Error):
    """A collective that failed or timed out (a rank died, hangs or never joined), or ranks of a
    tensor-parallel group that disagree (tp_size, rank, model); the message names the operation,
    the rank and the timeout, or every rank's values (dist/errors.h). A load across ranks
    (metaload._dist_load) sets `.failures`: {group rank: what went wrong there}; every rank
    raises it and keeps its previous weights."""

    def __init__(self, message: str = "", failures=None):
        super().__init__(message)
        self.failures = dict(failures or {})

    def __reduce__(self):
        return (type(self), (str(self), self.failures))


class UsageError(Error):
    """A command line the metaload tool does not accept (tools/cli/torch/torch_cli.h)."""


# The lines MismatchError's message lists its problems on (loader/errors.cc's list_block):
#   "  missing: <module name> [<shape>]"
#   "  unexpected: <checkpoint name>[ (as <module name>)] in <file>"
#   "  mismatched: <module name>: <why>"
# (model/transformers_model.cc writes its TP problems as mismatched lines too.)
_MISMATCH_LINE = re.compile(r"^  (missing|unexpected|mismatched): (.*)$", re.MULTILINE)


def _full_mismatch_names(message):
    """The full name lists the library kept for the MismatchError with this message, or None (a
    message made elsewhere, or a library without the operator)."""
    try:
        text = torch.ops.metaload.mismatch_names(message)
    except (AttributeError, RuntimeError):
        return None
    if text is None:
        return None
    names = json.loads(text)
    return names["missing"], names["unexpected"], names["mismatched"]


def _mismatch_names(message):
    """The names on the message's lines: a message made by hand (or unpickled) has them all."""
    found = {"missing": [], "unexpected": [], "mismatched": []}
    for kind, entry in _MISMATCH_LINE.findall(message):
        if kind == "missing":
            name = re.sub(r" \[[-0-9, ]*\]$", "", entry)
        elif kind == "unexpected":
            name = entry.split(" (as ", 1)[0] if " (as " in entry else entry.rsplit(" in ", 1)[0]
        else:
            name = entry.split(": ", 1)[0]
        found[kind].append(name)
    return found["missing"], found["unexpected"], found["mismatched"]


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


_prefix = re.compile(r"\[metaload\.([A-Za-z]+)\] ")


def translate(exc):
    """The metaload exception for a RuntimeError raised by the extension, or None."""
    m = _prefix.search(str(exc))
    if m is None:
        return None
    msg = str(exc)[m.end():].split("\nException raised from")[0]
    err = error_class(m.group(1))(msg)
    if isinstance(err, MismatchError):
        # The message lists at most 20 names of each kind; the library kept them all.
        full = _full_mismatch_names(msg)
        if full is not None:
            err.missing, err.unexpected, err.mismatched = (list(x) for x in full)
    return err


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
