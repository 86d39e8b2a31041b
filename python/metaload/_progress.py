"""The `progress` argument of every loading call: True (a bar on stderr when it is a terminal),
False (nothing), or a callback for the caller's own display:

    bar = tqdm.tqdm(unit="B", unit_scale=True)
    metaload.load_into(model, path, progress=bar)                        # a tqdm-like object
    metaload.load_into(model, path, progress=lambda done, total: ...)    # or any callable

A callable is called as callback(done_bytes, total_bytes) with file bytes, done never going back;
an object with update(n) (tqdm) gets its `total` set and update() called with each increment. It
is called from a helper thread while the load runs (about 10 times a second: the library posts its
progress under an id, loader/load/progress_board.h, and this thread reads it; torch releases the GIL
while the library works) and a last time, with done == total, from the calling thread when the load
has finished. An exception the callback raises is re-raised when the load has finished.
"""
import itertools
import threading
from typing import Any, Callable, Optional, Tuple, Union

from . import _lib

Progress = Union[bool, Callable[[int, int], Any], Any]

_ids = itertools.count(1)
_INTERVAL = 0.1  # seconds between reads, as often as the library posts


def supported() -> bool:
    """Whether the loaded libmetaload.so takes progress ids (torch.ops.metaload.load_progress)."""
    ops = _lib.load()
    try:
        getattr(ops, "load_progress")
    except (AttributeError, RuntimeError):
        return False
    return True


def require():
    """Raises when the loaded library cannot report progress to a callback."""
    if not supported():
        raise _lib.Error(
            f"{_lib.library_path()} predates progress callbacks (it has no "
            "torch.ops.metaload.load_progress): rebuild it, or pass progress=True/False")


def split(progress: Progress) -> Tuple[bool, Optional[Callable[[int, int], None]]]:
    """(show the library's own bar, the callback or None) for a `progress` argument."""
    if progress is None or isinstance(progress, bool):
        return bool(progress), None
    if callable(progress):
        return False, progress
    if callable(getattr(progress, "update", None)):
        return False, _TqdmAdapter(progress)
    raise TypeError(f"progress must be True, False, a callable (done_bytes, total_bytes) or an "
                    f"object with update(n) such as a tqdm bar; got {type(progress).__name__}")


class _TqdmAdapter:
    def __init__(self, bar):
        self.bar = bar
        self.shown = 0

    def __call__(self, done, total):
        if getattr(self.bar, "total", None) != total:
            self.bar.total = total
            if callable(getattr(self.bar, "refresh", None)):
                self.bar.refresh()
        if done > self.shown:
            self.bar.update(done - self.shown)
            self.shown = done


class Watch:
    """Context manager around one call into the library that may load: `id` is the progress id
    to pass in (0 when there is no callback); while the call runs, a helper thread forwards what
    the library posts under it to the callback."""

    def __init__(self, callback: Optional[Callable[[int, int], None]], progress_id: int = 0):
        self.callback = callback
        self.id = 0
        if callback is not None:
            require()
            self.id = progress_id or next(_ids)
        self._last = (-1, -1)
        self._error = None
        self._stop = threading.Event()
        self._thread = None

    @staticmethod
    def new_id() -> int:
        return next(_ids)

    def _forward(self, final):
        got = list(_lib.load().load_progress(self.id, final))
        if len(got) != 2 or self._error is not None:
            return
        done, total = int(got[0]), int(got[1])
        if (done, total) == self._last:
            return
        self._last = (done, total)
        try:
            self.callback(done, total)
        except BaseException as e:  # re-raised on the calling thread when the load is over
            self._error = e

    def _run(self):
        while not self._stop.wait(_INTERVAL):
            self._forward(False)

    def __enter__(self):
        if self.callback is not None:
            self._thread = threading.Thread(target=self._run, name="metaload-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._thread is None:
            return False
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self._forward(True)  # the library's last post: done == total
        else:
            _lib.load().load_progress(self.id, True)  # forget it
        if exc_type is None and self._error is not None:
            raise self._error
        return False
