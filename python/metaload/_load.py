"""Streaming a checkpoint into an existing torch.nn.Module: load_into.

    with metaload.meta():
        model = torchvision.models.resnet50()
    report = metaload.load_into(model, "resnet50.safetensors", device="cpu")

The module's own Parameter and buffer objects take the data (references held elsewhere see it;
requires_grad is kept); nothing changes unless every tensor was read and checked, and any problem
with the checkpoint (missing, unexpected, mismatched tensors) is one metaload.MismatchError listing
them all.
"""
import contextlib
import datetime
import json
import numbers
import os
from typing import Any, Dict, List, NamedTuple, Optional, Union

import torch

from . import _adapters, _buffer_init, _dist_load, _lib, _mapping, _progress, _quantized_modules
from ._mapping import _compiled_mapping, _is_transformers_model, _renames, _transformers_mapping
from ._reports import FileReport, LoadReport, _report  # noqa: F401 (FileReport, as before)


def _all_found(state: Dict[str, torch.Tensor], in_checkpoint: List[str],
               renamed: Dict[str, str], computed_names: List[str]) -> bool:
    """Whether every tensor of `state` has a name in the checkpoint (after `renamed`), one of its
    tied names, or is computed: then no further renaming can change what loads."""
    present = set(in_checkpoint)
    found = {id(t) for n, t in state.items() if renamed.get(n, n) in present}
    computed = set(computed_names)
    return all(id(t) in found or n in computed for n, t in state.items())


def _without_shadowed(state: Dict[str, torch.Tensor], renamed: Dict[str, str], ref: str,
                      strict: bool = True,
                      missing: Optional[List[str]] = None) -> Dict[str, torch.Tensor]:
    """`state` without the module names whose checkpoint tensor of the same name key_mapping
    renames onto another module name (that tensor is the other's: asking for it by this name too
    would load it twice). One tied to a tensor that loads is filled through the tie; any other
    is missing: a MismatchError naming it and the rename (strict=False: put in `missing`, left
    as it is)."""
    as_module = {c: m for m, c in renamed.items()}
    shadowed = [n for n in state if n not in renamed and n in as_module]
    if not shadowed:
        return state
    gone = set(shadowed)
    own = {n: t for n, t in state.items() if n not in gone}
    loaded = {id(t) for t in own.values()}
    lost = [n for n in shadowed if id(state[n]) not in loaded]
    if lost and not strict:  # left as they are, as any tensor the checkpoint lacks
        if missing is not None:
            missing[:] = lost
        return own
    if lost:
        why = "; ".join(f"key_mapping renames the checkpoint's {_lib.quote(n)} to "
                        f"{_lib.quote(as_module[n])}" for n in lost[:3])
        lines = "".join(f"\n  missing: {n} [{', '.join(map(str, state[n].shape))}]" for n in lost)
        raise _lib.MismatchError(f"checkpoint {_lib.quote(ref)} does not fit ({why}, leaving "
                                 f"no tensor for the module's own name): {len(lost)} missing, 0 "
                                 f"unexpected, 0 mismatched{lines}", missing=list(lost),
                                 unexpected=[], mismatched=[])
    return own


class _Computed(NamedTuple):
    tensors: List[torch.Tensor]
    names: List[str]
    values: List[Optional[torch.Tensor]]  # None: unknown


def _computed(ops, module: torch.nn.Module, state: Dict[str, torch.Tensor],
              target_device: torch.device) -> _Computed:
    """The buffers state_dict leaves out (once per tensor object) that the load sets: those on
    meta, with the values they carry (None when unknown), and real ones on another device."""
    in_state = {id(t) for t in state.values()}
    out = _Computed([], [], [])
    for n, b in module.named_buffers():
        if n in state or id(b) in in_state:
            continue
        if b.is_meta:
            values = ops.values_of(b)
            if values is None and _is_transformers_model(module):
                from ._mode import real
                values = _buffer_init.values_by_init(module, n, real)
            out.values.append(values)
        elif b.device != target_device:
            out.values.append(b)
        else:
            continue  # already real where the load puts the rest
        out.tensors.append(b)
        out.names.append(n)
    return out


def quant_layout(ref: str, revision: Optional[str] = None) -> Dict[str, Any]:
    """The quantized weights of checkpoint `ref`, from its headers, config.json and quant_state
    blobs: {"method": config.json's quant_method or "", "weights": [{"weight": "P.weight",
    "scheme": "gptq" | "awq" | "bnb4" | "bnb8" | "fp8", "shape": [out, in], "parts": {role:
    tensor name}}]}. Raises metaload.DequantError for a malformed quantized checkpoint."""
    return json.loads(_lib.load().quant_layout(str(ref), revision))


