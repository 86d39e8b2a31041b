"""bench/tp: metaload.load_into across tensor-parallel ranks (processes over gloo on loopback,
CPU): per-rank load time, bytes read and peak RSS for tp 1, 2 and 4, as ratios to tp 1 of the
same run, on the GPT-2 124M fixture and a Llama-3.2-1B-shaped fixture (1.24B parameters, bf16);
and the tensor-parallel forward's tokens/s.

    METALOAD_LIB=... PYTHONPATH=python python bench/tp/tp.py [--quick] [--keep DIR]

Each tp degree runs in fresh processes (one per rank): "shared" (every rank reads its own slice
from the same files) and "broadcast" (rank 0 reads every slice and sends each rank its own, 64 MiB
buffers). The files are in the page cache (written just before): warm loads. Time is the
load_into call on each rank (handshake, staging, vote and swap), after a barrier; peak RSS is the
rank process's (libtorch included), with its RSS before the load beside it.

"forward" rows: metaload.TransformersModel(ckpt, tp_size=N, process_group=the default group) in
fresh processes, dispatched into float32 (bf16 matmuls are the slow path on CPUs without
AVX-512 BF16; shared mode; load s is the construction with its handshake and the dispatch), then a greedy generation of NEW_TOKENS tokens after a PROMPT-token prompt (batch 1,
the same on every tp), timed after a one-token warm-up and a barrier: tokens/s is NEW_TOKENS over
the rank's generate() time (prefill included), its ratio against the forward at tp 1; every tp's
tokens must equal tp 1's. Each rank runs one thread (OMP_NUM_THREADS=1): tp N uses N cores where
the machine has them. CUDA with NCCL needs a device with several GPUs; none is lent here.
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
PROMPT, NEW_TOKENS = 8, 4


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


def forward_main(args):
    """One rank of the "forward" rows: a TP TransformersModel, dispatched, then generate()."""
    import torch.distributed as dist
    import metaload
    with open(os.path.join(args.ckpt, "config.json")) as f:
        config = json.load(f)
    before = rss_mib()
    dist.barrier()
    t0 = time.perf_counter()
    m = metaload.TransformersModel(args.ckpt, dtype="float32", tp_size=args.world,
                                   process_group=dist.group.WORLD if args.world > 1 else None,
                                   collective_timeout=600, progress=False)
    r = m.dispatch()
    seconds = time.perf_counter() - t0
    held = sum(p.numel() * p.element_size()
               for p in {id(p): p for p in m.named_parameters().values()}.values())
    ids = (torch.arange(PROMPT) * 7 + 3).remainder(config["vocab_size"]).reshape(1, PROMPT)
    m.generate(ids, 1)  # warm-up: first-call costs stay out of the timing
    dist.barrier()
    t1 = time.perf_counter()
    tokens = m.generate(ids, NEW_TOKENS)
    gen = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rank": args.rank, "seconds": seconds, "bytes_read": r.bytes, "held": held,
                      "rss_before": before, "peak_rss": peak, "tokens_s": NEW_TOKENS / gen,
                      "tokens": tokens[0, PROMPT:].tolist()}), flush=True)
    dist.barrier()
    os._exit(0)


def rank_main(args):
    import torch.distributed as dist
    import metaload
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=600))
    if args.mode == "forward":
        return forward_main(args)
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
          "RSS before MiB | peak RSS MiB | tokens/s | x tp1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, config, dtype in (QUICK if args.quick else MODELS):
        out = os.path.join(tmp, label)
        if not os.path.exists(os.path.join(out, "config.json")):
            metaload.make_checkpoint(out, config=config, dtype=dtype, layout="saved")
        info = metaload.describe_checkpoint(out)
        anchors = {}  # load rows: the shared load at tp 1; forward rows: the forward at tp 1
        for world in (1, 2, 4):
            for mode in ("shared", "broadcast", "forward") if world > 1 else ("shared", "forward"):
                port += 1
                rows = run_degree(out, world, mode, port)
                anchor = anchors.setdefault(mode == "forward", rows[0])
                for x in rows:
                    if mode == "forward":
                        if x["tokens"] != anchor["tokens"]:
                            raise SystemExit(f"bench/tp: {label} tp {world} rank {x['rank']} "
                                             f"generated {x['tokens']}, tp 1 {anchor['tokens']}")
                        tok = f"{x['tokens_s']:.2f} | {x['tokens_s'] / anchor['tokens_s']:.2f}"
                    else:
                        tok = "- | -"
                    print(f"| {label} | {world} | {mode} | {x['rank']} | {x['seconds']:.3f} | "
                          f"{x['seconds'] / anchor['seconds']:.2f} | {x['bytes_read'] / 1e6:.1f} | "
                          f"{x['bytes_read'] / anchor['bytes_read']:.3f} | {x['held'] / 1e6:.1f} | "
                          f"{x['held'] / anchor['held']:.3f} | {x['rss_before']:.0f} | "
                          f"{x['peak_rss']:.0f} | {tok} |", flush=True)
        print(f"({label}: {info.n_params / 1e6:.0f}M parameters, {info.size_bytes / 1e6:.0f} MB "
              f"stored as {dtype}; forward rows: {PROMPT}-token prompt, {NEW_TOKENS} new tokens, "
              f"greedy, the same tokens on every tp)")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"CUDA/NCCL rows need a lent device with several GPUs; none was lent to this run "
              f"({n} CUDA devices visible): not measured")
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
