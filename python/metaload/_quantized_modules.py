"""Quantized models as their libraries build them (issue 28): the glue between load_into and the
quantizing libraries' own layers, so a pre-quantized checkpoint loads packed, into the modules
from_pretrained would have built, with no dequantization.

    model = metaload.build_pretrained("dir-of-a-bnb-checkpoint")  # meta; Linear4bit, ... as HF does
    metaload.load_into(model, "dir-of-a-bnb-checkpoint")         # packed tensors + quant states

The skeleton: transformers' own quantizer for the checkpoint's quantization_config runs on the
meta model (`preprocess_model`, what from_pretrained does before reading weights), so the layers
are the library's (bitsandbytes' Linear4bit / Linear8bitLt, compressed-tensors' compressed
parameters `weight_packed`, `weight_scale`, ...).

The load: metaload's engine reads every tensor, in the one all-or-nothing load_into call. A
compressed-tensors skeleton names its packed parameters as the checkpoint does, so they load by
name. bitsandbytes keeps its packed form out of the module's parameters until its quant state
exists (a meta Linear4bit holds a [out, in] `weight`; the file a [n / 2, 1] uint8 one beside
`weight.absmax`, `weight.quant_map`, `weight.nested_*` and the JSON blob
`weight.quant_state.bitsandbytes__nf4`): while the load runs, each such module's state dict
names fresh meta receivers of the file's shapes and dtypes instead (a state-dict hook), the
engine fills them with everything else, and afterwards bitsandbytes' own constructors
(`Params4bit.from_prequantized`, `Int8Params(..., SCB=)`) make the parameters from the filled
receivers. Everything that can refuse a receiver is checked before the load, so a refusal leaves
the model as it was: the layout by the C++ parser (`quant_layout`: parts, dtypes, shapes and
every quant_state blob, a `DequantError` naming file, tensor and rule), the parts each module
needs (a `MismatchError` naming a missing one), int8's one-byte weight_format (read first: a
`QuantLayoutError` unless row-major). The checkpoint's headers are read for this apart from the
load's (twice: the layout's and the receivers' shapes; small beside the load). Then the quantizer's own `postprocess_model` runs,
as from_pretrained's last step (compressed-tensors decompresses there when its config says so).
"""
import contextlib
import functools
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _lib, _thread_scope

# The quantization methods whose layers this module fills; others keep from_pretrained.
METHODS = ("bitsandbytes", "compressed-tensors")
# bitsandbytes 4-bit: the parts each packed weight needs, by the C++ layout's role names, and the
# suffix after "P.weight." bitsandbytes' QuantState.from_dict reads each under.
_BNB4_PARTS = {"scales": "absmax", "code": "quant_map", "state": None}
_BNB4_NESTED = {"nested_scales": "nested_absmax", "nested_code": "nested_quant_map"}


def method_of(config) -> Optional[str]:
    """The quant_method of a transformers config (or config dict), or None."""
    qc = config.get("quantization_config") if isinstance(config, dict) else \
        getattr(config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return getattr(method, "value", method)


def apply_quantizer(model: torch.nn.Module, device: str = "cpu"):
    """What from_pretrained does to the skeleton of a pre-quantized checkpoint before it reads a
    weight: transformers' quantizer for model.config.quantization_config replaces the layers.
    Call it where the model is on meta (under metaload.meta()). Returns the quantizer (None for a
    model without quantization_config); load_into runs its postprocess_model after the load."""
    method = method_of(model.config)
    if method is None:
        return None
    if method not in METHODS:
        raise _lib.PlanError(f"quantization_config.quant_method {method!r}: metaload loads the "
                             f"layers of {', '.join(METHODS)} packed; dequantize it instead "
                             "(load_into(..., dequantize=torch.bfloat16) into a plain model)")
    from transformers.quantizers.auto import get_hf_quantizer
    quantizer, _, device_map = get_hf_quantizer(model.config, None, {"": device}, True, {})
    quantizer.preprocess_model(model=model, dtype=model.dtype, device_map=device_map,
                               checkpoint_files=None, use_kernels=False)
    model._metaload_quantizer = quantizer
    _scannable(model)
    # bitsandbytes' layers answer shapes under fake(); patched now, before anything (nnsight's
    # envoys) holds their forward.
    from ._interplay import patch_bitsandbytes_layers
    patch_bitsandbytes_layers()
    return quantizer


def prepared(model: torch.nn.Module) -> bool:
    """Whether apply_quantizer made this model's layers (before or after its load)."""
    return hasattr(model, "_metaload_quantizer") or getattr(model, "hf_quantizer", None) is not None


def build_pretrained(ref: str, revision: Optional[str] = None,
                     auto_class: str = "AutoModelForCausalLM", device: str = "cpu"):
    """The model of checkpoint `ref` (a local directory or a repo id in the hub cache) on meta,
    as from_pretrained builds it: transformers' `auto_class`.from_config under metaload.meta(),
    then, for a pre-quantized checkpoint, its quantizer's layers (apply_quantizer). Fill it with
    metaload.load_into(model, ref). The config is read from the directory metaload resolves (a
    repo id: its snapshot in the hub cache), so transformers never looks anything up online."""
    import transformers
    from ._mode import meta
    from .checkpoint import open_checkpoint
    where = open_checkpoint(ref, revision)
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(where["config_path"] or "")
                                                     or where["dir"])
    with meta():
        model = getattr(transformers, auto_class).from_config(config)
        apply_quantizer(model, device)
    return model.eval()


