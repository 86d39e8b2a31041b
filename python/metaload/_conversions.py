"""transformers' weight conversions as data for the C++ load plan (loader/load/assembly.h).

transformers 5 builds mixture-of-experts layers fused (Mixtral's `experts.gate_up_proj`
[E, 2I, H]) while checkpoints keep one tensor per expert; its conversion mapping
(`transformers.conversion_mapping`) says how the per-expert tensors merge. The mapping is read
from the installed transformers at run time, and its own matching (`rename_source_key` of each
transform) decides which checkpoint tensors feed which target, so a new release's mappings come
along unchanged. The geometry -- where each tensor's rows land in the fused slot -- is the C++
plan's: this module only names the tensors, in order, and the operations.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

import torch

# Operations the plan streams, by transformers' class name, with the arguments it needs.
_OPS = {
    "MergeModulelist": lambda op: {"dim": op.dim},
    "Concatenate": lambda op: {"dim": op.dim},
    "Chunk": lambda op: {"dim": op.dim},
    "Transpose": lambda op: {"dim": op.dim0, "dim1": op.dim1,
                             "check_dims": bool(getattr(op, "check_dims", False))},
    "Interleave": lambda op: {"dim": op.dim, "inverse": bool(op.inverse)},
    "ErnieFuseAndSplitTextVisionExperts": lambda op: {"dim": op.stack_dim, "dim1": op.concat_dim},
}

def _permute_for_rope(op, config, targets: List[str]) -> Dict[str, Any]:
    """PermuteForRope's heads (num_attention_heads of the config, or of its subconfig_key part, as
    transformers reads them) and, per target, whether its name holds one of the layer names the
    operation permutes (q and k; v passes)."""
    sub = getattr(config, op.subconfig_key, config) if op.subconfig_key else config
    layers = list(op.permute_layer_names or [])
    return {"n_heads": int(getattr(sub, "num_attention_heads", 1)), "inverse": bool(op.inverse),
            "applies": [any(n in t for n in layers) for t in targets]}


def _op_data(op, config, targets: List[str]) -> Dict[str, Any]:
    name = type(op).__name__
    if name == "PermuteForRope":
        return {"op": name, **_permute_for_rope(op, config, targets)}
    args = _OPS.get(name)
    # An operation the plan cannot do travels by name: the plan refuses it naming it and the
    # model type (never a wrong tensor).
    return {"op": name, **(args(op) if args else {})}


def _prefixed(key: str, prefix: str, state: Dict[str, torch.Tensor]) -> str:
    """The model's base_model_prefix added or removed where that names a module tensor (as
    transformers' rename_source_key does when loading a ForXxx model from a base model's weights
    or the other way round)."""
    if not prefix:
        return key
    if key.startswith(prefix + ".") and key[len(prefix) + 1:] in state:
        return key[len(prefix) + 1:]
    if prefix + "." + key in state:
        return prefix + "." + key
    return key


def _index_and_template(name: str, key: str, pattern: str) -> Tuple[int, str]:
    """The expert index a `*` pattern matched in `key` (checkpoint tensor `name` after the
    renames), and `name` with that index as `*`; (-1, "") for a pattern without `*`. transformers
    reads `*.` as any text up to a dot; the index is the digits it stands for."""
    if "*." not in pattern:
        return -1, ""
    try:
        m = re.search(pattern.replace("*.", r"([0-9]+)\.", 1), key)
    except re.error:
        m = None
    if m is None:
        return -1, ""
    index = m.group(1)
    tail = key[m.end(1):]
    at = name.rfind(index + tail)
    template = name[:at] + "*" + name[at + len(index):] if at >= 0 else ""
    return int(index), template


def _targets(conv, key: str, config) -> Optional[List[str]]:
    """The module tensors a converter makes for one layer, from the key its first target names."""
    first = conv.target_patterns[0]
    prefix, found, suffix = key.partition(first)
    if not found:
        return [key]
    patterns = list(conv.target_patterns)
    for op in conv.operations:
        shards = getattr(op, "num_shards_attribute", None)
        if type(op).__name__ == "Chunk" and shards is not None:
            n = getattr(config.get_text_config(), shards, None)
            if not isinstance(n, int):
                return None
            patterns = [first.replace("*", str(i)) for i in range(n)]
    return [prefix + p + suffix for p in patterns]


def names(module: torch.nn.Module, in_checkpoint: List[str],
          state: Dict[str, torch.Tensor]) -> Tuple[Dict[str, str], List[Dict[str, Any]]]:
    """What transformers does on load to `module`'s checkpoint (whose tensor names are
    `in_checkpoint`): ({checkpoint name: module name} for the names its renames change, every
    renaming that matches applied in turn; the conversions that merge several tensors into one or
    split one into several, as load_into's `assemblies`: loader/load/assembly.h,
    parse_assemblies). Only conversions whose targets are all module tensors of `state` become
    assemblies (the others' tensors stay ordinary names: unexpected, under strict)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     dot_natural_key)
    except ImportError:  # a transformers without conversion mappings changes no name on load
        return {}, []
    transforms = get_model_conversion_mapping(module)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    renames: Dict[str, str] = {}
    prefix = getattr(module, "base_model_prefix", "") or ""
    model_type = getattr(getattr(module, "config", None), "model_type", "") or ""
    # (converter, layer key) -> {pattern: [(index, name, template)]}
    groups: Dict[Tuple[int, str], Dict[str, List[Tuple[int, str, str]]]] = {}
    for name in sorted(in_checkpoint, key=dot_natural_key):
        key = name
        for r in renamings:
            key, _ = r.rename_source_key(key)
        converted = False
        for c, conv in enumerate(converters):
            new, pattern = conv.rename_source_key(key)
            if pattern is None:
                continue
            index, template = _index_and_template(name, key, pattern)
            layer = groups.setdefault((c, _prefixed(new, prefix, state)), {})
            layer.setdefault(pattern, []).append((index, name, template))
            converted = True
            break
        key = _prefixed(key, prefix, state)
        if not converted and key != name:
            renames[name] = key
    out = []
    for (c, key), by_pattern in groups.items():
        conv = converters[c]
        targets = _targets(conv, key, module.config)
        if targets is None or not all(t in state for t in targets):
            continue
        sources = []
        for pattern in conv.source_patterns:  # the converter's order, as Concatenate keeps it
            found = by_pattern.get(pattern)
            if not found:
                continue
            found.sort(key=lambda x: (x[0], dot_natural_key(x[1])))
            sources.append({"pattern": pattern, "names": [n for _, n, _ in found],
                            "indices": [i for i, _, _ in found],
                            "template": next((t for _, _, t in found if t), "")})
        out.append({"model_type": model_type, "targets": targets, "sources": sources,
                    "ops": [_op_data(op, module.config, targets) for op in conv.operations]})
    # A converter whose targets are not all module tensors: its tensors keep their names.
    return renames, out


def leaves(assembled: List[Dict[str, Any]]) -> List[str]:
    """Every checkpoint tensor the assemblies read."""
    return [n for a in assembled for s in a["sources"] for n in s["names"]]
