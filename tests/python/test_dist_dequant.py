"""Dequantizing (and tp_plan) loads across a process group (issue 28): load_into(dequantize=,
tp_plan=, process_group=) over gloo with 2 and 4 ranks, in shared mode (every rank reads its own
slice) and broadcast mode (source_rank=: the source reads every slice, the others have no file).
Each rank's tensors equal bitwise the single-process load_into(tp_rank=, tp_size=, tp_plan=) of
that rank; each rank reads only the packed bytes and scales of its slice (the report's bytes per
rank, from the headers); a degree off the scheme's boundaries is a DequantError "tp-boundary" on
every rank, and a part missing on one rank a DistributedError on every rank, nothing swapped.
Every rank is a process (scripts/dist_dequant_worker.py); every wait is bounded."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import metaload
from dist_load_util import env, free_port, header_bytes
from quant_refs import (awq_tensors, bnb4_tensors, bnb8_tensors, ct_config, ct_int_tensors,
                        fp8_tensors, gptq_tensors, nvfp4_tensors, write_safetensors)
from test_dequant import IN, OUT, PLAN, linears, norms, tp_model

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="this torch has no torch.distributed")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                      "dist_dequant_worker.py")
SCHEMES = ["gptq", "awq", "bnb4", "fp8"]
# The others the single-process path dequantizes (in one process below): int8, double-quantized
# NF4, compressed-tensors int (with zero points) and NVFP4.
MORE = ["bnb8", "bnb4_nested", "bnb4_nested48", "ct_int", "nvfp4"]
# Per scheme, the parts a rank reads whole, by the dim its weight splits on (0: q_proj, colwise;
# 1: o_proj, rowwise): GPTQ's g_idx along out, and along in every group's scales and zeros (g_idx
# may name any group); bitsandbytes' quant maps (and int8's SCB along in); double-quantized NF4
# along in all its parts (a nested absmax spans rows), and along out its one nested absmax (256
# blocks of 32 are the whole weight), and with nested absmaxes of 48 blocks rank 1's everything
# (its 128 blocks start mid-way through one: the kernel's index cannot be rebased; rank 0's start
# on one); NVFP4's one global scale.
WHOLE = {"gptq": {0: {"g_idx"}, 1: {"scales", "zeros"}}, "bnb4": {0: {"code"}, 1: {"code"}},
         "bnb8": {1: {"scales"}}, "nvfp4": {0: {"global"}, 1: {"global"}},
         "bnb4_nested": {0: {"code", "nested_code", "nested_scales"},
                         1: {"q", "scales", "code", "nested_scales", "nested_code"}}}
WHOLE["bnb4_nested48"] = WHOLE["bnb4_nested"]
WHOLE_ON_RANK = {("bnb4_nested48", 0): {0: {"code", "nested_code"}},
                 ("bnb4_nested48", 1): {0: WHOLE["bnb4_nested"][1]}}


def checkpoint(tmp, scheme, group=32, seed=3):
    """A Tiny (test_dequant) checkpoint of `scheme`: norms, and per Linear its parts (GPTQ with
    biases, the others without); config.json's quantization_config beside it."""
    rng = np.random.default_rng(seed)
    tensors = norms(rng)
    for p in linears():
        if scheme == "gptq":
            t = gptq_tensors(rng, p, OUT, IN, bits=4, group=group)[0]
        elif scheme == "awq":
            t = awq_tensors(rng, p, OUT, IN, group=group)[0]
        elif scheme == "bnb4":  # blocks of 32: a rowwise slice of 4 ranks is one block wide
            t = bnb4_tensors(rng, p, OUT, IN, blocksize=32)[0]
        elif scheme == "bnb4_nested":  # 256 blocks of 32 a nested absmax: one per weight
            t = bnb4_tensors(rng, p, OUT, IN, blocksize=32, nested=True)[0]
        elif scheme == "bnb4_nested48":
            t = bnb4_tensors(rng, p, OUT, IN, blocksize=32, nested=True, nested_block=48)[0]
        elif scheme == "fp8":
            t = fp8_tensors(rng, p, OUT, IN, (16, 32))[0]
        elif scheme == "bnb8":
            t = bnb8_tensors(rng, p, OUT, IN)[0]
        elif scheme == "ct_int":  # zero points packed down out: 32 rows a rank, 4 words
            t = ct_int_tensors(rng, p, OUT, IN, 4, group, symmetric=False)[0]
        elif scheme == "nvfp4":
            t = nvfp4_tensors(rng, p, OUT, IN)[0]
        else:  # "plain": float32 weights
            w = rng.random((OUT, IN), dtype=np.float32)
            t = {f"{p}.weight": ("F32", [OUT, IN], w.tobytes())}
        tensors.update(t)
    config = {"gptq": {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": False},
              "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                      "version": "gemm"},
              "bnb4": {"quant_method": "bitsandbytes", "load_in_4bit": True},
              "bnb4_nested": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                              "bnb_4bit_use_double_quant": True},
              "bnb4_nested48": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                "bnb_4bit_use_double_quant": True},
              "bnb8": {"quant_method": "bitsandbytes", "load_in_8bit": True},
              "ct_int": ct_config("pack-quantized", 4, group, symmetric=False),
              "nvfp4": ct_config("nvfp4-pack-quantized"),
              "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [16, 32]}}.get(scheme)
    folder = os.path.join(str(tmp), f"{scheme}-g{group}")
    os.makedirs(folder)
    path = os.path.join(folder, "model.safetensors")
    write_safetensors(path, tensors, {"quantization_config": config} if config else {})
    return path


