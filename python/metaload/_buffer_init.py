"""Non-persistent buffers of a transformers model whose values metaload does not know, computed as
from_pretrained computes them.

A buffer made under metaload.meta() carries values only when a small value factory made it
(c10_ext/values.h); `torch.zeros(...)` of a position table or a sinusoid table of 1500 x 1280 does
not. transformers 5 builds every model on meta in from_pretrained too, so each model's own
`_init_weights(module)` sets the non-persistent buffers of `module` (`init.zeros_(
module.token_type_ids)`, `init.copy_(module.positional_embedding, ...)`): the load asks it.
"""
import copy
from typing import Callable, Optional

import torch


def _twin(owner: torch.nn.Module, name: str, fill: int) -> torch.nn.Module:
    """A shallow copy of `owner` whose buffer `name` is a real CPU tensor filled with `fill` and
    whose real parameters are meta stand-ins (an init writing them changes nothing real)."""
    twin = copy.copy(owner)
    twin._buffers = dict(owner._buffers)
    b = owner._buffers[name]
    twin._buffers[name] = torch.full(b.shape, fill, dtype=b.dtype, device="cpu")
    twin._parameters = {k: (p if p is None or p.is_meta else
                            torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                               requires_grad=p.requires_grad))
                        for k, p in owner._parameters.items()}
    return twin


def values_by_init(model: torch.nn.Module, name: str,
                   real: Callable) -> Optional[torch.Tensor]:
    """The values of `model`'s buffer `name` as the model's own _init_weights sets them, or None
    where the model has no such init or it leaves the buffer alone. The init runs twice, on
    buffers filled with 0 and with 1: only a buffer both runs set alike counts as computed (an
    init that skips it, or draws it at random, gives no values)."""
    init = getattr(model, "_init_weights", None)
    if init is None:
        return None
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    got = []
    for fill in (0, 1):
        twin = _twin(owner, leaf, fill)
        try:
            with real(), torch.no_grad():
                init(twin)
        except Exception:  # noqa: BLE001 -- an init that cannot run on this twin: unknown
            return None
        got.append(twin._buffers[leaf])
    return got[0] if torch.equal(got[0], got[1]) else None
