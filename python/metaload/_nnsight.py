"""metaload under nnsight: its meta build runs in metaload's mode, its dispatch streams the weights
into the skeleton it already has.

    import metaload, nnsight
    metaload.enable_nnsight()
    model = nnsight.LanguageModel("org/name", dispatch=False)   # built under metaload.meta()
    with model.trace("Hello"):                                   # dispatches: metaload.load_into
        h = model.model.layers[0].output.save()

Without it, nnsight builds the skeleton under its own TorchFunctionMode (Python on every torch
call; small constant tensors such as rotary `inv_freq` lose their values) and, at the first real
run, builds the whole model a second time with `from_pretrained` and re-points its envoys at it.
With it, the skeleton's own Parameters receive the weights (all or nothing, each byte read once,
computed buffers from the values metaload kept), so nothing is built twice and references to the
skeleton's modules stay valid.

The dispatch goes through metaload only where that gives the same model: a transformers model
whose checkpoint metaload can resolve (a local directory or a repo id in the hub cache, at the
model's revision) and whose load options mean nothing more than a device and a dtype. A PEFT
adapter (`peft=`: a LoRA adapter directory, or its repo id in the hub cache), whose layers nnsight's
meta build puts into the skeleton, is filled in the same load (load_into's adapters=). A
pre-quantized checkpoint (bitsandbytes 4-bit / 8-bit, compressed-tensors: its config.json's
quantization_config) gets the library's layers in the meta build, as from_pretrained builds them
(transformers' quantizer on the skeleton: _quantized_modules), so scan and dispatch see the same
modules; the dispatch loads the packed tensors into them. Quantizing on load
(`quantization_config=` or a quantization name as `dtype=`), other quantization methods,
`device_map="auto"` / dicts, `max_memory` and other loading options fall back to nnsight's own
dispatch, with a warning saying which option did it.
"""
import threading
import warnings

import torch

from . import _lib, _quantized_modules, _thread_scope

_lock = threading.Lock()
_saved = {}  # (module, attribute) -> original, while enabled
_options = {"mmap": True, "scan": True, "mmap_fused": False}

# Load options that say only where and in what dtype: the rest needs nnsight's own load.
_PLACEMENT = {"device_map", "device", "dtype", "torch_dtype"}
# Options of the meta build that the loaded model keeps as they are (the skeleton already has
# what they chose).
_BUILD_ONLY = {"attn_implementation", "experts_implementation", "config", "trust_remote_code",
               "revision", "low_cpu_mem_usage", "token", "local_files_only", "cache_dir"}


class _MetaloadMetaDevice:
    """Stands in for nnsight.modeling.mixins.meta.MetaDevice: the build runs under metaload.meta()."""

    def __enter__(self):
        # nnsight's own mode imports torch._dynamo first (its import makes tensors and reads
        # them): metaload runs whatever is imported inside meta() real (_imports.py).
        from ._mode import meta
        self._scope = meta()
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)

    @classmethod
    def real(cls):
        from ._mode import real
        return real()


def _device_of(kwargs):
    """The one device the load options name, or None when they name something else."""
    device_map = kwargs.get("device_map", kwargs.get("device"))
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, (str, int, torch.device)) and device_map not in ("auto", "balanced",
                                                                               "sequential"):
        return torch.device(device_map)
    if isinstance(device_map, dict) and set(device_map) == {""}:
        return torch.device(device_map[""])
    return None


def _unsupported(model):
    """Why metaload cannot dispatch this nnsight model itself (None when it can)."""
    kwargs = dict(getattr(model, "kwargs", {}) or {})
    if kwargs.get("quantization_config") is not None:
        return "quantization_config"
    method = _quantized_modules.method_of(getattr(model._module, "config", None))
    if method is not None and not _quantized_modules.prepared(model._module):
        return f"the checkpoint's quantization_config (quant_method {method!r})"
    for name in ("dtype", "torch_dtype"):
        if isinstance(kwargs.get(name), str) and kwargs[name] != "auto" and \
                not isinstance(getattr(torch, kwargs[name], None), torch.dtype):
            return f"{name}={kwargs[name]!r} (a quantization)"
    others = sorted(set(kwargs) - _PLACEMENT - _BUILD_ONLY)
    if others:
        return "the load option" + ("s " if len(others) > 1 else " ") + ", ".join(others)
    if _device_of(kwargs) is None:
        return f"device_map={kwargs.get('device_map')!r}"
    return None


