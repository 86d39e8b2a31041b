"""PEFT (LoRA) adapters on a module built on meta: load_into(..., adapters=[dir]) and describe.

    with metaload.meta():
        model = transformers.AutoModelForCausalLM.from_config(config)
    metaload.load_into(model, "org/base", adapters=["my-lora"])   # base and adapter, one call

An adapter is a directory as peft's save_pretrained writes it: adapter_config.json and
adapter_model.safetensors. peft's own injection (peft.inject_adapter_in_model) puts its layers
into the module on meta, where PeftModel would put them (each targeted module becomes a LoRA
layer holding the original as base_layer), and the adapter file's tensor names are mapped to the
module's names by peft's own remapping; a module that already has the adapter's layers (nnsight's
meta build with peft=...) keeps them and only takes the weights.

All or nothing: every adapter is checked against the module from its config and header (a
missing or extra tensor, a shape that does not fit, a target module the model lacks: a
metaload.MismatchError or PlanError naming the adapter's file and tensor) and read into fresh
tensors before the base checkpoint loads; the base loads into the module with its LoRA layers
taken out (so it sees the names and shapes of the base model: renames, fused experts and the rest
work as without adapters), and only when it succeeded do the adapter tensors take the place of
the meta ones (one swap). On any error the module is as it was, injected layers removed.

Adapter weights stay float32 when they were stored in half precision (peft's cast_adapter_dtype,
as PeftModel.from_pretrained and nnsight do), whatever load_into's dtype says for the base.
"""
import copy
import functools
import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from . import _lib

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_FLOAT_FILE_DTYPES = ("F32", "F16", "BF16")
# Config features whose weights live elsewhere than in LoRA layers, or whose layers compute from
# the base weight's values when they are made: refused until they are tested on meta.
_NOT_YET = {"modules_to_save": "modules_to_save (whole modules saved beside the adapter)",
            "trainable_token_indices": "trainable_token_indices",
            "use_dora": "use_dora (DoRA's magnitude is computed from the base weight)",
            "layer_replication": "layer_replication", "target_parameters": "target_parameters",
            "alora_invocation_tokens": "alora_invocation_tokens (activated LoRA)"}


@dataclass
class AdapterInfo:
    """A PEFT adapter directory, from adapter_config.json and its safetensors header."""

    dir: str
    peft_type: str
    rank: Optional[int]  # r: the default rank (rank_pattern gives per-module ones)
    alpha: Optional[float]  # lora_alpha: scaling = alpha / rank (alpha / sqrt(rank) with rslora)
    target_modules: List[str]  # sorted; a regex target is a one-element list with the pattern
    base_model: Optional[str]  # base_model_name_or_path, as peft saved it (None when unknown)
    size_bytes: int  # the tensors' stored bytes
    n_params: int
    n_tensors: int
    dtype: Optional[str]  # the tensors' file dtype when they share one ("F32"), else None
    task_type: Optional[str] = None
    rank_pattern: Dict[str, int] = field(default_factory=dict)
    alpha_pattern: Dict[str, float] = field(default_factory=dict)
    use_rslora: bool = False
    layers: List[str] = field(default_factory=list)  # the adapted modules, by the file's names


class _Adapter:
    """One adapter directory, read: where it is, its config and header, its name in the model."""

    def __init__(self, ref, name: str):
        self.ref = ref
        self.name = name
        self.dir = _adapter_dir(ref)
        self.config_path = os.path.join(self.dir, ADAPTER_CONFIG)
        self.weights_path = os.path.join(self.dir, ADAPTER_WEIGHTS)
        self.config = _read_config(self.config_path)
        self.peft_config = None  # peft's, read once (_peft_config)
        if not os.path.isfile(self.weights_path):
            other = [f for f in ("adapter_model.bin", "adapter_model.pt")
                     if os.path.exists(os.path.join(self.dir, f))]
            why = (f"only {other[0]} (a pickle, which metaload does not read)" if other
                   else "no such file")
            raise _lib.ResolveError(f"adapter {_lib.quote(self.dir)}: "
                                    f"{_lib.quote(self.weights_path)}: {why}")
        header = json.loads(_lib.load().read_safetensors_header(self.weights_path))
        self.tensors = {t["name"]: t for t in header["tensors"]}

    @property
    def base_model(self):
        return self.config.get("base_model_name_or_path")

    def made_for(self) -> str:
        return (f" (made for base model {_lib.quote(self.base_model)})" if self.base_model
                else "")


