"""What a scan returns, from either route: metaload.scan(model, inputs) over any torch.nn.Module,
and TransformersModel.scan(...) over the C++ model layer.

    s = metaload.scan(model, torch.empty(8, 3, 224, 224, device="meta"), device="cuda")
    s[""]       # ModuleShape(path='', cls='ResNet', shape=(8, 1000), dtype=torch.float32,
                #             device=device(type='cuda', index=0), calls=1, bytes=32000)
    s["layer4"].shape          # (8, 512, 7, 7)
    s.total_bytes, s.device    # every module's output bytes summed (each module once); the device
"""
import collections.abc
import time
from typing import Dict, Iterator, NamedTuple, Optional, Tuple, Union

import torch

from . import _lib


class ModuleShape(NamedTuple):
    path: str  # dotted module path; "" is the whole model
    cls: str  # the module's class name ("Linear", "GPT2Attention", ...)
    shape: Tuple[int, ...]
    dtype: torch.dtype
    device: torch.device  # the device the (fake) output claims
    calls: int  # outputs the module produced during the scan; shape etc. are the last one's
    bytes: int  # of the output: elements x element size


class Scan(collections.abc.Mapping):
    """{module path: ModuleShape}, in the order the modules first produced output (so the whole
    model, "", comes last), with the scan's device, its duration and total_bytes.

    A module whose output is a tuple: metaload.scan reports its first tensor under the module's
    path; TransformersModel.scan reports each element as "<path>.0", "<path>.1", ...; modules
    whose output holds no tensor are absent."""

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
        return sum(m.bytes for m in self.modules.values())

    def __getitem__(self, path: str) -> ModuleShape:
        return self.modules[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def __repr__(self):
        root = self.modules.get("")
        what = f", output {tuple(root.shape)} {root.dtype}" if root is not None else ""
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
    return None


def scan(model: torch.nn.Module, *inputs, device="cpu", **kwargs) -> Scan:
    """Runs `model` on fake tensors and returns a Scan: {module path: ModuleShape} for every
    submodule whose output is a tensor (or a tuple starting with one; the root module is ""),
    without memory and without computing.

    Inputs may be real tensors (they count as on their own device), meta tensors (on `device`) or
    anything the model accepts; nothing is allocated and no weights are needed (build the model
    under metaload.meta())."""
    from ._fake import _needs_cuda_detour, _to_device, claimable, fake

    device = claimable(device, "metaload.scan")  # ModeError before any hook is in place
    modules: Dict[str, ModuleShape] = {}
    hooks = []

    def record(path):
        def hook(module, args, output):
            out = _first_tensor(output)
            if out is None:
                return
            before = modules.get(path)
            # Read past the fake mode's __torch_function__ (each .shape / .dtype / ... would go
            # through it: a third of a Llama scan's time); torch 1.13 ignores this and still asks.
            with torch._C.DisableTorchFunction():
                shape, dtype, device = tuple(out.shape), out.dtype, out.device
                nbytes = out.numel() * out.element_size()
            modules[path] = ModuleShape(path, type(module).__name__, shape, dtype, device,
                                        (before.calls if before else 0) + 1, nbytes)
        return hook

    for path, module in model.named_modules():
        hooks.append(module.register_forward_hook(record(path)))
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), fake(device):
            inputs = tuple(_to_device(x, device) if isinstance(x, torch.Tensor) and
                           _needs_cuda_detour(device) and not x.is_meta else x for x in inputs)
            model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return Scan(device, time.perf_counter() - t0, modules)
