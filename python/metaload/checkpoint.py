"""Checkpoints and remote identity: describe, model keys, TP degrees, dtype sizes, safetensors I/O.

Thin wrappers over torch.ops.metaload.*; errors surface as metaload.<Kind> exceptions
(FormatError, ShardError, ResolveError, ModelKeyError, DTypeError, TPError, ConfigError).
"""
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Union

import torch

from . import _adapters, _lib
from ._lib import typed_errors


def _ops():
    return _lib.load()


def _dtype_name(dtype):
    """A torch.dtype or a name -> the name the C++ table accepts ("torch.bfloat16", "nf4")."""
    return None if dtype is None else str(dtype)  # str(torch.bfloat16) == "torch.bfloat16"


# ---------------------------------------------------------------------------------------------
# describe


@dataclass
class MoeInfo:
    """A mixture of experts, from the headers' expert tensors and config.json."""

    n_experts: int = 0  # routed experts per MoE layer
    n_shared_experts: int = 0
    experts_per_token: Optional[int] = None
    n_moe_layers: int = 0
    layout: str = ""  # "per-expert", "fused", "mixed", or "" when no expert tensor is stored
    expert_params: int = 0  # the routed experts' parameters (logical elements), all layers
    expert_bytes: int = 0  # their stored bytes, scales and zero points included
    shared_expert_params: int = 0
    # n_params minus (1 - top_k / E) of each MoE layer's routed experts: what "A3B" counts.
    active_params: Optional[int] = None
    max_ep_size: int = 0  # the most ranks the routed experts split across whole (= n_experts)
    ep_degrees: List[int] = field(default_factory=list)  # every such degree (divisors of E)


@dataclass
class CheckpointInfo:
    """What a checkpoint is, from its headers and config.json. None means unknown, never zero."""

    size_bytes: Optional[int] = None
    n_params: Optional[int] = None
    config: Optional[Dict[str, Any]] = None
    revision: Optional[str] = None
    # Details beyond nnsight's four fields.
    dtype: Optional[str] = None
    repo_id: Optional[str] = None
    dir: Optional[str] = None
    n_files: int = 0
    n_tensors: int = 0
    n_buffer_elements: int = 0
    stored_bytes: int = 0
    max_tp_size: Optional[int] = None
    # A quantized checkpoint (config.json's quantization_config): the scheme, "modules" (each
    # {module, shape, n_params, weight_bytes, aux_bytes}), weight/aux/unquantized bytes, and what
    # limits max_tp_size ("tp_limited_by"). None for an unquantized checkpoint.
    quantization: Optional[Dict[str, Any]] = None
    # A mixture of experts (MoeInfo); None for a dense checkpoint. A checkpoint whose headers hold
    # another number of experts than its config names is a metaload.FormatError naming both.
    moe: Optional[MoeInfo] = None
    # The first config.json field describe could not read (max_tp_size is then None): {"kind":
    # "ConfigError", "rule", "field", "message"}, the error any other reader of the field raises.
    config_error: Optional[Dict[str, str]] = None
    # A PEFT adapter directory (adapter_config.json beside adapter_model.safetensors): its rank,
    # alpha, target modules and base model (metaload._adapters.AdapterInfo); None otherwise.
    adapter: Optional[Any] = None


@typed_errors
def describe_checkpoint(ref_or_key: str, dtype=None, revision: Optional[str] = None, *,
                        allow_local_paths: bool = False) -> CheckpointInfo:
    """Describes a checkpoint directory/file, an HF repo id in the local cache, or a model key.

    dtype: a torch.dtype, a dtype name or a quantization name (see QUANTIZATIONS) to size for;
    by default the stored bytes are the size. allow_local_paths: a model key may name a local
    path (by default its repo_id must be a Hub repo id, looked up in the hub cache only).
    """
    _lib.check_utf8(_lib.ResolveError, "describe(ref_or_key=...)", [str(ref_or_key), revision])
    out = json.loads(_ops().describe_checkpoint(str(ref_or_key), _dtype_name(dtype), revision,
                                                bool(allow_local_paths)))
    if out.get("moe") is not None:
        out["moe"] = MoeInfo(**out["moe"])
    if _adapters.is_adapter_dir(ref_or_key):
        out["adapter"] = _adapters.describe_adapter(ref_or_key)
    return CheckpointInfo(**out)


describe = describe_checkpoint