def _streaming_dispatch(self):
    """nnsight's Meta.dispatch, by metaload.load_into into the skeleton already built."""
    if self.dispatched:
        return
    why = _unsupported(self)
    if why is not None:
        warnings.warn(f"metaload.enable_nnsight: {why} needs nnsight's own load; dispatching "
                      "with from_pretrained", stacklevel=3)
        return _saved[("meta", "dispatch")](self)
    from ._load import load_into
    device = _device_of(self.kwargs or {})
    peft = getattr(self, "peft", None)
    report = load_into(self._module, self.repo_id, device=device, revision=self.revision,
                       progress=False, mmap=_options["mmap"] if device.type == "cpu" else None,
                       mmap_fused=_options["mmap_fused"],
                       adapters=[peft] if peft is not None else None)
    self._module.eval()  # as from_pretrained leaves a model (from_config leaves it training)
    _quantized_modules.decompress_now(self._module)
    pipeline = getattr(self, "pipeline", None)
    if pipeline is not None and hasattr(pipeline, "device"):
        pipeline.device = device  # built with device="meta"; its preprocessing follows it
    self.dispatched = True
    self.metaload_report = report


def _quantized_meta(self, *args, **kwargs):
    """nnsight's meta build, then, for a pre-quantized checkpoint whose layers metaload fills, the
    library's layers as from_pretrained builds them (inside the meta build's metaload.meta())."""
    model = _saved[("transformers", "_load_meta")](self, *args, **kwargs)
    config = getattr(model, "config", None)
    if kwargs.get("quantization_config") is None and \
            _quantized_modules.method_of(config) in _quantized_modules.METHODS:
        device = _device_of(kwargs) or torch.device("cpu")
        try:
            _quantized_modules.apply_quantizer(model, str(device))
        except ImportError:  # the library is not installed: nnsight's own dispatch says so
            pass
    return model


def _detect_fake_mode(*args, **kwargs):
    """nnsight's test for a scan in progress (torch._guards.detect_fake_mode, where nnsight calls it):
    torch's fake mode if one is active, else metaload's fake() scope when it is the innermost, so a
    scan on metaload's fake mode is a scan to nnsight too (no dispatch, no mask correction)."""
    found = _saved[("guards", "detect_fake_mode")](*args, **kwargs)
    if found is None and _thread_scope.kind() == "fake":
        from ._mode import innermost
        return innermost()
    return found


def _scan_device(tracer):
    """The device a scan claims: where the model dispatches to (its load options' one device; cpu
    by default), as metaload.scan claims the target device; nnsight's own scan says meta."""
    kwargs = dict(getattr(tracer.envoy, "kwargs", {}) or {})  # the nnsight model's load options
    device = _device_of(kwargs) or torch.device("cpu")
    from ._fake import claimable
    try:
        return claimable(device, "nnsight's scan")
    except _lib.ModeError:  # a device fake tensors cannot claim (xla, ...): shapes on cpu
        return torch.device("cpu")


def _scanning_execute(self, code):
    """nnsight's ScanningTracer.execute on metaload's fake mode instead of torch's FakeTensorMode:
    the same tracing (tokenizing, batching, interventions), the forward on fake tensors claiming
    the model's device. An already dispatched model scans its real weights as fake ones.
    enable_nnsight(scan=False) keeps nnsight's own."""
    if not _options["scan"]:
        return _saved[("tracer", "execute")](self, code)
    from nnsight.intervention.tracer import InterleavingTracer
    from ._fake import fake
    with torch.no_grad(), fake(_scan_device(self)):
        InterleavingTracer.execute(self, code)


