"""bench/peers.py --quick: the smoke run of the peers benchmark (issue 11) on tiny configs.

It runs in a subprocess (the benchmark starts its own worker process) and must print every row of
its three tables with numbers (times, ratios, peak RSS; the load rows' bytes checked against the
file) and write its chart. The peers (transformers, nnsight, the fast loaders) need torch 2.x: on
Debian's torch 1.13 the run is skipped, and the benchmark itself says so and exits cleanly.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, lib_path

SCRIPT = os.path.join(ROOT, "bench", "peers.py")
TORCH2 = hasattr(torch, "get_default_device")


def run_peers(tmp_path, *args):
    path = os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, METALOAD_LIB=lib_path(), PYTHONPATH=path)
    for k in ("METALOAD", "LD_PRELOAD"):
        env.pop(k, None)
    return subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def table_rows(out, heading):
    """The rows (lists of cells) of the markdown table under the heading that starts with
    `heading`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("### "):
            break
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[0], rows[1:]


NUMBER = re.compile(r"^\d+(\.\d+)?x?$")


@pytest.mark.skipif(not TORCH2, reason="the peers (transformers 5, nnsight, fastsafetensors, ...) "
                    "need torch 2.x; Debian's torch 1.13 has none of them")
def test_quick_run_prints_every_row_with_numbers_and_writes_the_chart(tmp_path):
    for mod in ("transformers", "accelerate", "nnsight", "fastsafetensors", "runai_model_streamer",
                "tensorizer", "matplotlib"):
        pytest.importorskip(mod)
    chart = tmp_path / "peers.png"
    p = run_peers(tmp_path, "--quick", "--chart", str(chart), "--cache", str(tmp_path / "cache"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "failed:" not in out and "WRONG" not in out, out

    head, rows = table_rows(out, "### 1. Meta build")
    want = {(c, r) for c in ("llama-tiny", "gpt2-tiny") for r in (
        "metaload.meta()", 'torch.device("meta") (anchor)', "accelerate.init_empty_weights()",
        "nnsight LanguageModel(dispatch=False)")}
    assert {(r[0], r[1]) for r in rows} == want
    for r in rows:
        assert all(NUMBER.match(c) for c in r[2:]), r
    anchors = [r for r in rows if "(anchor)" in r[1]]
    assert all(r[head.index("x anchor")] == "1.00" for r in anchors)

    head, rows = table_rows(out, "### 2. Scan")
    want = {(c, r) for c in ("gpt2-tiny", "llama-tiny") for r in (
        "torch FakeTensorMode (anchor)", 'metaload.fake("cuda") forward',
        "metaload.scan (every module's output)", "nnsight scan")}
    assert {(r[0], r[1]) for r in rows} == want
    for r in rows:
        assert all(NUMBER.match(c) for c in r[2:]), r
    assert "Target: metaload at least 10x faster than FakeTensorMode" in out

    head, rows = table_rows(out, "### 3. CPU load")
    routes = ["metaload.load_into, copying (mmap=False)",
              "metaload.load_into, zero-copy (mmap=True)",
              "metaload.load_file, zero-copy (mmap=True)",
              "safetensors.torch.load_file", "safetensors.torch.load_model (into to_empty(cpu))",
              "safetensors.torch.load_file + load_state_dict(assign=True)",
              "transformers from_pretrained(dtype=bf16)", "torch.load(mmap=True)",
              "torch.load(mmap=True) + load_state_dict(assign=True)", "torch.load(mmap=False)",
              "fastsafetensors fastsafe_open(cpu, nogds=True)",
              "runai-model-streamer SafetensorsStreamer",
              "tensorizer TensorDeserializer(device=cpu)"]
    assert [(r[0], r[1]) for r in rows] == [(m, r) for m in ("warm", "cold") for r in routes]
    col = {name: head.index(name) for name in head}
    for r in rows:
        for name in ("s", "GB/s", "x anchor", "peak RSS growth MiB", "fresh (anon) MiB",
                     "then touch every page, s", "load + touch s", "x anchor (load + touch)"):
            assert NUMBER.match(r[col[name]]), (name, r)
        assert r[col["bytes checked"]] == "ok", r
    backing = {(r[0], r[1]): r[col["backing"]] for r in rows}
    # measured, not declared: metaload's two routes differ, and the anchor of the zero-copy row
    # is safetensors' mmap-backed load_file
    assert backing[("warm", routes[0])] == "copy"
    assert backing[("warm", routes[1])] == "zero-copy (mmap)"
    assert backing[("warm", "safetensors.torch.load_file")] == "zero-copy (mmap)"
    assert backing[("warm", routes[2])] == "zero-copy (mmap)"  # metaload's load_file: a dict
    assert backing[("warm", routes[5])] == "zero-copy (mmap)"  # load_file + assign, into a model
    assert "(into a model built on meta, as this row)" in out
    assert all(r[col["anchor"]] == "safetensors.torch.load_file" for r in rows
               if r[col["backing"]] != "copy")

    head, rows = table_rows(out, "### 4. nnsight")
    assert [r[1] for r in rows] == ["nnsight LanguageModel (anchor)",
                                    "nnsight + metaload.enable_nnsight()",
                                    "metaload.TransformersModel"]
    for r in rows:
        assert all(NUMBER.match(c) for c in r[2:]), r

    assert chart.stat().st_size > 10_000
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --replot draws the chart again from the printed output alone (no case runs)
    saved, again = tmp_path / "out.txt", tmp_path / "again.png"
    saved.write_text(out)
    p = run_peers(tmp_path, "--replot", str(saved), "--chart", str(again))
    assert p.returncode == 0, p.stderr[-3000:]
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "PEERS_RESULT" not in p.stdout


@pytest.mark.skipif(TORCH2, reason="checks the torch 1.13 path: the benchmark says it needs 2.x")
def test_on_torch_113_the_benchmark_says_it_needs_torch2_and_exits_cleanly(tmp_path):
    chart = tmp_path / "peers.png"
    p = run_peers(tmp_path, "--quick", "--chart", str(chart), "--cache", str(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr
    assert "need the torch 2.x environment" in p.stdout and "skipped" in p.stdout
    assert not chart.exists()
