"""Torch functions wrapped while a metaload.meta() scope is open in the process.

Reads: Tensor.tolist() and Tensor.numpy() of meta tensors.

item(), float(), int(), bool() and tolist() of a small tensor made from constants are answered
below Python from the values MetaMode keeps (c10_ext/values.h). Two reads need Python: numpy()
refuses every non-CPU tensor before dispatching, and tolist() of a meta tensor without values fails
in torch's binding with a message about storage. While a meta() scope is open in the process,
these two methods are wrapped: a meta tensor on a forcing thread gets its values as a numpy array,
or a metaload.DataDependentError naming the read; every other call goes straight to torch's method.

torch 1.13 only: torch.tensor / as_tensor / Tensor.new_tensor with a cuda device copy their data to
the device inside the binding, with every dispatch key above the backends switched off, so MetaMode
never sees the copy (2.x has a flag to hand the CPU tensor over first: _device_init.py). On a
forcing thread their device is given as cpu; MetaMode then puts the result on meta as ever.
"""
import threading

import torch

from . import _device_init, _lib

_lock = threading.Lock()
_originals = {}
_own = {}  # (owner, name): whether owner defines it itself (else inherits it)


def _no_values(t, what):
    return _lib.DataDependentError(
        f"{what} reads the values of a meta tensor ({t.dtype}, shape {tuple(t.shape)}), which "
        "has none: it was created while metaload forced tensors onto meta, and only small "
        "tensors made from constants (arange, linspace, torch.tensor, ...) keep values. Create "
        "tensors whose values you need inside `with metaload.real():`.")


def _tolist(self):
    original = _originals[(torch.Tensor, "tolist")]
    if not (self.is_meta and _device_init.forcing_here()):
        return original(self)
    try:
        return original(self)
    except RuntimeError:
        raise _no_values(self, "Tensor.tolist()") from None


def _numpy(self, *args, **kwargs):
    original = _originals[(torch.Tensor, "numpy")]
    if not (self.is_meta and _device_init.forcing_here()):
        return original(self, *args, **kwargs)
    try:
        values = _originals[(torch.Tensor, "tolist")](self)
    except RuntimeError:
        raise _no_values(self, "Tensor.numpy()") from None
    from ._mode import real
    with real():
        return original(torch.tensor(values, dtype=self.dtype), *args, **kwargs)


def _with_cpu_device(original, device_position):
    def wrapper(*args, **kwargs):
        if _device_init.forcing_here():
            if len(args) > device_position:
                args = args[:device_position] + ("cpu",) + args[device_position + 1:]
            elif kwargs.get("device") is not None:
                kwargs["device"] = "cpu"
        return original(*args, **kwargs)

    wrapper.__doc__ = original.__doc__
    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    return wrapper


_WRAPPERS = {(torch.Tensor, "tolist"): _tolist, (torch.Tensor, "numpy"): _numpy}
if not hasattr(torch._C, "_set_only_lift_cpu_tensors"):  # torch 1.13
    _WRAPPERS[(torch, "tensor")] = _with_cpu_device(torch.tensor, 99)  # device: keyword only
    _WRAPPERS[(torch, "as_tensor")] = _with_cpu_device(torch.as_tensor, 2)
    _WRAPPERS[(torch.Tensor, "new_tensor")] = _with_cpu_device(torch.Tensor.new_tensor, 99)


def wrap():
    """While a meta() scope is open (first scope in the process)."""
    with _lock:
        for (owner, name), wrapper in _WRAPPERS.items():
            _originals.setdefault((owner, name), getattr(owner, name))
            _own.setdefault((owner, name), name in vars(owner))
            setattr(owner, name, wrapper)


def unwrap():
    """When the last meta() scope in the process closes."""
    with _lock:
        for (owner, name), wrapper in _WRAPPERS.items():
            if getattr(owner, name) is wrapper:
                if _own[(owner, name)]:
                    setattr(owner, name, _originals[(owner, name)])
                else:  # inherited (from torch._C.TensorBase): inherited again
                    delattr(owner, name)
