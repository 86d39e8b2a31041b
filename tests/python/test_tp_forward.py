"""Tensor parallelism across processes (torch.distributed, gloo on loopback): each rank of a
tp_size-N split runs the Megatron / vLLM layout (column-parallel QKV and gate/up, row-parallel
output projections + all_reduce, vocabulary-parallel embedding and LM head) and must give the
logits of the whole model (1e-5 relative, float32) and its greedy tokens; every rank reads its
share of the checkpoint plus the replicated tensors and holds about 1/N of the split weights.
Ranks are started by torch.multiprocessing.spawn and by torchrun; the error paths (ranks that
disagree on tp_size, a rank that dies or hangs mid-forward) end in metaload.DistributedError on
the survivors within 30 s. Every subprocess wait has a timeout.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import metaload
from metaload.model import TransformersModel, make_checkpoint

from conftest import run_cli

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "tp_worker.py")
IDS = torch.tensor([[3, 14, 15, 92, 65], [35, 89, 79, 32, 38]])  # as tp_worker.py's
VOCAB_PARALLEL = {"transformer.wte.weight", "model.embed_tokens.weight", "lm_head.weight"}


def fixture(tmp_path, config):
    return make_checkpoint(str(tmp_path / config), config=config, seed=3)["dir"]


def launch(cmd, timeout=150):
    # The ranks import this tree's package (conftest puts it on the path of this process only).
    package = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package, os.environ.get("PYTHONPATH")) if p))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(map(str, cmd[:4]))} blocked for {timeout} s: {e.stderr}")
    return r


def spawn(n, out, mode, *dirs, timeout=150):
    r = launch([sys.executable, WORKER, "spawn", str(n), str(out), mode, *dirs], timeout)
    if mode == "run":
        assert r.returncode == 0, r.stderr[-4000:]
    return r


def check_rank(result, ref_logits, ref_tokens, full, n, rank, vocab):
    rel = (result["logits"] - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel < 1e-5, f"rank {rank} of {n}: logits differ by {rel:.2e} (relative)"
    assert torch.equal(result["tokens"], ref_tokens), f"rank {rank} of {n}"
    # Bytes needed: this rank's rows of every split tensor (a vocabulary block beyond the vocabulary
    # is padding, never read) and the whole of every replicated tensor.
    expected_read = 0
    split_full = replicated = 0
    for name, shape in result["shapes"].items():
        numel = torch.Size(shape).numel()
        whole = full[name]
        if name in VOCAB_PARALLEL and shape[0] != whole[0]:
            rows = max(0, min(shape[0], vocab - rank * shape[0]))
            expected_read += rows * shape[1] * 4
        else:
            expected_read += numel * 4
        if tuple(shape) == tuple(whole):
            replicated += torch.Size(whole).numel() * 4
        else:
            split_full += torch.Size(whole).numel() * 4
    # Exactly those bytes: the holes between the rows of a strided slice (Conv1D columns, Linear
    # input features) are other ranks' bytes, never read, however small (CopyJob::exact).
    assert result["report_bytes"] == expected_read, (rank, n, result["report_bytes"],
                                                     expected_read)
    assert split_full > 0
    # Held: 1/N of the split tensors (plus vocabulary padding and kv heads replicated across
    # ranks, both small here) and the replicated ones; the scan of a skeleton says the same.
    held = result["held_bytes"]
    assert replicated + split_full / n <= held <= replicated + split_full / n * 1.3, (held, n)
    assert result["scan_weight_bytes"] == held
    assert result["scan_shapes"][""] == tuple(ref_logits.shape)  # the logits are whole


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tp_ranks_give_the_whole_models_logits_and_tokens(tmp_path, n):
    # GPT-2 (4 heads: 2 and 4) and Llama with grouped-query attention (4 heads, 2 kv heads: kv
    # heads replicated at 4); Llama with 6 heads for 3 (its last rank holds vocabulary padding only).
    configs = {2: ["gpt2-tiny", "llama-tiny"], 3: ["llama-tiny-tied"],
               4: ["gpt2-tiny", "llama-tiny", "qwen2-tiny"]}[n]
    dirs = [fixture(tmp_path, c) for c in configs]
    out = tmp_path / "out"
    out.mkdir()
    spawn(n, out, "run", *dirs)
    for i, d in enumerate(dirs):
        whole = TransformersModel(d, progress=False)
        ref_logits, ref_tokens = whole(IDS), whole.generate(IDS, 6)
        full = {k: tuple(p.shape) for k, p in whole.named_parameters().items()}
        vocab = whole.config["vocab_size"]
        for rank in range(n):
            result = torch.load(out / f"{i}-{rank}.pt")
            assert result["info"]["tp_size"] == n and result["info"]["tp_rank"] == rank
            assert result["info"]["process_group"]
            check_rank(result, ref_logits, ref_tokens, full, n, rank, vocab)


# Debian's torch 1.13 torchrun fails under Python 3.11 before starting any rank (its elastic
# agent's redirect map is None); there the ranks get torchrun's environment from the test itself.
TORCHRUN_WORKS = int(torch.__version__.split(".")[0]) >= 2


def torchrun(n, cmd, timeout=150, python=True):
    if TORCHRUN_WORKS:
        return launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       *([] if python else ["--no_python"]), "--nproc_per_node", str(n),
                       *cmd], timeout)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    package = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=package, METALOAD_PYTHON=sys.executable)
        procs.append(subprocess.Popen(([sys.executable] if python else []) + cmd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank of {cmd[:3]} blocked for {timeout} s")
    codes = [p.returncode for p in procs]
    return subprocess.CompletedProcess(cmd, max(codes, key=abs), "".join(o for o, _ in outs),
                                       "".join(e for _, e in outs))


def test_torchrun_launch(tmp_path):
    d = fixture(tmp_path, "llama-tiny")
    out = tmp_path / "out"
    out.mkdir()
    r = torchrun(2, [WORKER, "env", str(out), "run", d])
    assert r.returncode == 0, r.stderr[-4000:]
    whole = TransformersModel(d, progress=False)
    for rank in range(2):
        result = torch.load(out / f"0-{rank}.pt")
        assert torch.equal(result["tokens"], whole.generate(IDS, 6))


def errors(out, ranks):
    seen = {}
    for rank in ranks:
        path = out / f"error-{rank}.txt"
        assert path.exists(), f"rank {rank} recorded no error"
        head, message = path.read_text().split("\n", 1)
        kind, seconds = head.split()
        seen[rank] = (kind, float(seconds), message)
    return seen


def test_ranks_that_disagree_on_tp_size_fail_together(tmp_path):
    d = fixture(tmp_path, "gpt2-tiny")
    out = tmp_path / "out"
    out.mkdir()
    spawn(2, out, "mismatch", d, timeout=90)
    for rank, (kind, seconds, message) in errors(out, [0, 1]).items():
        assert kind == "DistributedError", message
        assert "tp_size must equal the group's size 2" in message
        assert "rank 0: 2, rank 1: 3" in message, message
        assert seconds < 30  # a hang guard, not a speed claim: they disagree in about a second


def test_a_split_the_model_does_not_allow_lists_the_degrees_that_work(tmp_path):
    d = fixture(tmp_path, "llama-tiny")  # 4 heads, 2 kv heads: 1, 2 and 4 (kv heads replicated)
    out = tmp_path / "out"
    out.mkdir()
    spawn(3, out, "nosplit", d, timeout=90)
    for rank, (kind, seconds, message) in errors(out, [0, 1, 2]).items():
        assert kind == "TPError", message
        assert "cannot be split into 3 tensor-parallel ranks; degrees that work: 1, 2, 4" in message


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_a_rank_lost_mid_forward_is_a_distributed_error_not_a_hang(tmp_path, mode):
    d = fixture(tmp_path, "llama-tiny")
    out = tmp_path / "out"
    out.mkdir()
    spawn(2, out, mode, d)  # "hang": rank 1 sleeps 24 s before it exits
    kind, seconds, message = errors(out, [0])[0]
    assert kind == "DistributedError", message
    assert "rank 0 of 2" in message and "timeout 8000 ms" in message, message
    assert "all_reduce" in message or "all_gather" in message, message
    # A hang guard, not a speed claim: the 8 s collective timeout ends the wait (the message says
    # so); 45 s is over 5 times that, and under the process group's own 60 s.
    assert seconds < 45, message
    if mode == "hang":
        assert "not every rank took part within 8000 ms" in message, message


def read_state(out, rank):
    with open(out / f"state-{rank}.txt") as f:
        return f.read()


def read_error(out, rank):
    with open(out / f"error-{rank}.txt") as f:
        head, message = f.read().split("\n", 1)
    kind, seconds = head.split()
    return kind, float(seconds), message


def test_a_rank_whose_dispatch_fails_makes_every_rank_fail_and_none_keeps_weights(tmp_path):
    import shutil
    good = fixture(tmp_path, "gpt2-tiny")
    broken = str(tmp_path / "broken")
    shutil.copytree(good, broken)
    shard = next(os.path.join(broken, f) for f in sorted(os.listdir(broken))
                 if f.endswith(".safetensors"))
    with open(shard, "r+b") as f:  # rank 1's file ends half-way through its tensors
        f.truncate(os.path.getsize(shard) // 2)
    out = tmp_path / "out"
    out.mkdir()
    spawn(2, out, "dispatchfail", good, broken)
    for rank in (0, 1):
        kind, _, message = read_error(out, rank)
        assert kind == "DistributedError", (rank, kind, message)
        assert "not every rank succeeded" in message and "rank 1:" in message, message
        assert "rank 0:" not in message, message  # rank 0's part went well
        # Nobody went ahead: no rank is dispatched, every parameter is still meta.
        assert read_state(out, rank) == "dispatched=False all_meta=True", rank


def test_a_rank_that_never_dispatches_stops_the_others_within_the_timeout(tmp_path):
    d = fixture(tmp_path, "gpt2-tiny")
    out = tmp_path / "out"
    out.mkdir()
    spawn(2, out, "dispatchsilent", d)
    kind, seconds, message = read_error(out, 0)
    assert kind == "DistributedError" and "tensor-parallel dispatch" in message, message
    # A hang guard, not a speed claim: the vote waits one collective timeout (8 s), not forever.
    assert seconds < 60, seconds
    assert read_state(out, 0) == "dispatched=False all_meta=True"


def test_scan_with_tp_size_needs_no_group(tmp_path):
    d = fixture(tmp_path, "llama-tiny")
    m = TransformersModel(d, progress=False)
    whole = m.scan(batch=2, seq=5)
    half = m.scan(batch=2, seq=5, tp_size=2, tp_rank=1)
    assert (whole.tp_size, half.tp_size, half.tp_rank) == (1, 2, 1)
    q = "model.layers.0.self_attn.q_proj"
    assert half[q].shape == (2, 5, whole[q].shape[-1] // 2)  # column-parallel: the rank's heads
    assert half["model.layers.0.self_attn.o_proj"].shape == whole["model.layers.0.self_attn.o_proj"].shape
    assert half[""].shape == whole[""].shape  # the logits are gathered
    assert half.weight_bytes < whole.weight_bytes
    assert whole.weight_bytes == sum(p.numel() * 4 for p in m.named_parameters().values())
    # The skeleton is whole again, and still meta.
    assert m.parameter("model.layers.0.self_attn.q_proj.weight").shape == (64, 64)
    assert not m.dispatched
    with pytest.raises(metaload.ModelError, match="rank 2 of 2 does not exist"):
        m.scan(batch=1, seq=2, tp_size=2, tp_rank=2)
    with pytest.raises(metaload.MismatchError, match="cannot be split into 3"):
        m.scan(batch=1, seq=2, tp_size=3)
    # A rank's shard without a group scans (its own split) but cannot run.
    shard = TransformersModel(d, tp_size=2, tp_rank=1, progress=False)
    shard.dispatch()
    assert shard.scan(batch=2, seq=5)[q].shape == half[q].shape
    with pytest.raises(metaload.ModelError, match="cannot run the model alone"):
        shard(IDS)


def cli_tokens(*args, env=None):
    r = run_cli("run", *args, "--json", env=dict({"METALOAD_PYTHON": sys.executable}, **(env or {})),
                timeout=150)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout[r.stdout.index("{"):])["tokens"]


def test_cli_run_with_tp_prints_the_tokens_of_tp_1(tmp_path):
    d = fixture(tmp_path, "gpt2-tiny")
    ids = ["--ids", "3,14,15;92,65,35", "--new-tokens", "5"]
    whole = cli_tokens(d, *ids)
    assert len(whole) == 2 and len(whole[0]) == 5
    assert cli_tokens(d, "--tp", "2", *ids) == whole
    r = run_cli("run", d, "--tp", "2", *ids, env={"METALOAD_PYTHON": sys.executable}, timeout=150)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-2:] == [",".join(map(str, row)) for row in whole]


def test_cli_run_joins_a_torchrun_launch(tmp_path):
    from conftest import cli_path
    d = fixture(tmp_path, "llama-tiny")
    ids = ["--ids", "3,14,15", "--new-tokens", "4"]
    whole = cli_tokens(d, *ids)
    r = torchrun(2, [cli_path(), "run", d, "--tp", "2", *ids, "--json"], python=False)
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads(r.stdout[r.stdout.index("{"):])["tokens"] == whole
