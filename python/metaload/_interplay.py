"""What metaload's Python modes must know about torch 2.x's own device and fake-tensor machinery.

- `with torch.device(d)` and `torch.set_default_device(d)` (torch 2.0+) install a DeviceContext
  TorchFunctionMode. Below metaload's mode on the stack (set_default_device puts it at the
  bottom, `with torch.device` on top of what is there), it fills in `device=` of factories *after*
  metaload's mode has seen the call: a cuda default would reach torch's bindings, which initialise
  CUDA before dispatching (an error without a GPU, a CUDA context with one). metaload's modes
  therefore give those factories an explicit device themselves.
- torch's FakeTensorMode (torch 2.1+ keeps it in the dispatch-mode stack's FAKE slot). The
  innermost scope wins: a FakeTensorMode entered inside a metaload scope gets the calls made in
  it (metaload's dispatch keys are excluded for them); a metaload scope entered inside a
  FakeTensorMode sets it aside until the scope exits.
On torch 1.13 (none of this exists) every function here is a no-op.
"""
import contextlib

import torch

try:  # torch 2.x: the functions DeviceContext gives a device
    from torch.utils._device import DeviceContext, _device_constructors

    DEVICE_CONSTRUCTORS = frozenset(_device_constructors())
except ImportError:
    DeviceContext = None
    DEVICE_CONSTRUCTORS = frozenset()


def default_device():
    """The device torch's DeviceContext below the calling mode will fill in (`with torch.device`
    pushes one on top of the mode stack, set_default_device one at the bottom), or None. Read on
    factory calls inside the modes: usually no mode is below them and it costs one C call."""
    n = torch._C._len_torch_function_stack() if DeviceContext is not None else 0
    for i in range(n - 1, -1, -1):
        mode = torch._C._get_function_stack_at(i)
        if isinstance(mode, DeviceContext):
            return mode.device
    return None


def accelerator_default():
    """Whether torch's default device is one whose use would initialise an accelerator."""
    d = default_device()
    return d is not None and d.type not in ("cpu", "meta")


_FAKE_SLOT = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)


def _metaload_keys():
    parse = getattr(torch._C, "_parse_dispatch_key", None)
    keys = [parse(name) for name in ("DeferredInit", "Fake")] if parse else []
    if _FAKE_SLOT is None or not all(k is not None for k in keys) or not keys:
        return None
    return torch._C.DispatchKeySet(keys[0]) | torch._C.DispatchKeySet(keys[1])


_KEYS = _metaload_keys()


def torch_fake_mode_inside():
    """Whether torch's FakeTensorMode is on (so, inside a metaload scope, it was entered in it:
    the scope set any outer one aside)."""
    return (_KEYS is not None and torch._C._len_torch_dispatch_stack() > 0 and
            torch._C._get_dispatch_mode(_FAKE_SLOT) is not None)


def without_metaload_keys():
    """A guard under which calls skip metaload's MetaMode and FakeMode keys."""
    return torch._C._ExcludeDispatchKeyGuard(_KEYS)


@contextlib.contextmanager
def outer_fake_mode_set_aside():
    """For a metaload scope: an active FakeTensorMode is set aside until the scope exits."""
    if _KEYS is None or torch._C._len_torch_dispatch_stack() == 0:
        yield
        return
    old = torch._C._unset_dispatch_mode(_FAKE_SLOT)
    try:
        yield
    finally:
        if old is not None:
            torch._C._set_dispatch_mode(old)