def refuse_in_families(ref: str, config) -> None:
    """TransformersModel's families (C++) hold float weights: a pre-quantized checkpoint is a
    PlanError saying where its layers are built (it would fail at dispatch, tensor by tensor)."""
    method = method_of(config or {})
    if method is None:
        return
    raise _lib.PlanError(
        f"TransformersModel({ref!r}): the checkpoint is quantized (quantization_config.quant_method "
        f"{method!r}) and TransformersModel's families hold float weights; build it as "
        "from_pretrained does with metaload.build_pretrained(ref) and fill it with "
        "metaload.load_into(model, ref) (packed, into the library's layers), or use nnsight's "
        "LanguageModel under metaload.enable_nnsight()")


@contextlib.contextmanager
def refusing_families(ref):
    """Around TransformersModel's construction: one that dispatches at once fails on the packed
    tensors first (MismatchError); for a local directory whose config.json is quantized, the
    PlanError above says why instead."""
    try:
        yield
    except RuntimeError as e:
        # Only the dispatch's MismatchError (raw here: typed by TransformersModel's caller); any
        # other error, a malformed config.json's, says its own.
        if not isinstance(e if isinstance(e, _lib.Error) else _lib.translate(e),
                          _lib.MismatchError):
            raise
        path = os.path.join(str(ref), "config.json")
        if not os.path.isfile(path):
            raise
        with open(path) as f:
            try:
                config = json.load(f)
            except (ValueError, RecursionError):  # what the C++ reader refused is no config here
                raise e from None
        refuse_in_families(str(ref), config)
        raise


def _bnb_layers():
    """bitsandbytes' (Linear4bit, Linear8bitLt), or None when the program has not imported it
    (then no model holds its layers)."""
    nn = getattr(sys.modules.get("bitsandbytes"), "nn", None)
    if nn is None:
        return None
    return nn.Linear4bit, nn.Linear8bitLt


def _packed_modules(module: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, str]]:
    """(path, layer, "bnb4" | "bnb8") of every bitsandbytes layer whose weight is still on meta:
    the layers whose packed form the load has to receive."""
    layers = _bnb_layers()
    if layers is None:
        return []
    out = []
    for path, m in module.named_modules():
        if isinstance(m, layers) and m.weight.is_meta:
            out.append((path, m, "bnb4" if isinstance(m, layers[0]) else "bnb8"))
    return out


def _headers(ref: str, revision: Optional[str]) -> Dict[str, Tuple[str, List[int], str]]:
    """{tensor name: (safetensors dtype, shape, file)} of the checkpoint (headers only)."""
    from .checkpoint import open_checkpoint, read_safetensors_header
    out = {}
    for f in open_checkpoint(ref, revision)["files"]:
        for t in read_safetensors_header(f)["tensors"]:
            out[t["name"]] = (t["dtype"], t["shape"], f)
    return out


def _check_formats(names: List[str], headers) -> None:
    """bitsandbytes reads row-major int8 weights only (weight_format 0, all it has written since
    0.43; its own load refuses the rest). Each int8 layer's one-byte weight_format is read now,
    by metaload's reader, so a refusal comes before anything is swapped."""
    from ._safetensors import safe_open
    by_file: Dict[str, List[str]] = {}
    for n in names:
        by_file.setdefault(headers[n][2], []).append(n)
    for path, tensors in by_file.items():
        with safe_open(path) as f:
            for n in tensors:
                value = int(f.get_tensor(n).reshape(-1)[0])
                if value != 0:
                    raise _lib.QuantLayoutError(
                        f"{path}: tensor {n!r} is {value}: bitsandbytes reads row-major int8 "
                        "weights (weight_format 0) only")


