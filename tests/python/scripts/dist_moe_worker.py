"""One rank of test_moe_load's process-group loads of a mixture-of-experts checkpoint.

    python dist_moe_worker.py CKPT OUT WORLD PORT RANK

Builds the checkpoint's transformers model on meta, then loads it twice across the gloo group with
transformers' own tp_plan (config.base_model_tp_plan): every rank reading its own slice, then rank
0 reading every rank's and sending it (source_rank=0). Writes OUT/rank{RANK}.{shared,broadcast}.pt
(the state_dict) and OUT/rank{RANK}.json (each load's bytes read), or the error.
"""
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import metaload  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def main():
    ckpt, out, world, port, rank = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    result = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        cfg = AutoConfig.from_pretrained(ckpt)
        for mode, kw in (("shared", {}), ("broadcast", {"source_rank": 0})):
            with metaload.meta():
                model = AutoModelForCausalLM.from_config(cfg)
            r = metaload.load_into(model, ckpt, process_group=dist.group.WORLD, tp_size=world,
                                   tp_plan=dict(cfg.base_model_tp_plan), timeout=30,
                                   progress=False, **kw)
            torch.save(model.state_dict(), os.path.join(out, f"rank{rank}.{mode}.pt"))
            result[mode] = {"bytes_read": r.distributed.bytes_read}
    except Exception:
        result["error"] = traceback.format_exc()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
