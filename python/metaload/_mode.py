"""metaload.meta() and metaload.real(): the Python face of MetaMode and RealGuard.

Everything happens below Python, in the C++ mode (a dispatch-key fallback, c10_ext/mode.cc): it
forces every tensor the dispatcher creates onto meta, and keeps the values of small tensors made
from constants (arange, linspace, torch.tensor, ...) so constructors that compute a few numbers
and read them back (tolist, item, float) still work (c10_ext/values.h). No Python code runs per
torch call, so a build under meta() costs what the same build with device="meta" costs.

Python adds two things at the edges of a scope:
- torch's Python bindings initialise CUDA before dispatching a call that names it; _device_init.py
  keeps that from happening while this thread forces (no CUDA context, no error without a GPU);
- errors: a data-dependent read inside the block raises a RuntimeError whose message starts with
  "[metaload.DataDependentError]" (torch's bindings make every C++ error a RuntimeError); the
  `with` statement re-raises it as metaload.DataDependentError, so `except metaload.Error` around
  the block catches it typed.
"""
import contextlib
import threading

from . import _device_init, _interplay, _lib


def is_forcing():
    """Whether tensors created on this thread now land on meta (the C++ mode's own answer)."""
    return bool(_lib.load().is_forcing())


def forcing_stats():
    """(tensors forced onto meta, bytes not allocated) so far in this process, all threads."""
    tensors, nbytes = _lib.load().forcing_stats()
    return tensors, nbytes


def reset_forcing_stats():
    _lib.load().reset_forcing_stats()


_scope_calls = None


def _calls():
    """(enter_meta, enter_real, exit_scope) as the dispatcher's own callables: an OpOverloadPacket
    resolves its overload in Python at every call, which was a third of an empty scope's cost."""
    global _scope_calls
    if _scope_calls is None:
        ops = _lib.load()

        def direct(packet):
            overload = packet.default
            return getattr(overload, "_op", overload)
        _scope_calls = (direct(ops.enter_meta), direct(ops.enter_real), direct(ops.exit_scope))
    return _scope_calls


class _Scope(contextlib.ContextDecorator):
    """One C++ scope (MetaMode or RealGuard) entered and exited on the same thread."""

    _forcing = None  # what the scope makes of tensors created in it
    _name = ""

    def _recreate_cm(self):  # as a decorator: a fresh scope per call (recursion, threads)
        return type(self)()

    def __enter__(self):
        if getattr(self, "_thread", None) is not None:
            raise _lib.ModeError(f"this metaload.{self._name}() object is already open; "
                                 f"each `with` needs a fresh metaload.{self._name}()")
        enter_meta, enter_real, _ = _calls()
        try:
            self._token = enter_meta() if self._forcing else enter_real()
        except RuntimeError as e:
            raise (_lib.translate(e) or e) from None
        self._thread = threading.get_ident()
        self._was_forcing = _device_init.set_forcing(self._forcing)
        self._fake = _interplay.set_fake_mode_aside() if self._forcing else None
        if self._forcing:
            _device_init.install()
            _device_init.scope_opened()
        return None

    def __exit__(self, typ, value, tb):
        if threading.get_ident() != self._thread:
            raise _lib.ModeError(
                f"metaload.{self._name}() was entered on thread {self._thread} and exited on "
                f"thread {threading.get_ident()}: a scope belongs to the thread that entered it "
                "(tensors created on that thread stay forced until it exits the scope there)")
        try:
            _calls()[2](self._token)
        except RuntimeError as e:
            raise (_lib.translate(e) or e) from None
        finally:
            if self._forcing:
                _device_init.scope_closed()
            _interplay.restore_fake_mode(self._fake)
            _device_init.restore_forcing(self._was_forcing)
            self._thread = None
        if isinstance(value, RuntimeError) and not isinstance(value, _lib.Error):
            typed = _lib.translate(value)
            if typed is not None:
                raise typed.with_traceback(tb) from None
        return False


class meta(_Scope):
    """Every tensor created on this thread inside the block lands on the meta device.

    Usable as `with metaload.meta():` or as a decorator; scopes nest (each level costs O(1)).
    """

    _forcing = True
    _name = "meta"


class real(_Scope):
    """Inside metaload.meta(): tensors created in this block are real again."""

    _forcing = False
    _name = "real"