def _meta_of(entry: Tuple[str, List[int]]) -> torch.Tensor:
    from ._safetensors import _torch_dtypes
    from ._mode import real
    with real():
        return torch.empty(entry[1], dtype=_torch_dtypes()[entry[0]], device="meta")


class _Receivers:
    """The meta tensors one bitsandbytes layer's packed form loads into: {suffix after "P.":
    tensor}, e.g. {"weight": uint8 [n / 2, 1], "weight.absmax": ..., ...} or {"weight": int8,
    "SCB": ..., "weight_format": ...}."""

    def __init__(self, path: str, layer: torch.nn.Module, scheme: str,
                 tensors: Dict[str, torch.Tensor]):
        self.path, self.layer, self.scheme, self.tensors = path, layer, scheme, tensors

    def state_dict_hook(self, module, state_dict, prefix, local_metadata):
        """Names the receivers where the layer's state dict has its meta weight."""
        for suffix, t in self.tensors.items():
            state_dict[prefix + suffix] = t

    def make_parameter(self):
        """bitsandbytes' own parameter from the filled receivers (its constructors, as
        transformers' Bnb4bitDeserialize / Bnb8bitDeserialize call them)."""
        import bitsandbytes as bnb
        weight = self.tensors["weight"]
        if self.scheme == "bnb4":
            stats = {k[len("weight."):]: v for k, v in self.tensors.items() if k != "weight"}
            return bnb.nn.Params4bit.from_prequantized(data=weight, quantized_stats=stats,
                                                       requires_grad=False, device=weight.device,
                                                       module=self.layer)
        # (weight_format was checked before the load: _check_formats.) .to() of a quantized Int8Params sets CB (the int8 data), which the forward reads.
        return bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False,
                                 SCB=self.tensors["SCB"]).to(weight.device)


def _part_names(path: str, scheme: str, entry: Optional[Dict[str, Any]], ref: str) -> List[str]:
    """The checkpoint names of layer `path`'s packed parts, from the C++ layout's entry for it;
    a part the layer needs and the checkpoint lacks is a MismatchError naming it."""
    if entry is None or entry["scheme"] != scheme:
        have = "no packed weight" if entry is None else f"a {entry['scheme']} weight"
        raise _lib.PlanError(
            f"{path} is bitsandbytes' {'Linear4bit' if scheme == 'bnb4' else 'Linear8bitLt'} but "
            f"checkpoint {ref!r} holds {have} for {path}.weight: metaload loads pre-quantized "
            "checkpoints into these layers (from_pretrained quantizes on load)")
    parts = entry["parts"]
    if scheme == "bnb8":
        need = {"scales": f"{path}.SCB"}
    else:
        need = {role: f"{path}.weight.{suffix}" for role, suffix in _BNB4_PARTS.items() if suffix}
        need["state"] = f"{path}.weight.quant_state.bitsandbytes__<nf4|fp4>"
        if "nested_scales" in parts or "nested_code" in parts:
            need.update({r: f"{path}.weight.{s}" for r, s in _BNB4_NESTED.items()})
    lacking = [name for role, name in need.items() if role not in parts]
    if lacking:
        raise _lib.MismatchError(f"checkpoint {ref!r} does not fit: {path}.weight is packed "
                                 f"({scheme}) but lacks " + ", ".join(lacking))
    return sorted(parts.values())


def _receivers(module, ref, revision) -> List[_Receivers]:
    """A _Receivers for every bitsandbytes layer on meta, from the checkpoint's layout (checked
    by the C++ parser, blobs included) and headers; [] when the model has none."""
    packed = _packed_modules(module)
    if not packed:
        return []
    found = json.loads(_lib.load().quant_layout(str(ref), revision))  # DequantError if malformed
    layout = {w["weight"]: w for w in found["weights"]}
    headers = _headers(ref, revision)
    out = []
    for path, layer, scheme in packed:
        names = _part_names(path, scheme, layout.get(path + ".weight"), ref)
        tensors = {n[len(path) + 1:]: _meta_of(headers[n]) for n in names}
        out.append(_Receivers(path, layer, scheme, tensors))
    _check_formats([r.path + ".weight_format" for r in out if "weight_format" in r.tensors],
                   headers)
    return out


def _refuse_options(options: Dict[str, Any]) -> None:
    """The load_into options the packed layers do not take yet (PlanError naming them): each
    would change a packed tensor (dtype= converts floats, the quant states' among them)."""
    given = [k for k, v in options.items() if v not in (None, 1, 0, False)]
    if given:
        raise _lib.PlanError("load_into: a model with bitsandbytes' layers on meta loads their "
                             "packed weights as stored; not yet with " + ", ".join(sorted(given)))