def bias(scheme):
    return scheme == "gptq"


def run(tmp, world, steps, limit=60):
    """The ranks as processes over gloo on loopback; [rank's results] (each a list per step)."""
    out = os.path.join(str(tmp), f"out{world}")
    os.makedirs(out)
    job = os.path.join(out, "job.json")
    with open(job, "w") as f:
        json.dump({"world": world, "port": free_port(), "out": out, "steps": steps}, f)
    procs = [subprocess.Popen([sys.executable, WORKER, job, str(r)], env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True) for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=limit)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r in range(world):
        path = os.path.join(out, f"rank{r}.json")
        res = json.load(open(path)) if os.path.exists(path) else [{"crash": "no results"}]
        for e in res:
            assert "crash" not in e, f"rank {r}: {e['crash']}\n{logs[r]}"
        assert len(res) == len(steps), (r, res, logs[r])
        results.append(res)
    return results, out


def single(path, rank, size, scheme, dequantize=torch.float32, plan=PLAN):
    """The single-process load of one rank: (state dict, report)."""
    m = tp_model(rank, size, bias(scheme))
    rep = metaload.load_into(m, path, dequantize=dequantize, tp_rank=rank, tp_size=size,
                             tp_plan=plan, progress=False)
    return m.state_dict(), rep


def assert_equal_to_single(out, step, path, size, scheme, plan=PLAN, dequantize=torch.float32):
    for r in range(size):
        got = torch.load(os.path.join(out, f"rank{r}.step{step}.pt"))
        want, _ = single(path, r, size, scheme, dequantize, plan)
        assert got.keys() == want.keys()
        for n, t in want.items():
            assert got[n].dtype == t.dtype and got[n].shape == t.shape, (r, n, got[n], t)
            assert torch.equal(got[n], t), f"rank {r} of {size}: {n} differs"


def slice_bytes(path, size, rank=0):
    """The checkpoint bytes one rank's slice reads, from the headers: a split tensor's share
    (q_proj's along out, o_proj's along in, o_proj's bias whole), whole parts (WHOLE) and
    unsplit tensors whole; the parts read at plan time (a quant_state blob) not at all."""
    headers = header_bytes(os.path.dirname(path))
    layout = metaload.quant_layout(path)
    role = {n: (w["weight"], r) for w in layout["weights"] for r, n in w["parts"].items()}
    scheme = os.path.basename(os.path.dirname(path)).split("-g")[0]
    total = 0
    for name, (_, nbytes) in headers.items():
        dim = 0 if ".q_proj." in name else (1 if ".o_proj." in name else None)
        r = role.get(name, (None, None))[1]
        if r in ("state", "format", "shape"):
            continue
        rules = {**WHOLE.get(scheme, {}), **WHOLE_ON_RANK.get((scheme, rank), {})}
        whole = dim is None or name.endswith("o_proj.bias") or r in rules.get(dim, ())
        total += nbytes if whole else nbytes // size
    return total


def load_steps(paths, size, source_rank=None):
    steps = []
    for scheme in SCHEMES:
        kw = {"dequantize": "float32", "tp_plan": "PLAN", "tp_size": size}
        ref = paths[scheme]
        if source_rank is not None:  # the others' path does not exist: they never open it
            kw["source_rank"] = source_rank
            ref = {str(source_rank): ref, "*": ref + ".absent"}
        steps.append({"ref": ref, "kw": kw, "bias": bias(scheme), "fresh": True})
    return steps


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quantized")
    return {s: checkpoint(tmp, s) for s in SCHEMES + MORE + ["plain"]}


