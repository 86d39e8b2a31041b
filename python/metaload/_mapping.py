"""Checkpoint names to module names, for every loader (_load.py's load_into, _dist_load.py's rank
staging): key_mapping's renames and transformers' own conversion mapping (_conversions); and a
tp_plan as both hand it to the library."""
import re
from typing import Dict, List, Optional

import torch

from . import _conversions, _lib


def _is_transformers_model(module) -> bool:
    # By the class's ancestry: asking transformers (a lazy module) for PreTrainedModel would
    # import its modeling code into programs that only use its tokenizers.
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
               for c in type(module).__mro__)


def _transformers_mapping(module, in_checkpoint: List[str], key_mapping: Dict[str, str],
                          state: Dict[str, torch.Tensor]):
    """What transformers does to this model's checkpoint names on load (_conversions: its own
    matching, renames chained as from_pretrained chains them): its merges (fused experts, which
    the C++ plan assembles) and, for every other name, key_mapping's rename where one of its
    patterns matches, else transformers' own. Returns (renamed, assemblies)."""
    hf_renames, assembled = _conversions.names(module, in_checkpoint, state)
    taken = set(_conversions.leaves(assembled))
    rest = [n for n in in_checkpoint if n not in taken]
    return _renames(rest, key_mapping, hf_renames), assembled


def _compiled_mapping(key_mapping: Dict[str, str]) -> List[tuple]:
    """key_mapping's (pattern, compiled pattern, replacement), in order; a PlanError naming the
    entry that is not a string pair or whose pattern is no regular expression."""
    out = []
    for pattern, replacement in key_mapping.items():
        if not isinstance(pattern, str) or not isinstance(replacement, str):
            raise _lib.PlanError(f"key_mapping entry {pattern!r}: {replacement!r} is not a "
                                 "{regex: replacement} pair of strings")
        try:
            out.append((pattern, re.compile(pattern), replacement))
        except re.error as e:
            raise _lib.PlanError(f"key_mapping pattern {_lib.quote(pattern)} is not a valid "
                                 f"regular expression: {e}") from None
    return out


def _renamed_by(name: str, patterns: List[tuple]):
    """(name after the first pattern that matches it, that pattern or None)."""
    for pattern, compiled, replacement in patterns:
        try:
            new, n = compiled.subn(replacement, name)
        except (re.error, IndexError) as e:
            raise _lib.PlanError(f"key_mapping pattern {_lib.quote(pattern)}: its replacement "
                                 f"{_lib.quote(replacement)} cannot rename checkpoint tensor "
                                 f"{_lib.quote(name)}: {e}") from None
        if n:
            return new, pattern
    return name, None


_BY_TRANSFORMERS = object()  # a name renamed by transformers' own mapping, not key_mapping


def _renames(in_checkpoint: List[str], key_mapping: Dict[str, str],
             otherwise: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """{module name: checkpoint name} for the checkpoint names key_mapping renames (the first
    pattern that matches, as transformers' from_pretrained(key_mapping=...) applies them), and
    where none does, `otherwise`'s (transformers' own renames). Two checkpoint tensors that end
    with one module name (both renamed, or one renamed onto a name another keeps) are a
    PlanError naming both and the patterns that mapped them."""
    patterns = _compiled_mapping(key_mapping)
    out: Dict[str, str] = {}
    source: Dict[str, tuple] = {}  # module name -> (checkpoint name, pattern or None)
    for name in in_checkpoint:
        new, pattern = _renamed_by(name, patterns)
        if pattern is None and otherwise and name in otherwise:
            new, pattern = otherwise[name], _BY_TRANSFORMERS
        if new in source:
            def how(n, p):
                if p is _BY_TRANSFORMERS:
                    return f"{_lib.quote(n)} by transformers' conversion mapping"
                return (f"{_lib.quote(n)} by pattern {_lib.quote(p)}" if p is not None
                        else f"{_lib.quote(n)} by no pattern (it keeps its name)")
            first = source[new][0]
            raise _lib.PlanError(f"key_mapping maps both {_lib.quote(first)} and "
                                 f"{_lib.quote(name)} onto module name {_lib.quote(new)}: "
                                 f"{how(*source[new])}, {how(name, pattern)}")
        source[new] = (name, pattern)
        if new != name:
            out[new] = name
    return out


def flat_plan(tp_plan: Optional[Dict[str, str]]) -> Optional[List[str]]:
    """tp_plan as the library takes it, (pattern, style) pairs flattened; its styles and name rule
    are the library's (loader/tp/user_plan.h)."""
    return None if tp_plan is None else [x for pair in tp_plan.items() for x in pair]


def family_values(handle: int, names: List[str], values: list, device) -> list:
    """`values` (a computed buffer's, None where unknown) with the unknown ones taken from the
    model family's computed buffers (name_mapping="family": a causal mask, a rotary inv_freq;
    model/family_load.h), made on `device`. Call it in a real window."""
    if all(v is not None for v in values):
        return list(values)
    family = dict(zip(*_lib.typed_errors(_lib.load().family_buffers)(handle, device)))
    return [family.get(n) if v is None else v for n, v in zip(names, values)]
