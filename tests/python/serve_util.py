"""Helpers of tests/python/test_serve.py: a tiny GPT-2 in a hub cache of the test's own (no
network ever), a `python -m metaload.serve` process on a free loopback port, and a client
process running nnsight's real client against it.

Run as a script: `--write TOP` writes the checkpoint; `--client URL SCENARIO...` runs client
scenarios (this file's SCENARIOS) and prints one line "RESULT <json>".
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REPO = "metaload-test/serve-gpt2"
OTHER = "metaload-test/serve-gpt2-other"  # a second deployment, for isolation
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PROMPT = "the quick brown fox"


# ---------------------------------------------------------------------------------------------
# The checkpoint

def write_checkpoint(cache, cfg=None, repo_id=REPO):
    """A GPT-2 (by default 2 layers, 32 wide) and a byte-level BPE tokenizer trained here, as a
    hub-cache snapshot."""
    import torch
    import transformers as tf
    from conftest import write_tokenizer
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", COMMIT)
    torch.manual_seed(0)
    cfg = cfg or tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64,
                        bos_token_id=1, eos_token_id=1)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(snap)
    write_tokenizer(snap)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(COMMIT)


def env_for(top, **extra):
    from conftest import lib_path
    env = dict(os.environ, METALOAD_LIB=lib_path(), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_CACHE=os.path.join(top, "hub"), HF_HOME=os.path.join(top, "hf-home"),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), HERE,
                                           os.environ.get("PYTHONPATH", "")]),
               NNSIGHT_CONFIG=os.path.join(top, "nnsight-config.yaml"))
    for k in ("METALOAD", "LD_PRELOAD", "NDIF_HOST", "NDIF_API_KEY"):
        env.pop(k, None)
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# The server

class Server:
    """`python -m metaload.serve` on 127.0.0.1, a free port; stop() ends it and its executors."""

    def __init__(self, top, *args, timeout=300, command=None, refs=(REPO,)):
        self.log = open(os.path.join(top, f"server-{time.monotonic_ns()}.log"), "w+")
        command = command or [sys.executable, "-m", "metaload.serve"]
        self.proc = subprocess.Popen(
            [*command, *refs, "--host", "127.0.0.1", "--port", "0", *args], env=env_for(top),
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.url = self._ready(timeout)

    def _ready(self, timeout):
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = self.proc.stdout.readline()
                if line.startswith("metaload serve: ready on "):
                    return line.split()[-1]
                if not line and self.proc.poll() is not None:
                    break
        self.stop()
        raise AssertionError(f"the server did not start:\n{self.stderr()}")

    def stderr(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-5000:]

    def get(self, path, **kw):
        import httpx
        return httpx.get(self.url + path, timeout=30, **kw)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
        try:  # the executors are in the server's session: none may outlive it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def run_client(top, url, *scenarios, timeout=300, **env):
    r = subprocess.run([sys.executable, __file__, "--client", url, *scenarios],
                       env=env_for(top, **env), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"client failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


# ---------------------------------------------------------------------------------------------
# The client scenarios (each runs a trace remotely, then the same trace locally)

def _same(a, b):
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _hidden(model, remote):
    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    return [h, logits]


def _edited(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].mlp.output[:] = 0
        logits = model.lm_head.output.save()
    return [logits]


def _invokes(model, remote):
    with model.trace(remote=remote) as tracer:
        with tracer.invoke("the quick brown fox"):
            a = model.lm_head.output.save()
        with tracer.invoke("the lazy dog jumps over"):
            b = model.lm_head.output.save()
    return [a, b]


def _generate(model, remote):
    with model.generate(PROMPT, max_new_tokens=4, do_sample=False, remote=remote) as tracer:
        ids = tracer.result.save()
    return [ids]


def _nonblocking(model, remote):
    if not remote:
        return _hidden(model, False)
    with model.trace(PROMPT, remote=remote, blocking=False) as tracer:
        h = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    backend, result, deadline = tracer.backend, None, time.monotonic() + 120
    while result is None and time.monotonic() < deadline:
        time.sleep(0.2)
        result = backend()
    return [result["h"], result["logits"]]


TRACES = {"hidden": _hidden, "edited": _edited, "invokes": _invokes, "generate": _generate,
          "nonblocking": _nonblocking}


def _compare(model, url, name):
    remote = TRACES[name](model, url)
    local = TRACES[name](model, False)
    return {"equal": _same(remote, local), "n": len(remote)}


def _error_text(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads what the client raised
        return f"{type(e).__name__}: {e}"
    return None


def _raises(model, url):
    def body():
        with model.trace(PROMPT, remote=url):
            model.lm_head.output.save()
            raise ValueError("raised by the request, on purpose")
    return {"error": _error_text(body), "after": _compare(model, url, "hidden")}


def _crash(how):
    def scenario(model, url):
        def body():
            with model.trace(PROMPT, remote=url):
                import os as _os
                if how == "exit":
                    _os._exit(3)
                import ctypes
                ctypes.string_at(0)
        return {"error": _error_text(body), "after": _compare(model, url, "hidden")}
    return scenario


def _sleeps(model, url):
    def body():
        with model.trace(PROMPT, remote=url):
            import time as _time
            _time.sleep(600)
    return {"error": _error_text(body), "after": _compare(model, url, "hidden")}


def _unknown_key(model, url):
    from nnsight.intervention.backends.remote import RemoteBackend
    key = model.to_model_key().replace(REPO, "metaload-test/not-deployed")

    def body():
        with model.trace(PROMPT, backend=RemoteBackend(key, host=url)):
            model.lm_head.output.save()
    return {"error": _error_text(body), "key": key}


def _api_key(kind):
    def scenario(model, url):
        from nnsight.schema.config import CONFIG
        CONFIG.API.APIKEY = {"none": None, "wrong": "not-" + os.environ["NDIF_API_KEY"],
                             "right": os.environ["NDIF_API_KEY"]}[kind]
        if kind == "right":
            return _compare(model, url, "hidden")
        return {"error": _error_text(lambda: _hidden(model, url))}
    return scenario


def _ndif_host(model, url):
    from nnsight.schema.config import CONFIG
    assert CONFIG.API.HOST == url, CONFIG.API.HOST  # NDIF_HOST, read by nnsight at import
    remote = _hidden(model, True)
    return {"equal": _same(remote, _hidden(model, False)), "n": len(remote)}


def _concurrent(model, url):
    import threading
    results, errors = {}, []

    def one(i):
        try:
            results[i] = _hidden(model, url)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    local = _hidden(model, False)
    return {"errors": errors, "equal": [_same(results.get(i), local) for i in range(4)]}


def _key_spellings(model, url):
    """The same deployment under other spellings of its key: metaload's class path, revision
    "main", null and main's commit."""
    from nnsight.intervention.backends.remote import RemoteBackend
    suffix = {"repo_id": REPO, "revision": None}
    keys = ["metaload.TransformersModel:" + json.dumps(suffix)]
    for revision in ("main", COMMIT):
        keys.append(model.to_model_key().split(":", 1)[0] + ":" + json.dumps(
            {"repo_id": REPO, "revision": revision, "task": "text-generation"}))
    local = _hidden(model, False)
    out = {}
    for key in keys:
        with model.trace(PROMPT, backend=RemoteBackend(key, host=url)):
            h = model.transformer.h[0].output.save()
            logits = model.lm_head.output.save()
        out[key] = _same([h, logits], local)
    return out