@contextlib.contextmanager
def _open_checkpoint(ref: str, revision: Optional[str]):
    """The checkpoint opened once for one load (loader/load/open_checkpoints.h): its names and
    its load come from the headers read here, through the descriptors opened here."""
    ops = _lib.load()
    handle = ops.checkpoint_open(str(ref), revision)
    try:
        yield handle
    finally:
        ops.checkpoint_close(handle)


def checkpoint_tensor_names(ref: str, revision: Optional[str] = None) -> List[str]:
    """Every tensor name of checkpoint `ref`, from its headers (no tensor data is read)."""
    with _open_checkpoint(ref, revision) as handle:
        return list(_lib.load().checkpoint_names(handle))


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _bad_argument(name: str, rule: str, value):
    raise _lib.PlanError(f"{name} must be {rule}, got {value!r}")


def _check_arguments(a: Dict[str, Any]) -> None:
    """load_into's arguments (`a`: its locals on entry), each on its own rule, before any file is
    read: a PlanError naming the argument, what it accepts and what it got (tp_size before
    tp_rank, whose range it sets). Ranges the library checks (threads, staging_bytes, a rank
    without tp_size, a device that is not there) stay its own."""
    for name, default in (("dtype", "each tensor keeps the module's dtype"),
                          ("dequantize", "quantized weights stay packed")):
        v = a[name]
        if v is not None and (not isinstance(v, torch.dtype) or v not in _FLOAT_DTYPES):
            _bad_argument(name, f"float32, float16 or bfloat16 (a torch.dtype; None: {default})", v)
    if a["device"] is not None:
        try:
            torch.device(a["device"])
        except (RuntimeError, TypeError, ValueError):
            _bad_argument("device", "None, a torch.device or a device string ('cpu', 'cuda:0')",
                          a["device"])
    _check_ranks(a["tp_rank"], a["tp_size"], a["source_rank"])
    for name in ("threads", "staging_bytes", "buffer_bytes"):
        if not _integer(a[name]):
            _bad_argument(name, "an integer (0: the default)", a[name])
    for name in ("strict", "mmap", "distributed", "mmap_fused"):
        optional = name in ("mmap", "distributed")
        if not isinstance(a[name], bool) and (not optional or a[name] is not None):
            _bad_argument(name, "True or False" + (" or None" if optional else ""), a[name])
    t = a["timeout"]
    if t is not None and not isinstance(t, datetime.timedelta) and (
            isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0):
        _bad_argument("timeout", "None, a positive number of seconds or a timedelta", t)
    _check_mappings(a["key_mapping"], a["tp_plan"])
    _adapters.check_arguments(a["adapters"], a)
    _lib.check_utf8(_lib.ResolveError, "load_into(ref=...)", [a["ref"], a["revision"]])
    _lib.check_utf8(_lib.PlanError, "load_into(key_mapping=...)", a["key_mapping"] or {})


def _check_ranks(tp_rank, tp_size, source_rank) -> None:
    if tp_size is not None and (not _integer(tp_size) or not 1 <= tp_size <= 2 ** 31 - 1):
        _bad_argument("tp_size", "from 1 to 2^31-1", tp_size)
    if tp_rank is not None and not _integer(tp_rank):
        _bad_argument("tp_rank", "an integer from 0 to tp_size - 1", tp_rank)
    if tp_rank is not None and tp_size is not None and not 0 <= tp_rank < tp_size:
        _bad_argument("tp_rank", f"from 0 to tp_size - 1 ({tp_size - 1})", tp_rank)
    if source_rank is not None and (not _integer(source_rank) or source_rank < 0):
        _bad_argument("source_rank", "None or a rank of the process group (an integer >= 0)",
                      source_rank)


def _check_mappings(key_mapping, tp_plan) -> None:
    for name, value in (("key_mapping", key_mapping), ("tp_plan", tp_plan)):
        if value is not None and not isinstance(value, dict):
            _bad_argument(name, "None or a dict", value)
    if key_mapping:
        _compiled_mapping(key_mapping)
    styles = list(_lib.load().tp_plan_styles()) if tp_plan else []
    for module, style in (tp_plan or {}).items():
        if not isinstance(module, str):
            raise _lib.PlanError(f"tp_plan key {module!r} is not a module name (a string)")
        if not isinstance(style, str) or style not in styles:
            raise _lib.PlanError(f"tp_plan style {style!r} of {module!r} is not one of {styles}")


