"""Tensor.to's arguments, in each form torch documents, as one set of keywords:

    to(dtype, non_blocking=False, copy=False, *, memory_format=...)
    to(device=None, dtype=None, non_blocking=False, copy=False, *, memory_format=...)
    to(other, non_blocking=False, copy=False, *, memory_format=...)

metaload.meta() and metaload.fake() change the device of a .to() call; they parse the call here and
pass torch the keyword form, whichever form the caller used (positional non_blocking and copy
included).
"""
import torch

_TAIL = ("non_blocking", "copy", "memory_format")  # memory_format is keyword-only


def is_device(x) -> bool:
    return isinstance(x, (str, torch.device)) or (isinstance(x, int) and not isinstance(x, bool))


def device_of(x):
    """A device argument as a torch.device (an int is a CUDA index, as torch reads it)."""
    if x is None or isinstance(x, torch.device):
        return x
    return torch.device("cuda", x) if isinstance(x, int) else torch.device(x)


def parse(args, kwargs):
    """The arguments after self as {device, dtype, non_blocking, copy, memory_format} (those
    given; to(other) gives other's device and dtype; device as a torch.device), or None when they
    fit no form of Tensor.to -- the caller then passes them on unchanged and torch raises its own
    TypeError."""
    args = list(args)
    out = {}
    if args and isinstance(args[0], torch.Tensor):  # to(other, ...)
        other = args.pop(0)
        out["device"], out["dtype"] = other.device, other.dtype
        positional, keywords = ("non_blocking", "copy"), _TAIL
    elif args and isinstance(args[0], torch.dtype):  # to(dtype, ...)
        out["dtype"] = args.pop(0)
        positional, keywords = ("non_blocking", "copy"), _TAIL
    elif args and (args[0] is None or is_device(args[0])):  # to(device, dtype, ...)
        out["device"] = args.pop(0)
        positional, keywords = ("dtype", "non_blocking", "copy"), ("dtype",) + _TAIL
    elif args:
        return None
    else:  # keywords only
        positional, keywords = (), ("device", "dtype") + _TAIL
    if len(args) > len(positional):
        return None
    out.update(zip(positional, args))
    for name, value in kwargs.items():
        if name not in keywords or name in out:
            return None
        out[name] = value
    if out.get("device") is not None:
        if not is_device(out["device"]):
            return None
        out["device"] = device_of(out["device"])
    return out
