"""Tensor-parallel ranks for tests/python/test_tp_forward.py.

    tp_worker.py spawn N OUT MODE [DIR ...]   # N ranks by torch.multiprocessing.spawn
    tp_worker.py env OUT MODE [DIR ...]       # this process is one rank of a torchrun launch

MODE "run": every rank loads each checkpoint DIR with tp_size N and saves what the test compares
(logits, greedy tokens, load report, the shapes and bytes it holds, its scan) to OUT/<i>-<rank>.pt.
MODE "mismatch": rank r asks for tp_size N + r (only rank 0 is right); MODE "nosplit": the
model cannot be split into N ranks; MODE "die": rank 1 kills
itself after the first forward and rank 0 runs a second one; MODE "hang": rank 1 sleeps instead of
the second forward. MODE "dispatchfail": rank 1 loads DIR[1] (a broken copy of DIR[0]);
MODE "dispatchsilent": rank 1 never dispatches (sleeps, then exits). In both, OUT/state-<rank>.txt
says after the dispatch whether the model is dispatched and whether every parameter is still meta.
Errors go to OUT/error-<rank>.txt as "<kind> <seconds>\\n<message>".
"""
import datetime
import os
import signal
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

TIMEOUT = 8.0  # seconds a collective waits in the error modes
IDS = torch.tensor([[3, 14, 15, 92, 65], [35, 89, 79, 32, 38]])


def unique_parameters(model):
    seen, out = set(), {}
    for name, p in model.named_parameters().items():
        if id(p) not in seen:
            seen.add(id(p))
            out[name] = p
    return out


def record_error(out, rank, e, t0):
    with open(os.path.join(out, f"error-{rank}.txt"), "w") as f:
        f.write(f"{type(e).__name__} {time.perf_counter() - t0:.2f}\n{e}")


def dispatch_vote(rank, world, out, mode, dirs):
    """The dispatch is a vote: a rank whose part failed, or that never comes, stops every rank."""
    import metaload
    d = dirs[1] if (mode == "dispatchfail" and rank == 1) else dirs[0]
    m = metaload.TransformersModel(d, tp_size=world, collective_timeout=TIMEOUT, progress=False)
    t0 = time.perf_counter()
    try:
        if rank == 1 and mode == "dispatchsilent":
            time.sleep(TIMEOUT * 3)
            os._exit(0)
        m.dispatch()
    except Exception as e:  # noqa: BLE001 (the test reads what each rank saw)
        record_error(out, rank, e, t0)
    metas = all(p.is_meta for p in m.named_parameters().values())
    with open(os.path.join(out, f"state-{rank}.txt"), "w") as f:
        f.write(f"dispatched={m.dispatched} all_meta={metas}")
    sys.stdout.flush()
    os._exit(0)


def run(rank, world, out, mode, dirs):
    import metaload

    if mode.startswith("dispatch"):
        return dispatch_vote(rank, world, out, mode, dirs)

    if mode == "run":
        for i, d in enumerate(dirs):
            m = metaload.TransformersModel(d, tp_size=world, collective_timeout=60, progress=False)
            report = m.dispatch()
            logits = m(IDS)
            tokens = m.generate(IDS, 6)
            params = unique_parameters(m)
            # The scan of a fresh skeleton of that split (no group needed): weights and activations.
            scan = metaload.TransformersModel(d, progress=False).scan(
                batch=IDS.shape[0], seq=IDS.shape[1], tp_size=world, tp_rank=rank)
            torch.save({"logits": logits, "tokens": tokens, "report_bytes": report.bytes,
                        "shapes": {k: tuple(p.shape) for k, p in params.items()},
                        "held_bytes": sum(p.numel() * p.element_size() for p in params.values()),
                        "scan_weight_bytes": scan.weight_bytes,
                        "scan_shapes": {k: tuple(v.shape) for k, v in scan.items()},
                        "info": m.info}, os.path.join(out, f"{i}-{rank}.pt"))
        dist.barrier()
        return
    t0 = time.perf_counter()
    try:
        tp_size = world + rank if mode == "mismatch" else world
        m = metaload.TransformersModel(dirs[0], tp_size=tp_size, collective_timeout=TIMEOUT,
                                       progress=False)
        m(IDS)
        if rank == 1 and mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1 and mode == "hang":
            time.sleep(TIMEOUT * 3)
            os._exit(0)
        t0 = time.perf_counter()
        m(IDS)
        raise AssertionError("the second forward succeeded")
    except Exception as e:  # noqa: BLE001 (the test reads what each rank saw)
        record_error(out, rank, e, t0)
    sys.stdout.flush()
    os._exit(0)  # never wait for a collective another rank abandoned


def spawned(rank, world, port, out, mode, dirs):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        run(rank, world, out, mode, dirs)
    except BaseException:
        traceback.print_exc()  # the test shows the ranks' stderr
        sys.stderr.flush()
        raise


def main():
    if sys.argv[1] == "spawn":
        world, out, mode, dirs = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # torch.multiprocessing's spawn without its join: that one terminates the other ranks as
        # soon as one dies, and the test wants to see what the survivors report.
        ctx = torch.multiprocessing.start_processes(
            spawned, args=(world, port, out, mode, dirs), nprocs=world, join=False,
            start_method="spawn")
        codes = []
        for p in ctx.processes:
            p.join()
            codes.append(p.exitcode)
        if mode == "run" and any(codes):
            sys.exit(f"ranks exited with {codes}")
    else:  # torchrun: the environment names the rank and the rendezvous
        out, mode, dirs = sys.argv[2], sys.argv[3], sys.argv[4:]
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        run(dist.get_rank(), dist.get_world_size(), out, mode, dirs)


if __name__ == "__main__":
    main()
