"""The HTTP front: nnsight 0.8's remote protocol (FastAPI).

  GET  /ping                  "pong"
  GET  /status                {"deployments": {name: {model_key, repo_id, revision, n_params,
                               config, deployment_level, application_state, placement, ...}}}
  GET  /env                   {"python_version", "packages"}
  WS   /subscribe             first frame {"session_id": ...}; then the session's status frames
  POST /request               multipart: data (RequestModel JSON), blob (the serialized trace)
  GET  /response/{id}         a request's latest status (404 until it has one)
  GET  /download/{token}      a result too large to go inline (once; unguessable token)
"""
import asyncio
import contextlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional

from fastapi import FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import keys
from .deployment import Job
from .store import Store


@dataclass
class Settings:
    api_keys: FrozenSet[str] = frozenset()
    max_body_bytes: int = 64 << 20
    inline_result_bytes: int = 8 << 20
    result_ttl_s: float = 600.0
    # /subscribe is unauthenticated (nnsight's client sends no key there): open sockets are
    # capped per client address and in all, and one whose session no POST /request names
    # within subscribe_timeout_s is closed.
    max_subscribers: int = 256
    max_subscribers_per_ip: int = 16
    subscribe_timeout_s: float = 60.0
    placement: Dict[str, dict] = field(default_factory=dict)


def key_ok(settings: Settings, given: Optional[str]) -> bool:
    """Whether `given` is one of the keys (every key compared, each in constant time)."""
    if not settings.api_keys:
        return True
    given_b = (given or "").encode("utf-8", "surrogateescape")
    ok = False
    for k in settings.api_keys:
        ok |= hmac.compare_digest(given_b, k.encode("utf-8"))
    return ok and bool(given)


def _refuse(settings, given):
    if not key_ok(settings, given):
        what = "no API key (the ndif-api-key header)" if not given else "a wrong API key"
        raise HTTPException(401, f"metaload serve: the request carries {what}; this server "
                                 f"needs one of its keys (NDIF_API_KEY or CONFIG.API.APIKEY)")


class Front:
    """The state behind the endpoints: deployments, open sessions, statuses and results."""

    def __init__(self, deployments: Dict[keys.Identity, object], settings: Settings, env: dict):
        self.deployments, self.settings, self.env = deployments, settings, env
        self.store = Store(settings.result_ttl_s)
        self.sessions: Dict[str, asyncio.Queue] = {}
        self.named: Dict[str, asyncio.Event] = {}  # session -> set once a request names it
        self.per_ip: Dict[str, int] = {}
        self.refused_sockets = self.idle_closed = 0
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def emit(self, job: Job, status: str, description: str = "", data=None, meta=None):
        """Called from the deployments' threads: hands the update to the event loop."""
        self.loop.call_soon_threadsafe(self._deliver, job, status, description, data, meta)

    def _deliver(self, job, status, description, data, meta):
        from nnsight.schema.response import ResponseModel
        queue = self.sessions.get(job.session_id) if job.session_id else None
        if job.session_id and queue is None:
            return  # its client went away: nothing is kept for it
        binary = None
        if status == "COMPLETED":
            if queue is not None and len(data) <= self.settings.inline_result_bytes:
                binary = ResponseModel(id=job.id, status=status, data=data, meta=meta).pickle()
                data = None
            else:
                data = f"{job.base_url}/download/{self.store.put_result(data)}"
        response = ResponseModel(id=job.id, status=status, description=description, data=data,
                                 meta=meta)
        text = response.model_dump_json()
        if status != "LOG":
            self.store.set_status(job.id, text)
        if queue is not None:
            queue.put_nowait(binary if binary is not None else text)

    def held_keys(self):
        return sorted(d.spec.key for d in self.deployments.values())

    def status(self):
        out = {}
        for d in self.deployments.values():
            entry = dict(d.describe)
            entry.update({"deployment_level": "HOT", "application_state": d.state,
                          "queued": d.queued(), "executor_pid": d.pid, "restarts": d.restarts,
                          "cancelled": d.cancelled,
                          "load_seconds": d.load_s,
                          "placement": self.settings.placement.get(d.spec.ref)})
            out[d.spec.repo_id if d.spec.revision is None else
                f"{d.spec.repo_id}@{d.spec.revision}"] = entry
        return {"deployments": out, "results_held": self.store.results_held(),
                "subscribers": len(self.sessions), "subscribers_refused": self.refused_sockets,
                "subscribers_idle_closed": self.idle_closed}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"metaload serve: the request body is {declared} bytes; the "
                                 f"limit is {limit} (--max-body)")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HTTPException(413, f"metaload serve: the request body is over the limit of "
                                     f"{limit} bytes (--max-body)")
        chunks.append(chunk)
    return b"".join(chunks)


async def _envelope(front: Front, request: Request):
    """(RequestModel, blob) of POST /request, or a 4xx naming what is wrong."""
    from nnsight.schema.request import RequestModel
    request._body = await _read_body(request, front.settings.max_body_bytes)
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise HTTPException(400, f"metaload serve: POST /request is {kind or 'no content type'}, "
                                 f"not multipart/form-data with fields data and blob")
    try:
        form = await request.form(max_files=1, max_fields=4,
                                  max_part_size=front.settings.max_body_bytes)
    except Exception as e:  # noqa: BLE001 - any unparseable body is the client's error
        raise HTTPException(400, f"metaload serve: POST /request is not multipart/form-data "
                                 f"with fields data and blob: {e}") from None
    data, blob = form.get("data"), form.get("blob")
    if not isinstance(data, str) or blob is None or isinstance(blob, str):
        raise HTTPException(422, "metaload serve: POST /request needs a form field 'data' (the "
                                 "RequestModel JSON) and a file part 'blob'")
    try:
        envelope = RequestModel.model_validate_json(data)
    except Exception as e:  # noqa: BLE001 - pydantic's message names the field
        raise HTTPException(422, f"metaload serve: field 'data' is not a RequestModel: {e}")
    return envelope, await blob.read()


