"""metaload.load_into across processes over torch.distributed (gloo on loopback): each rank's
slice equals the single-process TP load of that rank bitwise, bytes read per rank are its share
plus the replicated tensors, broadcast mode serves receivers whose path does not exist, and a rank
that dies, fails or disagrees is a DistributedError on every survivor within 30 s with its weights
unchanged. Every rank is a process (tests/python/scripts/dist_load_worker.py); every wait is
bounded."""
import json
import os
import shutil

import pytest
import torch

import metaload
from dist_load_util import (GPT2_12, LLAMA_GQA, WORKER, header_bytes, make_fixture, reference,
                            run_ranks, saved, skeleton_spec)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="this torch has no torch.distributed")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt2")
    ckpt = make_fixture(tmp, "gpt2-12", GPT2_12, shards=2)
    return ckpt, skeleton_spec(ckpt, str(tmp / "gpt2.skeleton.json"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    ckpt = make_fixture(tmp, "llama-gqa", LLAMA_GQA)
    return ckpt, skeleton_spec(ckpt, str(tmp / "llama.skeleton.json"))


def check_equal_to_reference(out, step, ckpt, size):
    for r in range(size):
        got = saved(out, r, step)
        want = reference(ckpt, r, size)
        assert set(got) <= set(want), sorted(set(got) - set(want))
        for n, t in got.items():
            assert t.shape == want[n].shape and t.dtype == want[n].dtype, n
            assert torch.equal(t, want[n]), f"rank {r} of {size}: {n} differs"


def reference_buffers(ckpt, rank, size):
    m = metaload.TransformersModel(ckpt, tp_rank=rank, tp_size=size, dispatch=True,
                                   progress=False)
    return list({id(t): t for t in m.named_buffers().values()}.values())  # shared ones once


def shares(ckpt, size):
    """Per rank, from the headers and the single-process TP loads' shapes: (payload: the
    checkpoint bytes of its slice, its share plus the replicated tensors; padding: the bytes of
    the zero rows a padded vocabulary adds; buffer bytes), and (total, replicated) bytes."""
    headers = header_bytes(ckpt)
    total = sum(b for _, b in headers.values())
    out, replicated = [], 0
    for r in range(size):
        ref = reference(ckpt, r, size)
        payload = padding = 0
        for n, (shape, b) in headers.items():
            s = list(ref[n].shape)
            if s == shape:
                payload += b
                replicated += b if r == 0 else 0
                continue
            (d,) = [i for i in range(len(s)) if s[i] != shape[i]]
            real = min(s[d], max(0, shape[d] - r * s[d]))  # rows past the vocabulary: padding
            payload += b * real // shape[d]
            padding += b * (s[d] - real) // shape[d]
        buffers = sum(t.numel() * t.element_size() for t in reference_buffers(ckpt, r, size))
        out.append((payload, padding, buffers))
    return out, total, replicated


def check_bytes(results, step, ckpt, size):
    """Bytes per rank: it holds its share plus the replicated tensors (and a padded vocabulary's
    zero rows) and reads exactly its share plus the replicated tensors: never the holes between
    the rows of a strided slice, which are other ranks' bytes (CopyJob::exact), as a
    single-process TP load of that rank; every rank's report lists every rank's bytes."""
    per_rank, total, replicated = shares(ckpt, size)
    assert sum(p for p, _, _ in per_rank) == total + (size - 1) * replicated
    got = [res[step]["distributed"]["bytes_read"] for res in results]
    for r, (payload, padding, buffers) in enumerate(per_rank):
        d = results[r][step]["distributed"]
        assert d["bytes_read"] == payload, (r, d, payload, total)
        assert d["held_bytes"] == payload + padding + buffers, (r, d, payload, padding, buffers)
        assert d["rank_bytes_read"] == got and d["rank_held_bytes"][r] == d["held_bytes"]
        single = metaload.TransformersModel(ckpt, tp_rank=r, tp_size=size, dispatch=True,
                                            progress=False).dispatch()
        assert d["bytes_read"] == single.bytes, (r, d, single)
    assert replicated < min(got) and max(got) < total
    return got


@pytest.mark.parametrize("size", [2, 3, 4])
def test_gpt2_tp_loads_equal_single_process_tp_loads_and_broadcast_serves_each_its_slice(
        gpt2, tmp_path, size):
    ckpt, spec = gpt2
    steps = [
        {"ref": ckpt, "save": True},  # shared: every rank reads its own slice
        # broadcast: rank 0 reads, the others' path does not exist
        {"ref": {"0": ckpt, "*": str(tmp_path / "no-such-checkpoint")}, "source_rank": 0,
         "buffer_bytes": 4096, "save": True},
    ]
    results, out, logs = run_ranks(tmp_path, size, steps, spec)
    for r, res in enumerate(results):
        assert [e["ok"] for e in res] == [True, True], (r, res, logs[r])
        assert res[0]["distributed"]["mode"] == "shared" and res[0]["distributed"]["tp_rank"] == r
        assert res[0]["meta_left"] == []
    check_equal_to_reference(out, 0, ckpt, size)
    check_equal_to_reference(out, 1, ckpt, size)
    shared = check_bytes(results, 0, ckpt, size)
    # Broadcast: the source read every rank's slice (what the ranks read themselves above), each
    # receiver read nothing and received exactly what it holds, through 4 KiB buffers.
    d = [res[1]["distributed"] for res in results]
    assert d[0]["bytes_read"] == sum(shared) and d[0]["mode"] == "broadcast"
    assert d[0]["bytes_sent"] == sum(x["held_bytes"] for x in d[1:])
    for x in d[1:]:
        assert x["bytes_read"] == 0 and x["bytes_received"] == x["held_bytes"] > 4096
        assert x["buffer_bytes"] == 4096
    assert d[0]["buffer_bytes"] == 4096


@pytest.mark.parametrize("size", [2, 4])
def test_llama_gqa_tp_loads_equal_single_process_tp_loads(llama, tmp_path, size):
    ckpt, spec = llama
    steps = [{"ref": ckpt, "save": True},
             {"ref": {"0": ckpt, "*": str(tmp_path / "absent")}, "source_rank": 0,
              "save": True}]
    results, out, logs = run_ranks(tmp_path, size, steps, spec)
    for r, res in enumerate(results):
        assert [e["ok"] for e in res] == [True, True], (r, res, logs[r])
    check_equal_to_reference(out, 0, ckpt, size)
    check_equal_to_reference(out, 1, ckpt, size)
    check_bytes(results, 0, ckpt, size)


GEN_IDS = [[3, 14, 15, 92, 65], [35, 89, 79, 32, 38]]


def test_broadcast_feeds_a_tp_forward_on_ranks_without_the_checkpoint(llama, tmp_path):
    """TransformersModel(ref, tp_size=2, process_group=, source_rank=0): rank 0 reads config.json
    and every slice, rank 1's path does not exist; both generate tp 1's greedy tokens. Then the
    source's copy is missing: a DistributedError on both ranks, at once, naming its error."""
    ckpt, spec = llama
    absent = str(tmp_path / "absent")
    gen = {"ids": GEN_IDS, "new_tokens": 4}
    steps = [{"ref": {"0": ckpt, "*": absent}, "source_rank": 0, "buffer_bytes": 4096,
              "generate": gen},
             {"ref": absent, "source_rank": 0, "generate": gen, "timeout": 20}]
    results, _, logs = run_ranks(tmp_path, 2, steps, spec)
    want = metaload.TransformersModel(ckpt, progress=False).generate(torch.tensor(GEN_IDS), 4)
    per_rank, _, _ = shares(ckpt, 2)
    for r in range(2):
        e = results[r][0]
        assert e["ok"], (e, logs[r])
        assert torch.equal(torch.tensor(e["tokens"]), want), (r, e["tokens"], want)
        d = e["distributed"]
        assert d["mode"] == "broadcast" and d["tp_rank"] == r and d["tp_size"] == 2
    src, recv = results[0][0]["distributed"], results[1][0]["distributed"]
    assert src["bytes_read"] == sum(p for p, _, _ in per_rank)  # both slices, exactly
    assert recv["bytes_read"] == 0 and recv["bytes_received"] == recv["held_bytes"] > 4096
    assert src["bytes_sent"] == recv["held_bytes"]
    for r in range(2):
        e = results[r][1]
        # "At once": well before the step's 20 s timeout. A hang guard, not a speed claim: it takes
        # hundredths of a second, the bound is 10 s.
        assert not e["ok"] and e["is_distributed_error"] and e["seconds"] < 10, e
        assert "the source rank 0 cannot read" in e["message"] and "ResolveError" in \
            e["message"], e["message"]


def check_failed_everywhere(results, step, world, dead=(), within=30.0):
    """Every surviving rank raised a DistributedError within `within` s, its weights as before
    (those of the step before, all real). `within` is a hang guard, not a speed claim: a dead or
    failing rank is known to the others at once (hundredths of a second on the 2-core VM), and
    without the collectives' timeouts a survivor would block for good."""
    for r in range(world):
        res = results[r]
        if r in dead:
            assert res is None or len(res) == step, f"rank {r} should have died: {res}"
            continue
        e = res[step]
        assert not e["ok"] and e["is_distributed_error"] and e["is_metaload_error"], e
        assert e["seconds"] < within, e
        assert e["unchanged"] and e["meta_left"] == [], e
    return [results[r][step] for r in range(world) if r not in dead]


def test_rank_killed_mid_load_is_an_error_on_every_survivor(gpt2, tmp_path):
    ckpt, spec = gpt2
    steps = [{"ref": ckpt}, {"ref": ckpt, "fault": "2:mid_load", "timeout": 20}]
    results, _, logs = run_ranks(tmp_path, 3, steps, spec)
    assert all(results[r][0]["ok"] for r in range(3)), logs
    for e in check_failed_everywhere(results, 1, 3, dead={2}):
        assert "the vote on loading" in e["message"] and "could not agree" in e["message"], \
            e["message"]


def test_a_silent_rank_is_an_error_on_the_others_after_the_timeout(gpt2, tmp_path):
    ckpt, spec = gpt2
    steps = [{"ref": ckpt}, {"ref": ckpt, "fault": "1:hang", "timeout": 3}]
    results, _, logs = run_ranks(tmp_path, 2, steps, spec,
                                 extra_env={1: {"METALOAD_TEST_DIST_FAULT_TIMEOUT": "3"}})
    assert all(results[r][0]["ok"] for r in range(2)), logs
    # rank 0 waited 3 s for the vote; rank 1 woke after 6 s to a closed group: both raise
    for e in check_failed_everywhere(results, 1, 2):
        assert "the vote" in e["message"], e["message"]
    e = results[0][1]
    # It waited out the 3 s timeout (a wait is never shorter), and no longer than a hang guard's
    # 30 s (10 times the timeout: no speed claim).
    assert 2.5 < e["seconds"] < 30 and "not every rank took part within 3000 ms" in e["message"], e


def test_broadcast_over_a_subgroup_and_to_replicas(gpt2, tmp_path):
    """Group ranks are not global ranks: the subgroup {1, 2}, its rank 0 (global 1) the source.
    Then tp_size 1 over all three (replicas): rank 0 sends the whole model to each."""
    ckpt, spec = gpt2
    absent = str(tmp_path / "absent")
    steps = [{"ref": {"1": ckpt, "*": absent}, "group": [1, 2], "source_rank": 0,
              "buffer_bytes": 2048, "save": True},
             {"ref": {"0": ckpt, "*": absent}, "tp_size": 1, "source_rank": 0, "fresh": True,
              "save": True}]
    results, out, logs = run_ranks(tmp_path, 3, steps, spec)
    assert results[0][0].get("skipped") and results[0][0]["ok"], logs
    for r, tp_rank in ((1, 0), (2, 1)):
        e = results[r][0]
        assert e["ok"] and e["distributed"]["tp_rank"] == tp_rank, (e, logs[r])
        want = reference(ckpt, tp_rank, 2)
        for n, t in saved(out, r, 0).items():
            assert torch.equal(t, want[n]), (r, n)
    whole = reference(ckpt, 0, 1)
    for r in range(3):
        e = results[r][1]
        assert e["ok"] and e["meta_left"] == [] and e["distributed"]["tp_size"] == 1, (e, logs[r])
        assert e["distributed"]["bytes_read"] == (e["distributed"]["held_bytes"] if r == 0 else 0)
        for n, t in saved(out, r, 1).items():
            if n in whole and not t.is_meta:  # buffers without known values stay on meta
                assert torch.equal(t, whole[n]), (r, n)


def test_receiver_killed_mid_broadcast_is_an_error_on_every_survivor(gpt2, tmp_path):
    ckpt, spec = gpt2
    steps = [{"ref": ckpt},
             {"ref": {"0": ckpt, "*": str(tmp_path / "absent")}, "source_rank": 0,
              "buffer_bytes": 1024, "fault": "1:mid_load", "timeout": 20}]
    results, _, logs = run_ranks(tmp_path, 3, steps, spec)
    assert all(results[r][0]["ok"] for r in range(3)), logs
    check_failed_everywhere(results, 1, 3, dead={1})


@pytest.mark.parametrize("mode", ["shared", "broadcast"])
def test_a_shard_missing_on_one_rank_is_an_error_on_every_rank(gpt2, tmp_path, mode):
    ckpt, spec = gpt2
    broken = str(tmp_path / "broken")
    shutil.copytree(ckpt, broken)
    shard = sorted(f for f in os.listdir(broken) if f.endswith(".safetensors"))[-1]
    os.remove(os.path.join(broken, shard))
    if mode == "shared":  # rank 1's copy lacks a shard
        step = {"ref": {"0": ckpt, "1": broken}, "timeout": 20}
    else:  # the source's copy lacks it: the receivers are told at once, not left waiting
        step = {"ref": {"0": broken, "*": str(tmp_path / "absent")}, "source_rank": 0,
                "timeout": 20}
    results, _, logs = run_ranks(tmp_path, 2, [{"ref": ckpt}, step], spec)
    assert all(results[r][0]["ok"] for r in range(2)), logs
    for e in check_failed_everywhere(results, 1, 2, within=10):
        assert "ShardError" in e["message"] and shard in e["message"], e["message"]
        if mode == "shared":  # rank 1 failed; rank 0 had staged its slice
            assert list(e["failures"]) == ["1"] and "rank 1: ShardError" in e["message"], e
        else:
            assert sorted(e["failures"]) == ["0", "1"], e
            assert "the source rank 0 could not serve this rank" in e["failures"]["1"], e


def test_mismatched_tp_size_is_an_error_on_every_rank_before_anything_is_read(gpt2, tmp_path):
    ckpt, spec = gpt2
    steps = [{"ref": ckpt}, {"ref": ckpt, "tp_size": {"0": 2, "1": 3}, "timeout": 20}]
    results, _, logs = run_ranks(tmp_path, 2, steps, spec)
    assert all(results[r][0]["ok"] for r in range(2)), logs
    for e in check_failed_everywhere(results, 1, 2):
        assert "tp_size differs (rank 0: 2, rank 1: 3)" in e["message"], e["message"]


def test_single_process_tp_load_into_a_module_takes_the_family_plan(gpt2):
    """Without a process group, load_into(tp_rank=r, tp_size=n) loads rank r's slice (the
    family's plan, the checkpoint's config.json) into a meta module, as a TransformersModel
    dispatch of that rank does."""
    import json
    from scripts.dist_load_worker import skeleton
    ckpt, spec = gpt2
    m = skeleton(json.load(open(spec)))
    rep = metaload.load_into(m, ckpt, tp_rank=1, tp_size=4, progress=False)
    want = reference(ckpt, 1, 4)
    for n, t in m.named_parameters():
        assert torch.equal(t, want[n]), n
    assert rep.bytes > 0 and rep.distributed is None
    # A rank that does not exist changes nothing.
    m2 = skeleton(json.load(open(spec)))
    with pytest.raises(metaload.PlanError, match="tp_rank must be from 0 to tp_size - 1"):
        metaload.load_into(m2, ckpt, tp_rank=4, tp_size=4, progress=False)
    assert all(t.is_meta for t in m2.parameters())


def test_the_handshake_names_every_disagreement():
    from metaload._dist_load import _handshake_problems

    def hello(tp_rank, tp_size, source_rank=None, buffer_bytes=0, protocol=1):
        return dict(protocol=protocol, tp_rank=tp_rank, tp_size=tp_size, source_rank=source_rank,
                    buffer_bytes=buffer_bytes)

    assert _handshake_problems([hello(0, 2), hello(1, 2)], 2) == []
    assert _handshake_problems([hello(0, 1), hello(0, 1)], 2) == []  # replicas
    assert _handshake_problems([hello(0, 2), hello(1, 3)], 2) == [
        "tp_size differs (rank 0: 2, rank 1: 3)"]
    assert _handshake_problems([hello(0, 3), hello(1, 3)], 2) == [
        "tp_size 3 is neither 1 nor the process group's size 2"]
    assert _handshake_problems([hello(1, 2), hello(1, 2)], 2) == [
        "tp_rank must be 0..1, once each (rank 0: 1, rank 1: 1)"]
    assert _handshake_problems([hello(0, 2, 0), hello(1, 2, 1)], 2) == [
        "source_rank differs (rank 0: 0, rank 1: 1)"]
    assert _handshake_problems([hello(0, 2, 2), hello(1, 2, 2)], 2) == [
        "source_rank 2 is not a rank of the group (0..1)"]
    assert "buffer_bytes must be 0" in _handshake_problems([hello(0, 2), hello(1, 2, None, -1)],
                                                           2)[0]
    assert "metaload versions differ" in _handshake_problems([hello(0, 2), hello(1, 2, protocol=2)],
                                                             2)[0]


def test_distributed_error_is_a_metaload_error_and_pickles():
    import pickle
    e = metaload.DistributedError("2 of 3 ranks failed", {1: "ReadError: x", 2: "lost"})
    assert isinstance(e, metaload.Error) and isinstance(e, RuntimeError)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is metaload.DistributedError and back.failures == e.failures
    assert str(back) == str(e)
    with pytest.raises(metaload.DistributedError, match="needs torch.distributed initialised"):
        metaload.load_into(torch.nn.Linear(2, 2), "x", process_group=None, distributed=True)


def test_single_process_tp_load_into_a_transformers_model(tmp_path):
    """A transformers GPT-2 built under metaload.meta() takes rank 1 of 2's slices (Conv1D
    weights split along dim 1), as the TransformersModel dispatch of that rank holds them."""
    transformers = pytest.importorskip("transformers", reason="transformers is in the torch 2.x "
                                       "environment only")
    ck = metaload.make_checkpoint(str(tmp_path / "g"), config="gpt2-tiny", layout="saved")["dir"]
    with metaload.meta():
        m = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(ck))
    metaload.load_into(m, ck, tp_rank=1, tp_size=2, progress=False)
    want = reference(ck, 1, 2)
    assert m.transformer.h[0].attn.c_attn.weight.shape == (64, 96)
    for n, t in m.named_parameters():
        assert torch.equal(t, want[n]), n
    assert not any(t.is_meta for t in m.state_dict().values())


def test_broadcast_from_a_model_key(tmp_path, monkeypatch):
    """TransformersModel(key, source_rank=0): the source resolves the key in its hub cache (never
    a path) and serves the slices from that snapshot (the key reached the loader's path rules and
    was a ResolveError); the receiver has no cache at all."""
    hub = tmp_path / "hub"
    made = metaload.make_checkpoint(config="llama-tiny", hf_cache=str(hub), repo="org/llama")
    key = metaload.to_model_key("metaload.TransformersModel", "org/llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    spec = skeleton_spec(made["dir"], str(tmp_path / "llama.skeleton.json"))
    gen = {"ids": GEN_IDS, "new_tokens": 4}
    steps = [{"ref": {"0": key, "*": str(tmp_path / "absent")}, "source_rank": 0,
              "generate": gen}]
    results, _, logs = run_ranks(tmp_path, 2, steps, spec,
                                 extra_env={1: {"HF_HUB_CACHE": str(tmp_path / "no-cache")}})
    want = metaload.TransformersModel(key, progress=False).generate(torch.tensor(GEN_IDS), 4)
    for r in range(2):
        e = results[r][0]
        assert e["ok"], (e.get("message"), logs[r])
        assert torch.equal(torch.tensor(e["tokens"]), want), (r, e["tokens"], want)


def test_what_a_rank_staged_must_fit_its_module_or_nothing_changes():
    """The check between a rank's staged tensors and its module (before the vote): every module
    tensor without a staged one (strict), a staged tensor the module lacks, a shape off by more
    than the one split dim, a tensor subclass, a grad-requiring tensor staged as integers: one
    MismatchError naming each, with its names as fields; a meta tensor takes its shard's shape
    and a tie is staged once."""
    from metaload._dist_load import _match, _targets

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.empty(4, 6, device="meta"))
            self.b = torch.nn.Parameter(torch.empty(4, 6, device="meta"))
            self.c = torch.nn.Parameter(torch.empty(3, device="meta"))
            self.register_buffer("n", torch.zeros(2, dtype=torch.long))

    m = Two()
    m.tied = m.a  # a second name of one tensor
    targets = _targets(m)
    ok = {"a": torch.ones(2, 6), "b": torch.ones(4, 6), "c": torch.ones(3),
          "n": torch.zeros(2, dtype=torch.long)}
    pairs = _match(targets, ok, True, "rank 0 of 2")
    assert sorted(n for _, _, n in pairs) == ["a", "b", "c", "n"]  # the tie once
    assert [tuple(s.shape) for t, s, n in pairs if n == "a"] == [(2, 6)]  # its shard's shape
    bad = {"a": torch.ones(2, 3), "b": torch.ones(4, 6, dtype=torch.long), "zz": torch.nn.Parameter(
        torch.ones(1)), "n": torch.zeros(2, dtype=torch.long)}
    with pytest.raises(metaload.MismatchError) as e:
        _match(targets, bad, True, "rank 0 of 2")
    assert e.value.missing == ["c"] and e.value.unexpected == ["zz"], str(e.value)
    assert e.value.mismatched == ["a", "b"], str(e.value)
    assert "  mismatched: a: shape [4, 6] in the module but rank 0 of 2 holds [2, 3]" in str(e.value)
    assert "  mismatched: b: requires grad but loads as torch.int64" in str(e.value)
    assert all(t.is_meta for t in m.parameters())  # nothing changed
    # strict=False: what was not staged is left as it is, and nothing is unexpected.
    assert len(_match(targets, {"a": torch.ones(2, 6)}, False, "rank 0 of 2")) == 1
    # A tie staged under its second name pairs once; a staged buffer the module lacks is
    # unexpected too; a tensor subclass (Python's to know) cannot take the staged data.

    class Sub(torch.Tensor):
        pass

    m.register_buffer("sub", torch.zeros(2).as_subclass(Sub))
    staged = dict(ok, tied=ok.pop("a"), sub=torch.zeros(2), extra=torch.zeros(1))
    with pytest.raises(metaload.MismatchError) as e:
        _match(_targets(m), staged, True, "rank 1 of 2")
    assert e.value.missing == [] and e.value.unexpected == ["extra"], str(e.value)
    assert e.value.mismatched == ["sub"], str(e.value)
    assert "  mismatched: sub: not a plain dense tensor" in str(e.value)
    del staged["extra"], staged["sub"]
    pairs = _match(_targets(m), staged, False, "rank 1 of 2")
    assert sorted(n for _, _, n in pairs) == ["a", "b", "c", "n"], pairs


def test_a_family_tp_load_fills_the_buffers_a_meta_build_left_without_values(gpt2, llama):
    """load_into(tp_size=) by the family's plan, in one process: a module whose non-persistent
    buffers were built on meta with no values (GPT-2's causal mask and masked_bias, Llama's
    rotary inv_freq) takes the family's computed ones, equal to TransformersModel's; every
    parameter equals that rank's reference. (They stayed on meta before.)"""
    import importlib.util
    spec_ = importlib.util.spec_from_file_location("dist_load_worker", WORKER)
    worker = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(worker)
    for ckpt, spec in (gpt2, llama):
        m = worker.skeleton(json.load(open(spec)))
        assert any(b.is_meta for b in m.buffers())
        metaload.load_into(m, ckpt, tp_rank=1, tp_size=2, progress=False)
        want = reference(ckpt, 1, 2)
        got = dict(m.named_parameters())
        got.update(m.named_buffers())
        assert not [n for n, t in got.items() if t.is_meta]
        for n, t in got.items():
            assert torch.equal(t, want[n]), n
