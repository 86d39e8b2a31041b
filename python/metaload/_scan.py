"""What a scan returns, from either route: metaload.scan(model, inputs) over any torch.nn.Module,
and TransformersModel.scan(...) over the C++ model layer.

    s = metaload.scan(model, torch.empty(8, 3, 224, 224, device="meta"), device="cuda")
    s[""]       # ModuleShape(path='', cls='ResNet', shape=(8, 1000), dtype=torch.float32,
                #             device=device(type='cuda', index=0), calls=1, bytes=32000)
    s["layer4"].shape          # (8, 512, 7, 7)
    s.total_bytes, s.device    # every module's output bytes summed (each module once); the device
"""
import collections.abc
import functools
import time
from typing import Dict, Iterator, NamedTuple, Optional, Tuple, Union

import torch

from . import _lib


class ModuleShape(NamedTuple):
    path: str  # dotted module path; "" is the whole model
    cls: str  # the module's class name ("Linear", "GPT2Attention", ...)
    shape: Optional[Tuple[int, ...]]  # None: data-dependent
    dtype: Optional[torch.dtype]  # None: data-dependent
    device: Optional[torch.device]  # the device the (fake) output claims; None: data-dependent
    calls: int  # outputs the module produced during the scan; shape etc. are the last one's
    bytes: Optional[int]  # of the output: elements x element size; None: data-dependent
    # Why the output is not known without the data (metaload.scan): the module read values a fake
    # tensor does not hold (MoE routing: which experts each token picked, how many tokens each
    # expert got), or its output was computed from such a module's. None: shape etc. are exact.
    data_dependent: Optional[str] = None


class Scan(collections.abc.Mapping):
    """{module path: ModuleShape}, in the order the modules first produced output (so the whole
    model, "", comes last), with the scan's device, its duration and total_bytes.

    A module whose output is a tuple: metaload.scan reports its first tensor under the module's
    path; TransformersModel.scan reports each element as "<path>.0", "<path>.1", ...; modules
    whose output holds no tensor are absent.

    A module whose forward needs values fake tensors do not hold (a data-dependent op such as
    nonzero, or Python control flow on a tensor's value) is data-dependent: its ModuleShape has
    shape, dtype, device and bytes None and `data_dependent` saying why, and so has every module
    whose output is computed from its output; modules inside it that never ran are absent.
    `data_dependent` maps each such path to its reason."""

    def __init__(self, device: Union[str, torch.device], seconds: float,
                 modules: Dict[str, ModuleShape], tp_size: int = 1, tp_rank: int = 0,
                 weight_bytes: Optional[int] = None):
        self.device = torch.device(device)
        self.seconds = seconds
        self.modules = modules  # the mapping itself, as a dict
        # TransformersModel.scan: the tensor-parallel rank scanned (its modules' outputs are that
        # rank's) and the bytes of the parameters that rank holds; None from metaload.scan.
        self.tp_size = tp_size
        self.tp_rank = tp_rank
        self.weight_bytes = weight_bytes

    @property
    def total_bytes(self) -> int:
        """The known outputs' bytes (data-dependent ones are not known)."""
        return sum(m.bytes for m in self.modules.values() if m.bytes is not None)

    @property
    def data_dependent(self) -> Dict[str, str]:
        """{path: reason} of the modules whose output depends on values (see Scan)."""
        return {p: m.data_dependent for p, m in self.modules.items() if m.data_dependent}

    def __getitem__(self, path: str) -> ModuleShape:
        return self.modules[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def __repr__(self):
        root = self.modules.get("")
        what = ""
        if root is not None:
            what = f", output {tuple(root.shape)} {root.dtype}" if root.shape is not None else \
                ", output data-dependent"
        return (f"Scan({len(self.modules)} modules on {self.device}{what}, "
                f"{self.total_bytes} bytes of outputs, {self.seconds * 1e3:.1f} ms)")


def dtype_named(name: str) -> torch.dtype:
    """"float32" / "torch.float32" -> torch.float32."""
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {_lib.quote(name)}")
    return dtype


def from_json(j) -> Scan:
    """The C++ model layer's scan (model/model_ops.cc's scan_json), parsed."""
    modules = {m["path"]: ModuleShape(m["path"], m["class"], tuple(m["shape"]),
                                      dtype_named(m["dtype"]), torch.device(m["device"]),
                                      m["calls"], m["bytes"]) for m in j["modules"]}
    return Scan(j["device"], j["seconds"], modules, j.get("tp_size", 1), j.get("tp_rank", 0),
                j.get("weight_bytes"))


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, collections.abc.Mapping) and output:
        # transformers' ModelOutput (an OrderedDict of the fields that are set: logits, ...).
        first = next(iter(output.values()))
        return first if isinstance(first, torch.Tensor) else None
    return None