@_lib.typed_errors
@_adapters.with_adapters(_check_arguments)
def load_into(module: torch.nn.Module, ref: str, device: Union[str, torch.device, None] = None,
              dtype: Optional[torch.dtype] = None, *, tp_rank: Optional[int] = None,
              tp_size: Optional[int] = None, threads: int = 0, staging_bytes: int = 0,
              strict: bool = True, revision: Optional[str] = None,
              progress: _progress.Progress = True, mmap: Optional[bool] = None,
              key_mapping: Optional[Dict[str, str]] = None, process_group=None,
              source_rank: Optional[int] = None, buffer_bytes: int = 0,
              timeout: Optional[float] = None, distributed: Optional[bool] = None,
              dequantize: Optional[torch.dtype] = None,
              tp_plan: Optional[Dict[str, str]] = None, adapters=None,
              mmap_fused: bool = True) -> LoadReport:
    """Loads checkpoint `ref` (a safetensors file, an index, a directory, a Hugging Face repo id
    in the local cache, or a model key: its repo in the hub cache only, never a path) into
    `module`'s parameters and persistent buffers, by state_dict names.

    Non-persistent buffers (rotary inv_freq, causal masks: computed by the constructor, never in
    a checkpoint) take the values the constructor computed, which a module built under
    metaload.meta() keeps for small tensors made from constants (arange, torch.tensor, ...): each
    becomes a fresh tensor on `device` in its own dtype, in the same all-or-nothing step, and the
    report's computed_keys name them (a real buffer on another device moves there). One still on
    meta without values cannot be made: a missing tensor of the MismatchError (strict), or left
    on meta and listed in missing_keys (strict=False).

    device: where the tensors go (default cpu). dtype: floating-point checkpoint tensors load as
    this dtype (default: each tensor keeps the module's dtype; float32/float16/bfloat16 convert).
    A module tensor that already holds real memory of the loaded shape, dtype and device is
    written in place (copy_, as load_state_dict does), so another thread's forward never reads
    freed memory; one whose dtype or device changes takes new storage, as module.to() does.
    strict: as load_state_dict's: with False, module tensors the checkpoint lacks keep what they
    hold (meta stays meta) and checkpoint tensors the module lacks are not read; the report's
    missing_keys and unexpected_keys name them. A tensor whose shape or dtype does not fit fails
    the load either way (metaload.MismatchError). Tied tensors (one object under two names) need
    one name in the checkpoint.
    key_mapping: {regex: replacement} renaming checkpoint names to module names, the first
    pattern that matches (as transformers' from_pretrained(key_mapping=...)). A transformers
    model's own renames (its conversion mapping, e.g. GPT-NeoX's {r"^embed_out\\.": "lm_head."})
    apply after the given ones, as from_pretrained applies them. Errors name a renamed tensor by
    its checkpoint name (PlanError: a pattern that is no regex, two mapped onto one module name).
    Its merges too (fused 3-D experts from per-expert weights): each checkpoint tensor read once
    into its place (loader/load/assembly.h); a lacking or misshapen expert is a MismatchError
    naming it; not with dequantize (PlanError).
    progress: True, a bar on stderr when it is a terminal; False, none; a callable
    (done_bytes, total_bytes) or a tqdm-like object (metaload._progress explains when it is
    called). mmap: on cpu, tensors stored as loaded point into copy-on-write mappings of the
    files (no fresh memory); default: on for Hugging Face cache blobs, off for other files.
    Pages in the page cache map lazily (first touch) where the file is leased; the rest are read
    during the call, so a read error is a ReadError there, unless a sample finds 95% of the pages
    cached: then the call returns at once and the few missing pages are read ahead in the
    background. Mapped files may be deleted or replaced by rename, never truncated or written in
    place while the module uses them (check_mapped_files; the README's Reliability section).
    mmap_fused: with mmap, fused MoE experts are views of the files' pages too, at the file's
    alignment (CPU matmuls sum by alignment: outputs may differ in the last bit from
    from_pretrained's); False copies them. Returns a LoadReport; all or nothing.

    Tensor parallelism: tp_size > 1 loads rank tp_rank's slice of each tensor by the family's
    TP plan (vLLM's layouts); a meta tensor takes its slice's shape. With process_group (or
    source_rank, or tp_size > 1 under torch.distributed) every rank of the group calls it: each
    reads its slice (or rank source_rank reads and sends each rank its own through buffer_bytes
    buffers), and the module changes only after all staged theirs, else a
    metaload.DistributedError on every rank within `timeout` s (metaload._dist_load; the report's
    .distributed has each rank's bytes).
    dequantize: a float dtype: quantized weights load dequantized (loader/load/README.md).
    tp_plan: {module or parameter pattern: style} in transformers' styles (loader/tp/user_plan.h;
    a model's `config.base_model_tp_plan` as it is): this rank's slice only, reading only its
    bytes; with dequantize, on pack and group boundaries; across a process group where asked.
    """
    _check_arguments(dict(locals()))
    ref, revision = _key_checkpoint(ref, revision)
    routed = _dist_load.route(
        module, ref, device=device, dtype=dtype, tp_rank=tp_rank, tp_size=tp_size,
        threads=threads, strict=strict, revision=revision, mmap=mmap, key_mapping=key_mapping,
        process_group=process_group, source_rank=source_rank, buffer_bytes=buffer_bytes,
        timeout=timeout, distributed=distributed, dequantize=dequantize, tp_plan=tp_plan)
    if routed is not None:
        return routed
    # One process, a TP slice without the caller's plan: the family's (model/family_load.h).
    family = "family" if (tp_size or 1) > 1 and tp_plan is None and dequantize is None else None
    return _load_plain(module, ref, device, dtype, tp_rank or 0, tp_size or 1, threads,
                       staging_bytes, strict, revision, progress, mmap, key_mapping, dequantize,
                       tp_plan, family, mmap_fused=mmap_fused)