def enable_nnsight(mmap: bool = True, scan: bool = True, mmap_fused: bool = False):
    """Switches the integration on for this process (idempotent; a second call only changes
    the options): every nnsight model built from now on builds under metaload.meta(), every
    transformers-backed nnsight model dispatches by streaming into its skeleton (see this
    module's docstring for when it falls back), and `model.scan(...)` runs its forward on
    metaload.fake(). Models already built keep their skeleton but dispatch through metaload too.

    mmap: on cpu, weights stored in the model's dtype stay mapped from the checkpoint files
    (copy-on-write), as from_pretrained leaves them; False copies them into fresh memory, each
    byte read once (see load_into's mmap for the files' contract).

    mmap_fused: with mmap, fused MoE experts are views of the files' pages too (load_into's
    mmap_fused: no private memory for them, but their outputs may differ in the last bit from
    nnsight's own dispatch, whose experts are copied). Default False: a trace saves exactly what
    it saves without metaload.

    scan: nnsight's scan runs on metaload.fake() claiming the model's dispatch device (cpu by
    default; nnsight's own says meta), with the same saved shapes and dtypes as nnsight's
    FakeTensorMode; False keeps nnsight's own."""
    _options["mmap"] = bool(mmap)
    _options["scan"] = bool(scan)
    _options["mmap_fused"] = bool(mmap_fused)
    try:
        from nnsight.intervention import tracer as nn_tracer
        from nnsight.modeling import processing as nn_processing
        from nnsight.modeling.mixins import meta as nn_meta
        from nnsight.modeling import transformers as nn_transformers
    except ImportError as e:
        raise _lib.Error(f"metaload.enable_nnsight needs nnsight: {e}") from e
    with _lock:
        if _saved:
            return
        _saved[("meta", "MetaDevice")] = nn_meta.MetaDevice
        _saved[("meta", "dispatch")] = nn_meta.Meta.dispatch
        _saved[("transformers", "dispatch")] = nn_transformers.TransformersModel.__dict__.get(
            "dispatch")
        _saved[("transformers", "_load_meta")] = nn_transformers.TransformersModel._load_meta
        nn_meta.MetaDevice = _MetaloadMetaDevice
        nn_transformers.TransformersModel.dispatch = _streaming_dispatch
        nn_transformers.TransformersModel._load_meta = _quantized_meta
        _saved[("guards", "detect_fake_mode")] = nn_meta.detect_fake_mode
        _saved[("tracer", "execute")] = nn_tracer.ScanningTracer.__dict__["execute"]
        nn_meta.detect_fake_mode = _detect_fake_mode
        nn_processing.detect_fake_mode = _detect_fake_mode
        nn_tracer.ScanningTracer.execute = _scanning_execute


def disable_nnsight():
    """Puts nnsight's own meta build and dispatch back (idempotent)."""
    with _lock:
        if not _saved:
            return
        from nnsight.intervention import tracer as nn_tracer
        from nnsight.modeling import processing as nn_processing
        from nnsight.modeling.mixins import meta as nn_meta
        from nnsight.modeling import transformers as nn_transformers
        nn_meta.MetaDevice = _saved[("meta", "MetaDevice")]
        nn_meta.detect_fake_mode = _saved[("guards", "detect_fake_mode")]
        nn_processing.detect_fake_mode = _saved[("guards", "detect_fake_mode")]
        nn_tracer.ScanningTracer.execute = _saved[("tracer", "execute")]
        nn_transformers.TransformersModel._load_meta = _saved[("transformers", "_load_meta")]
        own = _saved[("transformers", "dispatch")]
        if own is None:
            del nn_transformers.TransformersModel.dispatch
        else:
            nn_transformers.TransformersModel.dispatch = own
        _saved.clear()


def nnsight_enabled():
    """Whether enable_nnsight() is in effect."""
    return bool(_saved)
