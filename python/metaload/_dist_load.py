"""load_into across processes and hosts, on torch.distributed (c10d). The messages are CPU
tensors: the group must be a gloo one (with NCCL for the forward, make a second group for the
load: dist.new_group(backend="gloo")); the weights still go to `device`.

    dist.init_process_group("gloo", ...)          # torchrun, mp.spawn, or by hand
    report = metaload.load_into(model, ckpt, tp_size=dist.get_world_size())  # the default group
    report.distributed.bytes_read      # this rank's share + the replicated tensors, exactly

Every rank of the group calls load_into with the same tp_size. The steps, each bounded by
`timeout` seconds (a rank that dies or hangs is an error on the others, never a hang):

1. handshake: every rank tells the others its tp_rank, tp_size and source_rank (an all_gather);
   a disagreement is a DistributedError on every rank before anything is read.
2. staging: the rank's tensors are loaded into fresh tensors beside the module (the module is
   untouched). Default ("shared"): every rank reads its own slice from the checkpoint path, which
   every host sees. Broadcast (source_rank=r): rank r reads each rank's slice in turn and sends it
   to that rank alone (point-to-point, never the whole checkpoint) through a buffer of
   buffer_bytes; the other ranks never open the files (their path need not exist). The source
   holds its own slice, the one slice it is sending and the buffer; a receiver its slice and the
   buffer.
3. vote: every rank tells the others whether it staged everything (an all_gather of a status; a
   failure carries its error). The module's tensors take the staged ones only after a unanimous
   yes; otherwise every rank raises DistributedError naming each failed rank and its error, and
   keeps its previous weights.

A rank's slice is the single-process load_into(tp_rank=, tp_size=, ...) of that rank into meta
stand-ins of the module's tensors, one C++ load op: by the model family's TP plan (vLLM's layouts;
metaload.TransformersModel's families: GPT-2, Llama, Mistral, Qwen2; loader/tp/family_plan.h), or
by the caller's tp_plan=, or dequantized (the C++ plan slices: loader/load/dequant_load.h reads
only the packed bytes and scales of the rank's window); tp_size 1 (every rank a whole replica)
works for any module, as load_into does. The staged tensors meet the module's in C++ too
(loader/load/swap.h: pair_staged, then swap_in after the vote). dequantize= with tp_size > 1
needs tp_plan= (the families' plans do not dequantize). tp_plan= and dequantize= load across the
group only where asked (process_group=, source_rank=, distributed=True): under an initialised
torch.distributed each process may be loading its own slice alone. When every rank
fails with a DequantError (a degree off the scheme's boundaries), each raises a DequantError (its
.rule, and .failures as a DistributedError's) instead of a DistributedError.

After a DistributedError raised because a rank died or did not answer, the process group is
broken (gloo keeps the failed operation): destroy it and make a new one before the next load.
"""
import contextlib
import datetime
import json
import os
import signal
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _lib, _mapping
from ._reports import LoadReport, _report

DEFAULT_TIMEOUT_S = 600.0
# Test hook: "RANK:POINT" kills group rank RANK with SIGKILL at POINT ("mid_load": after it has
# staged some bytes and before the vote; a broadcast receiver after its first chunk, the source
# after serving its first rank), makes it raise ("fail_stage": a failure while staging) or go
# silent before the vote ("hang": sleeps twice $METALOAD_TEST_DIST_FAULT_TIMEOUT seconds).
_FAULT_ENV = "METALOAD_TEST_DIST_FAULT"

# dist/errors.h's kind; .failures maps group ranks to what went wrong there (set by _error).
DistributedError = _lib.DistributedError
# metaload.TransformersModel (a TP slice's staging, the source's config.json): a hook model.py
# sets, as model.py imports this module for its broadcast and importing it here would be a circle.
TransformersModel: Any = None


def _error(message: str, failures: Optional[Dict[int, str]] = None):
    """A DistributedError with .failures, whichever module defines the class."""
    e = DistributedError(message)
    e.failures = dict(failures or {})
    return e


