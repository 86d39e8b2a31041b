"""Greedy generation with the model split over N tensor-parallel ranks on torch.distributed:

    python -m metaload.tp_run REF --tp N --ids 1,2,3[;4,5,6] --new-tokens K [--device cpu|cuda]
                              [--dtype D] [--timeout S] [--json]

starts N local ranks (torch.multiprocessing.spawn; gloo on CPU, NCCL on CUDA, rendezvous on
127.0.0.1), or, launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set), runs as
this process's rank of that launch. Rank 0 prints the new tokens of each sequence, one line each
(comma-separated), as `metaload run` does; `metaload run REF --tp N` runs this module.
A rank's error (metaload.DistributedError when another rank died, hangs or disagrees) is printed
as "metaload run: error: rank R: ..." and the exit status is 1.
"""
import argparse
import datetime
import json
import os
import socket
import sys
import time


def parse_ids(text):
    rows = [[int(x) for x in row.split(",") if x.strip()] for row in text.split(";") if row.strip()]
    if not rows or any(len(r) != len(rows[0]) or not r for r in rows):
        raise ValueError(f"--ids: {text!r} is not one or more comma-separated id lists of one length")
    return rows


def parser():
    p = argparse.ArgumentParser(prog="python -m metaload.tp_run", description=__doc__.split("\n\n")[0])
    p.add_argument("ref", help="checkpoint directory, Hugging Face repo id in the cache, or model key")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks")
    p.add_argument("--ids", required=True, help="prompt token ids: 1,2,3 (several sequences: 1,2;3,4)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens to generate")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--dtype", default=None, help="model dtype (default float32)")
    p.add_argument("--revision", default=None, help="branch, tag or commit of a repo id")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective waits for the other ranks at most")
    p.add_argument("--allow-local-paths", action="store_true",
                   help="a model key's repo_id may name a local path")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def _fail(rank, e):
    sys.stderr.write(f"metaload run: error: rank {rank}: {type(e).__name__}: {e}\n")
    sys.stderr.flush()
    # The group may still hold a collective another rank never joined: exit without waiting
    # for it to be torn down.
    os._exit(1)


def run_rank(rank, world, args):
    """One rank: joins the group (the environment's rendezvous), builds, loads and generates; rank
    0 prints."""
    import torch
    import torch.distributed as dist

    import metaload

    try:
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=max(args.timeout, 1.0)))
        device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
        ids = torch.tensor(parse_ids(args.ids), dtype=torch.long)
        t0 = time.perf_counter()
        model = metaload.TransformersModel(args.ref, revision=args.revision, device=device,
                                           dtype=args.dtype, tp_size=world,
                                           collective_timeout=args.timeout, progress=False,
                                           allow_local_paths=args.allow_local_paths)
        report = model.dispatch()
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = model.generate(ids, args.new_tokens)
        gen_s = time.perf_counter() - t1
    except Exception as e:  # noqa: BLE001 (every rank reports its own failure, then exits)
        _fail(rank, e)
    tokens = out[:, ids.shape[1]:].tolist()
    if rank == 0:
        if args.json:
            print(json.dumps({"model": model.info["class"], "device": device, "tp_size": world,
                              "load_bytes": report.bytes, "load_seconds": load_s,
                              "generate_seconds": gen_s, "tokens": tokens}, indent=2))
        else:
            n = len(tokens) * args.new_tokens
            print(f"model      {model.info['class']} ({model.info['config_path']}), {world} "
                  f"tensor-parallel ranks over {'nccl' if device != 'cpu' else 'gloo'}")
            print(f"loaded     {report.bytes} bytes on rank 0 in {load_s:.2f} s")
            print(f"generated  {n} tokens in {gen_s:.2f} s ({n / gen_s if gen_s > 0 else 0:.1f} tokens/s)")
            for row in tokens:
                print(",".join(str(t) for t in row))
        sys.stdout.flush()
    dist.barrier()  # no rank tears the group down while another still uses it


def _spawned(rank, world, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    run_rank(rank, world, args)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        parse_ids(args.ids)
    except ValueError as e:
        parser().error(str(e))
    if args.tp < 1:
        parser().error(f"--tp must be at least 1, got {args.tp}")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: join its launch
        world = int(os.environ["WORLD_SIZE"])
        if world != args.tp:
            sys.stderr.write(f"metaload run: error: --tp {args.tp} but the launch has "
                             f"WORLD_SIZE {world} ranks\n")
            return 2
        run_rank(int(os.environ["RANK"]), world, args)
        return 0
    import torch.multiprocessing as mp

    try:
        mp.spawn(_spawned, args=(args.tp, free_port(), args), nprocs=args.tp, join=True)
    except mp.ProcessExitedException:
        return 1  # the rank printed its error
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"metaload run: error: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
