"""Which metaload scope is innermost on this thread: "meta", "real", "fake" or None.

metaload's Python scopes (_mode.py, _fake.py) set it; the hooks they install (_device_init.py,
_wrapped.py) read it. It lives below all of them, so no hook imports the scopes to ask.
"""
import threading

from . import _lib

_tls = threading.local()


def set_scope(kind):
    """The innermost metaload scope on this thread is now `kind` ("meta", "real", "fake"); returns
    the previous one, which restore_scope puts back when the scope exits."""
    old = getattr(_tls, "scope", None)
    _tls.scope = kind
    return old


def restore_scope(old):
    _tls.scope = old


def kind():
    """The innermost scope's kind on this thread, None outside every metaload Python scope."""
    return getattr(_tls, "scope", None)


def tensors_not_real():
    """Whether a tensor made on this thread now would not be real: inside meta() (meta) or fake()
    (fake), innermost first; with no Python scope open, the C++ mode's own answer (METALOAD=meta,
    C++ code)."""
    scope = kind()
    if scope is not None:
        return scope != "real"
    return bool(_lib.load().is_forcing())


def forcing_here():
    """Whether this thread forces tensors onto meta (as metaload's Python scopes left it: the
    innermost is a meta() scope)."""
    return kind() == "meta"
