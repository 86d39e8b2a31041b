"""A deployment on the front's side: its queue, and the executor process it supervises.

One thread per deployment takes the requests in order and hands each to the executor; what
happens to a request is reported through `emit(job, status, description, data, meta)`. A request
past its time limit, or one whose executor dies (a segfault, os._exit, the kernel's OOM killer),
is an ERROR; the executor is then killed if need be and started again, and the queue goes on.
"""
import collections
import multiprocessing
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from . import executor


@dataclass
class Job:
    id: str
    blob: bytes
    compress: bool
    env: Dict[str, Any]
    session_id: str
    base_url: str
    received: float = field(default_factory=time.time)
    cancelled: bool = False


@dataclass
class Limits:
    time_limit_s: float = 600.0
    start_timeout_s: float = 600.0


def _exit_text(code):
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class ExecutorGone(Exception):
    pass


class Cancelled(Exception):
    """The running request's client went away: its executor is killed and started again."""


_ctx_lock = threading.Lock()


def _context():
    """The executors' multiprocessing context: a fork server that has imported the heavy modules
    once (see _preload), so a start or a restart forks a ready process instead of importing
    torch and transformers again; never a fork of the front itself (its threads)."""
    with _ctx_lock:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["metaload.serve._preload"])
        return ctx


class Deployment:
    def __init__(self, spec, describe, device, dtype, limits: Limits, emit: Callable,
                 threads: int = 0):
        self.spec, self.describe, self.device, self.dtype = spec, describe, device, dtype
        self.threads = threads
        self.limits, self.emit = limits, emit
        self.state = "NOT_STARTED"
        self.restarts, self.load_s, self.pid = 0, [], None
        self.cancelled = 0  # running requests stopped because their client went away
        self._queue = collections.deque()
        self._cv = threading.Condition()
        self._running: Optional[Job] = None
        self._proc = self._conn = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"deployment {spec.ref}",
                                        daemon=True)

    # -- the executor process

    def start(self):
        """Starts the executor and waits until the model is loaded (RuntimeError if it fails)."""
        self.state = "DEPLOYING"
        ctx = _context()
        parent, child = ctx.Pipe()
        spec = {"key": self.spec.key, "repo_id": self.spec.repo_id, "ref": self.spec.ref,
                "threads": self.threads}
        proc = ctx.Process(target=executor.main, args=(child, spec, self.device, self.dtype),
                           name=f"metaload-serve-executor {self.spec.ref}", daemon=True)
        began = time.monotonic()
        proc.start()
        child.close()
        if not parent.poll(self.limits.start_timeout_s):
            proc.kill()
            raise RuntimeError(f"the executor of {self.spec.ref} did not load it within "
                               f"{self.limits.start_timeout_s:g} s")
        try:
            msg = parent.recv()
        except EOFError:
            proc.join(5)
            msg = ("failed", f"the executor {_exit_text(proc.exitcode)} while loading")
        if msg[0] != "ready":
            proc.kill()
            self.state = "UNHEALTHY"
            raise RuntimeError(f"deployment {self.spec.ref}: {msg[1]}")
        self._proc, self._conn, self.pid = proc, parent, msg[1]["pid"]
        self.load_s.append(round(time.monotonic() - began, 3))
        self.state = "RUNNING"
        if not self._thread.is_alive():
            self._thread.start()

    def _kill(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def _restart(self):
        self._kill()
        self.restarts += 1
        try:
            self.start()
        except RuntimeError:
            self.state = "UNHEALTHY"

    def stop(self):
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._kill()

    # -- the queue

    def submit(self, job: Job):
        with self._cv:
            self._queue.append(job)
            position = len(self._queue)
            self._cv.notify()
        self.emit(job, "QUEUED", f"queued at position {position}", meta={"position": position})

    def cancel_session(self, session_id: str):
        """Drops the queued requests of a client that went away, and stops its running one: the
        deployment's thread sees the mark within half a second, kills the executor (a request is
        arbitrary code: nothing short of that stops it) and starts it again."""
        with self._cv:
            for job in [j for j in self._queue if j.session_id == session_id]:
                self._queue.remove(job)
            if self._running is not None and self._running.session_id == session_id:
                self._running.cancelled = True

    def queued(self) -> int:
        return len(self._queue)

    def _next(self) -> Optional[Job]:
        with self._cv:
            while not self._queue and not self._stopped:
                self._cv.wait()
            if self._stopped:
                return None
            job = self._running = self._queue.popleft()
            waiting = list(self._queue)
        for i, other in enumerate(waiting):
            self.emit(other, "QUEUED", f"queued at position {i + 1}", meta={"position": i + 1})
        return job

    def _loop(self):
        while True:
            job = self._next()
            if job is None:
                return
            try:
                self._run(job)
            finally:
                with self._cv:
                    self._running = None

    # -- one request

    def _run(self, job: Job):
        if self.state != "RUNNING" or self._conn is None:
            self._restart()
            if self.state != "RUNNING":
                self.emit(job, "ERROR", f"deployment {self.spec.key} cannot start its executor")
                return
        if job.cancelled:  # its client went away between the queue and here
            return
        self.emit(job, "RUNNING", "running")
        began = time.monotonic()
        deadline = began + self.limits.time_limit_s
        try:
            self._conn.send(("job", job.id, job.blob, job.compress, job.env))
            self._wait(job, deadline)
        except ExecutorGone as e:
            self.emit(job, "ERROR", str(e), meta={"seconds": time.monotonic() - began})
            self._restart()
        except Cancelled:
            self.cancelled += 1
            sys.stderr.write(f"metaload serve: request {job.id} of deployment {self.spec.ref} "
                             f"was cancelled after {time.monotonic() - began:.1f} s: its client "
                             f"went away; restarting the executor\n")
            self._restart()

    def _wait(self, job: Job, deadline: float):
        while True:
            if job.cancelled:
                raise Cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecutorGone(
                    f"the request ran past the time limit of {self.limits.time_limit_s:g} s "
                    f"and was stopped (deployment {self.spec.ref} goes on)")
            try:
                ready = self._conn.poll(min(left, 0.5))
                msg = self._conn.recv() if ready else None
            except (EOFError, OSError):
                msg = None
                ready = True
            if msg is None:
                if ready or not self._proc.is_alive():
                    self._proc.join(5)
                    raise ExecutorGone(
                        f"the executor of deployment {self.spec.ref} "
                        f"{_exit_text(self._proc.exitcode)} while running this request; it is "
                        f"being restarted")
                continue
            kind, _, payload = msg[:3]
            if kind == "log":
                self.emit(job, "LOG", payload)
                continue
            if kind == "done":
                # What the request cost here: the executor's run (deserialize, execute, save)
                # and the whole stay from POST to now.
                self.emit(job, "COMPLETED", "", data=payload,
                          meta={"executor_seconds": msg[3],
                                "server_seconds": time.time() - job.received})
            else:
                self.emit(job, "ERROR", payload)
            return