def _first_line(e, limit=300):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:limit] if text else ''}"


def _stand_in_for(args, kwargs, reason):
    """A data-dependent stand-in for a module's output: like its first tensor argument (a shape
    nobody claims; _fake.py marks it and what is computed from it), or None without one."""
    from ._fake import _stand_ins, _tensors_in, mark_data_dependent

    inputs = _tensors_in(kwargs, _tensors_in(args, []))
    if not inputs:
        return None
    _stand_ins[0] += 1
    return mark_data_dependent(torch.empty_like(inputs[0]), reason)


def _guarded(module, own, path, made, last, lean):
    """module's forward (`own`, an instance attribute, or its class's), but a forward that needs
    values fake tensors do not hold returns a data-dependent stand-in: on a DataDependentError, or
    on any error raised after a stand-in was made inside it (its caller got a stand-in where it
    expected, say, a tuple). made[0] counts the scan's stand-ins, last[0] is the latest one's
    reason; while lean[0] (the first pass of a cpu scan, see scan) every error goes up as it is.
    The class's forward is looked up at each call: fake() wraps some classes' forward when it
    starts (bitsandbytes' layers: _interplay), after this wrapper is made."""
    @functools.wraps(module.forward)  # inspect.signature(module.forward) still sees the real one
    def call(*args, **kwargs):
        before = made[0]
        try:
            forward = own if own is not None else type(module).forward.__get__(module)
            return forward(*args, **kwargs)
        except Exception as e:
            if lean[0]:
                raise
            if made[0] != before:
                reason = last[0]
            elif isinstance(e, _lib.DataDependentError):
                reason = f"{path or '<model>'}: {_first_line(e)}"
            else:
                raise
            out = _stand_in_for(args, kwargs, reason)
            if out is None:
                raise
        made[0] += 1
        last[0] = reason
        return out
    return call


def _lean_pass_fits(device):
    """Whether a scan on `device` may first run without fake()'s Python TorchFunctionMode.

    On a cpu scan that mode only carries one_hot's shape rule, data-dependent stand-ins and typed
    errors inside the forward; each of those comes with an error in a pass without it (one_hot
    reads min() of a tensor fake tensors do not hold), and an error sends the scan to the full
    pass. The C++ mode checks histc's and _grouped_mm's CPU rules itself, and counts the calls it
    sends on to a torch FakeTensorMode entered inside (those, too, send the scan to the full
    pass). A cuda scan needs the mode's detours; another TorchFunctionMode already on
    (torch.device(...) as a context, a default device) would fill factories' device before ours
    does."""
    count = getattr(torch._C, "_len_torch_function_stack", None)
    return device.type == "cpu" and count is not None and count() == 0


def _forward(model, inputs, kwargs, device, function_mode):
    from ._fake import _FakeScope, _needs_cuda_detour, _to_device

    with torch.no_grad(), _FakeScope(device, function_mode):
        inputs = tuple(_to_device(x, device) if isinstance(x, torch.Tensor) and
                       _needs_cuda_detour(device) and not x.is_meta else x for x in inputs)
        model(*inputs, **kwargs)