class DistReport(NamedTuple):
    """What a distributed load_into did on this rank (LoadReport.distributed)."""
    rank: int  # in the process group
    world_size: int
    tp_rank: int
    tp_size: int
    mode: str  # "shared" (every rank read its own slice) or "broadcast"
    source_rank: Optional[int]
    bytes_read: int  # checkpoint bytes this rank read (its slice, or every slice on the source)
    held_bytes: int  # bytes of the tensors this rank now holds
    bytes_sent: int
    bytes_received: int
    buffer_bytes: int  # the largest transfer buffer this rank used
    stage_seconds: float
    seconds: float
    rank_bytes_read: List[int]  # bytes_read of every rank, by group rank (from the vote)
    rank_held_bytes: List[int]


# -- the process group, with a timeout on every wait --------------------------------------------


class _Lost(Exception):
    """A collective or a transfer failed (a peer died) or timed out."""


class _Group:
    """The caller's group, through metaload's bounded collectives (distributed/collectives.h:
    every wait has the timeout; after one failure the group refuses every later call)."""

    def __init__(self, group, timeout_s: float):
        import torch.distributed as dist
        from . import _tp
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        self.c = _lib.typed_errors(torch.classes.metaload.Collectives)(_tp.box(group),
                                                                       float(timeout_s))
        self.rank = self.c.rank()
        self.size = self.c.size()

    def _call(self, what: str, fn, *args):
        try:
            return _lib.typed_errors(fn)(*args)
        except DistributedError as e:
            raise _Lost(f"{what}: {e}") from None

    def all_gather_text(self, text: str, what: str) -> List[str]:
        return self._call(what, self.c.all_gather_text, text)

    def send(self, t: torch.Tensor, dst: int, what: str):
        self._call(what, self.c.send, t, dst)

    def recv(self, t: torch.Tensor, src: int, what: str):
        self._call(what, self.c.recv, t, src)

    def send_text(self, text: str, dst: int, what: str):
        self._call(what, self.c.send_text, text, dst)

    def recv_text(self, src: int, what: str) -> str:
        return self._call(what, self.c.recv_text, src)

    def lost(self, step: str, e: BaseException) -> BaseException:
        """The DistributedError of `step` losing contact (its message: distributed/handshake.h)."""
        return _error(self.c.lost_contact(step, str(e)))


def _default_buffer_bytes() -> int:
    """A broadcast's transfer buffer when buffer_bytes is 0 (distributed/handshake.h)."""
    return int(_lib.load().load_default_buffer_bytes())


def _fault(rank: int, point: str):
    spec = os.environ.get(_FAULT_ENV, "")
    if not spec:
        return
    r, _, p = spec.partition(":")
    if p != point or int(r) != rank:
        return
    if point == "fail_stage":
        raise _lib.LoadError(f"injected failure on rank {rank} ({_FAULT_ENV})")
    if point == "hang":  # alive but silent for twice the others' timeout, then carries on
        time.sleep(2 * float(os.environ.get(_FAULT_ENV + "_TIMEOUT", "10")))
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _describe(e: BaseException) -> str:
    kind = getattr(e, "kind", None) or type(e).__name__
    return f"{kind}: {e}"


# -- the module's side: targets, staging, the swap ----------------------------------------------


class _Targets(NamedTuple):
    names: List[str]  # every name (tied tensors under each of their names)
    tensors: List[torch.Tensor]
    strict_names: List[str]  # names that must be filled (state_dict's)
    module: Any = None  # the module itself (a transformers model's conversion mapping)


def _targets(module: torch.nn.Module) -> _Targets:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"a distributed load_into takes a torch.nn.Module, got {type(module).__name__} (a "
            "metaload.TransformersModel loads its own rank's slice when it dispatches)")
    state = module.state_dict(keep_vars=True)
    names, tensors = list(state.keys()), list(state.values())
    seen = {id(t) for t in tensors}
    for n, b in module.named_buffers():  # non-persistent: filled when the staged model has them
        if n not in state and id(b) not in seen:
            names.append(n)
            tensors.append(b)
    return _Targets(names, tensors, list(state.keys()), module)


class _Staged(NamedTuple):
    tensors: Dict[str, torch.Tensor]  # by module name; tied names share one tensor
    bytes_read: int
    report: Any  # the LoadReport of the files read for this slice, or None


class _OwnPlan(NamedTuple):
    """load_into's dequantize= and tp_plan=: the slice is the single-process load's (not the
    family's TransformersModel); None where neither is given."""
    dequantize: Optional[torch.dtype]
    tp_plan: Optional[Dict[str, str]]