@contextlib.contextmanager
def receiving(module: torch.nn.Module, ref: str, revision: Optional[str], **options):
    """Around one load_into of `module`: the packed layers' receivers take their weights' places
    in its state dict while the load runs. Yields a function that the load's report goes
    through: it makes the library's parameters and runs the quantizer's postprocess_model."""
    recv = _receivers(module, ref, revision)
    if recv:
        _refuse_options(options)
    hooks = [r.layer.register_state_dict_post_hook(functools.partial(_Receivers.state_dict_hook, r))
             for r in recv]  # (torch marks the hook: a bound method takes no attribute)
    try:
        yield lambda report: _finish(module, recv, report)
    finally:
        for h in hooks:
            h.remove()


def _finish(module: torch.nn.Module, recv: List[_Receivers], report):
    """After the load: each packed layer's parameter from its receivers, then the quantizer's
    own last step (from_pretrained's postprocess_model)."""
    made = [(r, r.make_parameter()) for r in recv]
    for r, param in made:
        r.layer.weight = param
        r.layer._is_hf_initialized = True
    quantizer = getattr(module, "_metaload_quantizer", None)
    if quantizer is not None:
        module.hf_quantizer = quantizer
        del module._metaload_quantizer
        quantizer.postprocess_model(module)
    return report


# ---- compressed-tensors' skeleton under a scan ---------------------------------------------------
# compress_model leaves a pre-hook on the model that decompresses every layer on the first forward
# (compressed-tensors' own decompression, which wants real tensors: on the meta skeleton or on
# fake inputs it fails). While the packed parameters are still on meta, or under fake() (a scan
# of the loaded, still compressed model), a forward runs each compressed layer as the plain Linear
# it decompresses to (a meta `weight` [out, in] in the model's dtype), and its packed parameters
# come back after the forward; a real forward runs the library's own hook.
_PACKED_NAMES = ("weight_packed", "weight_shape", "weight")


def _compressed_layers(model):
    return [m for m in model.modules() if getattr(m, "quantization_scheme", None) is not None
            and any(getattr(m, n, None) is not None for n in _PACKED_NAMES)]


class _MetaDecompress:
    """The model's forward hooks standing in for compressed-tensors' decompression on meta."""

    def __init__(self, model, own_hook):
        self.model, self.own_hook, self.stash = model, own_hook, []

    def pre(self, model, args):
        layers = _compressed_layers(model)
        on_meta = any(getattr(m, n).is_meta for m in layers for n in _PACKED_NAMES
                      if getattr(m, n, None) is not None)
        if not on_meta and _thread_scope.kind() != "fake":  # a real forward: the library's own
            return self.own_hook(model, args)
        from ._mode import real
        for m in layers:
            self.stash.append((m, dict(m._parameters)))
            for n in _PACKED_NAMES:
                m._parameters.pop(n, None)
            with real():
                w = torch.empty(m.out_features, m.in_features, dtype=model.dtype, device="meta")
            m._parameters["weight"] = torch.nn.Parameter(w, requires_grad=False)
        return None

    def post(self, model, args, output):
        while self.stash:
            m, params = self.stash.pop()
            m._parameters.clear()
            m._parameters.update(params)
        return None


def _scannable(model) -> None:
    """Puts _MetaDecompress in place of compressed-tensors' first-forward pre-hook, if any."""
    handle = getattr(model, "ct_decompress_hook", None)
    own = model._forward_pre_hooks.get(getattr(handle, "id", None))
    if own is None:
        return
    stand_in = _MetaDecompress(model, own)
    model._forward_pre_hooks[handle.id] = stand_in.pre
    model.register_forward_hook(stand_in.post)


def decompress_now(model: torch.nn.Module) -> None:
    """compressed-tensors' decompression, now instead of on the first forward (nnsight replaces
    each module's forward, which compressed-tensors' own first-forward path re-wraps and cannot:
    it fails with nnsight's own dispatch too). Each compressed layer by the library's
    decompress_module, as its decompress_model does on a model held on one device."""
    handle = getattr(model, "ct_decompress_hook", None)
    quantizer = getattr(model, "hf_quantizer", None)
    if handle is None or quantizer is None:
        return
    from compressed_tensors.compressors.base import decompress_module
    from compressed_tensors.quantization import QuantizationStatus
    for m in _compressed_layers(model):
        decompress_module(m)
    compressor = quantizer.compressor
    compressor.remove_decompression_hook(model)
    if compressor.quantization_config is not None:
        compressor.quantization_config.quantization_status = QuantizationStatus.DECOMPRESSED