def _blob(model, body):
    """The serialized request of a trace whose body is `body` (run on a meta model: capture
    only)."""
    from nnsight.schema.request import RequestModel
    got = {}

    class Capture:
        def __call__(self, tracer):
            got["blob"] = RequestModel.serialize(tracer, False)
    body(model, Capture())
    return got["blob"]


def _sleep_one(model, backend):
    with model.trace(PROMPT, backend=backend):
        import time as _time
        _time.sleep(2)
        logits = model.lm_head.output.save()  # noqa: F841


def _session_of_sleeps(model, url):
    """A websocket session of our own and a function that posts one 2 s request on it."""
    import httpx
    import websocket
    blob = _blob(model, _sleep_one)
    ws = websocket.create_connection(url.replace("http", "ws", 1) + "/subscribe", timeout=120)
    sid = json.loads(ws.recv())["session_id"]
    envelope = json.dumps({"model_key": model.to_model_key(), "session_id": sid,
                           "compress": False, "env": {}})

    def post():
        return httpx.post(url + "/request", data={"data": envelope},
                          files={"blob": ("r", blob, "application/octet-stream")}, timeout=30)
    return ws, post


def _queue_positions(model, url):
    """Three requests on one session, sent at once: their QUEUED frames' positions."""
    from nnsight.schema.response import ResponseModel
    ws, post = _session_of_sleeps(model, url)
    ids = [post().json()["id"] for _ in range(3)]
    seen = {i: [] for i in ids}
    done = 0
    while done < 3:
        frame = ws.recv()
        r = ResponseModel.unpickle(frame) if isinstance(frame, bytes) else \
            ResponseModel.model_validate_json(frame)
        seen[r.id].append([r.status.value, (r.meta or {}).get("position")])
        done += r.status.value in ("COMPLETED", "ERROR")
    ws.close()
    return [seen[i] for i in ids]


def _disconnect(model, url):
    """A client that goes away with a request running and two queued: nothing is left queued."""
    import httpx
    ws, post = _session_of_sleeps(model, url)
    for _ in range(3):
        post()
    ws.close()
    deadline = time.monotonic() + 30
    while True:  # the server notices the close at once; this only waits for that
        queued = httpx.get(url + "/status", timeout=30).json()["deployments"][REPO]["queued"]
        if queued == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {"queued_after_close": queued, "after": _compare(model, url, "hidden")}


def _hidden_on(model, backend):
    with model.trace(PROMPT, backend=backend):
        h = model.transformer.h[0].output.save()  # noqa: F841
        logits = model.lm_head.output.save()  # noqa: F841


