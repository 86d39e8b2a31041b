"""metaload.TransformersModel: name a model, get its skeleton at once, scan it, and have the weights
arrive on the first real forward (the C++ class torch.classes.metaload.TransformersModel).

    model = metaload.TransformersModel("openai-community/gpt2")   # reads config.json only
    shapes = model.scan(batch=2, seq=16)                          # {path: ModuleShape}: a Scan
    w = model.parameter("transformer.h.0.attn.c_attn.weight")     # meta for now
    layer = model.capture("transformer.h.3")
    logits = model(torch.tensor([[464, 2068, 7586]]))             # dispatches, then runs
    layer.value                                                   # transformer.h.3's output
    w.device                                                      # cpu: the same tensor object

Errors surface as metaload.<Kind> exceptions (ResolveError, ConfigError, MismatchError,
ModulePathError, ModelError, ...).
"""
import json
import warnings
from typing import Any, Dict, List, Optional

import torch

from . import _dist_load, _lib, _progress, _quantized_modules, _tp
from ._lib import typed_errors
from ._reports import LoadReport
from ._reports import _report as _load_report
from ._scan import ModuleShape, Scan  # noqa: F401 (metaload.model.ModuleShape, as before)
from ._scan import from_json as _scan_from_json


def _scan(text):
    return _scan_from_json(json.loads(text))


def _report(text):
    return _load_report(text)


class Capture:
    """A module's output, kept while this object lives (fake during scans, real in forwards)."""

    def __init__(self, handle):
        self._h = handle

    @property
    def path(self) -> str:
        return self._h.path()

    @property
    def value(self) -> torch.Tensor:
        return typed_errors(self._h.value)()

    @property
    def count(self) -> int:
        return self._h.count()

    def has_value(self) -> bool:
        return self._h.has_value()

    def reset(self):
        self._h.reset()