def _key_checkpoint(ref, revision):
    """(ref, revision) to load: for a model key, its snapshot directory in the hub cache at the
    key's revision joined with `revision` (identity/reference.h: a key is never a path, not even
    one its repo id names in the working directory; RepoIdError, ResolveError); anything else
    as given (a path first, then a repo id in the hub cache)."""
    if not isinstance(ref, str) or ":" not in ref or os.path.exists(ref):
        return ref, revision
    r = json.loads(_lib.load().resolve_reference(ref, revision, False))
    return (r["dir"], None) if r["key"] else (ref, revision)


def _load_plain(module, ref, device, dtype, tp_rank, tp_size, threads, staging_bytes, strict,
                revision, progress, mmap, key_mapping, dequantize=None, tp_plan=None,
                name_mapping=None, mmap_fused=True) -> LoadReport:
    """load_into in one process: without a TP plan, with the one given (tp_plan), or with the
    family's (name_mapping="family"). Quantizing libraries' layers still on meta receive their
    packed tensors in the same load (_quantized_modules)."""
    with _open_checkpoint(ref, revision) as handle, _quantized_modules.receiving(
            module, ref, revision, dtype=dtype, dequantize=dequantize, tp_plan=tp_plan,
            tp_size=tp_size) as finish:
        return finish(_load_opened(module, ref, handle, device, dtype, tp_rank, tp_size, threads,
                                   staging_bytes, strict, revision, progress, mmap, key_mapping,
                                   dequantize, tp_plan, name_mapping, mmap_fused))


