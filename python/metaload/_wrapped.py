"""Torch functions wrapped while a metaload.meta() scope is open in the process.

Reads: Tensor.tolist() and Tensor.numpy() of meta tensors; torch.load, whose tensors land on meta.

item(), float(), int(), bool() and tolist() of a small tensor made from constants are answered
below Python from the values MetaMode keeps (c10_ext/values.h). Two reads need Python: numpy()
refuses every non-CPU tensor before dispatching, and tolist() of a meta tensor without values fails
in torch's binding with a message about storage. While a meta() scope is open in the process,
these two methods are wrapped: a meta tensor on a forcing thread gets its values as a numpy array,
or a metaload.DataDependentError naming the read; every other call goes straight to torch's method.
torch.load on a forcing thread loads as with map_location="meta" (shapes and dtypes, no data read
on 2.x); without it the unpickler sets the file's cpu storages into tensors MetaMode made on meta.

Random initialisers (torch.nn.init.uniform_, normal_, trunc_normal_, kaiming_*, xavier_*,
orthogonal_): on a forcing thread, a weight on meta without values (a plain Tensor or
Parameter above kMaxValueElements elements, so MetaMode keeps no values for it) is returned as it
is. A meta tensor has no values to fill and the meta kernels consume no random numbers, so the
result and the generators' state are those of the real call; what is skipped is the Python around
it (fan computation, no_grad, the dispatch), more than half of what an nn.Linear costs to build on
meta. Each keeps the argument checks that raise (mode, nonlinearity, dimensions, a > b, std < 0).
Small tensors, subclasses (their __torch_function__ decides) and tensors off meta go to torch.

torch 1.13 only: torch.tensor / as_tensor / Tensor.new_tensor with a cuda device copy their data to
the device inside the binding, with every dispatch key above the backends switched off, so MetaMode
never sees the copy (2.x has a flag to hand the CPU tensor over first: _device_init.py). On a
forcing thread their device is given as cpu; MetaMode then puts the result on meta as ever.
"""
import threading

import torch

from . import _lib, _seeding, _thread_scope

_lock = threading.Lock()
_originals = {}
_own = {}  # (owner, name): whether owner defines it itself (else inherits it)
# metaload.real, for _numpy: a hook _mode.py sets, as _mode imports this module (through
# _device_init) and importing it here would close a circle.
real_scope = None


def _no_values(t, what):
    hint = _lib.load().random_draws_hint()  # c10_ext/random_draws.h: "" unless a draw was skipped
    return _lib.DataDependentError(
        f"{what} reads the values of a meta tensor ({t.dtype}, shape {tuple(t.shape)}), which "
        "has none: it was created while metaload forced tensors onto meta, and only small "
        "tensors made from constants (arange, linspace, torch.tensor, ...) or drawn at random "
        "on cpu keep values. Create tensors whose values you need inside "
        "`with metaload.real():`." + hint)


def _tolist(self):
    original = _originals[(torch.Tensor, "tolist")]
    if not (self.is_meta and _thread_scope.forcing_here()):
        return original(self)
    try:
        return original(self)
    except RuntimeError:
        raise _no_values(self, "Tensor.tolist()") from None


def _numpy(self, *args, **kwargs):
    original = _originals[(torch.Tensor, "numpy")]
    if not (self.is_meta and _thread_scope.forcing_here()):
        return original(self, *args, **kwargs)
    try:
        values = _originals[(torch.Tensor, "tolist")](self)
    except RuntimeError:
        raise _no_values(self, "Tensor.numpy()") from None
    with real_scope():
        return original(torch.tensor(values, dtype=self.dtype), *args, **kwargs)


_MAX_VALUE_ELEMENTS = 4096  # c10_ext/values.h kMaxValueElements: larger meta tensors keep no values
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _skips(tensor):
    """Whether a random initialiser may return `tensor` untouched (see the module's docstring)."""
    return (type(tensor) in _PLAIN and tensor.is_meta and tensor.numel() > _MAX_VALUE_ELEMENTS
            and _thread_scope.forcing_here())


_valid_kaiming = set()  # (type(a), a, mode, nonlinearity) that torch's checks accepted


def _two_dims(tensor, *rest, **kwargs):
    if tensor.dim() < 2:
        raise _Unchecked  # torch's ValueError (fan in and out, orthogonal_)


def _kaiming(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", *rest, **kwargs):
    _two_dims(tensor)
    try:
        key = (type(a), a, mode, nonlinearity)
        if key in _valid_kaiming:  # the checks below depend on these alone for >= 2 dimensions
            return
    except TypeError:  # unhashable: check every time
        key = None
    init = torch.nn.init
    init._calculate_correct_fan(tensor, mode)  # ValueError: a mode other than fan_in / fan_out
    init.calculate_gain(nonlinearity, a)  # ValueError: an unknown nonlinearity, a bad slope
    if key is not None:
        _valid_kaiming.add(key)


def _uniform(tensor, a=0.0, b=1.0, *rest, **kwargs):
    if a > b:  # reversed bounds: torch's call decides what they mean
        raise _Unchecked


def _normal(tensor, mean=0.0, std=1.0, *rest, **kwargs):
    if std < 0:
        raise _Unchecked


def _trunc_normal(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, *rest, **kwargs):
    if mean < a - 2 * std or mean > b + 2 * std:  # the real call warns
        raise _Unchecked


class _Unchecked(Exception):
    """A check that the real call makes with its own error: let torch raise it."""


def _skip_init(name, check):
    original = getattr(torch.nn.init, name)

    def wrapper(tensor, *args, **kwargs):
        if _skips(tensor):
            try:
                check(tensor, *args, **kwargs)
                _seeding.note_skipped(kwargs.get("generator"))  # the draw eager would make
                return tensor
            except _Unchecked:
                pass
        return original(tensor, *args, **kwargs)

    wrapper.__doc__ = original.__doc__
    wrapper.__name__ = name
    wrapper.__wrapped__ = original
    return wrapper


_INITS = {"uniform_": _uniform, "normal_": _normal, "trunc_normal_": _trunc_normal,
          "kaiming_uniform_": _kaiming, "kaiming_normal_": _kaiming, "xavier_uniform_": _two_dims,
          "xavier_normal_": _two_dims, "orthogonal_": _two_dims}
# Not sparse_: it draws a CPU randperm even for a meta tensor, so skipping it would change the state.


def _with_cpu_device(original, device_position):
    def wrapper(*args, **kwargs):
        if _thread_scope.forcing_here():
            if len(args) > device_position:
                args = args[:device_position] + ("cpu",) + args[device_position + 1:]
            elif kwargs.get("device") is not None:
                kwargs["device"] = "cpu"
        return original(*args, **kwargs)

    wrapper.__doc__ = original.__doc__
    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    return wrapper


def _load(f, *args, **kwargs):
    """torch.load on a forcing thread: every tensor it makes lands on meta, as with
    map_location="meta" (the unpickler makes an empty tensor on the storage's device, which
    MetaMode puts on meta, and then sets a cpu storage into it: torch's storage-device error)."""
    if _thread_scope.forcing_here():
        if args:
            args = ("meta",) + args[1:]
        else:
            kwargs["map_location"] = "meta"
    return _originals[(torch, "load")](f, *args, **kwargs)


_WRAPPERS = {(torch.Tensor, "tolist"): _tolist, (torch.Tensor, "numpy"): _numpy,
             (torch, "load"): _load}
_WRAPPERS.update({(torch.nn.init, name): _skip_init(name, check) for name, check in _INITS.items()
                  if hasattr(torch.nn.init, name)})
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
