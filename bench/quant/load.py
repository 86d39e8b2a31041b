"""bench/quant/load: dequantizing loads against a plain copying load of the same bytes.

For each scheme a checkpoint of LAYERS Linear weights [D, D] is written once (quant_refs'
writers: the libraries' documented layouts), then loaded into plain nn.Linear layers built under
metaload.meta() with load_into(..., dequantize=torch.bfloat16) on the CPU. The anchor, measured in
the same run: load_into of a checkpoint holding exactly as many file bytes as plain uint8 tensors
(mmap=False: copied into memory, as the engine does for every load). Each case runs in its own
process (so peak RSS is that case's), median of ROUNDS loads after one warm-up (page cache warm).
Columns: file GB/s (bytes read from the files per second) and its ratio to the anchor, output GB/s
(bf16 bytes written), peak RSS of the process.

    python bench/quant/load.py [--layers 4] [--dim 4096] [--rounds 5]
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

SCHEMES = ["gptq4", "awq4", "nf4", "nf4-dq", "int8", "fp8"]


def write_case(path, scheme, layers, dim):
    import quant_refs as q
    rng = np.random.default_rng(0)
    tensors, config = {}, None
    for i in range(layers):
        p = f"layers.{i}"
        if scheme == "gptq4":
            t, _ = q.gptq_tensors(rng, p, dim, dim, bits=4, group=128, bias=False)
            config = {"quant_method": "gptq", "bits": 4, "group_size": 128}
        elif scheme == "awq4":
            t, _ = q.awq_tensors(rng, p, dim, dim, group=128)
            config = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
        elif scheme in ("nf4", "nf4-dq"):
            t, _ = q.bnb4_tensors(rng, p, dim, dim, nested=scheme == "nf4-dq")
            config = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                      "bnb_4bit_use_double_quant": scheme == "nf4-dq"}
        elif scheme == "int8":
            t, _ = q.bnb8_tensors(rng, p, dim, dim)
            config = {"quant_method": "bitsandbytes", "load_in_8bit": True}
        else:
            t, _, _, _ = q.fp8_tensors(rng, p, dim, dim)
            config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
        tensors.update(t)
    os.makedirs(path, exist_ok=True)
    q.write_safetensors(os.path.join(path, "model.safetensors"), tensors,
                        {"quantization_config": config})
    return os.path.getsize(os.path.join(path, "model.safetensors"))


def write_anchor(path, nbytes, layers):
    """Plain uint8 tensors, as many file bytes as the quantized checkpoint."""
    import quant_refs as q
    os.makedirs(path, exist_ok=True)
    per = nbytes // layers
    tensors = {f"layers.{i}.weight": ("U8", [per], np.zeros(per, np.uint8).tobytes())
               for i in range(layers)}
    q.write_safetensors(os.path.join(path, "model.safetensors"), tensors)


def run_case(args):
    """In a child process: load ROUNDS times, print {seconds: [...], bytes, slot_bytes, rss}."""
    import torch
    import metaload
    rounds, layers, dim = args.rounds, args.layers, args.dim
    times, report = [], None
    for r in range(rounds + 1):
        if args.case == "anchor":
            per = args.per
            model = torch.nn.ParameterDict()
            with metaload.meta():
                for i in range(layers):
                    model[f"layers_{i}"] = torch.nn.Parameter(torch.empty(per, dtype=torch.uint8),
                                                             requires_grad=False)
            mapping = {rf"^layers\.{i}\.weight$": f"layers_{i}" for i in range(layers)}
            t0 = time.perf_counter()
            report = metaload.load_into(model, args.path, progress=False, mmap=False,
                                        key_mapping=mapping)
        else:
            with metaload.meta():
                model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList(
                    [torch.nn.Linear(dim, dim, bias=False) for _ in range(layers)])})
            t0 = time.perf_counter()
            report = metaload.load_into(model, args.path, dequantize=torch.bfloat16,
                                        progress=False)
        dt = time.perf_counter() - t0
        if r:
            times.append(dt)
        del model
    print(json.dumps({"seconds": times, "bytes": report.bytes, "slot_bytes": report.slot_bytes,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--case")
    ap.add_argument("--path")
    ap.add_argument("--per", type=int, default=0)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    if args.case:
        return run_case(args)
    import torch
    print(f"bench/quant/load: {args.layers} x Linear [{args.dim}, {args.dim}] -> bfloat16 on the "
          f"CPU, torch {torch.__version__}, median of {args.rounds} warm loads, each case in its "
          f"own process")
    print()
    print("| case | file MB | ms | file GB/s | x anchor | output GB/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="metaload_bench_quant_") as tmp:
        for scheme in args.schemes.split(","):
            path = os.path.join(tmp, scheme)
            size = write_case(path, scheme, args.layers, args.dim)
            anchor = os.path.join(tmp, scheme + "-anchor")
            write_anchor(anchor, size, args.layers)
            res = {}
            for case, p in (("anchor", anchor), (scheme, path)):
                out = subprocess.run([sys.executable, __file__, "--case", case, "--path", p,
                                      "--rounds", str(args.rounds), "--layers", str(args.layers),
                                      "--dim", str(args.dim), "--per", str(size // args.layers)],
                                     capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{case}: {out.stderr}")
                res[case] = json.loads(out.stdout.strip().splitlines()[-1])
            a = res["anchor"]
            a_s = statistics.median(a["seconds"])
            for case in ("anchor", scheme):
                r = res[case]
                s = statistics.median(r["seconds"])
                gbs = r["bytes"] / s / 1e9
                label = f"{scheme}: plain copy of the same bytes (anchor)" if case == "anchor" else \
                    f"{scheme}: dequantizing load"
                print(f"| {label} | {r['bytes'] / 1e6:.0f} | {s * 1e3:.1f} | {gbs:.2f} | "
                      f"{(a['bytes'] / a_s) and gbs / (a['bytes'] / a_s / 1e9):.2f} | "
                      f"{r['slot_bytes'] / s / 1e9:.2f} | {r['rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
