"""metaload.fake(device): shapes, dtypes and devices without memory or compute (metaload.scan,
which runs a model under it, is in _scan.py).

The C++ FakeMode does the work. Python adds what the dispatcher cannot see: torch's Python bindings
pass an explicit cpu device to factories when none is given (so the mode's device is filled in
here), and initialise CUDA before dispatching for device="cuda" / .cuda() (so those calls are made
on cpu and moved with metaload.fake_to, which does the .to() in C++).
"""
import torch
from torch.overrides import TorchFunctionMode

from . import _device_init, _imports, _interplay, _lib, _mode, _thread_scope, _to_args

# torch functions that make tensors from nothing and take a `device` keyword.
_FACTORIES = {
    torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
    torch.arange, torch.linspace, torch.logspace, torch.eye, torch.tensor, torch.as_tensor,
    torch.scalar_tensor, torch.empty_strided, torch.randperm, torch.range, torch.tril_indices,
    torch.triu_indices, torch.hann_window, torch.hamming_window, torch.bartlett_window,
    torch.blackman_window, torch.kaiser_window,
}
# ... and those of newer torches (2.x's default device would fill in theirs: cuda init).
_FACTORIES |= {f for f in (getattr(torch, "asarray", None), getattr(torch, "empty_permuted", None),
                           getattr(torch.fft, "fftfreq", None),
                           getattr(torch.fft, "rfftfreq", None)) if f is not None}


# Tensor methods that make new tensors on self's device (or a given one).
_NEW_METHODS = {
    torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty, torch.Tensor.new_full,
    torch.Tensor.new_tensor, torch.Tensor.new_empty_strided,
}


# torch functions that make a tensor like a given one, on its device unless told otherwise: torch
# 1.13's bindings initialise CUDA for a cuda `input` before dispatching.
_LIKE = {
    torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like,
    torch.randn_like, torch.randint_like,
}

_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


def _mode_device():
    """The device of the innermost scope if it is a fake() one; None inside meta() or real() (then
    calls go to torch as they are: the C++ mode of that scope decides)."""
    scope = _mode.innermost()
    return scope.device if scope is not None else None


def _needs_cuda_detour(device):
    return device is not None and torch.device(device).type not in ("cpu", "meta")


def _typed_call(func, args, kwargs):
    """func(*args, **kwargs), the extension's errors raised as metaload.<Kind>."""
    try:
        return func(*args, **kwargs)
    except RuntimeError as e:
        typed = _lib.translate(e)
        if typed is None:
            raise
        raise typed from None


class _FakeFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _interplay.torch_fake_mode_inside():  # entered in this scope: it wins (innermost)
            with _interplay.without_metaload_keys():
                return func(*args, **(kwargs or {}))
        if _stand_ins[0]:  # a scan stood in for a data-dependent module output (_scan.py)
            return _propagate(_dispatch, func, args, kwargs or {})
        if func not in _SPECIAL and not (kwargs and "device" in kwargs):
            # Nothing to change (most calls: ops, .shape, .dtype, ...): the C++ FakeMode does it.
            return _typed_call(func, args, kwargs or {})
        return _dispatch(func, args, kwargs)


