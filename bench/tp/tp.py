"""bench/tp: metaload.load_into across tensor-parallel ranks (processes over gloo on loopback,
CPU): per-rank load time, bytes read and peak RSS for tp 1, 2 and 4, as ratios to tp 1 of the
same run, on the GPT-2 124M fixture and a Llama-3.2-1B-shaped fixture (1.24B parameters, bf16).

    METALOAD_LIB=... PYTHONPATH=python python bench/tp/tp.py [--quick] [--keep DIR]

Each tp degree runs in fresh processes (one per rank): "shared" (every rank reads its own slice
from the same files) and "broadcast" (rank 0 reads every slice and sends each rank its own, 64 MiB
buffers). The files are in the page cache (written just before): warm loads. Time is the
load_into call on each rank (handshake, staging, vote and swap), after a barrier; peak RSS is the
rank process's (libtorch included), with its RSS before the load beside it. Tokens/s need the TP
forward (TransformersModel with a process group, on another branch): not measured here.
"""
import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = [("gpt2-124m", "gpt2", "float32"), ("llama-1b", "llama-3.2-1b", "bfloat16")]
QUICK = [("gpt2-tiny", "gpt2-tiny", "float32"), ("llama-tiny", "llama-tiny", "float32")]


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def skeleton(ckpt):
    """A meta module with the names, shapes and ties of the checkpoint's model (its config.json;
    what a user builds under metaload.meta())."""
    import metaload
    with open(os.path.join(ckpt, "config.json")) as f:
        dtype = json.load(f).get("torch_dtype")  # as stored: no conversion, no doubled memory
    m = metaload.TransformersModel(ckpt, dtype=dtype, progress=False)
    root, made = torch.nn.Module(), {}
    for is_param, items in ((True, m.named_parameters()), (False, m.named_buffers())):
        for name, t in items.items():
            owner = root
            *path, leaf = name.split(".")
            for p in path:
                if not hasattr(owner, p):
                    owner.add_module(p, torch.nn.Module())
                owner = getattr(owner, p)
            if id(t) not in made:
                data = torch.empty(t.shape, dtype=t.dtype, device="meta")
                made[id(t)] = torch.nn.Parameter(data, requires_grad=False) if is_param else data
            if is_param:
                owner.register_parameter(leaf, made[id(t)])
            else:
                owner.register_buffer(leaf, made[id(t)], persistent=False)
    return root


def rank_main(args):
    import torch.distributed as dist
    import metaload
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=600))
    module = skeleton(args.ckpt)
    before = rss_mib()
    kw = {}
    if args.mode == "broadcast":
        kw = dict(source_rank=0, buffer_bytes=64 << 20)
    dist.barrier()
    t0 = time.perf_counter()
    r = metaload.load_into(module, args.ckpt, tp_size=args.world, process_group=dist.group.WORLD,
                           progress=False, **kw)
    seconds = time.perf_counter() - t0
    d = r.distributed
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rank": args.rank, "seconds": seconds, "bytes_read": d.bytes_read,
                      "held": d.held_bytes, "sent": d.bytes_sent, "received": d.bytes_received,
                      "rss_before": before, "peak_rss": peak}), flush=True)
    dist.barrier()
    os._exit(0)


def run_degree(ckpt, world, mode, port):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--ckpt", ckpt, "--mode", mode],
                              env=env, stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"bench/tp: a rank failed (exit {p.returncode}):\n{out}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(rows, key=lambda x: x["rank"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny fixtures (a smoke run)")
    ap.add_argument("--keep", help="write the fixtures here (default: a temporary folder)")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--ckpt")
    ap.add_argument("--mode")
    args = ap.parse_args()
    if args.rank is not None:
        return rank_main(args)
    import metaload
    print(f"bench/tp: torch {torch.__version__}, metaload {metaload.__version__}, "
          f"{os.cpu_count()} CPUs, gloo on loopback, warm page cache")
    tmp = args.keep or tempfile.mkdtemp(prefix="bench-tp-")
    port = 29600 + os.getpid() % 1000
    print("| model | tp | mode | rank | load s | x tp1 | read MB | x tp1 | held MB | x tp1 | "
          "RSS before MiB | peak RSS MiB | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, config, dtype in (QUICK if args.quick else MODELS):
        out = os.path.join(tmp, label)
        if not os.path.exists(os.path.join(out, "config.json")):
            metaload.make_checkpoint(out, config=config, dtype=dtype, layout="saved")
        info = metaload.describe_checkpoint(out)
        anchor = None
        for world in (1, 2, 4):
            for mode in ("shared", "broadcast") if world > 1 else ("shared",):
                port += 1
                rows = run_degree(out, world, mode, port)
                if anchor is None:
                    anchor = rows[0]
                for x in rows:
                    print(f"| {label} | {world} | {mode} | {x['rank']} | {x['seconds']:.3f} | "
                          f"{x['seconds'] / anchor['seconds']:.2f} | {x['bytes_read'] / 1e6:.1f} | "
                          f"{x['bytes_read'] / anchor['bytes_read']:.3f} | {x['held'] / 1e6:.1f} | "
                          f"{x['held'] / anchor['held']:.3f} | {x['rss_before']:.0f} | "
                          f"{x['peak_rss']:.0f} | n/a (TP forward: branch tpfwd) |", flush=True)
        print(f"({label}: {info.n_params / 1e6:.0f}M parameters, {info.size_bytes / 1e6:.0f} MB "
              f"stored as {dtype})")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"CUDA/NCCL: no device with several GPUs was lent to this run ({n} CUDA devices "
              "visible): not measured")
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
