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
import sys

import torch

from . import _lib

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


# ---- bitsandbytes' quantized layers without weights ----------------------------------------------
# A Linear4bit / Linear8bitLt built under metaload.meta() holds its weight unquantized on meta (the
# quantization happens when bitsandbytes moves it to a device), so its forward -- which wants a
# quant_state or SCB -- fails on fake inputs (nnsight's users meet this when scanning a model made
# with BitsAndBytesConfig). Under fake(), such a layer computes what it would return: x's leading
# dims by out_features, in x's dtype and device. So does a layer with real (packed) weights given a
# fake input (a scan of a loaded model: bitsandbytes' kernels have no fake implementation, nnsight
# #86 / #106); real inputs run bitsandbytes' own forward.

_BNB_PATCHED = set()


def _bnb_shape_forward(original):
    def forward(self, x, *args, **kwargs):
        if self.weight is None or not (x.is_meta or _lib.is_fake(x)):
            return original(self, x, *args, **kwargs)
        if x.shape[-1] != self.in_features:
            raise _shape_error(f"{type(self).__name__}: input of {x.shape[-1]} features, the layer "
                               f"takes {self.in_features}")
        return x.new_empty(tuple(x.shape[:-1]) + (self.out_features,))

    forward.__wrapped__ = original
    return forward


def _shape_error(message):
    return _lib.error_class("ShapeError")(message)


def patch_bitsandbytes_layers():
    """Wraps the forward of bitsandbytes' Linear4bit / Linear8bitLt (once; only if the program
    imported bitsandbytes) as described above."""
    bnb_nn = getattr(sys.modules.get("bitsandbytes"), "nn", None)
    if bnb_nn is None:
        return
    for name in ("Linear4bit", "Linear8bitLt"):
        cls = getattr(bnb_nn, name, None)
        if cls is None or cls in _BNB_PATCHED:
            continue
        cls.forward = _bnb_shape_forward(cls.forward)
        _BNB_PATCHED.add(cls)


# ---- transformers' test for a traced forward ------------------------------------------------------
# transformers decides whether a forward is being traced (and so must not branch on values: the
# padding mask's all(), the causal-mask skip) with `is_tracing(tensor)`, which asks whether the
# tensor is torch's FakeTensor. metaload's fake tensors are fake too: under fake(), that question
# says so, and the forward takes the traced path as it does under torch's FakeTensorMode (nnsight's
# scan passes an attention mask, whose all() would otherwise be a DataDependentError).

_TF_PATCHED = []


def patch_transformers_fake_check():
    """Wraps transformers' is_fake_tensor (once; only if the program imported transformers)."""
    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None)
    if original is None or _TF_PATCHED:
        return

    def is_fake_tensor(x):
        return original(x) or _lib.is_fake(x)

    is_fake_tensor.__wrapped__ = original
    utils.is_fake_tensor = is_fake_tensor
    _TF_PATCHED.append(original)