def _adapter_dir(ref) -> str:
    """An adapter directory: a path, else a repo id in the hub cache (open_checkpoint finds its
    snapshot, as for a base checkpoint)."""
    if not isinstance(ref, (str, os.PathLike)):
        raise _lib.PlanError(f"adapters: each adapter must be a directory (a str or os.PathLike) "
                             f"or a repo id in the hub cache, got {ref!r}")
    path = os.fspath(ref)
    if os.path.isdir(path):
        return path
    if os.path.exists(path) or os.path.isabs(path) or path.startswith("."):
        raise _lib.ResolveError(f"adapter {_lib.quote(path)} is not a directory")
    try:
        return json.loads(_lib.load().open_checkpoint(path, None))["dir"]
    except RuntimeError as e:
        t = _lib.translate(e)
        raise _lib.ResolveError(f"adapter {_lib.quote(path)}: not a directory, nor a repo id "
                                f"in the hub cache: {t if t is not None else e}") from None


def _read_config(path: str) -> Dict[str, Any]:
    if not os.path.isfile(path):
        raise _lib.ResolveError(f"adapter {_lib.quote(os.path.dirname(path))}: "
                                f"{_lib.quote(path)}: no such file (a PEFT adapter directory "
                                f"holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise _lib.FormatError(f"{_lib.quote(path)}: not a JSON adapter config: {e}") from None
    if not isinstance(config, dict):
        raise _lib.FormatError(f"{_lib.quote(path)}: not a JSON object")
    return config


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ---------------------------------------------------------------------------------------------
# describe

def is_adapter_dir(ref) -> bool:
    return isinstance(ref, (str, os.PathLike)) and os.path.isfile(
        os.path.join(os.fspath(ref), ADAPTER_CONFIG))


@_lib.typed_errors
def describe_adapter(ref) -> AdapterInfo:
    """An adapter directory's size, rank, alpha, target modules and base model."""
    a = _Adapter(ref, "default")
    c = a.config
    targets = c.get("target_modules")
    targets = [targets] if isinstance(targets, str) else sorted(targets or [])
    dtypes = {t["dtype"] for t in a.tensors.values()}
    layers = sorted({n.split(".lora_", 1)[0].removeprefix(_PEFT_PREFIX) for n in a.tensors
                     if ".lora_" in n})
    return AdapterInfo(
        dir=a.dir, peft_type=str(c.get("peft_type")), rank=c.get("r"), alpha=c.get("lora_alpha"),
        target_modules=targets, base_model=a.base_model,
        size_bytes=sum(t["end"] - t["begin"] for t in a.tensors.values()),
        n_params=sum(_numel(t["shape"]) for t in a.tensors.values()), n_tensors=len(a.tensors),
        dtype=dtypes.pop() if len(dtypes) == 1 else None, task_type=c.get("task_type"),
        rank_pattern=dict(c.get("rank_pattern") or {}),
        alpha_pattern=dict(c.get("alpha_pattern") or {}),
        use_rslora=bool(c.get("use_rslora")), layers=layers)


# ---------------------------------------------------------------------------------------------
# load


def _peft():
    try:
        import peft
    except ImportError as e:
        raise _lib.PlanError(f"load_into(adapters=...) needs peft (tools/requirements.txt): "
                             f"{e}") from None
    return peft


def adapters_of(adapters) -> List[tuple]:
    """[(name, ref)] of load_into's adapters: a list of directories (the first named "default",
    as PeftModel.from_pretrained names it, then "adapter_1", ...) or a dict {name: directory}."""
    if isinstance(adapters, dict):
        items = list(adapters.items())
    elif isinstance(adapters, (list, tuple)):
        items = [("default" if i == 0 else f"adapter_{i}", a) for i, a in enumerate(adapters)]
    else:
        raise _lib.PlanError(f"adapters must be None, a list of adapter directories or a dict "
                             f"{{name: directory}}, got {adapters!r}")
    for name, _ in items:
        if not isinstance(name, str) or not name or "." in name:
            raise _lib.PlanError(f"adapters: adapter name {name!r} is not a non-empty string "
                                 "without '.'")
    return items


def check_arguments(adapters, a: Dict[str, Any]) -> None:
    """load_into's adapters= and the options it does not combine with yet (PlanError)."""
    if adapters is None:
        return
    adapters_of(adapters)
    for name in ("tp_plan", "dequantize", "process_group", "source_rank"):
        if a.get(name) is not None:
            raise _lib.PlanError(f"load_into: adapters= does not combine with {name}= yet")
    if (a.get("tp_size") or 1) > 1 or a.get("distributed"):
        raise _lib.PlanError("load_into: adapters= loads in one process without tensor "
                             "parallelism (tp_size > 1, distributed=True) for now")


def _snapshot(module: torch.nn.Module):
    """Every submodule's attributes, containers copied one level: what undo puts back."""
    out = []
    for m in module.modules():
        state = {k: (copy.copy(v) if isinstance(v, (dict, list, set)) else v)
                 for k, v in vars(m).items()}
        out.append((m, state))
    # peft's injection freezes the base parameters (requires_grad) as PeftModel does
    grads = [(p, p.requires_grad) for p in module.parameters()]
    return out, grads


def _undo(snapshot) -> None:
    modules, grads = snapshot
    for m, state in modules:
        vars(m).clear()
        vars(m).update(state)
    for p, requires_grad in grads:
        p.requires_grad_(requires_grad)


def _activate(module, names: List[str]) -> None:
    """Every adapter loaded is active (peft's injection activates the last one it injects);
    their weights stay frozen, as PeftModel.from_pretrained leaves them."""
    if len(names) < 2:
        return
    for _, _, layer in _tuner_layers(module):
        layer.set_adapter([n for n in names if n in layer.lora_A or n in
                           getattr(layer, "lora_embedding_A", {})])
    for p in _adapter_params_all(module, names):
        p.requires_grad_(False)


def _adapter_params_all(module, names):
    return [t for n in names for t in _adapter_params(module, n).values()]


def _tuner_layers(module):
    """(parent, child name, layer) of every peft tuner layer, outermost ones only."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    out = []

    def walk(m):
        for name, child in m._modules.items():
            if child is None:
                continue
            if isinstance(child, BaseTunerLayer):
                out.append((m, name, child))
            else:
                walk(child)
    walk(module)
    return out


def _adapter_params(module, adapter_name: str) -> Dict[str, torch.Tensor]:
    """{module state name: tensor} of one adapter's weights in the module's LoRA layers."""
    state = module.state_dict(keep_vars=True)
    out = {}
    for name, t in state.items():
        parts = name.split(".")
        for i in range(len(parts) - 1):
            if parts[i].startswith("lora_") and parts[i + 1] == adapter_name:
                out[name] = t
                break
    return out


def _has_adapter(module, adapter_name: str) -> bool:
    return any(adapter_name in getattr(layer, "lora_A", {}) for _, _, layer in
               _tuner_layers(module))


def _peft_config(peft, a: _Adapter):
    """peft's config of adapter `a`: a LoRA one without the features not loaded yet (PlanError);
    one peft cannot read is a FormatError naming the file."""
    if str(a.config.get("peft_type")) != "LORA":
        raise _lib.PlanError(f"adapter {_lib.quote(a.config_path)}: peft_type "
                             f"{a.config.get('peft_type')!r} is not a LoRA adapter (the one "
                             "kind load_into(adapters=...) loads)")
    for key, what in _NOT_YET.items():
        if a.config.get(key):
            raise _lib.PlanError(f"adapter {_lib.quote(a.config_path)}: {what} is not loaded "
                                 "onto meta yet")
    if a.peft_config is None:
        try:
            a.peft_config = peft.PeftConfig.from_pretrained(a.dir)
        except (ValueError, TypeError, KeyError) as e:
            raise _lib.FormatError(f"{_lib.quote(a.config_path)}: peft cannot read it: "
                                   f"{e}") from None
    return a.peft_config


def _inject(peft, module, a: _Adapter) -> None:
    """peft's LoRA layers for adapter `a` into `module`, on meta (as PeftModel puts them)."""
    config = _peft_config(peft, a)
    config.inference_mode = True
    from peft.tuners.tuners_utils import cast_adapter_dtype
    try:
        peft.inject_adapter_in_model(config, module, adapter_name=a.name, low_cpu_mem_usage=True)
    except ValueError as e:
        targets = a.config.get("target_modules")
        raise _lib.PlanError(f"adapter {_lib.quote(a.config_path)}: its target modules "
                             f"{targets!r} do not fit this model{a.made_for()}: peft: "
                             f"{e}") from None
    cast_adapter_dtype(module, a.name)  # half-precision adapter weights held in float32


def _file_names(peft, module, a: _Adapter, expected: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """{adapter file name: module state name}, as peft maps them on load: each file tensor
    stands in as a meta tensor and peft's own remapping renames it (the adapter name inserted,
    the PeftModel prefix dropped); a rename that is not one-to-one (transformers' weight
    conversions of fused experts) is a PlanError."""
    from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING
    config = _peft_config(peft, a)
    stand_in = {n: torch.empty(info["shape"], device="meta") for n, info in a.tensors.items()}
    name_of = {id(t): n for n, t in stand_in.items()}
    state = dict(stand_in)
    try:
        from peft.utils.transformers_weight_conversion import \
            convert_peft_adapter_state_dict_for_transformers
    except ImportError:
        convert_peft_adapter_state_dict_for_transformers = None
    if convert_peft_adapter_state_dict_for_transformers is not None:
        try:
            state = convert_peft_adapter_state_dict_for_transformers(
                model=module, peft_config=config, adapter_state_dict=state, adapter_name=a.name)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise _lib.PlanError(f"adapter {_lib.quote(a.weights_path)}: transformers' weight "
                                 f"conversion of its tensors for this model, which load_into "
                                 f"does not do yet, failed on meta: {e}") from None
    tuner = PEFT_TYPE_TO_TUNER_MAPPING[config.peft_type]
    state = tuner._remap_adapter_state_dict_for_load(model=module, config=config,
                                                      adapter_name=a.name, state_dict=state)
    out = {}
    for key, t in state.items():
        src = name_of.get(id(t))
        if src is None or src in out:
            raise _lib.PlanError(f"adapter {_lib.quote(a.weights_path)}: peft converts its "
                                 f"tensors for this model ({_lib.quote(key)} is not one file "
                                 "tensor renamed), which load_into does not do yet")
        out[src] = key if key in expected else key.removeprefix(_PEFT_PREFIX)
    return out


def _file_name_of(module_name: str, adapter_name: str) -> str:
    """The name peft's save_pretrained gives a module's adapter tensor (for error messages)."""
    parts = [p for i, p in enumerate(module_name.split("."))
             if not (p == adapter_name and i > 0
                     and module_name.split(".")[i - 1].startswith("lora_"))]
    return _PEFT_PREFIX + ".".join(parts)


def _check_fit(a: _Adapter, names: Dict[str, str], expected: Dict[str, torch.Tensor],
               state: Dict[str, torch.Tensor]) -> None:
    """Every adapter tensor of the module has its file tensor of the same shape, and every file
    tensor has its place: else one MismatchError naming the file and each tensor. A file tensor
    of a base layer (peft saves a targeted embedding's weight beside its LoRA tensors) replaces
    the base checkpoint's, as PeftModel.from_pretrained loads it: it joins `expected`."""
    placed = set(names.values())
    for n in placed:
        if n not in expected and n in state and ".base_layer." in n:
            expected[n] = state[n]
    missing = [n for n in expected if n not in placed]
    unexpected = [f for f, n in names.items() if n not in expected]
    mismatched = []
    for f, n in names.items():
        if n not in expected:
            continue
        t, info = expected[n], a.tensors[f]
        if list(t.shape) != list(info["shape"]) or info["dtype"] not in _FLOAT_FILE_DTYPES:
            rank = a.config.get("r")
            mismatched.append((f"{f}: {info['dtype']} [{', '.join(map(str, info['shape']))}] "
                               f"in the file, the model's {n} is [{', '.join(map(str, t.shape))}]"
                               f" (rank {rank} in {ADAPTER_CONFIG})", f))
    if not (missing or unexpected or mismatched):
        return
    lost = [_file_name_of(n, a.name) for n in missing]
    lines = [f"\n  missing: {f} [{', '.join(map(str, expected[n].shape))}]"
             for f, n in zip(lost, missing)]
    lines += [f"\n  unexpected: {f} in {a.weights_path}" for f in unexpected]
    lines += [f"\n  mismatched: {m}" for m, _ in mismatched]
    raise _lib.MismatchError(
        f"adapter {_lib.quote(a.weights_path)} does not fit the model{a.made_for()}: "
        f"{len(missing)} missing, {len(unexpected)} unexpected, {len(mismatched)} mismatched"
        + "".join(lines), missing=lost, unexpected=list(unexpected),
        mismatched=[f for _, f in mismatched])


class _Staged:
    """One adapter's tensors read into fresh tensors, waiting for the swap."""

    def __init__(self, targets: List[torch.Tensor], sources: List[torch.Tensor], names,
                 report: Dict[str, Any]):
        self.targets, self.sources, self.names, self.report = targets, sources, names, report


def _stage(a: _Adapter, names: Dict[str, str], expected: Dict[str, torch.Tensor], device,
           dtype, threads: int, mmap) -> _Staged:
    """Reads the adapter file into fresh tensors of its module tensors' shapes and dtypes; a base
    layer's tensor (an embedding's weight) in load_into's `dtype` where one is given, as the base
    checkpoint's tensors load."""
    try:
        from ._mode import real
    except ImportError:  # pragma: no cover
        import contextlib
        real = contextlib.nullcontext
    files = list(names)
    module_names = [names[f] for f in files]
    targets = [expected[n] for n in module_names]
    dev = torch.device(device) if device is not None else None
    with real():
        fresh = [torch.empty(t.shape, device="meta", dtype=dtype if dtype is not None and
                             ".base_layer." in n and t.is_floating_point() else t.dtype)
                 for n, t in zip(module_names, targets)]
        out = _lib.load().load_into(fresh, files, a.weights_path, None, dev, None, 0, 1,
                                    int(threads or 0), 0, True, False, mmap)
    return _Staged(targets, fresh, module_names, json.loads(out))


def _detached(layers):
    """Takes the LoRA layers out of the module (each parent holds its base layer again)."""
    for parent, name, layer in layers:
        parent._modules[name] = layer.get_base_layer()


def _attached(layers):
    for parent, name, layer in layers:
        parent._modules[name] = layer


def with_adapters(check_arguments):
    """load_into's decorator: a call with adapters= is load(...), whose base load is the call
    itself without them; `check_arguments` checks load_into's arguments first."""
    def wrap(load_into):
        signature = inspect.signature(load_into)

        @functools.wraps(load_into)
        def wrapper(*args, **kwargs):
            if kwargs.get("adapters") is None:  # keyword-only: never among args
                return load_into(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check_arguments(dict(bound.arguments))
            return load(dict(bound.arguments), load_into)
        wrapper.__doc__ = (load_into.__doc__ or "").rstrip() + _ADAPTERS_DOC
        return wrapper
    return wrap


# load_into's docstring paragraph for adapters= (kept here: load_into is at its 80 lines).
_ADAPTERS_DOC = """

    adapters: PEFT LoRA adapter directories as peft's save_pretrained writes them
    (adapter_config.json, adapter_model.safetensors; or a repo id in the hub cache), or
    {name: directory}: peft's LoRA layers are put into the module (on meta) and filled in the
    same call, all or nothing; report.adapter_keys names their tensors (metaload._adapters).
    """


def load(args: Dict[str, Any], load_into):
    """load_into with adapters (`args`: load_into's arguments): the base checkpoint loads by
    load_into(**args, adapters=None) into the module with its LoRA layers taken out; returns its
    LoadReport with the adapters' bytes and files added and adapter_keys naming the adapter
    tensors loaded."""
    module = args["module"]
    peft = _peft()
    read = [_Adapter(ref, name) for name, ref in adapters_of(args["adapters"])]
    snapshot = _snapshot(module)
    for a in read:
        _peft_config(peft, a)  # every adapter's kind and features, before anything changes
    try:
        staged = []
        for a in read:
            if not _has_adapter(module, a.name):
                _inject(peft, module, a)
            expected = _adapter_params(module, a.name)
            names = _file_names(peft, module, a, expected)
            _check_fit(a, names, expected, module.state_dict(keep_vars=True))
            staged.append(_stage(a, names, expected, args["device"], args["dtype"],
                                 args["threads"], args["mmap"]))
        layers = _tuner_layers(module)
        _detached(layers)
        try:
            report = load_into(**dict(args, adapters=None))
        finally:
            _attached(layers)
        targets = [t for s in staged for t in s.targets]
        sources = [t for s in staged for t in s.sources]
        _lib.typed_errors(_lib.load().swap_tensors)(targets, sources)
        _activate(module, [a.name for a in read])
    except BaseException:
        _undo(snapshot)
        raise
    return _with_adapters(report, staged)


def _with_adapters(report, staged: List[_Staged]):
    from ._reports import _report
    extra_bytes = sum(s.report.get("bytes", 0) for s in staged)
    extra_slot = sum(s.report.get("slot_bytes", 0) for s in staged)
    files = list(report.files)
    for s in staged:
        r = _report(json.dumps(s.report), [], [], [])
        files.extend(r.files)
    return report._replace(bytes=report.bytes + extra_bytes,
                           slot_bytes=report.slot_bytes + extra_slot, files=files,
                           adapter_keys=[n for s in staged for n in s.names])