def _load_opened(module, ref, handle, device, dtype, tp_rank, tp_size, threads, staging_bytes,
                 strict, revision, progress, mmap, key_mapping, dequantize, tp_plan,
                 name_mapping, mmap_fused=True) -> LoadReport:
    """_load_plain on the checkpoint opened once (`handle`): every name asked of it, the load
    and a retry with transformers' renames read no header again."""
    ops = _lib.load()
    try:  # the meta mode (metaload.meta()) would turn the call's device into meta
        from ._mode import real
    except ImportError:
        real = contextlib.nullcontext
    bar, callback = _progress.split(progress)
    state = module.state_dict(keep_vars=True)  # the Parameters themselves; ties appear twice
    _lib.check_utf8(_lib.PlanError, "load_into: a name in the module's state_dict", state.keys())
    dev = torch.device(device) if device is not None else None
    with real():
        computed = _computed(ops, module, state, dev if dev is not None else torch.device("cpu"))
        if name_mapping == "family":  # buffers built on meta: the family's values
            computed = computed._replace(values=_mapping.family_values(
                handle, computed.names, computed.values, dev or torch.device("cpu")))
    renamed: Dict[str, str] = {}
    assembled: List[Dict[str, Any]] = []  # fused targets the C++ plan assembles (_conversions)
    in_checkpoint: List[str] = []
    key_mapping = dict(key_mapping or {})  # the given patterns first, then transformers' own
    # The family's mapping renames on its own (base-model prefixes), as TransformersModel does.
    hf = _is_transformers_model(module) and name_mapping is None
    # A transformers model's own renames matter only where a name is unfound. A strict load
    # without renames of its own tries first without them (no header read twice, no table of
    # conversions: 150 ms on a process's first load, more than a warm zero-copy load itself);
    # a MismatchError then asks the checkpoint's names.
    try_plain = hf and strict and not key_mapping and dequantize is None
    if key_mapping or (hf and not try_plain):
        in_checkpoint = list(ops.checkpoint_names(handle, dequantize is not None))
    if key_mapping:
        renamed = _renames(in_checkpoint, key_mapping)
    if hf and not try_plain and not _all_found(state, in_checkpoint, renamed, computed.names):
        renamed, assembled = _transformers_mapping(module, in_checkpoint, key_mapping, state)
    # strict=False: the C++ plan leaves what the checkpoint lacks and lists it (under the names
    # it was given: a renamed tensor's checkpoint name, named back here).
    missing: List[str] = []
    as_module: Dict[str, str] = {}

    def call(renamed: Dict[str, str], assembled: List[Dict[str, Any]]) -> str:
        own = _without_shadowed(state, renamed, str(ref), strict, missing)
        names = [renamed.get(n, n) for n in own.keys()]
        as_module.clear()
        as_module.update(zip(names, own.keys()))

        args = [list(own.values()), names, str(ref), revision, dev, dtype, tp_rank, tp_size,
                threads, staging_bytes, strict, bar, mmap]
        with real(), _progress.Watch(callback) as watch:
            return ops.load_into(*args, progress_id=watch.id or 0, computed=computed.tensors,
                                 computed_names=computed.names,
                                 computed_values=computed.values, dequantize=dequantize,
                                 tp_plan=_mapping.flat_plan(tp_plan),  # it names modules:
                                 tp_names=list(own.keys()) if tp_plan is not None else None,
                                 assemblies=json.dumps(assembled) if assembled else None,
                                 checkpoint=handle, name_mapping=name_mapping,
                                 map_views=mmap_fused)

    try:
        out = call(renamed, assembled)
    except (_lib.Error, RuntimeError) as e:
        typed = e if isinstance(e, _lib.Error) else _lib.translate(e)
        if not try_plain or not isinstance(typed, _lib.MismatchError):
            raise
        # Nothing changed (a load applies all or nothing): with transformers' renames, if
        # they find what was missing.
        in_checkpoint = list(ops.checkpoint_names(handle, False))
        if _all_found(state, in_checkpoint, renamed, computed.names):
            raise
        renamed, assembled = _transformers_mapping(module, in_checkpoint, key_mapping, state)
        if not renamed and not assembled:
            raise
        out = call(renamed, assembled)
    report = _report(out)
    left = [as_module.get(n, n) for n in report.missing_keys] + missing
    gone = set(left)
    return report._replace(missing_keys=left,
                           computed_keys=[n for n in computed.names if n not in gone])


def _tensors_of(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return list(obj.parameters()) + list(obj.buffers())
    if hasattr(obj, "named_parameters") and hasattr(obj, "named_buffers"):  # a TransformersModel
        return list(obj.named_parameters().values()) + list(obj.named_buffers().values())
    if isinstance(obj, dict):
        return [t for t in obj.values() if isinstance(t, torch.Tensor)]
    return [t for t in obj if isinstance(t, torch.Tensor)]


@_lib.typed_errors
def check_mapped_files(obj) -> Dict[str, str]:
    """Checks the files that `obj`'s tensors map (a zero-copy load_into or dispatch; obj: a module,
    a TransformersModel, a state dict, a tensor or an iterable of tensors) and returns
    {path: guard} for each: "lease" (a read lease: a writer or truncate waits while the bytes are
    copied into private memory, and the weights stay as loaded), "checked" (no lease could be had:
    this check compares size and mtime) or "detached" (the bytes were copied; the file no longer
    matters). Raises metaload.FileChangedError naming a file truncated or written in place since
    it was mapped: its weights can no longer be trusted; load the module again.
    TransformersModel checks on its own before and after every forward and generate; call this
    where your own code runs a module loaded zero-copy."""
    out = _lib.load().check_mapped_files(_tensors_of(obj))
    return {m["path"]: m["guard"] for m in json.loads(out)}

