"""Values of small meta tensors computed from constants, tracked inside metaload.meta().

Some constructors compute a few numbers with torch and read them back: torchvision's RegNets
derive their stage widths with torch.arange / round / log and `.tolist()`. Under meta() those
tensors land on meta like every other, and the read would be a DataDependentError. So a tensor
made by a factory from values (torch.tensor, arange, linspace, ...) with at most LIMIT elements
keeps a real CPU copy of its values next to it (the attribute `_metaload_value`); every op whose
meta inputs all carry values computes the values of its (small) outputs too, and reads (tolist,
item, float, numpy, ...) return them. The tensors themselves stay on meta; weights (empty, zeros,
randn, module parameters) never get values, and an op that mixes a tracked tensor with an untracked
meta tensor drops what it cannot know (also the values of an input it modifies in place).
"""
import torch

LIMIT = 4096  # elements: enough for every constructor-time table seen; bounded memory
_ATTR = "_metaload_value"

FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.arange, torch.range, torch.linspace,
                       torch.logspace, torch.scalar_tensor})

# Reads that return Python values: answered from the tracked values.
READS = frozenset({torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.item,
                   torch.Tensor.__array__, torch.Tensor.__bool__, torch.Tensor.__int__,
                   torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__complex__})

_CPU = torch.device("cpu")
_CONVERSIONS = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu,
                          torch.Tensor.type_as})


def value_of(t):
    return getattr(t, _ATTR, None) if isinstance(t, torch.Tensor) else None


def _attach(result, value):
    if (isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor) and result.is_meta
            and value.shape == result.shape and value.dtype == result.dtype):
        setattr(result, _ATTR, value)


def _tensors(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _swap(x):
    """An argument with tracked meta tensors replaced by their values, devices by cpu."""
    if isinstance(x, torch.Tensor):
        v = value_of(x)
        return v if v is not None else x
    if isinstance(x, (list, tuple)):
        return type(x)(_swap(y) for y in x)
    if isinstance(x, torch.device) or (isinstance(x, str) and x.split(":")[0] in ("cuda", "meta")):
        return _CPU
    return x


def _mutates(func):
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.endswith("_") and not name.endswith("__")) or \
        name.startswith("__i")


def track(func, args, kwargs, result, real):
    """After `func(*args, **kwargs)` gave `result` under meta(): attach the values it can know.
    `real` is the metaload.real context manager (values are computed on real CPU tensors)."""
    metas = [t for t in _tensors(args, kwargs) if t.is_meta]
    untracked = any(value_of(t) is None for t in metas)
    if func in FACTORIES:
        if untracked or not isinstance(result, torch.Tensor) or result.numel() > LIMIT:
            return
    elif not metas or untracked:
        if untracked and _mutates(func) and args and value_of(args[0]) is not None:
            delattr(args[0], _ATTR)  # modified by something whose values are unknown
        return
    outputs = result if isinstance(result, (list, tuple)) else (result,)
    if not any(isinstance(o, torch.Tensor) and o.is_meta and o.numel() <= LIMIT for o in outputs) \
            and not _mutates(func):
        return
    try:
        with real():
            if func in _CONVERSIONS:
                values = value_of(args[0]).to(dtype=result.dtype)
            else:
                kw = {k: _swap(v) for k, v in kwargs.items()}
                if func in FACTORIES:  # not torch's default device (a torch.device context)
                    kw["device"] = _CPU
                values = func(*[_swap(a) for a in args], **kw)
    except Exception:  # values are a bonus: an op they cannot follow just leaves them unknown
        if _mutates(func) and args and value_of(args[0]) is not None:
            delattr(args[0], _ATTR)
        return
    if isinstance(result, (list, tuple)) and isinstance(values, (list, tuple)):
        for r, v in zip(result, values):
            _attach(r, v)
    else:
        _attach(result, values)


def read(func, args, kwargs, real):
    """A read (tolist, item, ...) of a tracked meta tensor, answered from its values."""
    with real():
        return func(value_of(args[0]), *args[1:], **kwargs)
