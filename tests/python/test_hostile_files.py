"""Hostile and unlucky inputs through the Python package and the CLI: JSON nested past the one
depth limit (kMaxJsonDepth, 128 levels), FIFOs and other things that are not regular files where a
file is expected, more shards than the process may open files, and hub snapshot links that lead
out of their repo. Each call runs in a fresh interpreter, so a crash (a stack overflow) or a hang
(open() of a FIFO) fails its test instead of taking pytest down.

Run: METALOAD_LIB=build/dev/libmetaload.so /usr/bin/python3 -m pytest tests/python/test_hostile_files.py -q
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT, lib_path, run_cli
from metaload import checkpoint as ck
from metaload.model import make_checkpoint

DEPTH = 128  # kMaxJsonDepth (loader/format/json_util.h)
HASH = "0123456789abcdef0123456789abcdef01234567"


def outcomes(calls, setup="", env=None, timeout=180):
    """Runs each Python expression of `calls` in one fresh interpreter (after `setup`); for each,
    'ok', or '<Kind> <rule>: <message>' for a metaload error. A crash or a hang fails the test."""
    code = "import json, os, resource, sys, torch\nimport metaload\nfrom metaload import _lib\n"
    code += textwrap.dedent(setup) + textwrap.dedent("""
        for call in json.loads(sys.argv[1]):
            try:
                eval(call)
                print("RESULT ok", flush=True)
            except _lib.Error as e:
                rule = e.rule if isinstance(e, _lib.error_class("FormatError")) else None
                print("RESULT", type(e).__name__, str(rule) + ":", " ".join(str(e).split()),
                      flush=True)
        """)
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["METALOAD_LIB"] = lib_path()
    e.update(env or {})
    try:
        r = subprocess.run([sys.executable, "-c", code, json.dumps(calls)], env=e,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as t:
        pytest.fail(f"blocked for {timeout} s (a FIFO opened for reading waits for a writer); "
                    f"output so far: {t.stdout}")
    got = [ln[len("RESULT "):] for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0, (f"crashed with exit {r.returncode} after {len(got)} of "
                               f"{len(calls)} calls: {r.stderr[-3000:]}")
    assert len(got) == len(calls), r.stdout[-2000:] + r.stderr[-2000:]
    return got


def cli(*args, env=None, timeout=120):
    return run_cli(*args, env=env, timeout=timeout)


def nested_objects(depth):
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.fixture
def sharded(tmp_path):
    """A 2-shard gpt2-tiny checkpoint (config.json, index, shards)."""
    return make_checkpoint(str(tmp_path / "ck"), config="gpt2-tiny", shards=2)["dir"]


# ---------------------------------------------------------------------------------------------
# Deep JSON: a typed error naming the file and the rule, never a stack overflow


def test_index_metadata_100000_deep(sharded):
    index = os.path.join(sharded, "model.safetensors.index.json")
    with open(index) as f:
        text = f.read()
    with open(index, "w") as f:
        f.write(text.replace('"metadata": {', '"metadata": {"deep": ' + "[" * 100000 +
                             "]" * 100000 + ", ", 1))
    for got in outcomes([f"metaload.describe_checkpoint({sharded!r})",
                         f"metaload.load_into(torch.nn.Linear(2, 2), {sharded!r}, progress=False)"]):
        assert got.startswith("ShardError json-too-deep:"), got
        assert index in got and str(DEPTH) in got, got
    r = cli("describe", sharded)
    assert r.returncode != 0 and "json-too-deep" in r.stderr and index in r.stderr, r.stderr


def test_config_70000_deep(sharded):
    config = os.path.join(sharded, "config.json")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("{", '{"deep": ' + nested_objects(70000) + ", ", 1))
    for got in outcomes([f"metaload.describe_checkpoint({sharded!r})",
                         f"metaload.TransformersModel({sharded!r})"]):
        assert got.startswith("FormatError json-too-deep:") and config in got, got
    for args in (("describe", sharded), ("scan", "--seq", 4, sharded)):
        r = cli(*args)
        assert r.returncode != 0 and "json-too-deep" in r.stderr and config in r.stderr, (
            args, r.returncode, r.stderr[-2000:])


def test_model_key_deep_extra_field():
    setup = """
        def key(depth):
            return ('metaload.TransformersModel:{"repo_id": "org/x", "task": ' + "[" * depth +
                    "]" * depth + "}")
        """
    deep, ok = outcomes(["metaload.from_model_key(key(100000))",
                         f"metaload.from_model_key(key({DEPTH - 1}))"], setup)
    assert deep.startswith("ModelKeyError None:") and "rule json-too-deep" in deep, deep[:500]
    assert len(deep) < 2000  # the key is quoted cut short
    assert ok == "ok"
    key = ('metaload.TransformersModel:{"repo_id": "org/x", "task": ' + "[" * 60000 +
           "]" * 60000 + "}")
    r = cli("key", key)
    assert r.returncode != 0 and "json-too-deep" in r.stderr, (r.returncode, r.stderr[-2000:])


# ---------------------------------------------------------------------------------------------
# Not a regular file: said what it is, and no open() blocks

KINDS = {"fifo": "a FIFO", "directory": "a directory", "device": "a character device",
         "socket": "a socket", "loop": "a symbolic link loop"}


@pytest.fixture
def make_odd():
    """make_odd(kind, path): something that is not a regular file at path."""
    held = []

    def make(kind, path):
        path = str(path)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            os.mkdir(path)
        elif kind == "device":
            os.symlink("/dev/null", path)  # stat follows it to the device
        elif kind == "socket":
            s = socket.socket(socket.AF_UNIX)
            held.append(s)
            if len(path) < 100:
                s.bind(path)
            else:  # sun_path is short: bound elsewhere, linked here
                short = f"/tmp/metaload-sock-{os.getpid()}-{len(held)}"
                if os.path.lexists(short):
                    os.unlink(short)
                s.bind(short)
                held.append(short)
                os.symlink(short, path)
        else:
            os.symlink(path + ".loop", path)
            os.symlink(path, path + ".loop")

    yield make
    for h in held:
        if isinstance(h, str):
            os.unlink(h)
        else:
            h.close()


def test_header_and_single_file_that_are_no_files(tmp_path, make_odd):
    calls = []
    for kind in KINDS:
        (tmp_path / kind).mkdir()
        odd = str(tmp_path / kind / "model.safetensors")
        make_odd(kind, odd)
        calls += [f"metaload.checkpoint.read_safetensors_header({odd!r})",
                  f"metaload.describe_checkpoint({str(tmp_path / kind)!r})"]
    got = outcomes(calls)
    for i, (kind, words) in enumerate(KINDS.items()):
        header, directory = got[2 * i], got[2 * i + 1]
        assert header.startswith("FormatError not-a-file:") and words in header, header
        assert str(tmp_path / kind / "model.safetensors") in header, header
        # Was "no safetensors weights ... looked for model.safetensors".
        assert directory.startswith("FormatError not-a-file:") and words in directory, directory
        assert "no safetensors weights" not in directory


def test_index_naming_a_shard_that_is_no_file(tmp_path, make_odd):
    calls = []
    for kind in KINDS:
        d = make_checkpoint(str(tmp_path / kind), config="gpt2-tiny", shards=2)["dir"]
        shard = os.path.join(d, "model-00002-of-00002.safetensors")
        os.unlink(shard)
        make_odd(kind, shard)
        calls += [f"metaload.describe_checkpoint({d!r})",
                  f"metaload.load_into(torch.nn.Linear(2, 2), {d!r}, progress=False)"]
    got = outcomes(calls)
    for i, (kind, words) in enumerate(KINDS.items()):
        for g in got[2 * i:2 * i + 2]:
            assert g.startswith("ShardError not-a-file:") and words in g, g
            assert "model-00002-of-00002.safetensors" in g
    r = cli("describe", tmp_path / "fifo")
    assert r.returncode != 0 and "a FIFO" in r.stderr, r.stderr


def test_config_that_is_no_file(tmp_path, make_odd):
    calls = []
    for kind in KINDS:
        d = make_checkpoint(str(tmp_path / kind), config="gpt2-tiny")["dir"]
        os.unlink(os.path.join(d, "config.json"))
        make_odd(kind, os.path.join(d, "config.json"))
        calls += [f"metaload.describe_checkpoint({d!r})", f"metaload.TransformersModel({d!r})"]
    got = outcomes(calls)
    for i, (kind, words) in enumerate(KINDS.items()):
        for g in got[2 * i:2 * i + 2]:
            assert g.startswith("FormatError not-a-file:") and words in g, g
            assert str(tmp_path / kind) in g


def test_refs_main_that_is_no_file(tmp_path, make_odd):
    refs = {}
    for kind in KINDS:
        make_checkpoint(config="gpt2-tiny", hf_cache=str(tmp_path / kind), repo="org/tiny")
        refs[kind] = str(tmp_path / kind / "models--org--tiny" / "refs" / "main")
        os.unlink(refs[kind])
        make_odd(kind, refs[kind])
    setup = """
        def describe_in(cache):  # the library reads HF_HUB_CACHE at each call
            os.environ["HF_HUB_CACHE"] = cache
            metaload.describe_checkpoint("org/tiny")
        """
    got = outcomes([f"describe_in({str(tmp_path / kind)!r})" for kind in KINDS], setup)
    for g, (kind, words) in zip(got, KINDS.items()):
        assert g.startswith("ResolveError None:"), g
        assert f"{refs[kind]}: is {words}" in g and "refs/main: no such file" not in g, g


# ---------------------------------------------------------------------------------------------
# More shards than open files


def test_load_into_more_shards_than_the_file_limit(tmp_path):
    n = 2000
    d = tmp_path / "many"
    d.mkdir()
    weight_map = {}
    for i in range(n):
        name = f"s{i:05d}.safetensors"
        ck.save_safetensors(str(d / name), {f"w{i}": torch.arange(4 * i, 4 * i + 4,
                                                                  dtype=torch.float32)})
        weight_map[f"w{i}"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    # Under ulimit -n 256 (10,000 shards under 1024 failed with "Too many open files").
    setup = f"""
        from metaload import load_into

        def load():
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            m = torch.nn.Module()
            for i in range({n}):
                m.register_parameter(f"w{{i}}", torch.nn.Parameter(torch.empty(4, device="meta")))
            report = load_into(m, {str(d)!r}, progress=False, threads=4)
            assert len(report.files) == {n}, len(report.files)
            for i in range({n}):
                w = getattr(m, f"w{{i}}")
                assert torch.equal(w, torch.arange(4 * i, 4 * i + 4, dtype=torch.float32)), i
            assert len(os.listdir("/proc/self/fd")) < 128  # every shard closed again
        """
    assert outcomes(["load()"], setup, timeout=300) == ["ok"]


# ---------------------------------------------------------------------------------------------
# Hub snapshot links stay in their repo


def test_snapshot_link_out_of_the_repo_is_refused(tmp_path):
    made = make_checkpoint(config="gpt2-tiny", hf_cache=str(tmp_path / "hub"), repo="org/tiny")
    snap = made["dir"]
    link = os.path.join(snap, "model.safetensors")
    outside = str(tmp_path / "elsewhere.safetensors")
    with open(link, "rb") as src, open(outside, "wb") as dst:
        dst.write(src.read())
    os.unlink(link)
    os.symlink(outside, link)
    got = outcomes(["metaload.describe_checkpoint('org/tiny')",
                    f"metaload.describe_checkpoint({snap!r})",
                    "metaload.TransformersModel('org/tiny').dispatch()",
                    "metaload.load_into(torch.nn.Linear(2, 2), 'org/tiny', progress=False)",
                    # Named directly, a link may lead anywhere.
                    f"metaload.describe_checkpoint({link!r})"],
                   env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    for g in got[:4]:
        assert g.startswith("FormatError link-outside-repo:"), g
        assert link in g and outside in g and "blobs" in g, g
    assert got[4] == "ok", got[4]
