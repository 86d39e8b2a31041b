"""One rank of the distributed dequantizing load_into tests (tests/python/test_dist_dequant.py).

    python dist_dequant_worker.py JOB.json RANK

JOB.json: {"world": N, "port": p, "out": dir,
           "steps": [{"ref": path or {rank: path}, "kw": {load_into's keywords} or {rank: ...,
                      "*": ...} ("dequantize": a dtype name, "tp_plan": "PLAN": test_dequant's),
                      "bias": true, "fresh": true}, ...]}
Each step loads into the same module (test_dequant's Tiny on meta, every weight of its whole
shape), so a failing step finds the weights of the step before ("fresh": a new one). The rank
writes OUT/rank{R}.json (one entry per step) and OUT/rank{R}.step{i}.pt (its tensors) after each
load that worked, then leaves together with the others.
"""
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import metaload  # noqa: E402
from test_dequant import PLAN, meta_model  # noqa: E402


def per_rank(value, rank):
    if isinstance(value, dict) and ("*" in value or str(rank) in value):
        return value.get(str(rank), value.get("*"))
    return value


def keywords(kw):
    kw = dict(kw)
    if kw.get("dequantize"):
        kw["dequantize"] = getattr(torch, kw["dequantize"])
    if kw.get("tp_plan") == "PLAN":
        kw["tp_plan"] = PLAN
    return kw


def entry_of(step, i, module, rank):
    before = {n: t.clone() for n, t in module.state_dict().items() if not t.is_meta}
    entry = {"step": i}
    try:
        r = metaload.load_into(module, per_rank(step["ref"], rank), process_group=dist.group.WORLD,
                               timeout=20, progress=False, **keywords(per_rank(step["kw"], rank)))
        entry.update(ok=True, distributed=r.distributed._asdict(), bytes=r.bytes,
                     dequantized=sorted(r.dequantized_keys))
    except Exception as e:
        entry.update(ok=False, error_type=type(e).__name__, message=str(e),
                     rule=getattr(e, "rule", None),
                     failures={str(k): v for k, v in getattr(e, "failures", {}).items()})
    after = module.state_dict()
    entry["unchanged"] = all(not after[n].is_meta and torch.equal(after[n], t)
                             for n, t in before.items()) and \
        len(before) == sum(not t.is_meta for t in after.values())
    entry["meta_left"] = sorted(n for n, t in after.items() if t.is_meta)
    return entry


def main():
    job = json.load(open(sys.argv[1]))
    rank, out = int(sys.argv[2]), job["out"]
    results = []

    def flush():
        with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
            json.dump(results, f)
        os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank,
                                world_size=job["world"], timeout=datetime.timedelta(seconds=60))
        module = None
        for i, step in enumerate(job["steps"]):
            if module is None or step.get("fresh"):
                module = meta_model(bias=step.get("bias", True))
            entry = entry_of(step, i, module, rank)
            if entry["ok"]:
                torch.save({n: t.clone() for n, t in module.state_dict().items()},
                           os.path.join(out, f"rank{rank}.step{i}.pt"))
            results.append(entry)
            flush()
        dist.barrier()
    except Exception:
        results.append({"crash": traceback.format_exc()})
        flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