def check_loads(results, out, paths, size, first, source_rank=None, schemes=SCHEMES):
    """Steps first.. (one per scheme) loaded on every rank, equal to the single-process loads,
    each rank's bytes its slice's (shared) or the source's all of them (broadcast)."""
    for k, scheme in enumerate(schemes):
        step = first + k
        for r in range(size):
            e = results[r][step]
            assert e["ok"], (scheme, r, e)
            assert not e["meta_left"] and len(e["dequantized"]) == 4, (scheme, r, e)
        assert_equal_to_single(out, step, paths[scheme], size, scheme)
        expect = slice_bytes(paths[scheme], size)
        got = [results[r][step]["distributed"]["bytes_read"] for r in range(size)]
        whole = metaload.load_into(tp_model(0, 1, bias(scheme)), paths[scheme],
                                   dequantize=torch.float32, progress=False).bytes
        if source_rank is None:  # each rank its own slice, as its single-process load reads
            assert got == [expect] * size, (scheme, got, expect)
            assert got == [single(paths[scheme], r, size, scheme)[1].bytes for r in range(size)]
            assert expect < whole / size * 1.25, (scheme, expect, whole)
        else:  # the source every slice, the others nothing
            assert got[source_rank] == expect * size and sum(got) == expect * size, (scheme, got)
            for r in range(size):
                d = results[r][step]["distributed"]
                assert d["mode"] == "broadcast" and d["rank_bytes_read"] == got
                if r != source_rank:
                    assert d["bytes_received"] == d["held_bytes"] > 0


def test_two_ranks(paths, tmp_path):
    """2 ranks: GPTQ, AWQ, bnb 4-bit and FP8 in shared and broadcast mode equal the single-process
    loads bitwise; tp_plan alone and dequantize on replicas load across the group too; a degree
    off GPTQ's groups is a DequantError on both ranks in both modes and a part missing on one rank
    a DistributedError on both, each time with the weights of the load before; ranks that
    disagree on dequantize fail before anything is read; dequantize with tp_size 2 but no
    tp_plan is a PlanError on both."""
    off = checkpoint(tmp_path, "gptq", group=128)  # one group: halves of it are off boundaries
    lacking = os.path.join(str(tmp_path), "lacking")
    shutil.copytree(os.path.dirname(paths["awq"]), lacking)
    _without(os.path.join(lacking, "model.safetensors"), "layers.1.o_proj.scales")
    dq = {"dequantize": "float32", "tp_plan": "PLAN", "tp_size": 2}
    steps = load_steps(paths, 2) + load_steps(paths, 2, source_rank=1) + [
        {"ref": paths["plain"], "kw": {"tp_plan": "PLAN", "tp_size": 2}, "bias": False,
         "fresh": True},
        {"ref": paths["awq"], "kw": {"dequantize": "bfloat16", "tp_size": 1}, "bias": False,
         "fresh": True},
        {"ref": off, "kw": dq, "bias": True, "fresh": True},  # 10: on meta
        {"ref": paths["gptq"], "kw": dq, "bias": True},
        {"ref": off, "kw": dq},
        {"ref": off, "kw": dict(dq, source_rank=0)},
        {"ref": {"0": paths["awq"], "1": os.path.join(lacking, "model.safetensors")},
         "kw": dict(dq), "bias": False, "fresh": True},
        {"ref": paths["awq"], "kw": {"0": dq, "1": dict(dq, dequantize=None)}},
        {"ref": paths["awq"], "kw": {"dequantize": "float32", "tp_size": 2}},
    ]
    results, out = run(tmp_path, 2, steps)
    check_loads(results, out, paths, 2, 0)
    check_loads(results, out, paths, 2, 4, source_rank=1)
    # tp_plan without dequantize: the single-process tp_plan load of each rank
    assert all(results[r][8]["ok"] for r in range(2)), results[0][8]
    assert_equal_to_single(out, 8, paths["plain"], 2, "plain", dequantize=None)
    # dequantize on replicas (tp_size 1): the whole dequantized weights on both
    assert all(results[r][9]["ok"] for r in range(2)), results[0][9]
    whole = tp_model(0, 1, False)
    metaload.load_into(whole, paths["awq"], dequantize=torch.bfloat16, progress=False)
    for r in range(2):
        got = torch.load(os.path.join(out, f"rank{r}.step9.pt"))
        assert all(torch.equal(got[n], t) for n, t in whole.state_dict().items())
    for step, on_meta in ((10, True), (12, False), (13, False)):
        for r in range(2):
            e = results[r][step]
            assert not e["ok"] and e["error_type"] == "DequantError", (step, r, e)
            assert e["rule"] == "tp-boundary" and set(e["failures"]) == {"0", "1"}, e
            assert "degrees that split it on boundaries: 1" in e["message"], e
            assert e["unchanged"], (step, r)
            if on_meta:
                assert len(e["meta_left"]) == 12, e["meta_left"]  # every tensor still on meta
    assert all(results[r][11]["ok"] for r in range(2))
    for r in range(2):  # a part lacking on rank 1: every rank fails, nothing swapped
        e = results[r][14]
        assert not e["ok"] and e["error_type"] == "DistributedError", e
        assert set(e["failures"]) == {"1"} and "layers.1.o_proj" in e["failures"]["1"], e
        assert e["unchanged"] and len(e["meta_left"]) == 8, e
        e = results[r][15]
        assert e["error_type"] == "DistributedError" and "dequantize differs" in e["message"]
        e = results[r][16]
        assert e["error_type"] == "PlanError" and "needs tp_plan=" in e["message"], e


