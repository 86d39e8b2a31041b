"""bench/serve: metaload serve against the same trace run locally (torch 2.x environment).

    METALOAD_LIB=build/torch2/libmetaload.so PYTHONPATH=python:tests/python \
        ~/.cache/metaload/venv-torch2/bin/python bench/serve.py [--rounds 30] [--layers 4] \
        [--width 256] [--cold-only]

A GPT-2 (--layers x --width, vocab 4096) written into a hub cache of its own (no network);
all on 127.0.0.1. Tables:
  1. remote-trace overhead: one trace saving a hidden state and the logits, remotely (blocking
     client, through the websocket) and locally (the client's own dispatched model): median and
     p95 over --rounds, and the (de)serialization alone (RequestModel.serialize/deserialize of
     the same trace, torch.save/load of the result)
  2. throughput with 1, 4 and 16 concurrent clients (threads of one client process)
  3. cold start: launching `python -m metaload.serve` to the first COMPLETED, against the same
     model's first local nnsight trace without metaload (a from_pretrained dispatch), each from
     a fresh process; peak RSS of the server (front + executor) and of the local process
  4. bench/serve_place's table: metaload place against NDIF's sizing rule
bench/run serve runs it (torch 2.x only).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import serve_util  # noqa: E402

PROMPT = "the quick brown fox jumps over the lazy dog " * 4


def write(top, layers, width=256):
    code = ("import sys, transformers as tf, serve_util as s\n"
            f"s.write_checkpoint(sys.argv[1], tf.GPT2Config(n_layer={layers}, n_embd={width}, "
            f"n_head={max(1, width // 64)}, vocab_size=4096, n_positions=256, bos_token_id=1, "
            "eos_token_id=1))\n")
    subprocess.run([sys.executable, "-c", code, os.path.join(top, "hub")], check=True,
                   env=serve_util.env_for(top))


def _peak_rss_tree(pid):
    """VmHWM of a process and its children, summed (MiB)."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


CLIENT = r'''
import json, statistics, sys, threading, time, io
import warnings; warnings.simplefilter("ignore")
import torch, nnsight
from nnsight.modeling import huggingface
from nnsight.schema.config import CONFIG
CONFIG.APP.REMOTE_LOGGING = False
url, rounds, prompt, repo = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if int(sys.argv[5]):
    torch.set_num_threads(int(sys.argv[5]))
huggingface._ID_CACHE[repo] = repo
model = nnsight.LanguageModel(repo, dispatch=False)

metas = []
def trace(remote):
    with model.trace(prompt, remote=remote) as tracer:
        h = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    if remote:
        metas.append(tracer.backend.meta)
    return logits

def timed(remote, n):
    out = []
    for _ in range(n):
        t = time.perf_counter(); trace(remote); out.append(time.perf_counter() - t)
    return out

trace(url); trace(False)  # warm both (the local dispatch, the server's first request)
metas.clear()
remote, local = timed(url, rounds), timed(False, rounds)
server_meta = list(metas)

from nnsight.schema.request import RequestModel
blobs = {}
class Capture:
    def __call__(self, tracer):
        t = time.perf_counter(); blobs["b"] = RequestModel.serialize(tracer, True)
        blobs["ser"] = time.perf_counter() - t
ser = []
for _ in range(rounds):
    with model.trace(prompt, backend=Capture()):
        h = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    ser.append(blobs["ser"])
persistent = model._remoteable_persistent_objects()
de = []
for _ in range(rounds):
    t = time.perf_counter(); RequestModel.deserialize(blobs["b"], persistent, compress=True)
    de.append(time.perf_counter() - t)
res = {"h": torch.zeros(1, 40, 256), "logits": torch.zeros(1, 40, 4096)}
import zstandard
rt = []
for _ in range(rounds):
    t = time.perf_counter(); b = io.BytesIO(); torch.save(res, b)
    z = zstandard.ZstdCompressor(level=6).compress(b.getvalue())
    torch.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(z)), weights_only=False)
    rt.append(time.perf_counter() - t)

def throughput(k, per):
    t = time.perf_counter()
    ts = [threading.Thread(target=lambda: [trace(url) for _ in range(per)]) for _ in range(k)]
    [x.start() for x in ts]; [x.join() for x in ts]
    return k * per / (time.perf_counter() - t)
tput = {k: throughput(k, max(2, 32 // k)) for k in (1, 4, 16)}
import httpx
hc = []
for _ in range(rounds):  # what nnsight's client spends on each POST before sending anything
    t = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(10.0, read=600.0)):
        pass
    hc.append(time.perf_counter() - t)
print("RESULT " + json.dumps({"remote": remote, "local": local, "ser": ser, "de": de,
                             "result_rt": rt, "throughput": tput, "httpx_client": hc,
                             "executor": [m["executor_seconds"] for m in server_meta],
                             "server": [m["server_seconds"] for m in server_meta]}))
'''

LOCAL_COLD = r'''
import sys, time, json
t0 = float(sys.argv[2])
import warnings; warnings.simplefilter("ignore")
import nnsight
from nnsight.modeling import huggingface
huggingface._ID_CACHE[sys.argv[1]] = sys.argv[1]
model = nnsight.LanguageModel(sys.argv[1])
with model.trace(sys.argv[3]):
    logits = model.lm_head.output.save()
t = time.time() - t0
with open("/proc/self/status") as f:
    rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
print("RESULT " + json.dumps({"seconds": t, "rss_mib": rss}))
'''

