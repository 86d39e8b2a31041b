"""bench/quant/load: dequantizing loads against a plain copying load of the same output bytes.

For each scheme a checkpoint of LAYERS Linear weights [D, D] is written once (quant_refs'
writers: the libraries' documented layouts), then loaded into plain nn.Linear layers built under
metaload.meta() with load_into(..., dequantize=torch.bfloat16) on the CPU. The anchor, measured in
the same run: load_into of a bf16 checkpoint of the same LAYERS x [D, D] weights into bf16
nn.Linear layers (mmap=False: copied into fresh memory, as the engine does for every copying
load), so both write as many output bytes, with the same (default) threads. PAIRS fresh processes
each load the anchor and the case alternately, ROUNDS times each after one warm-up of each (page
cache warm): each process gives one ratio of the two medians. Columns: output GB/s (bf16 bytes
written per second) of the dequantizing load and of the anchor (medians over the processes),
their ratio (the median of the processes' ratios, and their range; the issue's target: >= 0.8),
the file bytes read, peak RSS of one process of each case alone.

    python bench/quant/load.py [--layers 4] [--dim 4096] [--rounds 5] [--pairs 3] [--schemes a,b]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "python"))

SCHEMES = ["gptq4", "gptq4-act", "awq4", "nf4", "nf4-dq", "fp4", "int8", "fp8", "ct-int4", "nvfp4"]


def ct_int4_tensors(rng, p, out, inp, group=128):
    """compressed-tensors pack-quantized int4 (symmetric, group strategy) packed with numpy:
    quant_refs.pack_stream packs bit by bit in Python, too slow for [4096, 4096]."""
    import quant_refs as q
    groups = inp // group
    codes = rng.integers(0, 16, size=(out, inp)).astype(np.uint32)  # q + 8
    words = (codes.reshape(out, inp // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(
        axis=2, dtype=np.uint32)
    scales = q.bf16_round((rng.random((out, groups)) * 0.05 + 0.001).astype(np.float32))
    return {f"{p}.weight_packed": q.arr("I32", words.view(np.int32)),
            f"{p}.weight_shape": q.arr("I64", np.array([out, inp])),
            f"{p}.weight_scale": ("BF16", [out, groups], q.bf16_bytes(scales))}


def write_case(path, scheme, layers, dim):
    import quant_refs as q
    rng = np.random.default_rng(0)
    tensors, config = {}, None
    for i in range(layers):
        p = f"layers.{i}"
        if scheme in ("gptq4", "gptq4-act"):
            t, _ = q.gptq_tensors(rng, p, dim, dim, bits=4, group=128, bias=False,
                                  act_order=scheme == "gptq4-act")
            config = {"quant_method": "gptq", "bits": 4, "group_size": 128,
                      "desc_act": scheme == "gptq4-act"}
        elif scheme == "awq4":
            t, _ = q.awq_tensors(rng, p, dim, dim, group=128)
            config = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
        elif scheme in ("nf4", "nf4-dq", "fp4"):
            t, _ = q.bnb4_tensors(rng, p, dim, dim, nested=scheme == "nf4-dq",
                                  quant_type="fp4" if scheme == "fp4" else "nf4")
            config = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                      "bnb_4bit_quant_type": "fp4" if scheme == "fp4" else "nf4",
                      "bnb_4bit_use_double_quant": scheme == "nf4-dq"}
        elif scheme == "int8":
            t, _ = q.bnb8_tensors(rng, p, dim, dim)
            config = {"quant_method": "bitsandbytes", "load_in_8bit": True}
        elif scheme == "ct-int4":
            t = ct_int4_tensors(rng, p, dim, dim)
            config = q.ct_config(bits=4, group=128)
        elif scheme == "nvfp4":
            t, _ = q.nvfp4_tensors(rng, p, dim, dim)
            config = q.ct_config(fmt="nvfp4-pack-quantized")
        else:
            t, _, _, _ = q.fp8_tensors(rng, p, dim, dim)
            config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
        tensors.update(t)
    os.makedirs(path, exist_ok=True)
    q.write_safetensors(os.path.join(path, "model.safetensors"), tensors,
                        {"quantization_config": config})
    return os.path.getsize(os.path.join(path, "model.safetensors"))


def write_anchor(path, layers, dim):
    """The same layers as a plain bf16 checkpoint: as many output bytes as the dequantized load."""
    import quant_refs as q
    os.makedirs(path, exist_ok=True)
    zeros = np.zeros(dim * dim, np.uint16).tobytes()
    tensors = {f"layers.{i}.weight": ("BF16", [dim, dim], zeros) for i in range(layers)}
    q.write_safetensors(os.path.join(path, "model.safetensors"), tensors)


def load_once(case, path, layers, dim):
    """One load of `path` into LAYERS fresh meta-built Linear layers: (seconds, report)."""
    import torch
    import metaload
    anchor = case == "anchor"
    with metaload.meta():
        model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList(
            [torch.nn.Linear(dim, dim, bias=False,
                             dtype=torch.bfloat16 if anchor else torch.float32)
             for _ in range(layers)])})
    t0 = time.perf_counter()
    if anchor:
        report = metaload.load_into(model, path, progress=False, mmap=False)
    else:
        report = metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    dt = time.perf_counter() - t0
    del model
    return dt, report


def run_case(args):
    """In a child process: load ROUNDS times after a warm-up, print {seconds: [...], bytes,
    slot_bytes, rss}; with --anchor-path, the anchor's loads alternate with the case's (one
    process: both see the same machine from moment to moment) and come as anchor_seconds."""
    cases = [(args.case, args.path)]
    if args.anchor_path:
        cases.append(("anchor", args.anchor_path))
    times = {case: [] for case, _ in cases}
    reports = {}
    for r in range(args.rounds + 1):
        for case, path in cases:
            dt, reports[case] = load_once(case, path, args.layers, args.dim)
            if r:
                times[case].append(dt)
    report = reports[args.case]
    out = {"seconds": times[args.case], "bytes": report.bytes, "slot_bytes": report.slot_bytes,
           "rss_mib": peak_rss_mib()}
    if args.anchor_path:
        out["anchor_seconds"] = times["anchor"]
        out["anchor_slot_bytes"] = reports["anchor"].slot_bytes
    print(json.dumps(out))


def peak_rss_mib():
    """This process's peak RSS: VmHWM belongs to the address space exec made (ru_maxrss on
    Linux carries the parent's peak over fork and exec: it read the writer's numpy arrays)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(args, case, path, anchor_path=None, rounds=None):
    extra = ["--anchor-path", anchor_path] if anchor_path else []
    out = subprocess.run([sys.executable, __file__, "--case", case, "--path", path,
                          "--rounds", str(rounds or args.rounds), "--layers", str(args.layers),
                          "--dim", str(args.dim)] + extra, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{case}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratio(run):
    """Output bytes per second of the case over the anchor's, from each one's median load in
    one interleaved child."""
    return (run["slot_bytes"] / statistics.median(run["seconds"])) / (
        run["anchor_slot_bytes"] / statistics.median(run["anchor_seconds"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--case")
    ap.add_argument("--path")
    ap.add_argument("--anchor-path")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    if args.case:
        return run_case(args)
    import torch
    print(f"bench/quant/load: {args.layers} x Linear [{args.dim}, {args.dim}] -> bfloat16 on the "
          f"CPU, torch {torch.__version__}, median of {args.rounds} warm loads of each, the "
          f"anchor's and the case's alternating in one process, {args.pairs} such processes "
          f"(x anchor: their median ratio, their range in brackets), load average "
          f"{os.getloadavg()[0]:.2f} at the start")
    print()
    print("| scheme | file MB | ms | output GB/s | anchor ms | anchor output GB/s | x anchor "
          "(range) | peak RSS MiB (anchor) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="metaload_bench_quant_") as tmp:
        anchor = os.path.join(tmp, "anchor")
        write_anchor(anchor, args.layers, args.dim)
        anchor_rss = run_child(args, "anchor", anchor, rounds=1)["rss_mib"]  # one process alone
        for scheme in args.schemes.split(","):
            path = os.path.join(tmp, scheme)
            write_case(path, scheme, args.layers, args.dim)
            # The machine's speed drifts by tens of percent within minutes, so the anchor's
            # loads alternate with the scheme's, load by load, in one fresh process per pair;
            # each pair's ratio is taken, and the median of those is the table's. Peak RSS comes
            # from one process of the scheme alone (the anchor's from one before the schemes).
            pairs = [run_child(args, scheme, path, anchor_path=anchor) for _ in range(args.pairs)]
            ratios = sorted(ratio(pr) for pr in pairs)
            a_s = statistics.median(statistics.median(pr["anchor_seconds"]) for pr in pairs)
            s = statistics.median(statistics.median(pr["seconds"]) for pr in pairs)
            rss = run_child(args, scheme, path, rounds=1)["rss_mib"]
            a_gbs = pairs[-1]["anchor_slot_bytes"] / a_s / 1e9
            gbs = pairs[-1]["slot_bytes"] / s / 1e9
            spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
            print(f"| {scheme} | {pairs[-1]['bytes'] / 1e6:.0f} | {s * 1e3:.1f} | {gbs:.2f} | "
                  f"{a_s * 1e3:.1f} | {a_gbs:.2f} | {statistics.median(ratios):.2f}{spread} | "
                  f"{rss:.0f} ({anchor_rss:.0f}) |", flush=True)
    print()
    print(f"load average after: {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