def test_four_ranks(paths, tmp_path):
    """4 ranks: the four schemes in shared mode, FP8 in broadcast mode from rank 2, and GPTQ with
    groups of 64 (32 inputs a rank) a DequantError "tp-boundary" on every rank."""
    off = checkpoint(tmp_path, "gptq", group=64)
    steps = load_steps(paths, 4) + load_steps(paths, 4, source_rank=2)[3:] + [
        {"ref": off, "kw": {"dequantize": "bfloat16", "tp_plan": "PLAN", "tp_size": 4},
         "bias": True, "fresh": True}]
    results, out = run(tmp_path, 4, steps, limit=90)
    check_loads(results, out, paths, 4, 0)
    check_loads(results, out, paths, 4, 4, source_rank=2, schemes=["fp8"])
    for r in range(4):
        e = results[r][5]
        assert e["error_type"] == "DequantError" and e["rule"] == "tp-boundary", e
        assert "degrees that split it on boundaries: 1, 2" in e["message"], e
        assert set(e["failures"]) == {"0", "1", "2", "3"} and e["unchanged"], e


def test_single_process_meta_module_of_whole_shapes_takes_the_slices(paths):
    """A module on meta of whole shapes (as the ranks' stand-ins) takes each rank's slice in one
    process too, the same tensors as a module built with the slices' shapes, reading only the
    slice's bytes; each weight is its slice of the whole dequantized weight (a load without TP
    reads every part whole: the slices' rebased reads against it)."""
    from test_dequant import meta_model
    for scheme in SCHEMES + MORE:
        whole = tp_model(0, 1, bias(scheme))
        metaload.load_into(whole, paths[scheme], dequantize=torch.float32, progress=False)
        for r in range(2):
            m = meta_model(bias=bias(scheme))
            rep = metaload.load_into(m, paths[scheme], dequantize=torch.float32, tp_rank=r,
                                     tp_size=2, tp_plan=PLAN, progress=False)
            want, want_rep = single(paths[scheme], r, 2, scheme)
            got = m.state_dict()
            assert all(torch.equal(got[n], t) for n, t in want.items()), scheme
            assert rep.bytes == want_rep.bytes == slice_bytes(paths[scheme], 2, r), (scheme, r)
            for i, layer in enumerate(whole.layers):
                rows, cols = slice(r * OUT // 2, (r + 1) * OUT // 2), slice(r * IN // 2,
                                                                            (r + 1) * IN // 2)
                assert torch.equal(got[f"layers.{i}.q_proj.weight"], layer.q_proj.weight[rows])
                assert torch.equal(got[f"layers.{i}.o_proj.weight"],
                                   layer.o_proj.weight[:, cols]), (scheme, r, i)


def _without(path, name):
    """Rewrites safetensors file `path` without tensor `name` (its config.json stays)."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for k, v in header.items():
        if k == "__metadata__" or k == name:
            continue
        a, b = v["data_offsets"]
        tensors[k] = (v["dtype"], v["shape"], data[a:b])
    write_safetensors(path, tensors)


@pytest.mark.parametrize("kw", [dict(dequantize=torch.float32, source_rank=0),
                                dict(tp_plan=PLAN, tp_size=2, distributed=True)])
def test_across_a_group_without_torch_distributed(paths, kw):
    """dequantize= and tp_plan= across a group (no longer a PlanError) need torch.distributed
    initialised, as any load across a group: a DistributedError, nothing loaded."""
    from test_dequant import meta_model
    m = meta_model(bias=True)
    with pytest.raises(metaload.DistributedError, match="needs torch.distributed initialised"):
        metaload.load_into(m, paths["gptq"], progress=False, **kw)
    assert all(t.is_meta for t in m.state_dict().values())
