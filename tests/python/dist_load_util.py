"""Helpers of the distributed load_into tests: fixtures, the ranks as processes (each wait
bounded), their results."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, lib_path

WORKER = os.path.join(ROOT, "tests", "python", "scripts", "dist_load_worker.py")

# Configs whose TP degrees include 2, 3 and 4 (GPT-2: 12 heads) and a grouped-query Llama (8
# query heads, 4 KV heads: degrees 1, 2, 4).
GPT2_12 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
           "bos_token_id": 0, "eos_token_id": 0, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
           "n_embd": 48, "n_head": 12, "n_inner": None, "n_layer": 2, "n_positions": 32,
           "tie_word_embeddings": True, "torch_dtype": "float32", "vocab_size": 200}
LLAMA_GQA = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1,
             "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 64,
             "intermediate_size": 96, "max_position_embeddings": 64, "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2,
             "num_key_value_heads": 4, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
             "tie_word_embeddings": False, "torch_dtype": "float32", "vocab_size": 200}


def make_fixture(tmp, name, config, shards=1):
    import metaload
    cfg = os.path.join(str(tmp), f"{name}.config.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    out = os.path.join(str(tmp), name)
    return metaload.make_checkpoint(out, config=cfg, shards=shards, seed=7, layout="saved")["dir"]


def skeleton_spec(ckpt, path):
    """The names, shapes, dtypes and ties of the checkpoint's model (a TransformersModel on meta,
    which reads config.json only), for the workers' skeletons."""
    import metaload
    m = metaload.TransformersModel(ckpt, progress=False)
    entries, ties = [], {}
    for params, items in ((True, m.named_parameters()), (False, m.named_buffers())):
        for n, t in items.items():
            tie = ties.setdefault(id(t), n)
            entries.append({"name": n, "shape": list(t.shape), "param": params, "tie": tie,
                            "dtype": str(t.dtype).replace("torch.", "")})
    with open(path, "w") as f:
        json.dump({"tensors": entries}, f)
    return path


def reference(ckpt, rank, size):
    """The single-process TP load of one rank: {name: tensor}."""
    import metaload
    m = metaload.TransformersModel(ckpt, tp_rank=rank, tp_size=size, dispatch=True,
                                   progress=False)
    out = dict(m.named_parameters())
    out.update(m.named_buffers())
    return out


def header_bytes(ckpt):
    """{checkpoint name: (shape, bytes)} from the headers."""
    from metaload import _lib
    ops = _lib.load()
    out = {}
    for f in json.loads(ops.open_checkpoint(ckpt, None))["files"]:
        for t in json.loads(ops.read_safetensors_header(f))["tensors"]:
            out[t["name"]] = (t["shape"], t["end"] - t["begin"] if "end" in t else t["nbytes"])
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["METALOAD_LIB"] = lib_path()
    for k in ("METALOAD", "METALOAD_REPORT", "LD_PRELOAD", "METALOAD_TEST_DIST_FAULT"):
        e.pop(k, None)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run_ranks(tmp, world, steps, skeleton, *, addr="127.0.0.1", prefix=None, limit=90,
              extra_env=None):
    """Runs `world` worker processes over gloo at addr (prefix[rank]: argv before python, e.g.
    `ip netns exec NS`); waits at most `limit` s for all (a test fails rather than hangs);
    returns [results of rank r]."""
    out = os.path.join(str(tmp), f"out{time.monotonic_ns()}")
    os.makedirs(out)
    job = {"world": world, "addr": addr, "port": free_port(), "skeleton": skeleton, "out": out,
           "steps": steps}
    path = os.path.join(out, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    procs = []
    for r in range(world):
        e = env()
        e.update((extra_env or {}).get(r, {}))
        argv = list((prefix or {}).get(r, [])) + [sys.executable, WORKER, path, str(r)]
        procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + limit
    logs = []
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"a rank was still running after {limit} s (a hang)")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    results = []
    for r in range(world):
        f = os.path.join(out, f"rank{r}.json")
        results.append(json.load(open(f)) if os.path.exists(f) else None)
    for r, res in enumerate(results):
        for entry in res or []:
            assert "crash" not in entry, f"rank {r} crashed:\n{entry['crash']}\n" + \
                logs[r].decode(errors="replace")
    return results, out, [l.decode(errors="replace") for l in logs]


def saved(out, rank, step):
    return torch.load(os.path.join(out, f"rank{rank}.step{step}.pt"))
