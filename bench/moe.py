"""Mixture-of-experts checkpoints: metaload's meta build + load and scan against transformers'
own (issue 25's MoE table).

Two bf16 checkpoints of about 2 GB in the Hub's per-expert layout, as save_pretrained writes
them (written once under --dir and kept): a Mixtral-shaped one (8 experts, top-2) and a
Qwen3-MoE-shaped one (64 experts, top-8). Every case runs in a fresh process (nothing warm but
the page cache, which the first run fills), median of --runs:
  - from_pretrained: AutoModelForCausalLM.from_pretrained(dir, dtype=bfloat16), transformers'
    own merge of the per-expert tensors (the anchor of the load rows);
  - metaload copy:  the model built under metaload.meta(), then load_into(dir, mmap=False): every
    fused expert tensor assembled in its slot, each checkpoint tensor read once;
  - metaload mmap:  the same with mmap=True: what lies whole in the file is mapped, and the
    assembled experts too (views of the file's pages side by side, FileMapping::map_view);
  - meta builds: from_config under torch.device("meta") (the anchor) and under metaload.meta();
  - FakeTensorMode scan: the model built under FakeTensorMode, a forward of 1 x 128 tokens (the
    anchor of the scan rows); metaload.scan of the model built under metaload.meta(). Scans
    time the forward alone; builds and loads everything from the config to the model.
Printed per case: seconds, the anchor's time over it (> 1: faster than the anchor), the peak RSS
growth of the process during the case (VmHWM after it minus VmRSS before), and its ratio to the
anchor's. Targets (issue 25): load >= 2x from_pretrained with <= 0.5x its peak RSS growth; scan
>= 10x FakeTensorMode. torch 2.x with transformers 5 only.

    METALOAD_LIB=build/torch2/libmetaload.so PYTHONPATH=python \\
        ~/.cache/metaload/venv-torch2/bin/python bench/moe.py [--runs 3] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONFIGS = {
    # ~2.0 GB bf16: Mixtral-8x7B's proportions (I = 3.5 H), 10 layers.
    "mixtral": dict(model_type="mixtral", hidden_size=1024, intermediate_size=3584,
                    num_hidden_layers=10, num_attention_heads=16, num_key_value_heads=4,
                    num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                    max_position_embeddings=4096),
    # ~2.0 GB bf16: Qwen3-30B-A3B's proportions (64 small experts, top-8), 12 layers.
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=1024, intermediate_size=3072,
                      moe_intermediate_size=384, num_hidden_layers=12, num_attention_heads=16,
                      num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
                      vocab_size=32000, max_position_embeddings=4096, decoder_sparse_step=1,
                      mlp_only_layers=[]),
}
QUICK = dict(num_hidden_layers=2)  # --quick: the same shapes, two layers (a smoke run)

WORKER = r"""
import json, sys, time, warnings, logging
warnings.filterwarnings("ignore")

def kb(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))

import torch, transformers
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
from transformers import AutoConfig, AutoModelForCausalLM
case, d = sys.argv[1], sys.argv[2]
cfg = AutoConfig.from_pretrained(d)
cfg.dtype = torch.bfloat16
ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
if case.startswith("metaload"):
    import metaload
from torch._subclasses.fake_tensor import FakeTensorMode
# Scans time the forward alone (each side's model built first, outside the timing); builds and
# loads time everything from the config to the loaded model.
if case == "FakeTensorMode scan":
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
elif case == "metaload scan":
    with metaload.meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kb("VmRSS")
t0 = time.perf_counter()
check = None
if case == "from_pretrained":
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    check = model.model.layers[0].mlp.experts.gate_up_proj
elif case in ("metaload copy", "metaload mmap"):
    with metaload.meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    metaload.load_into(model, d, progress=False, mmap=case.endswith("mmap"))
    check = model.model.layers[0].mlp.experts.gate_up_proj
elif case == "device meta build":
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
elif case == "metaload meta build":
    with metaload.meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
elif case == "FakeTensorMode scan":
    with mode, torch.no_grad():
        out = model(ids).logits
elif case == "metaload scan":
    s = metaload.scan(model, ids)
    assert s[""].shape == (1, 128, cfg.vocab_size), s[""]
seconds = time.perf_counter() - t0
peak = kb("VmHWM")
ok = check is None or (not check.is_meta and check.dtype == torch.bfloat16)
print("RESULT " + json.dumps({"seconds": seconds, "growth_mib": (peak - before) / 1024, "ok": ok}))
"""


def write_checkpoint(name, root, quick):
    import torch
    import transformers
    kw = dict(CONFIGS[name], **(QUICK if quick else {}))
    d = os.path.join(root, name + ("-quick" if quick else ""))
    stamp = os.path.join(d, "bench-config.json")
    if os.path.exists(stamp) and json.load(open(stamp)) == kw:
        return d
    cfg = transformers.AutoConfig.for_model(**kw)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(d)  # the Hub's per-expert layout (save_original_format)
    with open(stamp, "w") as f:
        json.dump(kw, f)
    return d


def run_case(case, d):
    out = subprocess.run([sys.executable, "-c", WORKER, case, d], capture_output=True, text=True,
                         timeout=1800)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
    r = json.loads(line[-1][len("RESULT "):])
    if not r["ok"]:
        raise RuntimeError(f"{case}: the experts did not load")
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "metaload-bench-moe"))
    p.add_argument("--models", default=",".join(CONFIGS))
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    groups = [("device meta build", ["metaload meta build"]),
              ("from_pretrained", ["metaload copy", "metaload mmap"]),
              ("FakeTensorMode scan", ["metaload scan"])]
    print(f"bench/moe: median of {a.runs} fresh processes per case; ratios against the anchor "
          f"of the same run (> 1: faster / less memory than the anchor)")
    print(f"{'model':10} {'case':20} {'seconds':>8} {'speed':>7} {'peak RSS +MiB':>14} "
          f"{'RSS ratio':>9}")
    for name in a.models.split(","):
        d = write_checkpoint(name, a.dir, a.quick)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                   if f.endswith(".safetensors"))
        print(f"{name} ({size / 2**30:.2f} GiB bf16, per-expert layout)")
        for anchor, cases in groups:
            runs = {c: [run_case(c, d) for _ in range(a.runs)] for c in [anchor] + cases}
            med = {c: (statistics.median(r["seconds"] for r in rs),
                       statistics.median(r["growth_mib"] for r in rs)) for c, rs in runs.items()}
            t0, m0 = med[anchor]
            for c in [anchor] + cases:
                t, m = med[c]
                print(f"{'':10} {c:20} {t:8.3f} {t0 / t:6.2f}x {m:14.0f} "
                      f"{(m / m0 if m0 > 0 else float('nan')):8.2f}x")


if __name__ == "__main__":
    main()