class TransformersModel:
    """A causal LM (GPT-2, Llama, Mistral, Qwen2) from a checkpoint directory, a Hugging Face repo
    id in the local cache, or a model key. Placement (device, dtype, tp_rank, tp_size, threads) is
    taken now and applied at dispatch; dispatch=True loads at once."""

    @typed_errors
    def __init__(self, ref: str, *, revision: Optional[str] = None, device="cpu", dtype=None,
                 tp_rank: Optional[int] = None, tp_size: int = 1, process_group=None,
                 collective_timeout: float = 300.0, threads: int = 0, dispatch: bool = False,
                 progress: _progress.Progress = True, progress_bar: Optional[bool] = None,
                 allow_local_paths: bool = False, source_rank: Optional[int] = None,
                 buffer_bytes: int = 0):
        """progress: as load_into's (True: a bar on stderr when it is a terminal; False; a
        callable (done_bytes, total_bytes) or a tqdm-like object), for the dispatch, whenever it
        happens. progress_bar: the old name of progress (deprecated).
        allow_local_paths: a model key `ref` may name a local path; by default a key's repo_id
        must be a Hugging Face Hub repo id, looked up in the hub cache only (metaload.RepoIdError
        otherwise). A `ref` that is a path (not a key) is a path either way.
        Tensor parallelism across processes: with tp_size > 1 the model runs as one rank of a
        torch.distributed group (process_group, default: the default group when
        torch.distributed is initialised; torchrun or torch.multiprocessing.spawn start the
        ranks): tp_size must be the group's size, tp_rank (default: this process's rank in the
        group) its rank. Construction checks that every rank agrees (metaload.DistributedError
        listing each rank's values otherwise); every collective waits collective_timeout
        seconds at most (a rank that died or hangs: metaload.DistributedError, never a hang).
        Without a group (or with process_group=False, which takes none even under
        torch.distributed) a rank can scan and load its shard but not run.
        source_rank: broadcast mode, for hosts without the checkpoint. Every rank of the group
        constructs the model together (a collective) and it is dispatched at once: rank
        source_rank reads `ref` (its config.json, then each rank's slice) and sends every other
        rank its config.json and its slice alone through buffers of buffer_bytes (0: 64 MiB);
        the other ranks never open `ref`. All or nothing: unless every rank got its weights,
        every rank raises metaload.DistributedError. dispatch() then returns the rank's
        LoadReport with .distributed (metaload.load_into's broadcast mode, DistReport)."""
        _lib.load()
        _lib.check_utf8(_lib.ResolveError, "TransformersModel(ref=...)", [str(ref), revision])
        self._dist_report = None
        if source_rank is not None:
            return self._init_broadcast(
                ref, source_rank, buffer_bytes, revision=revision, device=device, dtype=dtype,
                tp_rank=tp_rank, tp_size=tp_size, process_group=process_group,
                collective_timeout=collective_timeout, threads=threads, progress=progress,
                progress_bar=progress_bar, allow_local_paths=allow_local_paths)
        group = _tp.resolve(tp_size, process_group)
        if tp_rank is None:
            tp_rank = -1 if group is not None else 0  # -1: the group's rank
        if progress_bar is not None:
            warnings.warn("TransformersModel(progress_bar=...) is now progress=...",
                          DeprecationWarning, stacklevel=3)
            progress = progress_bar
        bar, self._progress = _progress.split(progress)
        args = [str(ref), revision, str(torch.device(device)),
                None if dtype is None else str(dtype), tp_rank, tp_size, threads, dispatch, bar]
        self._progress_id = 0
        if self._progress is not None:
            _progress.require()
            self._progress_id = _progress.Watch.new_id()
        if _progress.supported():
            args.append(self._progress_id)  # a library with progress ids takes one (0: none)
            args.append(bool(allow_local_paths))
            args.append(group)
            args.append(float(collective_timeout))
        elif allow_local_paths:
            raise _lib.Error(f"{_lib.library_path()} predates allow_local_paths: rebuild it")
        with self._watch(dispatching=dispatch), _quantized_modules.refusing_families(ref):
            self._m = torch.classes.metaload.TransformersModel(*args)
        _quantized_modules.refuse_in_families(str(ref), self.config)

    def _init_broadcast(self, ref, source_rank, buffer_bytes, *, process_group,
                        collective_timeout, revision, **placement):
        """TransformersModel(..., source_rank=): the receivers build from the source's
        config.json, then the broadcast dispatch (metaload._dist_load)."""
        import shutil
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise _lib.error_class("DistributedError")(
                "source_rank needs torch.distributed initialised (init_process_group) on every "
                "rank")
        if process_group is False or isinstance(process_group, torch.ScriptObject):
            raise _lib.error_class("DistributedError")(
                "source_rank needs a torch.distributed process group (None: the default group)")
        group = process_group if process_group is not None else dist.group.WORLD
        folder = _dist_load.share_config(group, source_rank, str(ref), revision,
                                         collective_timeout)
        try:
            self.__init__(ref if folder is None else folder, revision=revision if folder is None
                          else None, process_group=process_group,
                          collective_timeout=collective_timeout, **placement)
        finally:
            if folder is not None:  # read at construction only
                shutil.rmtree(folder, ignore_errors=True)
        # The source serves what it resolved at construction: a key's hub-cache snapshot (a
        # key is never a path for the loader to look up), a repo id pinned at its commit.
        source = folder is None
        self._dist_report = _dist_load.dispatch_broadcast(
            self, self.info["checkpoint"] if source else str(ref), process_group=group,
            source_rank=source_rank, buffer_bytes=buffer_bytes, timeout=collective_timeout,
            threads=placement["threads"], revision=None if source else revision)

    def _watch(self, dispatching=None):
        """Forwards the dispatch's progress to the callback while a call that may dispatch runs."""
        if dispatching is None:
            dispatching = not self._m.dispatched()
        return _progress.Watch(self._progress if dispatching else None, self._progress_id)

    @classmethod
    def from_model_key(cls, key: str, **placement) -> "TransformersModel":
        """A model in meta state from '<class>:<json>' (nnsight's class paths are aliases). The
        key's repo_id must be a Hub repo id unless allow_local_paths=True is among `placement`."""
        if ":" not in key:
            raise _lib.error_class("ModelKeyError")(
                f"{_lib.quote(key)} is not a model key (CLASS:JSON)")
        return cls(key, **placement)

    @typed_errors
    def to_model_key(self, allow_local_paths: Optional[bool] = None) -> str:
        """The model's key. A model loaded from a local checkpoint has no Hub repo id: its key
        names the directory, which needs allow_local_paths (default: as the model was made)."""
        return self._m.to_model_key(allow_local_paths)

    @property
    def info(self) -> Dict[str, Any]:
        return json.loads(self._m.info())

    @property
    def config(self) -> Dict[str, Any]:
        return self.info["config"]

    @property
    def dispatched(self) -> bool:
        return self._m.dispatched()

    @typed_errors
    def dispatch(self) -> LoadReport:
        """Loads the weights into the same tensors (idempotent: later calls load nothing)."""
        if self._dist_report is not None:  # dispatched by the broadcast at construction
            return self._dist_report
        with self._watch():
            return _report(self._m.dispatch())

    @typed_errors
    def scan(self, ids: Optional[torch.Tensor] = None, *, batch: Optional[int] = None,
             seq: Optional[int] = None, device=None, tp_size: Optional[int] = None,
             tp_rank: int = 0) -> Scan:
        """Every module's output shape for ids (any tensor; only its shape counts) or for a
        [batch, seq] batch, on fake tensors claiming `device`. Never loads weights.
        tp_size: scan rank tp_rank of that tensor-parallel split, with no process group (default:
        the split the weights are in); the Scan's weight_bytes is what that rank holds."""
        dev = None if device is None else str(torch.device(device))
        if ids is not None:
            return _scan(self._m.scan_ids(ids, dev, tp_size, tp_rank))
        if batch is None or seq is None:
            raise TypeError("scan() needs ids, or batch= and seq=")
        return _scan(self._m.scan(batch, seq, dev, tp_size, tp_rank))

    @typed_errors
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits. Real ids dispatch first; meta or fake ids scan (fake logits)."""
        with self._watch():
            return self._m.forward(ids)

    __call__ = forward

    @typed_errors
    def generate(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        """Greedy decoding of n tokens: [batch, seq + n]."""
        with self._watch():
            return self._m.generate(ids, n)

    @typed_errors
    def parameter(self, name: str) -> torch.Tensor:
        return self._m.parameter(name)

    def named_parameters(self) -> Dict[str, torch.Tensor]:
        return dict(zip(self._m.parameter_names(), self._m.parameters()))

    def named_buffers(self) -> Dict[str, torch.Tensor]:
        return dict(zip(self._m.buffer_names(), self._m.buffers()))

    def module_paths(self) -> List[str]:
        return list(self._m.module_paths())

    @typed_errors
    def module_class(self, path: str) -> str:
        return self._m.module_class(path)

    @typed_errors
    def capture(self, path: str) -> Capture:
        return Capture(self._m.capture(path))

    def __repr__(self):
        i = self.info
        state = "dispatched" if i["dispatched"] else "meta"
        return f"TransformersModel({i['reference']!r}, {i['class']}, {state})"


_dist_load.TransformersModel = TransformersModel  # the hook _dist_load builds ranks' models with


@typed_errors
def make_checkpoint(out: str = "", *, config: str, arch: str = "", dtype="float32", shards: int = 1,
                    seed: int = 0, layout: str = "published", buffers: bool = False,
                    hf_cache: str = "", repo: str = "") -> Dict[str, Any]:
    """Writes a deterministic checkpoint (as `metaload make-checkpoint`); returns what was written."""
    return json.loads(_lib.load().make_checkpoint(arch, config, str(dtype).replace("torch.", ""),
                                                  shards, seed, layout, buffers, hf_cache, repo,
                                                  str(out)))