def _passes(model, inputs, kwargs, device, lean, modules):
    """The lean pass where lean[0] (see _lean_pass_fits), then the full one if it is needed."""
    if lean[0]:
        deferrals = _lib.load().fake_mode_deferrals()
        try:
            _forward(model, inputs, kwargs, device, function_mode=False)
        except Exception:
            # Something the lean pass does not judge: a value read (data-dependent modules get
            # stand-ins only under the full mode), a call the full mode changes or any error. The
            # full pass decides, from the start.
            lean[0] = False
        # A torch FakeTensorMode entered inside the forward: torch calls into it past the
        # dispatcher, which only the full mode's Python sees (fake_mode.cc).
        if _lib.load().fake_mode_deferrals() != deferrals:
            lean[0] = False
        if not lean[0]:
            modules.clear()
    if not lean[0]:
        _forward(model, inputs, kwargs, device, function_mode=True)


def scan(model: torch.nn.Module, *inputs, device="cpu", **kwargs) -> Scan:
    """Runs `model` on fake tensors and returns a Scan: {module path: ModuleShape} for every
    submodule whose output is a tensor (or a tuple starting with one, or a mapping such as
    transformers' ModelOutput whose first value is one; the root module is ""), without memory and
    without computing.

    Inputs may be real tensors (they count as on their own device), meta tensors (on `device`) or
    anything the model accepts; nothing is allocated and no weights are needed (build the model
    under metaload.meta()).

    A module that needs values fake tensors do not hold (a data-dependent op, as MoE routing's
    nonzero; Python control flow on a value) does not end the scan: the module is marked
    data-dependent (ModuleShape.data_dependent, the reason) and its caller gets a stand-in whose
    shape is never reported; every module computed from it is data-dependent too. Meanwhile each
    module's forward is wrapped (restored after). An error that no value caused is raised.

    On cpu the forward runs first under metaload's C++ fake mode alone, without fake()'s Python
    layer (a third of a scan's time); where that pass cannot judge (an error, a data-dependent
    op, a torch FakeTensorMode entered inside), the forward runs again from the start under
    fake(), whose result counts: such a model's forward then runs twice."""
    from ._fake import _stand_ins, claimable, data_dependent_reason

    device = claimable(device, "metaload.scan")  # ModeError before any hook is in place
    modules: Dict[str, ModuleShape] = {}
    hooks = []
    made, last = [0], [None]  # stand-ins made by this scan, the latest one's reason
    lean = [_lean_pass_fits(device)]

    def record(path):
        def hook(module, args, output):
            out = _first_tensor(output)
            if out is None:
                return
            before = modules.get(path)
            reason = data_dependent_reason(out) if made[0] else None
            if reason is not None:
                modules[path] = ModuleShape(path, type(module).__name__, None, None, None,
                                            (before.calls if before else 0) + 1, None, reason)
                return
            # Read past the fake mode's __torch_function__ (each .shape / .dtype / ... would go
            # through it: a third of a Llama scan's time); torch 1.13 ignores this and still asks.
            with torch._C.DisableTorchFunction():
                shape, dtype, device = tuple(out.shape), out.dtype, out.device
                nbytes = out.numel() * out.element_size()
            modules[path] = ModuleShape(path, type(module).__name__, shape, dtype, device,
                                        (before.calls if before else 0) + 1, nbytes)
        return hook

    guarded = []  # (module, its own forward attribute or None)
    for path, module in model.named_modules():
        hooks.append(module.register_forward_hook(record(path)))
        own = module.__dict__.get("forward")
        try:
            module.forward = _guarded(module, own, path, made, last, lean)
        except (AttributeError, TypeError, RuntimeError):  # a ScriptModule's forward stays
            continue
        guarded.append((module, own))
    t0 = time.perf_counter()
    try:
        _passes(model, inputs, kwargs, device, lean, modules)
    finally:
        _stand_ins[0] -= made[0]
        for h in hooks:
            h.remove()
        for module, own in guarded:
            if own is None:
                del module.forward
            else:
                module.forward = own
    return Scan(device, time.perf_counter() - t0, modules)
