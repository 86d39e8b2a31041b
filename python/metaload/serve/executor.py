"""A deployment's executor: a process of its own that builds the model and runs requests.

The model is built by nnsight's own wrapper from the deployment's key, with metaload's
integration on (metaload.enable_nnsight: a meta build, then the weights streamed into that
skeleton, mapped from the hub cache on cpu), so its module paths are those of the client's meta
model. A request runs through nnsight's server-side API: RequestModel.deserialize against the
model's persistent objects, tracer.execute, and the saved values are the frame's locals nnsight
marked as saved. nnsight keeps each source file's text and parsed `with` blocks (and linecache
its lines) forever, keyed by file name: they are put back as they were after every request, so
one request's code never runs in another's.

The parent talks to it over a multiprocessing Connection:
  parent -> child  ("job", id, blob, compress, env) | ("stop",)
  child -> parent  ("ready", info) | ("failed", message) at start;
                   ("log", id, text), ("done", id, result_bytes, seconds),
                   ("error", id, description)
"""
import io
import linecache
import os
import sys
import time
import traceback


class _LogStream(io.TextIOBase):
    """stdout of a request: each line goes to the parent as a LOG."""

    def __init__(self, conn, job_id):
        self._conn, self._id, self._buf = conn, job_id, ""

    def writable(self):
        return True

    def write(self, text):
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self._conn.send(("log", self._id, line))
        return len(text)

    def flush(self):
        if self._buf:
            self._conn.send(("log", self._id, self._buf))
            self._buf = ""


def build(spec, device, dtype):
    """The deployment's nnsight model, dispatched; and what the parent reports of it."""
    import torch

    import metaload
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    metaload.enable_nnsight()
    from nnsight.modeling import huggingface
    from nnsight.modeling.mixins.remotable import Remotable
    huggingface._ID_CACHE[spec["repo_id"]] = spec["repo_id"]  # canonical already: no Hub call
    kwargs = {"dispatch": False, "device_map": device}
    if dtype:
        kwargs["dtype"] = dtype
    start = time.monotonic()
    model = Remotable.from_model_key(spec["key"], **kwargs)
    model.dispatch()
    report = getattr(model, "metaload_report", None)
    return model, {"load_s": time.monotonic() - start, "key": model.to_model_key(),
                   "streamed": report is not None,
                   "mapped_bytes": getattr(report, "mapped_bytes", 0) if report else 0}


def _cpu(value):
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_cpu(v) for v in value)
    return value


class _Memo:
    """nnsight's per-file memo tables and linecache, put back as they were on exit."""

    def __enter__(self):
        from nnsight.tracing.globals import BLOCKS, SOURCES
        self._tables = [(t, dict(t)) for t in (SOURCES, BLOCKS, linecache.cache)]
        return self

    def __exit__(self, *exc):
        for table, saved in self._tables:
            table.clear()
            table.update(saved)
        return False


def run(model, persistent, blob, compress, env):
    """One request: the result bytes (torch.save of the saved values, zstd when compress)."""
    import torch
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.tracer import _saves, dec, inc
    with _Memo():
        model._remoteable_set_env(env or {})
        tracer = RequestModel.deserialize(blob, persistent, compress=compress)
        inc()
        try:
            tracer.execute(tracer.info.code)
            saves = _saves()
            saved = {k: _cpu(v) for k, v in tracer.info.frame.f_locals.items() if id(v) in saves}
        finally:
            dec()
    buf = io.BytesIO()
    torch.save(saved, buf)
    data = buf.getvalue()
    if compress:
        import zstandard
        data = zstandard.ZstdCompressor(level=6).compress(data)
    return data


def _describe_error(e):
    """What the client's RemoteError says: the traceback of the user's own frames (those of the
    request's code; nnsight's, torch's, transformers' and this server's left out), the whole one
    when none is the user's."""
    import nnsight
    import torch
    import transformers
    from nnsight.tracing.util import filter_traceback
    library = tuple(os.path.dirname(m.__file__) for m in (nnsight, torch, transformers)) + \
        (os.path.dirname(os.path.abspath(__file__)),)
    tb = filter_traceback(e.__traceback__,
                          lambda frame: not frame.f_code.co_filename.startswith(library))
    lines = traceback.format_exception(type(e), e, tb or e.__traceback__)
    return "".join(lines).rstrip()


def _job(conn, model, persistent, job_id, blob, compress, env):
    stream = _LogStream(conn, job_id)
    old = sys.stdout
    sys.stdout = stream
    began = time.perf_counter()
    try:
        data = run(model, persistent, blob, compress, env)
    except BaseException as e:  # noqa: BLE001 - whatever the user's code raised goes back
        stream.flush()
        sys.stdout = old
        conn.send(("error", job_id, _describe_error(e)))
        return
    finally:
        sys.stdout = old
    stream.flush()
    conn.send(("done", job_id, data, time.perf_counter() - began))


def main(conn, spec, device, dtype):
    """The executor process's body (multiprocessing target)."""
    try:
        model, info = build(spec, device, dtype)
        persistent = model._remoteable_persistent_objects()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which refuses to start
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    info["pid"] = os.getpid()
    conn.send(("ready", info))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg[0] == "stop":
            return
        _, job_id, blob, compress, env = msg
        _job(conn, model, persistent, job_id, blob, compress, env)