def _stage_from_files(targets: _Targets, ref: str, device, dtype, tp_rank: int, tp_size: int,
                      threads: int, revision, strict: bool, mmap,
                      own: Optional[_OwnPlan] = None) -> _Staged:
    """Rank tp_rank's tensors of `ref`, loaded into fresh tensors (the module is not touched): by
    the caller's plan (own), else, for a TP slice, by the model family's (name_mapping="family",
    model/family_load.h), through the one load op either way."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    family = "family" if tp_size > 1 and own is None else None
    return _stage_plain(targets, ref, dev, dtype, tp_rank, tp_size, threads, revision, strict,
                        mmap, own or _OwnPlan(None, None), family)


def _stage_plain(targets: _Targets, ref: str, dev, dtype, tp_rank: int, tp_size: int,
                 threads: int, revision, strict: bool, mmap, own: _OwnPlan,
                 name_mapping: Optional[str] = None) -> _Staged:
    """The single-process load_into of rank tp_rank (by own.tp_plan, or the family's plan:
    name_mapping="family"; own.dequantize) into meta stand-ins of the module's tensors. A
    stand-in of a split tensor's whole shape takes the rank's slice (its shard's or dequantized
    window's shape, as the C++ plan cuts it)."""
    from ._mode import real
    ops = _lib.load()
    uniq: Dict[int, torch.Tensor] = {}
    names, shadows = [], []
    for n, t in zip(targets.names, targets.tensors):
        if n not in targets.strict_names:
            continue
        if id(t) not in uniq:
            uniq[id(t)] = torch.empty(t.shape, dtype=t.dtype, device="meta")
        names.append(n)
        shadows.append(uniq[id(t)])
    handle = _lib.typed_errors(ops.checkpoint_open)(str(ref), revision)  # its headers once
    try:
        # Non-persistent buffers take the values their constructor computed, where known (as
        # load_into's computed_keys), else the family's (model/family_load.h: a causal mask, a
        # rotary inv_freq); unknown ones are left as they are.
        comp = [(n, torch.empty(t.shape, dtype=t.dtype, device="meta"),
                 ops.values_of(t) if t.is_meta else t)
                for n, t in zip(targets.names, targets.tensors)
                if n not in targets.strict_names and id(t) not in uniq]
        if name_mapping == "family":
            with real():
                values = _mapping.family_values(handle, [c[0] for c in comp],
                                                [c[2] for c in comp], dev)
            comp = [(n, t, v) for (n, t, _), v in zip(comp, values)]
        comp = [c for c in comp if c[2] is not None]
        # A transformers model's renames and fused experts, as the single-process load applies
        # them (_mapping): the C++ plan assembles each rank's part of a fused target.
        renamed, assembled = {}, []
        # (The family's mapping renames on its own, as TransformersModel does.)
        if _mapping._is_transformers_model(targets.module) and name_mapping is None:
            in_checkpoint = list(ops.checkpoint_names(handle, own.dequantize is not None))
            renamed, assembled = _mapping._transformers_mapping(
                targets.module, in_checkpoint, {}, dict(zip(names, shadows)))
        with real():
            out = ops.load_into(
                shadows, [renamed.get(n, n) for n in names], str(ref), revision, dev, dtype,
                tp_rank, tp_size, threads, 0, strict, False, mmap, computed=[c[1] for c in comp],
                computed_names=[c[0] for c in comp], computed_values=[c[2] for c in comp],
                dequantize=own.dequantize,
                tp_plan=_mapping.flat_plan(own.tp_plan),
                tp_names=names if own.tp_plan is not None else None,
                assemblies=json.dumps(assembled) if assembled else None, checkpoint=handle,
                name_mapping=name_mapping)
    finally:
        ops.checkpoint_close(handle)
    rep = _report(out)
    as_module = {c: m for m, c in renamed.items()}
    left = {as_module.get(n, n) for n in rep.missing_keys}  # strict=False: what it lacks stays
    staged = {n: t for n, t in zip(names, shadows) if n not in left}
    staged.update((n, t) for n, t, _ in comp if n not in left)
    return _Staged(staged, rep.bytes, rep)


def _skeleton_targets(model) -> _Targets:
    """A TransformersModel not yet dispatched, as a broadcast stages for it: its parameters, on
    meta in their whole shapes (a tie under each of its names)."""
    params = model.named_parameters()
    return _Targets(list(params), list(params.values()), list(params))


def _match(targets: _Targets, staged: Dict[str, torch.Tensor], strict: bool,
           where: str) -> List[Tuple[torch.Tensor, torch.Tensor, str]]:
    """(target, staged tensor, name) once per target tensor, paired in C++
    (loader/load/swap.h: pair_staged); MismatchError listing every problem, raised before any
    tensor changes. Only Python knows a tensor subclass: that, and state_dict's names, go as
    data."""
    required = set(targets.strict_names)
    out = _lib.typed_errors(_lib.load().pair_staged)(
        targets.tensors, targets.names, [n in required for n in targets.names],
        [type(t) in (torch.Tensor, torch.nn.Parameter) for t in targets.tensors], list(staged),
        list(staged.values()), strict, where)
    return list(zip(*out))


def _swap(pairs: List[Tuple[torch.Tensor, torch.Tensor, str]]):
    """All or nothing (loader/load/swap.h): a meta target takes its shard's shape."""
    _lib.typed_errors(_lib.load().swap_tensors)([p[0] for p in pairs], [p[1] for p in pairs],
                                                [p[2] for p in pairs], True)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _held(pairs) -> int:
    return sum(_nbytes(s) for _, s, _ in pairs)


# -- broadcast mode: the source serves each rank its slice --------------------------------------


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _manifest(staged: Dict[str, torch.Tensor]) -> Tuple[dict, List[torch.Tensor]]:
    entries: Dict[int, dict] = {}
    order: List[torch.Tensor] = []
    for n, t in staged.items():
        if id(t) in entries:
            entries[id(t)]["names"].append(n)
            continue
        entries[id(t)] = {"names": [n], "dtype": str(t.dtype).replace("torch.", ""),
                          "shape": list(t.shape), "nbytes": _nbytes(t)}
        order.append(t)
    return {"tensors": list(entries.values())}, order


def _chunks(views: List[torch.Tensor], chunk: int):
    """The transfer's chunks of `chunk` bytes over the concatenated byte views: per chunk, its
    bytes and its spans (a view's slice, the buffer's slice it goes to or comes from). The one
    walk of both ends: the source fills its buffer from the spans, a receiver empties it into
    them."""
    total = sum(v.numel() for v in views)
    ti, off, at = 0, 0, 0  # the view and the byte within it that the next chunk starts at
    while at < total:
        n, spans, filled = min(chunk, total - at), [], 0
        while filled < n:
            v = views[ti]
            take = min(n - filled, v.numel() - off)
            spans.append((v[off:off + take], slice(filled, filled + take)))
            filled, off = filled + take, off + take
            if off == v.numel():
                ti, off = ti + 1, 0
        yield n, spans
        at += n


def _serve(g: _Group, dst: int, staged: Dict[str, torch.Tensor], buffer_bytes: int,
           progress: Dict[str, int], dequantized: List[str] = ()):
    """Sends rank dst its staged tensors: a manifest (with the names of those dequantized, for
    its report), then their bytes in buffer_bytes chunks."""
    manifest, order = _manifest(staged)
    manifest["dequantized"] = list(dequantized)
    total = sum(e["nbytes"] for e in manifest["tensors"])
    chunk = max(1, min(buffer_bytes, total))
    manifest["chunk"] = chunk
    g.send_text(json.dumps(manifest), dst, f"sending rank {dst} its manifest")
    buf = torch.empty(chunk, dtype=torch.uint8)
    progress["buffer"] = max(progress["buffer"], chunk if total else 0)
    for n, spans in _chunks([_as_bytes(t) for t in order], chunk):
        for view, part in spans:
            buf[part].copy_(view)
        g.send(buf[:n], dst, f"sending rank {dst} its weights")
        progress["sent"] += n


def _receive(g: _Group, src: int, device, rank: int,
             info: Optional[dict] = None) -> Tuple[Dict[str, torch.Tensor], int, int]:
    """(staged tensors, bytes received, buffer size) from the source; raises the source's error.
    info["dequantized"]: the names the source dequantized."""
    text = g.recv_text(src, f"waiting for rank {src}'s manifest")
    manifest = json.loads(text)
    if info is not None:
        info["dequantized"] = list(manifest.get("dequantized", []))
    if "error" in manifest:
        e = _lib.LoadError(f"the source rank {src} could not serve this rank: "
                           f"{manifest['error']}")
        # the vote's kind of this failure: the source's (a DequantError on every rank is one)
        e.source_kind, e.source_rule = manifest.get("kind"), manifest.get("rule")
        raise e
    dev = torch.device(device) if device is not None else torch.device("cpu")
    tensors, views, staged = [], [], {}
    for e in manifest["tensors"]:
        # Received into CPU memory (gloo moves CPU tensors), then moved to `device`.
        t = torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
        tensors.append(t)
        views.append(_as_bytes(t))
    total = sum(e["nbytes"] for e in manifest["tensors"])
    chunk = max(1, int(manifest.get("chunk", 1)))
    buf = torch.empty(chunk if total else 0, dtype=torch.uint8)
    got = 0
    for n, spans in _chunks(views, chunk):
        g.recv(buf[:n], src, f"receiving weights from rank {src}")
        got += n
        _fault(rank, "mid_load")
        for view, part in spans:
            view.copy_(buf[part])
    for e, t in zip(manifest["tensors"], tensors):
        t = t.to(dev) if t.device != dev else t
        for n in e["names"]:
            staged[n] = t
    return staged, got, buf.numel()


# -- the load -------------------------------------------------------------------------------------


def _timeout_s(timeout) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def route(module, ref, *, tp_rank, tp_size, key_mapping, process_group, source_rank,
          distributed, dequantize=None, tp_plan=None, **kw):
    """load_into's tensor-parallel and distributed cases (its report), or None: a plain load.
    With dequantize= or tp_plan=, across the group only where asked (the module's docstring)."""
    own_plan = dequantize is not None or tp_plan is not None
    if distributed is None:
        distributed = process_group is not None or source_rank is not None or (
            (tp_size or 1) > 1 and not own_plan and torch.distributed.is_available()
            and torch.distributed.is_initialized())
    if not distributed and ((tp_size or 1) == 1 or own_plan):
        return None
    if key_mapping:
        raise _lib.PlanError("key_mapping is not supported with tensor parallelism or a process "
                             "group")
    if not distributed:
        return None  # one process's TP slice: the plain load with the family's plan
    return load_distributed(module, ref, tp_rank=tp_rank, tp_size=tp_size,
                            process_group=process_group, source_rank=source_rank,
                            dequantize=dequantize, tp_plan=tp_plan, **kw)


def load_distributed(module: torch.nn.Module, ref: str, *, device=None, dtype=None,
                     tp_rank: Optional[int] = None, tp_size: Optional[int] = None,
                     process_group=None, source_rank: Optional[int] = None,
                     buffer_bytes: int = 0, timeout=None, threads: int = 0, strict: bool = True,
                     revision: Optional[str] = None, mmap: Optional[bool] = None,
                     dequantize: Optional[torch.dtype] = None,
                     tp_plan: Optional[Dict[str, str]] = None):
    """metaload.load_into with a process group (see the module's docstring); returns the rank's
    LoadReport with .distributed set."""
    import torch.distributed as dist
    t0 = time.monotonic()
    if not dist.is_available() or not dist.is_initialized():
        raise _error("a distributed load_into needs torch.distributed initialised "
                     "(init_process_group) on every rank")
    own = None if dequantize is None and tp_plan is None else _OwnPlan(dequantize, tp_plan)
    job = _Job(_Group(process_group, _timeout_s(timeout)), module, ref, device, dtype, threads,
               strict, revision, mmap, source_rank, buffer_bytes or _default_buffer_bytes(), own)
    size = tp_size if tp_size is not None else job.g.size
    rank = tp_rank if tp_rank is not None else (job.g.rank if size > 1 else 0)
    job.handshake(rank, size, buffer_bytes)  # 1: all agree, or all raise
    if own is not None and own.tp_plan is None and size > 1:  # every rank alike (the handshake)
        raise _lib.PlanError(f"dequantize= with tp_size {size} across a process group needs "
                             f"tp_plan= (the model families' TP plans do not dequantize)")
    t_stage = time.monotonic()
    status = job.stage(rank, size)  # 2: nothing in the module changes here
    stage_seconds = time.monotonic() - t_stage
    votes = job.vote(status)  # 3: all said yes, or all raise
    _swap(job.pairs)
    return job.report(rank, size, votes, stage_seconds, time.monotonic() - t0)


class _Job:
    """One distributed load on one rank: its steps, each a collective every rank takes part in
    (a local failure is a "no" in the vote, never a rank that leaves the others waiting)."""

    def __init__(self, g: _Group, module, ref, device, dtype, threads, strict, revision, mmap,
                 source_rank, buffer_bytes, own: Optional[_OwnPlan] = None):
        self.g, self.module, self.ref, self.device, self.dtype = g, module, ref, device, dtype
        self.threads, self.strict, self.revision, self.mmap = threads, strict, revision, mmap
        self.source_rank, self.buffer_bytes = source_rank, buffer_bytes
        self.own = own
        self.mode = "shared" if source_rank is None else "broadcast"
        self.peers: List[dict] = []
        self.pairs: List[Tuple[torch.Tensor, torch.Tensor, str]] = []
        self.bytes_read, self.received, self.load_report = 0, 0, None
        self.progress = {"sent": 0, "buffer": 0}

    def handshake(self, rank: int, size: int, buffer_bytes: int):
        """Every rank's hello, once they agree (distributed/load_agreement.cc); DistributedError
        on every rank otherwise."""
        own = self.own or _OwnPlan(None, None)
        hello = json.dumps({"tp_rank": rank, "tp_size": size,
                            "source_rank": self.source_rank, "buffer_bytes": buffer_bytes,
                            "dequantize": str(own.dequantize) if own.dequantize else None,
                            "tp_plan": sorted(own.tp_plan.items()) if own.tp_plan else None})
        self.peers = [json.loads(x) for x in
                      _lib.typed_errors(self.g.c.load_handshake)(hello)]

    def _own_slice(self, targets, rank, size):
        _fault(self.g.rank, "fail_stage")
        mine = _stage_from_files(targets, self.ref, self.device, self.dtype, rank, size,
                                 self.threads, self.revision, self.strict, self.mmap, self.own)
        self.bytes_read, self.load_report = mine.bytes_read, mine.report
        self.pairs = _match(targets, mine.tensors, self.strict, f"rank {rank} of {size}")
        return mine

    def stage(self, rank: int, size: int) -> Dict[str, Any]:
        g = self.g
        try:
            if self.source_rank is None:
                self._own_slice(_targets(self.module), rank, size)
                _fault(g.rank, "mid_load")
                _fault(g.rank, "hang")
            elif g.rank == self.source_rank:
                # The source serves every rank even when its own slice failed (they learn it at
                # once instead of waiting out the timeout); its own failure is raised after.
                own, own_error, targets = None, None, None
                try:
                    targets = _targets(self.module)
                    own = self._own_slice(targets, rank, size)
                except Exception as e:
                    own_error = e
                self.bytes_read += _serve_all(g, self.peers, self.ref, self.dtype, self.threads,
                                              self.revision, self.strict, self.mmap, targets,
                                              self.buffer_bytes, self.progress, own, own_error,
                                              plan=self.own)
                if own_error is not None:
                    raise own_error
            else:
                _fault(g.rank, "fail_stage")
                staged, self.received, self.progress["buffer"] = _receive(
                    g, self.source_rank, self.device, g.rank, self.progress)
                self.pairs = _match(_targets(self.module), staged, self.strict,
                                    f"rank {rank} of {size}")
            status: Dict[str, Any] = {"ok": True}
        except _Lost as e:
            status = {"ok": False, "error": f"lost contact: {e}"}
        except Exception as e:  # a failed stage is this rank's "no" in the vote
            status = {"ok": False, "error": _describe(e), "kind": _kind_of(e),
                      "rule": getattr(e, "source_rule", None) or getattr(e, "rule", None)}
        status.update(bytes_read=self.bytes_read, held_bytes=_held(self.pairs))
        return status

    def vote(self, status: Dict[str, Any]) -> List[dict]:
        """Every rank's status once all staged theirs; else every rank raises the same error
        (distributed/handshake.h's vote) and keeps its weights."""
        step = f"the vote on loading {_lib.quote(self.ref)} ({self.mode})"
        failure = "" if status["ok"] else status["error"]
        texts, message = _lib.typed_errors(self.g.c.vote)(step, failure, json.dumps(status))
        ballots = [json.loads(b) for b in texts]
        votes = [b["data"] for b in ballots]
        if message:
            failures = {i: b["failure"] for i, b in enumerate(ballots) if b["failure"]}
            raise _typed_failure(votes, message, failures) or _error(message, failures)
        return votes

    def report(self, rank, size, votes, stage_seconds, seconds):
        held = _held(self.pairs)
        d = DistReport(self.g.rank, self.g.size, rank, size, self.mode, self.source_rank,
                       self.bytes_read, held, self.progress["sent"], self.received,
                       self.progress["buffer"], stage_seconds, seconds,
                       [int(v["bytes_read"]) for v in votes], [int(v["held_bytes"]) for v in votes])
        report = self.load_report
        if report is None:  # a receiver: nothing read from files
            report = LoadReport(bytes=0, slot_bytes=held, seconds=stage_seconds,
                                peak_staging_bytes=self.progress["buffer"],
                                peak_device_staging_bytes=0, reads=0, direct_bytes=0,
                                mapped_bytes=0, threads=0, engine="received", files=[],
                                dequantized_keys=self.progress.get("dequantized", []))
        return report._replace(distributed=d)


def _kind_of(e: BaseException) -> str:
    """The metaload kind of a rank's failure; a receiver's is the source's failure it reports."""
    return getattr(e, "source_kind", None) or getattr(e, "kind", None) or type(e).__name__


def _typed_failure(votes: List[dict], message: str, failures: Dict[int, str]):
    """A DequantError when every rank failed with one (a degree off the scheme's boundaries, a
    malformed quantized checkpoint: the same on every rank), else None (a DistributedError)."""
    votes = [v if isinstance(v, dict) else {"ok": False} for v in votes]
    kinds = {v.get("kind") for v in votes}
    if any(v["ok"] for v in votes) or kinds != {"DequantError"}:
        return None
    rules = {v.get("rule") for v in votes}
    rule = rules.pop() if len(rules) == 1 else None
    if rule and not message.rstrip().endswith(f"(rule {rule})"):
        message += f" (rule {rule})"
    e = _lib.DequantError(message, rule=rule)
    e.failures = dict(failures)
    return e


def _handshake_problems(peers: List[dict], group_size: int) -> List[str]:
    """What the C++ handshake (distributed/load_agreement.cc) finds wrong with these hellos."""
    return list(_lib.load().load_handshake_problems([json.dumps(p) for p in peers], group_size))


def _serve_all(g: _Group, peers, ref, dtype, threads, revision, strict, mmap, targets,
               buffer_bytes, progress, own: Optional[_Staged],
               own_error: Optional[BaseException],
               plan: Optional[_OwnPlan] = None) -> int:
    """The source's part of a broadcast: each other rank's slice, read and sent in turn (one
    slice in memory at a time). Returns the bytes read. A failure sends the ranks not yet served
    the error (and its kind), so they vote at once instead of waiting out the timeout; it is
    raised after.

    With dequantize= (plan), each rank is sent its dequantized slice, not the packed parts and
    scales: those would be fewer bytes on the wire (a 4-bit weight is a quarter of its bf16
    slice), but the receivers never open the files, so they lack the headers and config.json the
    kernels' plan comes from (loader/load/dequant_load.h plans on the reading rank, in C++); the
    source runs every rank's kernels, on slices it reads anyway."""
    read, error = 0, None
    if own_error is not None:
        error = {"error": f"reading its own slice: {_describe(own_error)}",
                 "kind": _kind_of(own_error), "rule": getattr(own_error, "rule", None)}
    for r in range(g.size):
        if r == g.rank:
            continue
        if error is not None:
            with contextlib.suppress(_Lost):
                g.send_text(json.dumps(error), r, f"telling rank {r}")
            continue
        try:
            if peers[r]["tp_size"] == 1:  # replicas: every rank gets what the source holds
                staged = _Staged(own.tensors, 0, own.report)
            else:
                staged = _stage_from_files(targets, ref, "cpu", dtype, peers[r]["tp_rank"],
                                           peers[r]["tp_size"], threads, revision, strict, mmap,
                                           plan)
        except Exception as e:
            error = {"error": f"reading rank {r}'s slice: {_describe(e)}", "kind": _kind_of(e),
                     "rule": getattr(e, "rule", None)}
            with contextlib.suppress(_Lost):
                g.send_text(json.dumps(error), r, f"telling rank {r}")
            continue
        read += staged.bytes_read
        try:
            _serve(g, r, staged.tensors, buffer_bytes, progress,
                   getattr(staged.report, "dequantized_keys", None) or ())
        except _Lost as e:
            error = {"error": f"serving rank {r}: {e}"}
        del staged
        _fault(g.rank, "mid_load")
    if error is not None and own_error is None:
        raise _lib.LoadError(error["error"])
    return read


# -- broadcast into a TransformersModel: TransformersModel(..., source_rank=) ---------------------


def share_config(process_group, source_rank: int, ref: str, revision, timeout) -> Optional[str]:
    """The source's config.json for every rank of the group (the receivers build their skeleton
    from it; they need no file of the checkpoint): the folder of a temporary config.json on the
    receivers, None on the source. DistributedError on every rank when the source cannot read it
    (naming its error) or a rank is lost."""
    import tempfile
    g = _Group(process_group, _timeout_s(timeout))
    if not 0 <= source_rank < g.size:
        raise _error(f"source_rank {source_rank} is not a rank of the group (0..{g.size - 1})")
    mine = ""
    if g.rank == source_rank:
        try:
            probe = TransformersModel(ref, revision=revision, progress=False, process_group=False)
            with open(probe.info["config_path"]) as f:
                mine = json.dumps({"config": f.read()})
        except Exception as e:  # the others learn it now, not after a timeout
            mine = json.dumps({"error": _describe(e)})
    try:
        texts = g.all_gather_text(mine, "sharing config.json")
    except _Lost as e:
        raise g.lost("sharing the source's config.json", e) from None
    sent = json.loads(texts[source_rank])
    if "error" in sent:
        raise _error(f"the source rank {source_rank} cannot read {_lib.quote(ref)}, nothing was "
                     f"loaded: {sent['error']}", {source_rank: sent["error"]})
    if g.rank == source_rank:
        return None
    folder = tempfile.mkdtemp(prefix="metaload-config-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(sent["config"])
    return folder


def dispatch_broadcast(model, ref: str, *, process_group, source_rank: int, buffer_bytes: int,
                       timeout, threads: int, revision):
    """Dispatches `model` (a TransformersModel of every rank of the group, not dispatched) in
    broadcast mode: rank source_rank reads each rank's slice and sends it to that rank alone, the
    others never open the files; every rank checks what it staged against its skeleton, votes,
    and only after a unanimous yes do the models take the weights (dispatch_from). Returns the
    rank's LoadReport with .distributed; DistributedError on every rank otherwise (every model
    stays undispatched)."""
    t0 = time.monotonic()
    g = _Group(process_group, _timeout_s(timeout))
    info = model.info
    rank, size = info["tp_rank"], info["tp_size"]
    device, dtype = info["device"], getattr(torch, info["dtype"])
    job = _Job(g, None, ref, device, dtype, threads, True, revision, None, source_rank,
               buffer_bytes or _default_buffer_bytes())
    job.handshake(rank, size, buffer_bytes)
    t_stage = time.monotonic()
    staged: Dict[str, torch.Tensor] = {}
    try:
        if g.rank == source_rank:
            own, own_error, targets = None, None, None
            try:
                _fault(g.rank, "fail_stage")
                targets = _skeleton_targets(model)
                own = _stage_from_files(targets, ref, device, None, rank, size, threads,
                                        revision, True, None)
                job.bytes_read, job.load_report = own.bytes_read, own.report
                staged = own.tensors
            except Exception as e:
                own_error = e
            job.bytes_read += _serve_all(g, job.peers, ref, None, threads, revision, True, None,
                                         targets, job.buffer_bytes, job.progress, own, own_error)
            if own_error is not None:
                raise own_error
        else:
            _fault(g.rank, "fail_stage")
            staged, job.received, job.progress["buffer"] = _receive(g, source_rank, device,
                                                                    g.rank)
        # (The source staged the skeleton's parameters only, so every rank holds just those.)
        _lib.typed_errors(model._m.dispatch_from)(list(staged), list(staged.values()), True)
        status: Dict[str, Any] = {"ok": True}
    except _Lost as e:
        status = {"ok": False, "error": f"lost contact: {e}"}
    except Exception as e:  # this rank's "no" in the vote
        status = {"ok": False, "error": _describe(e)}
    unique = list({id(t): t for t in staged.values()}.values()) if status["ok"] else []
    job.pairs = [(None, t, "") for t in unique]
    status.update(bytes_read=job.bytes_read, held_bytes=_held(job.pairs))
    stage_seconds = time.monotonic() - t_stage
    votes = job.vote(status)
    _lib.typed_errors(model._m.dispatch_from)(list(staged), list(staged.values()), False)
    return job.report(rank, size, votes, stage_seconds, time.monotonic() - t0)
