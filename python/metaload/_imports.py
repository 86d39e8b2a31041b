"""A module imported inside metaload.meta() or metaload.fake() runs its top-level code real.

A module's globals outlive the scope that imported it: a constant tensor made at import time
(torch._dynamo's, a kernel library's lookup tables) would stay a meta or fake tensor for the rest
of the process, and import code that reads a value (`.item()`, `.tolist()`) fails outright. nnsight
imports torch._dynamo before entering its meta mode for that reason (about a second of every
build, whether the model needs it or not); with this finder first on sys.meta_path, a module
first imported inside a scope is executed under metaload.real() instead, and nothing needs
importing ahead. Outside every forcing scope the finder steps aside after one thread-local check.
"""
import importlib.abc
import sys
import threading

from . import _thread_scope

_tls = threading.local()  # .finding: this thread is inside _RealImports.find_spec
_install_lock = threading.Lock()
real_scope = None  # _mode.real, set by _mode (which imports this module)


class _RealExec(importlib.abc.Loader):
    """The module's own loader, its code run under real(); the module keeps its own loader."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        with real_scope():
            self._loader.exec_module(module)

    def __getattr__(self, name):  # get_source, is_package, ... as the module's own loader
        return getattr(self._loader, name)


class _RealImports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if getattr(_tls, "finding", False):  # the search below, or an import the check makes
            return None
        _tls.finding = True
        try:
            if not _thread_scope.tensors_not_real():
                return None
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            _tls.finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RealExec(spec.loader)
        return spec


_finder = _RealImports()


def install():
    """Puts the finder first on sys.meta_path, once per process (a forcing scope calls it)."""
    if sys.meta_path and sys.meta_path[0] is _finder:
        return
    with _install_lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        sys.meta_path.insert(0, _finder)