def _ttl(model, url):
    """Two non-blocking requests (no session: their results go through a URL): one downloaded at
    once, one left for longer than --result-ttl (the server's, 1 s here)."""
    import httpx
    blob = _blob(model, _hidden_on)
    envelope = json.dumps({"model_key": model.to_model_key(), "session_id": "",
                           "compress": False, "env": {}})

    def result_url():
        job = httpx.post(url + "/request", data={"data": envelope},
                         files={"blob": ("r", blob, "application/octet-stream")},
                         timeout=30).json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = httpx.get(f"{url}/response/{job}", timeout=30)
            if r.status_code == 200 and r.json()["status"] == "COMPLETED":
                return r.json()["data"]
            time.sleep(0.02)
        raise AssertionError(f"request {job} did not complete")
    at_once = httpx.get(result_url(), timeout=30)
    left = result_url()
    time.sleep(1.5)
    late = httpx.get(left, timeout=30)
    return {"at_once": at_once.status_code, "at_once_again": httpx.get(
        at_once.url, timeout=30).status_code, "late": late.status_code,
        "late_detail": late.json().get("detail")}


def _sleep_long(model, backend):
    with model.trace(PROMPT, backend=backend):
        import time as _time
        _time.sleep(600)
        logits = model.lm_head.output.save()  # noqa: F841


def _cancel_running(model, url):
    """A client that goes away while its (600 s) request runs: the next client's trace is
    served long before the server's time limit would have stopped the first."""
    import httpx
    import websocket
    from nnsight.schema.response import ResponseModel
    blob = _blob(model, _sleep_long)
    ws = websocket.create_connection(url.replace("http", "ws", 1) + "/subscribe", timeout=120)
    sid = json.loads(ws.recv())["session_id"]
    envelope = json.dumps({"model_key": model.to_model_key(), "session_id": sid,
                           "compress": False, "env": {}})
    httpx.post(url + "/request", data={"data": envelope},
               files={"blob": ("r", blob, "application/octet-stream")}, timeout=30)
    states = []
    while "RUNNING" not in states:
        frame = ws.recv()
        r = ResponseModel.unpickle(frame) if isinstance(frame, bytes) else \
            ResponseModel.model_validate_json(frame)
        states.append(r.status.value)
    ws.close()
    began = time.monotonic()
    after = _compare(model, url, "hidden")
    return {"states": states, "after": after, "seconds": time.monotonic() - began}


def _oom(model, url):
    """A request that asks for more memory than the machine has: an error, and the next works.
    Only where the kernel refuses an allocation past RAM + swap (vm.overcommit_memory 0 or 2):
    with 1 it would be granted, and filling it would bring the OOM killer to the machine."""
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "1":
            return {"skipped": "vm.overcommit_memory is 1"}

    def body():
        with model.trace(PROMPT, remote=url):
            hog = bytearray(1 << 42)  # noqa: F841 (4 TiB)
    return {"error": _error_text(body), "after": _compare(model, url, "hidden")}


def _prints(model, url):
    """What a request prints comes back as LOG frames, in order."""
    from nnsight.intervention.backends import remote
    seen = []
    parse = remote.RemoteBackend.parse

    def recording(message):
        r = parse(message)
        seen.append([r.status.value, r.description])
        return r
    remote.RemoteBackend.parse = staticmethod(recording)
    try:
        with model.trace(PROMPT, remote=url):
            print("first line from the request")
            print("second", "line")
            logits = model.lm_head.output.save()  # noqa: F841
    finally:
        remote.RemoteBackend.parse = staticmethod(parse)
    return [d for s, d in seen if s == "LOG"]


def _compare_env(model, url):
    """nnsight.status() and nnsight.compare() read this server (NDIF_HOST)."""
    import nnsight
    status = nnsight.status()
    c = nnsight.compare()
    return {"listed": REPO in status, "state": status[REPO]["state"] if REPO in status else None,
            "python_matches": c.python_matches, "mismatches": len(c.mismatches)}


SCENARIOS = {**{name: (lambda n: lambda model, url: _compare(model, url, n))(name)
                for name in TRACES},
             "raises": _raises, "exit": _crash("exit"), "segfault": _crash("segfault"),
             "sleeps": _sleeps, "unknown_key": _unknown_key, "ndif_host": _ndif_host,
             "concurrent": _concurrent, "no_key": _api_key("none"),
             "wrong_key": _api_key("wrong"), "right_key": _api_key("right"),
             "key_spellings": _key_spellings, "queue_positions": _queue_positions,
             "disconnect": _disconnect, "oom": _oom, "prints": _prints,
             "compare_env": _compare_env, "ttl": _ttl, "cancel_running": _cancel_running}


def client(url, names):
    import warnings
    warnings.simplefilter("ignore")
    import nnsight
    from nnsight.modeling import huggingface
    huggingface._ID_CACHE[REPO] = REPO  # the Hub's canonical spelling: the network part
    model = nnsight.LanguageModel(REPO, dispatch=False)
    out = {}
    for name in names:
        out[name] = SCENARIOS[name](model, url)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write_checkpoint(sys.argv[2])
        write_checkpoint(sys.argv[2], repo_id=OTHER)
    elif sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3:])