def _dispatch(func, args, kwargs):
    """One call inside fake(): the changes __torch_function__ makes (a factory's device, the cuda
    detours, the shape rules below), then the call."""
    if func not in _SPECIAL and not (kwargs and "device" in kwargs):
        return _typed_call(func, args, kwargs or {})
    rule = _SHAPE_RULES.get(func)
    if rule is not None:
        out = rule(*args, **(kwargs or {}))
        if out is not NotImplemented:
            return out
    kwargs = dict(kwargs or {})
    target = None
    mode_device = _mode_device()
    if mode_device is not None:
        if func in _FACTORIES:
            if kwargs.get("device") is None and not (
                    func in (torch.as_tensor, torch.asarray) and args and
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
        elif func in _LIKE and args and isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            device = args[0].device if device is None else torch.device(device)
            if _needs_cuda_detour(device):
                # Same call made on cpu (same shape, dtype and strides), then moved in C++.
                target = device
                kwargs["device"] = "cpu"
        elif func in _INDEXING and len(args) > 1 and _needs_cuda_detour(args[0].device):
            args = (args[0], _index_lists_on_cpu(args[1]), *args[2:])
        elif (_RPOW_MAKES_A_TENSOR and func is torch.Tensor.__rpow__ and len(args) == 2 and
              _needs_cuda_detour(args[0].device)):
            func, args = torch.pow, _rpow_args(*args)
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
    out = _typed_call(func, args, kwargs)
    if target is not None and isinstance(out, torch.Tensor):
        leaf_grad = out.requires_grad and out.grad_fn is None
        out = _to_device(out.detach() if leaf_grad else out, target)
        if leaf_grad:
            out.requires_grad_(True)
    return out


# torch 1.13's Tensor.__rpow__(self, other) is torch.tensor(other, dtype, device=self.device)
# ** self: the tensor made on a cuda fake's device initialises CUDA (2.x's: torch.pow(other, self)).
_RPOW_MAKES_A_TENSOR = int(torch.__version__.split(".")[0]) < 2

# ---- shape rules torch's kernels get wrong for fake tensors --------------------------------------
# Each takes the call's arguments and returns its result, or NotImplemented to leave the call to
# torch (real tensors, or a case torch's own kernel already answers as a real run would).

def _is_shape_only(t):
    return isinstance(t, torch.Tensor) and (t.is_meta or is_fake(t))


def _one_hot(tensor, num_classes=-1):
    """F.one_hot: libtorch checks the class values (min().item()) on every tensor that is not on
    the Meta backend, and fake tensors claim cpu or cuda. Its result is [*tensor.shape,
    num_classes] int64, whatever the values; with num_classes=-1 the count is max() + 1, which
    only the values know. A real tensor inside fake() gives a fake result, as every op there."""
    if not (_is_shape_only(tensor) or _mode_device() is not None):
        return NotImplemented  # real tensors inside real(): torch's one_hot
    if tensor.dtype != torch.long:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        raise _lib.DataDependentError(
            f"torch.nn.functional.one_hot with num_classes=-1 of a fake or meta tensor "
            f"({tensor.dtype} {tuple(tensor.shape)}): the class count is its maximum + 1, a value "
            "it does not hold; pass num_classes")
    if num_classes < 0 and tensor.numel() > 0:
        raise RuntimeError("num_classes should be positive")
    return tensor.unsqueeze(-1).expand(*tensor.shape, num_classes).contiguous()


# histc of integers and _grouped_mm in float32 / float16 on a fake cpu device are checked in C++
# (fake_mode/cpu_rules.h), below any Python mode: one_hot cannot be, as libtorch decomposes it above
# the Fake key (autograd's CompositeImplicit kernel).
_SHAPE_RULES = {torch.nn.functional.one_hot: _one_hot}


# ---- outputs a scan could not compute -------------------------------------------------------
# When a module's forward reads values a fake tensor does not have (MoE routing: which experts a
# token picked), metaload.scan (_scan.py) marks the module data-dependent and hands its caller a
# stand-in output. The stand-in's shape is nobody's claim: it and everything computed from it
# carry the reason (_DATA_DEPENDENT) and a scan reports them as data-dependent, never their shape.
# _stand_ins[0] counts the stand-ins made so far; while it is 0 nothing below runs.

_DATA_DEPENDENT = "_metaload_data_dependent"
_stand_ins = [0]


def data_dependent_reason(t):
    """Why `t`'s shape is not known (a stand-in or computed from one), or None."""
    return getattr(t, _DATA_DEPENDENT, None) if isinstance(t, torch.Tensor) else None


def mark_data_dependent(t, reason):
    setattr(t, _DATA_DEPENDENT, reason)
    return t


def _tensors_in(x, found):
    if isinstance(x, torch.Tensor):
        found.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            _tensors_in(e, found)
    elif isinstance(x, dict):
        for e in x.values():
            _tensors_in(e, found)
    return found


def _propagate(dispatch, func, args, kwargs):
    """dispatch(func, args, kwargs), where a tensor argument may be data-dependent: then every new
    tensor in the result is too, and an error of the call (its guessed shapes did not fit) is a
    DataDependentError naming the first reason."""
    inputs = _tensors_in(kwargs, _tensors_in(args, []))
    reason = next((r for r in map(data_dependent_reason, inputs) if r), None)
    if reason is None:
        return dispatch(func, args, kwargs)
    try:
        out = dispatch(func, args, kwargs)
    except _lib.DataDependentError:
        raise
    except Exception as e:
        raise _lib.DataDependentError(
            f"{getattr(func, '__name__', func)} of a data-dependent tensor failed "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
            f"its shape depends on {reason}") from None
    seen = {id(t) for t in inputs}
    for t in _tensors_in(out, []):
        if id(t) not in seen:
            mark_data_dependent(t, reason)
    return out


# Every function __torch_function__ may change (besides calls given a device=).
_SPECIAL = frozenset(_FACTORIES | _NEW_METHODS | _LIKE | _INDEXING | set(_SHAPE_RULES) |
                     {torch.Tensor.to, torch.Tensor.cuda} |
                     ({torch.Tensor.__rpow__} if _RPOW_MAKES_A_TENSOR else set()))


def _rpow_args(self, other):
    """torch.pow's arguments for 1.13's self.__rpow__(other): the base has the result type and
    self's device (as torch.tensor(other) makes it: detached), made without CUDA."""
    if not isinstance(other, torch.Tensor):
        return other, self
    base = other.detach().to(torch.result_type(other, self))
    return (base if base.device == self.device else _to_device(base, self.device)), self


def _index_lists_on_cpu(index):
    """The index of t[index] with its lists as cpu index tensors. torch turns each list into a
    tensor on t's device (for a cuda fake, its bindings initialise CUDA first); an index tensor on
    cpu is allowed for a tensor on any device and selects the same elements."""
    def as_tensor(i):
        return torch.tensor(i, device="cpu") if isinstance(i, list) else i

    if isinstance(index, tuple):
        return tuple(as_tensor(i) for i in index) if any(isinstance(i, list) for i in index) \
            else index
    if isinstance(index, list):
        # torch's rule (treatSequenceAsTuple): a short list holding tensors, sequences, slices,
        # None or Ellipsis is a tuple of indices; other lists are one index.
        if len(index) < 32 and any(isinstance(i, (torch.Tensor, list, tuple, slice)) or
                                   i is None or i is Ellipsis for i in index):
            return tuple(as_tensor(i) for i in index)
        return as_tensor(index)
    return index


def _to_device(t, device):
    return _lib.load().fake_to(t, str(device))


def _detour_to(args, kwargs):
    """Tensor.to(...) with a cuda device (any form of .to, _to_args.py): do the rest on the
    tensor's own device, then move; other calls go to torch unchanged."""
    spec = _to_args.parse(args[1:], kwargs)
    device = spec.pop("device", None) if spec is not None else None
    if device is None or not _needs_cuda_detour(device):
        return args, kwargs, None
    return (args[0],), spec, device


_MAX_FAKE_CUDA_DEVICES = 16  # fake_mode/fake_mode.h kMaxFakeCudaDevices
_FAKE_DEVICES = ("a fake device is cpu (no index, or 0) or cuda:N with 0 <= N < "
                 f"{_MAX_FAKE_CUDA_DEVICES}")


def claimable(device, call):
    """`device` as fake tensors claim it (cuda is cuda:0, cpu:0 is cpu), or a ModeError naming
    the call ("metaload.fake"), its `device` argument and the rule; raised before anything
    changes."""
    shown = _lib.quote(device) if isinstance(device, str) else repr(device)[:_lib.QUOTE_MAX_CHARS]
    try:
        d = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _lib.ModeError(f"{call}(device={shown}): not a device ({reason}); "
                             f"{_FAKE_DEVICES}") from None
    if d.type == "cpu" and d.index in (None, 0):
        return torch.device("cpu")
    if d.type == "cuda" and (d.index is None or d.index < _MAX_FAKE_CUDA_DEVICES):
        return torch.device("cuda", d.index or 0)
    kind = "" if d.type in ("cpu", "cuda") else \
        f" (torch knows {d.type} devices; metaload's fake tensors claim cpu and cuda only)"
    raise _lib.ModeError(f"{call}(device={shown}): fake tensors cannot claim {d}{kind}; "
                         f"{_FAKE_DEVICES}")


# ---- backward through fake cuda tensors without CUDA ------------------------------------------
# Autograd's engine asks the CUDA runtime about every cuda device (its primary context, its
# current and default streams) before it runs a graph holding cuda tensors, and again to sync the
# leaves' streams after; only a CUDA runtime with a GPU answers (torch's CUDA hooks refuse an index
# past the devices it counts, a CPU-only torch has none). A backward through fake cuda tensors on
# such a machine therefore cannot run: torch.autograd.backward and grad (Tensor.backward calls the
# former) are wrapped, once a fake() scope is entered, to raise a ModeError saying so before the
# engine starts (nothing is accumulated). fake("cpu") runs the same step, with the same shapes.

_autograd_originals = {}


def _fake_cuda_roots(tensors):
    if isinstance(tensors, torch.Tensor):
        tensors = (tensors,)
    try:
        return [t for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda" and
                is_fake(t)]
    except TypeError:  # not a sequence: torch's own call raises its error
        return []


def _no_cuda_backward(call, roots):
    return _lib.ModeError(
        f"{call} of fake tensors on {roots[0].device}: autograd's engine asks the CUDA runtime "
        "for each cuda device's primary context and streams before it runs, and this machine has "
        "none (torch.cuda.is_available() is False), so a backward through fake cuda tensors cannot "
        "run here. Run the step under metaload.fake('cpu') (the same shapes, dtypes and gradients) "
        "or where a GPU exists")


def _checked_autograd(name):
    original = _autograd_originals[name]

    def call(tensors, *args, **kwargs):
        roots = _fake_cuda_roots(tensors)
        if roots and not torch.cuda.is_available():
            raise _no_cuda_backward(f"torch.autograd.{name}", roots)
        return original(tensors, *args, **kwargs)

    call.__wrapped__ = original
    call.__doc__ = original.__doc__
    call.__name__ = name
    return call


def _wrap_autograd():
    if _autograd_originals:
        return
    for name in ("backward", "grad"):
        _autograd_originals[name] = getattr(torch.autograd, name)
        setattr(torch.autograd, name, _checked_autograd(name))


class _FakeScope(_mode._Scope):
    """metaload.fake(device) (see fake)."""

    _name = "fake"

    def __init__(self, device, function_mode=True):
        self.device = device
        # False (metaload.scan on cpu, see _scan.py): without _FakeFunctionMode, whose Python
        # costs more than the C++ mode's work on every call.
        self._with_function_mode = function_mode

    def _recreate_cm(self):
        return _FakeScope(self.device, self._with_function_mode)

    def _label(self):
        return f"metaload.fake({str(self.device)!r})"

    def _enter_cpp(self):
        _interplay.patch_bitsandbytes_layers()
        _interplay.patch_transformers_fake_check()
        _wrap_autograd()
        try:
            return _lib.load().enter_fake(str(self.device))
        except RuntimeError as e:
            raise (_lib.translate(e) or e) from None

    def _enter_here(self):
        self._was = _thread_scope.set_scope("fake")
        _device_init.install()
        _imports.install()
        self._fake = _interplay.set_fake_mode_aside()
        self._function_mode = _FakeFunctionMode() if self._with_function_mode else None
        if self._function_mode is not None:
            self._function_mode.__enter__()

    def _leave_here(self):
        if self._function_mode is not None:
            self._function_mode.__exit__(None, None, None)
        _interplay.restore_fake_mode(self._fake)
        _thread_scope.restore_scope(self._was)

    def _value(self):
        return self.device


def fake(device="cpu"):
    """Inside the block, tensors are fake: shapes, dtypes and `device` (cpu or cuda:N, also
    without a GPU), no memory. Parameters built under metaload.meta() count as on `device`.

    Usable as `with metaload.fake(device) as d:` (d: the torch.device claimed) or as a decorator.
    The innermost of meta(), real() and fake() decides what tensors created on the thread are:
    fake() inside meta() makes fake tensors, meta() or real() inside fake() make meta or real ones,
    and leaving the inner scope gives the outer one back its own. Fake tensors stay fake wherever
    they are used. A device fake tensors cannot claim is a metaload.ModeError, raised here."""
    return _FakeScope(claimable(device, "metaload.fake"))


is_fake = _lib.is_fake  # metaload.is_fake