FIRST = r'''
import sys, time, json
import warnings; warnings.simplefilter("ignore")
import nnsight, httpx
from nnsight.modeling import huggingface
from nnsight.schema.config import CONFIG
CONFIG.APP.REMOTE_LOGGING = False
huggingface._ID_CACHE[sys.argv[1]] = sys.argv[1]
model = nnsight.LanguageModel(sys.argv[1], dispatch=False)
url = None
print("READY", flush=True)
url = sys.stdin.readline().strip()
while True:  # until the server answers /ping
    try:
        if httpx.get(url + "/ping", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        time.sleep(0.02)
with model.trace(sys.argv[2], remote=url):
    logits = model.lm_head.output.save()
print("RESULT " + json.dumps({"done": time.time()}), flush=True)
'''


def _result(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def steady(top, rounds, threads):
    server = serve_util.Server(top, "--threads", str(threads))
    try:
        r = subprocess.run([sys.executable, "-c", CLIENT, server.url, str(rounds), PROMPT,
                            serve_util.REPO, str(threads)], env=serve_util.env_for(top),
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
        out = _result(r.stdout)
        out["server_rss_mib"] = _peak_rss_tree(server.proc.pid)
    finally:
        server.stop()
    return out


def cold(top):
    """(serve seconds, serve peak RSS MiB), (local seconds, local peak RSS MiB)."""
    local = _result(subprocess.run(
        [sys.executable, "-c", LOCAL_COLD, serve_util.REPO, repr(time.time()), PROMPT],
        env=serve_util.env_for(top), capture_output=True, text=True, timeout=600,
        check=True).stdout)
    client = subprocess.Popen([sys.executable, "-c", FIRST, serve_util.REPO, PROMPT],
                              env=serve_util.env_for(top), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "READY"
    t0 = time.time()
    server = serve_util.Server(top, "--port", "0")
    try:
        client.stdin.write(server.url + "\n")
        client.stdin.flush()
        done = _result(client.communicate(timeout=600)[0])["done"]
        rss = _peak_rss_tree(server.proc.pid)
    finally:
        server.stop()
    return (done - t0, rss), (local["seconds"], local["rss_mib"])


def print_cold(top, a):
    (serve_s, serve_rss), (local_s, local_rss) = cold(top)
    weights = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in
                  os.walk(os.path.join(top, "hub")) for f in fs if f.endswith(".safetensors"))
    print(f"\n| cold start, GPT-2 {a.layers} x {a.width} ({weights / 2**20:.0f} MiB of weights) | "
          "seconds | peak RSS MiB |\n|---|---|---|")
    print(f"| metaload serve: launch -> first COMPLETED | {serve_s:.2f} "
          f"(**{serve_s / local_s:.2f}x**) | {serve_rss:.0f} |")
    print(f"| local nnsight, from_pretrained dispatch: start -> first trace | {local_s:.2f} "
          f"(1.00x) | {local_rss:.0f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the executor and of the local trace alike (default 1: "
                        "on 2 shared cores two threads wait on each other; 0: torch's default)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--cold-only", action="store_true",
                   help="table 3 alone (with --layers / --width: how cold start moves with size)")
    a = p.parse_args()
    top = tempfile.mkdtemp(prefix="bench-serve-")
    write(top, a.layers, a.width)
    if a.cold_only:
        return print_cold(top, a)
    s = steady(top, a.rounds, a.threads)
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.1f} / {_pct(xs, 0.95) * 1e3:.1f}"  # noqa
    over = [r - l for r, l in zip(sorted(s["remote"]), sorted(s["local"]))]
    serde = statistics.median(s["ser"]) + statistics.median(s["de"]) + \
        statistics.median(s["result_rt"])
    print(f"bench/serve: GPT-2 {a.layers} x 256, prompt {len(PROMPT.split())} words, "
          f"{a.rounds} rounds, {a.threads or 'default'} torch threads, 127.0.0.1")
    print("\n| trace | median / p95 ms |\n|---|---|")
    print(f"| local (client's own model) | {ms(s['local'])} |")
    print(f"| remote (metaload serve) | {ms(s['remote'])} |")
    print(f"| remote - local | {statistics.median(over) * 1e3:.1f} / {_pct(over, .95) * 1e3:.1f} |")
    print(f"| (de)serialization alone (request + result) | {serde * 1e3:.1f} |")
    print(f"| the client's own httpx.Client() per POST (client side) | {ms(s['httpx_client'])} |")
    print(f"| on the server: POST received -> COMPLETED sent | {ms(s['server'])} |")
    print(f"| ... of which the executor's run (deserialize, execute, save) | {ms(s['executor'])} |")
    hop = [a - b for a, b in zip(s["server"], s["executor"])]
    print(f"| ... the rest: front, queue, pipe, frames | {ms(hop)} |")
    print(f"\nserver peak RSS (front + executor): {s['server_rss_mib']:.0f} MiB")
    print("\n| concurrent clients | traces/s |\n|---|---|")
    for k, v in s["throughput"].items():
        print(f"| {k} | {v:.1f} |")
    print_cold(top, a)
    print("\nPlacement from the key alone against NDIF's rule (bench/serve_place.py):\n")
    sys.path.insert(0, HERE)
    import serve_place
    serve_place.main()


if __name__ == "__main__":
    main()
