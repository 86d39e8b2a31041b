"""metaload.fake(device) and metaload.scan(): shapes, dtypes and devices without memory or compute.

The C++ FakeMode does the work. Python adds what the dispatcher cannot see: torch's Python bindings
pass an explicit cpu device to factories when none is given (so the mode's device is filled in
here), and initialise CUDA before dispatching for device="cuda" / .cuda() (so those calls are made
on cpu and moved with metaload.fake_to, which does the .to() in C++).
"""
import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

from . import _lib

_state = threading.local()

# torch functions that make tensors from nothing and take a `device` keyword.
_FACTORIES = {
    torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
    torch.arange, torch.linspace, torch.logspace, torch.eye, torch.tensor, torch.as_tensor,
    torch.scalar_tensor, torch.empty_strided, torch.randperm, torch.range, torch.tril_indices,
    torch.triu_indices, torch.hann_window, torch.hamming_window, torch.bartlett_window,
    torch.blackman_window, torch.kaiser_window,
}


# Tensor methods that make new tensors on self's device (or a given one).
_NEW_METHODS = {
    torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty, torch.Tensor.new_full,
    torch.Tensor.new_tensor, torch.Tensor.new_empty_strided,
}


def _mode_device():
    stack = getattr(_state, "devices", None)
    return stack[-1] if stack else None


def _needs_cuda_detour(device):
    return device is not None and torch.device(device).type not in ("cpu", "meta")


class _FakeFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        target = None
        mode_device = _mode_device()
        if mode_device is not None:
            if func in _FACTORIES:
                if kwargs.get("device") is None and not (func is torch.as_tensor and args and
                                                         isinstance(args[0], torch.Tensor)):
                    kwargs["device"] = mode_device
                if _needs_cuda_detour(kwargs.get("device")):
                    target = torch.device(kwargs["device"])
                    kwargs["device"] = "cpu"
            elif func in _NEW_METHODS:
                device = kwargs.get("device")
                device = args[0].device if device is None else torch.device(device)
                if _needs_cuda_detour(device):
                    # Same call on a cpu tensor of the same dtype, then moved in C++.
                    target = device
                    kwargs.pop("device", None)
                    args = (torch.empty(0, dtype=args[0].dtype, device="cpu"), *args[1:])
            elif func is torch.Tensor.to:
                args, kwargs, target = _detour_to(args, kwargs)
            elif func is torch.Tensor.cuda:
                index = args[1] if len(args) > 1 else kwargs.get("device")
                target = torch.device("cuda", index if isinstance(index, int) else 0) \
                    if not isinstance(index, (str, torch.device)) else torch.device(index)
                return _to_device(args[0], target)
            elif "device" in kwargs and _needs_cuda_detour(kwargs["device"]):
                target = torch.device(kwargs["device"])
                kwargs["device"] = "cpu"
        try:
            out = func(*args, **kwargs)
        except RuntimeError as e:
            typed = _lib.translate(e)
            if typed is None:
                raise
            raise typed from None
        if target is not None and isinstance(out, torch.Tensor):
            leaf_grad = out.requires_grad and out.grad_fn is None
            out = _to_device(out.detach() if leaf_grad else out, target)
            if leaf_grad:
                out.requires_grad_(True)
        return out


def _to_device(t, device):
    return _lib.load().fake_to(t, str(device))


def _detour_to(args, kwargs):
    """Tensor.to(...) with a cuda device: do the rest on the tensor's own device, then move."""
    self, rest = args[0], list(args[1:])
    device = kwargs.pop("device", None)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        kwargs.setdefault("dtype", other.dtype)
        device = other.device
    elif rest and (isinstance(rest[0], (str, torch.device)) or
                   (isinstance(rest[0], int) and not isinstance(rest[0], bool))):
        device = rest.pop(0)
        if isinstance(device, int):
            device = torch.device("cuda", device)
    if device is None or not _needs_cuda_detour(device):
        if device is not None:
            kwargs["device"] = device
        return (self, *rest), kwargs, None
    return (self, *rest), kwargs, torch.device(device)


@contextlib.contextmanager
def fake(device="cpu"):
    """Inside the block, tensors are fake: shapes, dtypes and `device` (cpu or cuda:N, also
    without a GPU), no memory. Parameters built under metaload.meta() count as on `device`."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    ops = _lib.load()
    try:
        token = ops.enter_fake(str(device))
    except RuntimeError as e:
        raise (_lib.translate(e) or e) from None
    stack = getattr(_state, "devices", None)
    if stack is None:
        stack = _state.devices = []
    stack.append(device)
    try:
        with _FakeFunctionMode():
            yield device
    finally:
        stack.pop()
        ops.exit_scope(token)


def is_fake(t):
    return isinstance(t, torch.Tensor) and bool(_lib.load().is_fake(t))


def scan(model, *inputs, device="cpu", **kwargs):
    """Runs `model` on fake tensors and returns {module path: (shape, dtype)} for every submodule
    whose output is a tensor (the root module under ""), without memory and without computing.

    Inputs may be real tensors (they count as on their own device), meta tensors (on `device`) or
    anything the model accepts; nothing is allocated and no weights are needed (build the model
    under metaload.meta())."""
    shapes = {}
    hooks = []
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)

    def record(path):
        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(out, torch.Tensor):
                shapes[path] = (tuple(out.shape), out.dtype)
        return hook

    for path, module in model.named_modules():
        hooks.append(module.register_forward_hook(record(path)))
    try:
        with torch.no_grad(), fake(device):
            inputs = tuple(_to_device(x, device) if isinstance(x, torch.Tensor) and
                           _needs_cuda_detour(device) and not x.is_meta else x for x in inputs)
            model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return shapes