def _routes(app: FastAPI, front: Front):
    @app.get("/ping")
    async def ping():
        return PlainTextResponse("pong")

    @app.get("/status")
    async def status():
        return front.status()

    @app.get("/env")
    async def env():
        return front.env

    @app.get("/response/{job_id}")
    async def response(job_id: str, request: Request):
        _refuse(front.settings, request.headers.get("ndif-api-key"))
        text = front.store.status(job_id)
        if text is None:
            raise HTTPException(404, f"metaload serve: no request {job_id!r} (yet)")
        return Response(text, media_type="application/json")

    @app.get("/download/{token}")
    async def download(token: str):
        data = front.store.take_result(token)
        if data is None:
            raise HTTPException(404, "metaload serve: no such result (downloaded or expired)")
        return Response(data, media_type="application/octet-stream")


def _submit_route(app: FastAPI, front: Front):
    @app.post("/request")
    async def submit(request: Request):
        from nnsight.schema.response import ResponseModel
        _refuse(front.settings, request.headers.get("ndif-api-key"))
        envelope, blob = await _envelope(front, request)
        job_id = secrets.token_hex(16)
        deployment = keys.find(envelope.model_key, front.deployments)
        if deployment is None:
            held = "\n  ".join(front.held_keys())
            return JSONResponse(json.loads(ResponseModel(
                id=job_id, status="ERROR",
                description=f"metaload serve: model key {envelope.model_key!r} is not deployed "
                            f"here; this server holds:\n  {held}").model_dump_json()))
        session = envelope.session_id if envelope.session_id in front.sessions else ""
        if session:
            front.named[session].set()
        job = Job(job_id, blob, bool(envelope.compress), dict(envelope.env), session,
                  str(request.base_url).rstrip("/"))
        received = ResponseModel(id=job_id, status="RECEIVED", description="received")
        front.store.set_status(job_id, received.model_dump_json())
        deployment.submit(job)
        return JSONResponse(json.loads(received.model_dump_json()))


def _admit(front: Front, ws: WebSocket) -> Optional[str]:
    """Why a new /subscribe socket is refused (None: it is admitted, and counted)."""
    ip = ws.client.host if ws.client else "?"
    st = front.settings
    total = sum(front.per_ip.values())
    if total >= st.max_subscribers:
        return f"{total} /subscribe sockets are open, the most this server takes"
    if front.per_ip.get(ip, 0) >= st.max_subscribers_per_ip:
        return (f"{ip} has {front.per_ip[ip]} /subscribe sockets open, the most one address may "
                f"have")
    front.per_ip[ip] = front.per_ip.get(ip, 0) + 1
    return None


def _subscribe_route(app: FastAPI, front: Front):
    @app.websocket("/subscribe")
    async def subscribe(ws: WebSocket):
        # A missing key is refused at POST /request, where the client says why; the socket
        # itself is unauthenticated, so it is capped (see _admit) and closed if unused.
        why = _admit(front, ws)
        if why is not None:
            front.refused_sockets += 1
            await ws.close(code=1013, reason=f"metaload serve: {why}; try again later")
            return
        ip = ws.client.host if ws.client else "?"
        sid = secrets.token_hex(16)
        queue = front.sessions[sid] = asyncio.Queue()
        named = front.named[sid] = asyncio.Event()
        closed = timer = None
        try:
            await ws.accept()
            closed = asyncio.ensure_future(ws.receive())
            timer = asyncio.ensure_future(
                asyncio.wait_for(named.wait(), front.settings.subscribe_timeout_s))
            await ws.send_text(json.dumps({"session_id": sid}))
            while True:
                frame = asyncio.ensure_future(queue.get())
                waits = {frame, closed} | ({timer} if timer is not None else set())
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if timer in done:
                    if not named.is_set():  # no request named this session in time
                        frame.cancel()
                        front.idle_closed += 1
                        await ws.close(code=1008, reason=(
                            f"metaload serve: no request named this session within "
                            f"{front.settings.subscribe_timeout_s:g} s"))
                        break
                    timer = None
                if closed in done:
                    frame.cancel()
                    break
                if frame not in done:
                    frame.cancel()
                    continue
                item = frame.result()
                await (ws.send_bytes(item) if isinstance(item, bytes) else ws.send_text(item))
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            for task in (closed, timer):
                if task is not None:
                    task.cancel()
            front.sessions.pop(sid, None)
            front.named.pop(sid, None)
            front.per_ip[ip] -= 1
            if not front.per_ip[ip]:
                del front.per_ip[ip]
            for d in front.deployments.values():
                d.cancel_session(sid)


def make_app(front: Front) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        front.loop = asyncio.get_running_loop()

        async def expire():  # take_result and status refuse expired entries by themselves
            while True:
                await asyncio.sleep(min(5.0, max(0.1, front.settings.result_ttl_s / 4)))
                front.store.expire()
        task = asyncio.ensure_future(expire())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="metaload serve", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    _routes(app, front)
    _submit_route(app, front)
    _subscribe_route(app, front)
    return app


def python_env() -> dict:
    """/env: this Python's version and installed packages, keyed as nnsight's own
    get_local_env keys them (import names), so nnsight.compare() matches them up; modules only
    importable from the server's working tree ("local") are left out."""
    from nnsight.ndif import get_local_env
    env = get_local_env()
    env["packages"] = {k: v for k, v in env["packages"].items() if v != "local"}
    return env
