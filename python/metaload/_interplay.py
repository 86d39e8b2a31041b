"""What metaload's Python modes must know about torch 2.x's own device and fake-tensor machinery.

- `with torch.device(d)` and `torch.set_default_device(d)` (torch 2.0+) install a DeviceContext
  TorchFunctionMode that fills in `device=` of factories. meta() needs nothing from it: the device
  reaches MetaMode's fallback, which forces it onto meta (and _device_init.py keeps torch's binding
  from initialising CUDA for it). fake() gives factories its own device first (_fake.py).
- torch's FakeTensorMode (torch 2.1+ keeps it in the dispatch-mode stack's FAKE slot). The
  innermost scope wins: a FakeTensorMode entered inside a metaload scope gets the calls made in
  it (metaload's dispatch keys are excluded for them); a metaload scope entered inside a
  FakeTensorMode sets it aside until the scope exits.
On torch 1.13 (none of this exists) every function here is a no-op.
"""
import contextlib

import torch

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


def set_fake_mode_aside():
    """For a metaload scope: an active FakeTensorMode is set aside until restore_fake_mode."""
    if _KEYS is None or torch._C._len_torch_dispatch_stack() == 0:
        return None
    return torch._C._unset_dispatch_mode(_FAKE_SLOT)


def restore_fake_mode(old):
    if old is not None:
        torch._C._set_dispatch_mode(old)


@contextlib.contextmanager
def outer_fake_mode_set_aside():
    """The same, as a context manager."""
    old = set_fake_mode_aside()
    try:
        yield
    finally:
        restore_fake_mode(old)