@dataclass
class QuantEstimate:
    """What a quantization scheme would store for an unquantized checkpoint or config."""

    scheme: str
    size_bytes: int  # every byte the quantized checkpoint would store
    n_params: int  # logical parameters
    unquantized_bytes: int  # tensors the scheme leaves as they are (embeddings, lm_head, norms)
    source_bytes: int  # the unquantized parameters' bytes
    table_name: str  # the old per-dtype table's name ("nf4", "int4", ...)
    table_bytes: int  # n_params x that table's bytes per element: what sizing used to say
    table_error: float  # (table_bytes - size_bytes) / size_bytes
    max_tp_size: Optional[int]
    max_tp_size_unquantized: Optional[int]
    tp_limited_by: str
    source: str  # "checkpoint" (headers) or "config" (shapes from config.json)
    quantization: Dict[str, Any]  # scheme fields and the per-module breakdown


@typed_errors
def estimate(ref: str, scheme, revision: Optional[str] = None, *,
             allow_local_paths: bool = False) -> QuantEstimate:
    """The exact bytes `scheme` would store for the unquantized checkpoint (or config.json) `ref`.

    scheme: a preset name (see quant_presets(): "bnb-nf4", "gptq-int4", "awq-int4", "fp8-block",
    "ct-w4a16", "ct-nvfp4", ...) or a quantization_config (dict or JSON text) as config.json
    holds it. metaload.QuantSchemeError for an unknown scheme or a layer it cannot quantize."""
    text = scheme if isinstance(scheme, str) else json.dumps(scheme)
    out = json.loads(_ops().estimate_quantized(str(ref), text, revision, bool(allow_local_paths)))
    return QuantEstimate(**out)


@typed_errors
def quant_presets() -> Dict[str, Dict[str, Any]]:
    """{preset name: quantization_config} of the schemes estimate() knows by name."""
    return {p["name"]: p["quantization_config"] for p in json.loads(_ops().quant_presets())}


# ---------------------------------------------------------------------------------------------
# model keys


class ModelKey(NamedTuple):
    class_path: str
    repo_id: str
    revision: Optional[str]
    canonical_class: str
    extra: Dict[str, Any]


def _class_path(cls_or_path) -> str:
    if isinstance(cls_or_path, str):
        return cls_or_path
    return f"{cls_or_path.__module__}.{cls_or_path.__name__}"


@typed_errors
def to_model_key(cls_or_path, repo_id: str, revision: Optional[str] = None, *,
                 allow_local_paths: bool = False, extra: Optional[Dict[str, Any]] = None) -> str:
    """The model key '<class path>:<json>' exactly as nnsight writes it (json.dumps form).
    repo_id must be a Hugging Face Hub repo id (metaload.RepoIdError names the rule broken)
    unless allow_local_paths=True. extra: further fields written after revision, in their order
    (nnsight's TransformersModel adds {"task": "text-generation"})."""
    _lib.check_utf8(_lib.ModelKeyError, "to_model_key",
                    [_class_path(cls_or_path), repo_id, revision])
    try:
        # NaN and Infinity are no JSON (json.dumps would write them); the library refuses
        # lone surrogates and writes every other value exactly as json.dumps does.
        extra_json = json.dumps(extra or {}, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _lib.ModelKeyError(f"to_model_key(extra=...): {e} (a model key holds JSON values "
                                 f"only: no NaN or Infinity)") from None
    return _ops().to_model_key(_class_path(cls_or_path), repo_id, revision, bool(allow_local_paths),
                               extra_json)


@typed_errors
def from_model_key(key: str, *, allow_local_paths: bool = False) -> ModelKey:
    """Parses and checks a model key; the class may be an alias (nnsight's LanguageModel).
    Keys are remote identities: the repo_id must be a Hugging Face Hub repo id ("name" or
    "org/name"; metaload.RepoIdError names the rule broken) unless allow_local_paths=True."""
    _lib.check_utf8(_lib.ModelKeyError, "from_model_key(key=...)", key)
    return ModelKey(**json.loads(_ops().from_model_key(key, bool(allow_local_paths))))


@typed_errors
def model_classes() -> List[str]:
    """Every registered wrapper class path and alias."""
    return list(_ops().model_classes())


# ---------------------------------------------------------------------------------------------
# TP degree


def _config_json(config) -> str:
    if isinstance(config, str):
        return config
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        config = config.to_dict()
    return json.dumps(config)


@typed_errors
def max_tp_size(config, expert_parallel: bool = False) -> Optional[int]:
    """gcd of heads, kv heads and intermediate size (and experts with expert_parallel); None when 1."""
    v = _ops().max_tp_size(_config_json(config), expert_parallel)
    return None if v < 0 else int(v)


@typed_errors
def tp_degree_for(config, n: int, expert_parallel: bool = False) -> int:
    """The smallest working TP degree >= n; metaload.TPError lists the working ones otherwise."""
    return int(_ops().tp_degree_for(_config_json(config), n, expert_parallel))


# ---------------------------------------------------------------------------------------------
# dtypes


@typed_errors
def bytes_per_element(dtype) -> float:
    """Bytes per element of a torch.dtype, a dtype name ("torch.bfloat16", "BF16") or a
    quantization name ("nf4" = 0.5). metaload.DTypeError lists the accepted names."""
    return float(_ops().bytes_per_element(_dtype_name(dtype)))


@typed_errors
def dtype_table() -> List[Dict[str, Any]]:
    """The one table of names sizing and loading accept: quantizations, torch and file dtypes."""
    return json.loads(_ops().dtype_table())


def __getattr__(name):
    # QUANTIZATIONS comes from the C++ table, loaded on first use (PEP 562).
    if name == "QUANTIZATIONS":
        return {r["name"]: r["bytes_per_element"] for r in dtype_table() if r["kind"] == "quantization"}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# safetensors I/O

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: Union[int, str]) -> int:
    """An int, or a string such as "5GB" / "500MiB" (transformers' max_shard_size spelling)."""
    if isinstance(size, int):
        return size
    m = _SIZE.match(str(size))
    if not m:
        raise ValueError(f"not a size: {_lib.quote(size)} (use an int or e.g. '5GB', '500MiB')")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])


