"""One rank of the distributed load_into tests (tests/python/test_dist_load*.py).

    python dist_load_worker.py JOB.json RANK

JOB.json: {"world": N, "addr": host, "port": p, "skeleton": spec.json, "out": dir,
           "steps": [{"ref": path or {rank: path}, "tp_size": n or {rank: n}, "source_rank": r,
                      "buffer_bytes": b, "timeout": s, "expect": "ok" | "error",
                      "fault": "RANK:POINT", "save": true, "group": [global ranks],
                      "fresh": true, "generate": {"ids": [[...]], "new_tokens": n}}, ...]}
Each step loads into the same module (a skeleton on meta made from the spec: the parameters and
buffers a TransformersModel of the checkpoint has, with its ties), so a failing step finds the
weights of the step before. The rank writes OUT/rank{R}.json (one entry per step) and, for steps
with "save", OUT/rank{R}.step{i}.pt (its tensors), then exits without tearing down the group (a
group broken by a dead rank may block in its destructor). A step with "generate" builds a
metaload.TransformersModel(ref, tp_size, process_group, source_rank=...) instead (broadcast mode
feeding the tensor-parallel forward) and records its greedy tokens.
"""
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import metaload


def skeleton(spec):
    """An nn.Module tree on meta with the spec's names, whole shapes, dtypes and ties."""
    root = torch.nn.Module()

    def owner(name):
        m = root
        parts = name.split(".")
        for p in parts[:-1]:
            if not hasattr(m, p) or not isinstance(getattr(m, p), torch.nn.Module):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        return m, parts[-1]

    made = {}
    for e in spec["tensors"]:
        t = made.get(e["tie"])
        if t is None:
            data = torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]), device="meta")
            t = torch.nn.Parameter(data, requires_grad=False) if e["param"] else data
            made[e["tie"]] = t
        m, leaf = owner(e["name"])
        if e["param"]:
            m.register_parameter(leaf, t)
        else:
            m.register_buffer(leaf, t, persistent=False)
    return root


def per_rank(value, rank):
    if isinstance(value, dict):
        return value.get(str(rank), value.get("*"))
    return value


def main():
    job = json.load(open(sys.argv[1]))
    rank = int(sys.argv[2])
    out = job["out"]
    results = []

    def flush():
        with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
            json.dump(results, f)
        os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))

    try:
        dist.init_process_group("gloo", init_method=f"tcp://{job['addr']}:{job['port']}",
                                rank=rank, world_size=job["world"],
                                timeout=datetime.timedelta(seconds=60))
        module = skeleton(json.load(open(job["skeleton"])))
        for i, step in enumerate(job["steps"]):
            if step.get("fresh"):  # a new skeleton, all on meta
                module = skeleton(json.load(open(job["skeleton"])))
            before = {n: t.clone() for n, t in module.state_dict().items() if not t.is_meta}
            fault = per_rank(step.get("fault", ""), rank) or ""
            if fault:
                os.environ["METALOAD_TEST_DIST_FAULT"] = fault
            else:
                os.environ.pop("METALOAD_TEST_DIST_FAULT", None)
            group = dist.group.WORLD
            if step.get("group"):  # a subgroup (every rank makes it; only its members load)
                group = dist.new_group(step["group"])
                if rank not in step["group"]:
                    results.append({"step": i, "ok": True, "skipped": True})
                    flush()
                    continue
            kw = dict(process_group=group, timeout=step.get("timeout", 20),
                      tp_size=per_rank(step.get("tp_size"), rank), progress=False)
            if step.get("source_rank") is not None:
                kw.update(source_rank=step["source_rank"], buffer_bytes=step.get("buffer_bytes", 0))
            t0 = time.monotonic()
            entry = {"step": i}
            try:
                if step.get("generate"):
                    kw.pop("timeout")
                    m = metaload.TransformersModel(
                        per_rank(step["ref"], rank), collective_timeout=step.get("timeout", 20),
                        **dict(kw, tp_size=kw["tp_size"] or dist.get_world_size(group)))
                    gen = step["generate"]
                    tokens = m.generate(torch.tensor(gen["ids"]), gen["new_tokens"])
                    r = m.dispatch()  # the broadcast's report
                    entry["tokens"] = tokens.tolist()
                else:
                    r = metaload.load_into(module, per_rank(step["ref"], rank), **kw)
                entry.update(ok=True, distributed=r.distributed._asdict(), bytes=r.bytes)
            except Exception as e:
                entry.update(ok=False, error_type=type(e).__name__,
                             is_distributed_error=isinstance(e, metaload.DistributedError),
                             is_metaload_error=isinstance(e, metaload.Error), message=str(e),
                             failures={str(k): v for k, v in getattr(e, "failures", {}).items()})
            entry["seconds"] = time.monotonic() - t0
            after = module.state_dict()
            entry["unchanged"] = all(n in after and not after[n].is_meta and
                                     torch.equal(after[n], t) for n, t in before.items()) and \
                len(before) == sum(not t.is_meta for t in after.values())
            entry["meta_left"] = sorted(n for n, t in after.items() if t.is_meta)
            if step.get("save") and entry["ok"]:
                torch.save({n: t.clone() for n, t in after.items()},
                           os.path.join(out, f"rank{rank}.step{i}.pt"))
            results.append(entry)
            flush()
            if not entry["ok"]:
                break  # the group may be broken now
        else:  # all went well: leave together (rank 0 holds the rendezvous store)
            dist.barrier()
    except Exception:
        results.append({"crash": traceback.format_exc()})
        flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
