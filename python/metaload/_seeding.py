"""Whether the default CPU generator is in step with an eager run (c10_ext/random_draws.h).

A small random tensor made inside metaload.meta() is drawn for real (so a constructor can compute
with it, as torch.linalg.qr(torch.randn(8, 8)) into a buffer) only while no draw has been skipped
since the generator was last seeded: a skipped draw is a random initialiser that returned a large
meta weight untouched (_wrapped.py, here) or a random op the C++ mode ran on meta (there). Seeding
(torch.manual_seed, torch.seed) puts the generator back in step: while any metaload scope has been
opened in the process, both are wrapped to say so.
"""
import functools
import threading

import torch

from . import _lib

_lock = threading.Lock()
_skipped = [False]  # this side's knowledge: True once a skip was reported and not since reseeded
_originals = {}


def note_skipped(generator=None):
    """A random initialiser skipped its draw (on `generator`: None is the default one)."""
    if generator is None and not _skipped[0]:
        _lib.load().note_skipped_draw()
        _skipped[0] = True


def _reseeding(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        _lib.load().note_reseeded()
        _skipped[0] = False
        return out
    wrapper.__metaload_original__ = original
    return wrapper


def install():
    """Wraps torch.manual_seed and torch.seed (and torch.random's, the same functions), once."""
    if _originals:
        return
    with _lock:
        if _originals:
            return
        for name in ("manual_seed", "seed"):
            original = getattr(torch, name)
            _originals[name] = original
            wrapped = _reseeding(original)
            setattr(torch, name, wrapped)
            if getattr(torch.random, name, None) is original:
                setattr(torch.random, name, wrapped)
