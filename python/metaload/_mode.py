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

from . import _device_init, _imports, _interplay, _lib, _seeding, _thread_scope, _wrapped


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
        # The first scope of any kind also registers fake()'s dispatch key (fake_mode.cc says
        # why); where it cannot be, the first fake() scope raises the reason.
        try:
            ops.register_fake_key()
        except RuntimeError:
            pass
    return _scope_calls


_tls = threading.local()  # .scopes: this thread's open metaload scopes, outermost first


def _open_scopes():
    scopes = getattr(_tls, "scopes", None)
    if scopes is None:
        scopes = _tls.scopes = []
    return scopes


def innermost():
    """This thread's innermost open metaload scope (meta(), real() or fake()), or None."""
    scopes = getattr(_tls, "scopes", None)
    return scopes[-1] if scopes else None


class _Scope(contextlib.ContextDecorator):
    """One C++ scope (MetaMode, RealGuard or FakeMode) entered and exited on the same thread.

    The innermost open scope decides what tensors created on the thread are: meta() meta, real()
    real, fake() fake (each switches the others off in C++ until it exits, c10_ext/meta_mode.h).
    Scopes exit innermost first. An outer scope exited while scopes entered inside it are still
    open closes them with it (innermost first) and then raises ModeError: the thread is back in the
    state it had before the outer scope was entered, and the inner scopes count as closed."""

    _forcing = None  # meta(): True, real(): False (fake() overrides _enter_here and _leave_here)
    _name = ""
    device = None  # the device fake tensors claim in this scope (fake() only)
    _thread = None  # the thread it is open on; None while closed
    _closed_by = None  # the outer scope whose out-of-order exit closed it

    def _recreate_cm(self):  # as a decorator: a fresh scope per call (recursion, threads)
        return type(self)()

    def _label(self):
        return f"metaload.{self._name}()"

    def __enter__(self):
        if self._thread is not None:
            raise _lib.ModeError(f"this {self._label()} object is already open; "
                                 f"each `with` needs a fresh {self._label()}")
        token = self._enter_cpp()
        self._token, self._closed_by = token, None
        try:
            self._enter_here()
        except BaseException:
            _calls()[2](token)
            raise
        self._thread = threading.get_ident()
        _open_scopes().append(self)
        return self._value()

    def _enter_cpp(self):
        enter_meta, enter_real, _ = _calls()
        try:
            return enter_meta() if self._forcing else enter_real()
        except RuntimeError as e:
            raise (_lib.translate(e) or e) from None

    def _enter_here(self):
        """What Python switches besides the C++ scope (undone by _leave_here)."""
        self._was = _thread_scope.set_scope(self._name)
        self._fake = _interplay.set_fake_mode_aside() if self._forcing else None
        if self._forcing:
            _device_init.install()
            _imports.install()
            _seeding.install()
            _device_init.scope_opened()

    def _leave_here(self):
        if self._forcing:
            _device_init.scope_closed()
        _interplay.restore_fake_mode(self._fake)
        _thread_scope.restore_scope(self._was)

    def _value(self):
        return None

    def __exit__(self, typ, value, tb):
        self._check_open()
        scopes = _tls.scopes
        if scopes[-1] is self:
            scopes.pop()
            self._close()
        else:
            self._close_with_inner(scopes)
        if isinstance(value, RuntimeError) and not isinstance(value, _lib.Error):
            typed = _lib.translate(value)
            if typed is not None:
                raise typed.with_traceback(tb) from None
        return False

    def _check_open(self):
        if self._thread == threading.get_ident():
            return
        if self._thread is None:
            why = (f"it was closed when {self._closed_by}, entered around it, exited first"
                   if self._closed_by else "it was never entered, or it was exited already")
            raise _lib.ModeError(f"{self._label()} is not open: {why}; each scope is exited once, "
                                 "innermost first")
        raise _lib.ModeError(
            f"{self._label()} was entered on thread {self._thread} and exited on "
            f"thread {threading.get_ident()}: a scope belongs to the thread that entered it "
            "(tensors created on that thread stay forced until it exits the scope there)")

    def _close(self):
        try:
            _calls()[2](self._token)
        except RuntimeError as e:
            raise (_lib.translate(e) or e) from None
        finally:
            self._leave_here()
            self._thread = None

    def _close_with_inner(self, scopes):
        """Out of order: this scope exits while scopes entered inside it are open. They close with
        it, innermost first, and the exit is a ModeError saying so."""
        at = len(scopes) - 1
        while scopes[at] is not self:
            at -= 1
        inner = scopes[at + 1:]
        del scopes[at:]
        failed = None
        for scope in inner[::-1] + [self]:  # innermost first
            scope._closed_by = self._label() if scope is not self else None
            try:
                scope._close()
            except _lib.Error as e:  # the C++ stack disagrees: close the rest all the same
                failed = failed or e
        if failed is not None:
            raise failed
        names = ", ".join(s._label() for s in inner)
        several = len(inner) > 1
        raise _lib.ModeError(
            f"{self._label()} exited while {names}, entered inside it, {'were' if several else 'was'}"
            f" still open: scopes exit innermost first. {'They were' if several else 'It was'} "
            f"closed with it; this thread is back in the state it had before {self._label()} was "
            "entered")


class meta(_Scope):
    """Every tensor created on this thread inside the block lands on the meta device.

    Usable as `with metaload.meta():` or as a decorator; scopes nest (each level costs O(1)). The
    innermost of meta(), real() and fake() decides: meta() inside fake() makes meta tensors, and
    leaving it gives fake() back its own."""

    _forcing = True
    _name = "meta"


class real(_Scope):
    """Tensors created in this block are real: inside metaload.meta() or metaload.fake() (the
    innermost scope decides), until the block exits."""

    _forcing = False
    _name = "real"


_wrapped.real_scope = real  # the hook _wrapped's numpy() enters (see real_scope there)
_imports.real_scope = real  # what a module imported inside a forcing scope runs under