def _named_tensors(state_dict_or_module):
    if isinstance(state_dict_or_module, torch.nn.Module):
        items = list(state_dict_or_module.state_dict().items())
    else:
        items = list(state_dict_or_module.items())
    # Tied weights (the same tensor under two names, e.g. GPT-2's lm_head.weight = wte.weight) are
    # stored once under the first name, as Hugging Face's save_model does.
    seen = set()
    names, tensors = [], []
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_lib.quote(name)}: not a tensor ({type(t).__name__})")
        t = t.detach()
        key = None
        if t.device.type != "meta" and t.numel() > 0:
            key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        names.append(name)
        tensors.append(t)
    return names, tensors


@typed_errors
def save_safetensors(path: str, state_dict_or_module, metadata: Optional[Dict[str, str]] = None, *,
                     max_shard_size: Union[int, str, None] = None, num_shards: Optional[int] = None,
                     prefix: str = "model"):
    """Saves a state dict (or a module's) as safetensors.

    Without max_shard_size/num_shards, `path` is the file and the parsed header is returned.
    With either, `path` is an existing directory that receives <prefix>-0000i-of-0000N.safetensors
    and <prefix>.safetensors.index.json (or one <prefix>.safetensors when everything fits one
    shard of max_shard_size); returns {"files", "index_path", "total_size"}.
    """
    names, tensors = _named_tensors(state_dict_or_module)
    _lib.check_utf8(_lib.FormatError, "save_safetensors: a tensor name", names, "name-not-utf8")
    _lib.check_utf8(_lib.FormatError, "save_safetensors(metadata=...)", metadata or {},
                    "invalid-metadata")
    md = json.dumps(metadata) if metadata is not None else ""
    if max_shard_size is None and num_shards is None:
        _ops().save_safetensors(str(path), names, tensors, md)
        return read_safetensors_header(path)
    out = _ops().save_safetensors_sharded(str(path), names, tensors, md,
                                          parse_size(max_shard_size) if max_shard_size is not None else 0,
                                          int(num_shards or 0), prefix)
    return json.loads(out)


@typed_errors
def read_safetensors_header(path: str) -> Dict[str, Any]:
    """The validated header: {path, header_size, data_start, file_size, metadata, tensors: [...]}
    with tensors in offset order, each {name, dtype, shape, begin, end}."""
    return json.loads(_ops().read_safetensors_header(str(path)))


@typed_errors
def open_checkpoint(ref: str, revision: Optional[str] = None) -> Dict[str, Any]:
    """Resolves and validates a checkpoint (headers and index only); a summary dict."""
    return json.loads(_ops().open_checkpoint(str(ref), revision))


def io_bytes_read() -> int:
    """Bytes the format layer has read from files in this process (headers, indexes, configs)."""
    return int(_ops().io_bytes_read())


def reset_io_bytes_read() -> None:
    _ops().reset_io_bytes_read()
