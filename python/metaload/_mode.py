"""metaload.meta() and metaload.real(): the Python face of MetaMode and RealGuard.

The C++ mode (a dispatch-key fallback) forces every tensor the dispatcher creates onto meta. Python
adds one thing the dispatcher cannot see: torch's Python bindings initialise CUDA for `.cuda()`,
`.to("cuda")` and `device="cuda"` *before* dispatching, which fails without a GPU and costs a CUDA
context with one. A TorchFunctionMode rewrites those device arguments to CPU first (the C++ mode
then forces them onto meta), and turns reads of values (tolist, numpy, item) on meta tensors into
metaload.DataDependentError -- except for small tensors made from constants, whose values it tracks
(_values.py).
"""
import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

from . import _interplay, _lib, _to_args, _values

_state = threading.local()


def _stack():
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


def _python_forcing():
    s = _stack()
    return bool(s) and s[-1] == "meta"


def is_forcing():
    """Whether tensors created on this thread now land on meta (the C++ mode's own answer)."""
    return bool(_lib.load().is_forcing())


def forcing_stats():
    """(tensors forced onto meta, bytes not allocated) so far in this process, all threads."""
    tensors, nbytes = _lib.load().forcing_stats()
    return tensors, nbytes


def reset_forcing_stats():
    _lib.load().reset_forcing_stats()


_DataDependentError = _lib.error_class("DataDependentError")
_META = torch.device("meta")
# Devices are rewritten to CPU, not meta: that avoids the CUDA initialisation in torch's Python
# bindings, and the C++ mode then forces CPU onto meta (and counts what it saved).
_CPU = torch.device("cpu")


def _redirect(device):
    """The device to pass on for a requested one: meta stays meta, anything else becomes CPU."""
    if device is None:
        return None
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return _META if d.type == "meta" else _CPU


def _to_args_on_meta(args, kwargs):
    """Tensor.to(...) arguments (after self; any form, _to_args.py) with the device redirected,
    as (args, kwargs); arguments that fit no form go on unchanged (torch raises)."""
    spec = _to_args.parse(args, kwargs)
    if spec is None:
        return list(args), kwargs
    if spec.get("device") is not None:
        spec["device"] = _redirect(spec["device"])
    return [], spec


_READS = {
    torch.Tensor.tolist: "Tensor.tolist()",
    torch.Tensor.numpy: "Tensor.numpy()",
    torch.Tensor.item: "Tensor.item()",
    torch.Tensor.__array__: "numpy.asarray(tensor)",
}


class _MetaFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _interplay.torch_fake_mode_inside():  # entered in this scope: it wins (innermost)
            with _interplay.without_metaload_keys():
                return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if _python_forcing():
            if func in _values.READS and _values.value_of(args[0] if args else None) is not None:
                return _values.read(func, args, kwargs, real)
            if func in _READS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                t = args[0]
                raise _DataDependentError(
                    f"{_READS[func]} reads the values of a meta tensor ({t.dtype}, shape "
                    f"{tuple(t.shape)}), which has none: it was created while metaload forced "
                    "tensors onto meta. Create tensors whose values you need inside "
                    "`with metaload.real():`.")
            if func is torch.Tensor.to:
                rest, kwargs = _to_args_on_meta(args[1:], kwargs)
                args = (args[0], *rest)
            elif func is torch.Tensor.cuda:
                return args[0].to(_CPU)
            elif kwargs.get("device") is not None:
                kwargs["device"] = _redirect(kwargs["device"])
            elif func in _interplay.DEVICE_CONSTRUCTORS and _interplay.accelerator_default():
                # torch's default device (set_default_device, `with torch.device`) is filled in
                # below this mode, before the C++ mode could force it: give cpu here instead.
                kwargs["device"] = _CPU
        try:
            result = func(*args, **kwargs)
        except RuntimeError as e:
            typed = _lib.translate(e)
            if typed is None:
                raise
            raise typed from None
        if _python_forcing():
            _values.track(func, args, kwargs, result, real)
        return result


@contextlib.contextmanager
def meta():
    """Every tensor created on this thread inside the block lands on the meta device."""
    ops = _lib.load()
    try:
        token = ops.enter_meta()
    except RuntimeError as e:
        raise (_lib.translate(e) or e) from None
    _stack().append("meta")
    try:
        with _interplay.outer_fake_mode_set_aside(), _MetaFunctionMode():
            yield
    finally:
        _stack().pop()
        ops.exit_scope(token)


@contextlib.contextmanager
def real():
    """Inside metaload.meta(): tensors created in this block are real again."""
    ops = _lib.load()
    token = ops.enter_real()
    _stack().append("real")
    try:
        yield
    finally:
        _stack().pop()
        ops.exit_scope(token)
