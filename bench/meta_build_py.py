"""bench/meta_build (Python part): building a Python Llama-2-70B module tree with no weights.

The same tree (80 decoder layers of q/k/v/o, gate/up/down projections and two RMSNorms, an
embedding and an LM head: 805 modules, 70B parameters) built four ways in one run, interleaved:
  metaload.meta()                         -- the route measured
  torch.device("meta") (torch 2.x)        -- anchor; on 1.13, device="meta" to every constructor
  device="meta" to every constructor      -- the floor: no mode at all
  accelerate.init_empty_weights()         -- accelerate 1.15 on torch 2.x; on 1.13, 0.34.2 (the
                                             last for torch 1.x) from tools/setup's torch113-peers
Median of N rounds (argv[1], default 7), wall-clock and this process's CPU time (on a shared
machine another job's load stretches the wall clock, not the CPU time); peak RSS growth next to
each (ru_maxrss of the process).
Target (issue 10): metaload.meta() <= 1.0x the torch.device anchor, <= 0.5x init_empty_weights.
"""
import contextlib
import os
import resource
import subprocess
import statistics
import sys
import time

import torch
import torch.nn as nn

import metaload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, FF, LAYERS, HEADS, KV, VOCAB = 8192, 28672, 80, 64, 8, 32000


class RMSNorm(nn.Module):
    def __init__(self, d, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, device=device))


class Layer(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        hd = D // HEADS
        lin = lambda i, o: nn.Linear(i, o, bias=False, device=device)  # noqa: E731
        self.q_proj, self.k_proj = lin(D, D), lin(D, KV * hd)
        self.v_proj, self.o_proj = lin(D, KV * hd), lin(D, D)
        self.gate_proj, self.up_proj, self.down_proj = lin(D, FF), lin(D, FF), lin(FF, D)
        self.input_layernorm = RMSNorm(D, device)
        self.post_attention_layernorm = RMSNorm(D, device)


class Llama70B(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D, device=device)
        self.layers = nn.ModuleList(Layer(device) for _ in range(LAYERS))
        self.norm = RMSNorm(D, device)
        self.lm_head = nn.Linear(D, VOCAB, bias=False, device=device)


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch2 = hasattr(torch, "get_default_device")
    routes = {"metaload.meta()": (metaload.meta, None)}
    if torch2:
        routes['torch.device("meta") (anchor)'] = (lambda: torch.device("meta"), None)
    routes['device="meta" to every constructor'] = (contextlib.nullcontext, "meta")
    if not torch2:  # accelerate 1.x needs torch 2: tools/setup puts 0.34.2 in a folder of its own
        venv = subprocess.run([os.path.join(ROOT, "tools", "torch2_env")], capture_output=True,
                              text=True, check=True).stdout.strip()
        sys.path.append(os.path.join(os.path.dirname(venv), "torch113-peers"))
    try:
        from accelerate import init_empty_weights
        routes["accelerate.init_empty_weights()"] = (init_empty_weights, None)
    except ImportError:
        pass
    anchor = 'torch.device("meta") (anchor)' if torch2 else 'device="meta" to every constructor'
    for ctx, device in routes.values():  # warm-up: first-use costs (mode registration) excluded
        with ctx():
            Llama70B(device)
    times = {k: [] for k in routes}
    cpu = {k: [] for k in routes}
    rss = {k: 0.0 for k in routes}
    for _ in range(rounds):  # interleaved: the machine's noise hits every route alike
        for name, (ctx, device) in routes.items():
            before = rss_mib()
            t0, c0 = time.perf_counter(), time.process_time()
            with ctx():
                model = Llama70B(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            assert all(p.is_meta for p in model.parameters()), name
            rss[name] = max(rss[name], rss_mib() - before)
            del model
    n_modules = sum(1 for _ in Llama70B("meta").modules())
    base = statistics.median(times[anchor])
    cpu_base = statistics.median(cpu[anchor])
    print(f"Python Llama-2-70B tree ({n_modules} modules), torch {torch.__version__}, "
          f"median of {rounds}")
    print("| route | ms | x anchor | CPU ms | x anchor (CPU) | peak RSS growth MiB |")
    print("|---|---|---|---|---|---|")
    for name in routes:
        m, c = statistics.median(times[name]), statistics.median(cpu[name])
        print(f"| {name} | {m * 1e3:.1f} | {m / base:.2f} | {c * 1e3:.1f} | {c / cpu_base:.2f} | "
              f"{rss[name]:.1f} |")
    ours = statistics.median(cpu["metaload.meta()"])
    verdict = [f"metaload.meta() {ours / cpu_base:.2f}x the anchor (target <= 1.0: "
               f"{'met' if ours <= cpu_base else 'MISSED'})"]
    acc = cpu.get("accelerate.init_empty_weights()")
    if acc:
        r = ours / statistics.median(acc)
        verdict.append(f"{r:.2f}x init_empty_weights (target <= 0.5: "
                       f"{'met' if r <= 0.5 else 'MISSED'})")
    else:
        verdict.append("no init_empty_weights row: accelerate is not installed (tools/setup)")
    print("Targets (CPU time): " + "; ".join(verdict))


if __name__ == "__main__":
    main()
