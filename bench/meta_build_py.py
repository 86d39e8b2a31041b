"""bench/meta_build (Python part): building a Python Llama-2-70B module tree with no weights.

The same tree (80 decoder layers of q/k/v/o, gate/up/down projections and two RMSNorms, an
embedding and an LM head: 805 modules, 70B parameters) built four ways in one run, interleaved:
  metaload.meta()                         -- the route measured
  torch.device("meta") (torch 2.x)        -- anchor; on 1.13, device="meta" to every constructor
  device="meta" to every constructor      -- the floor: no mode at all
  accelerate.init_empty_weights()         -- accelerate 1.15 on torch 2.x; on 1.13, 0.34.2 (the
                                             last for torch 1.x) from tools/setup's torch113-peers
Usage: meta_build_py.py [ROUNDS] [--nested] (--nested: the second table alone).
Median of N rounds (argv[1], default 7), wall-clock and this process's CPU time (on a shared
machine another job's load stretches the wall clock, not the CPU time); peak RSS growth next to
each (ru_maxrss of the process).
Target (issue 10): metaload.meta() <= 1.0x the torch.device anchor, <= 0.5x init_empty_weights.

A second table, "nested scopes": a torch.empty(1) call under 64 nested metaload.meta() scopes
against the same call under one (the anchor), per call, wall-clock and CPU time. meta() pushes no
Python mode, so depth should cost nothing (it was one Python mode per scope, 2x per level); this
was a timing assertion in tests/python/test_mode.py, which now checks that no Python runs.
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


def nested_scopes(rounds, depths=(1, 64), n=2000):
    """Per-call time of torch.empty(1) under each depth of nested meta() scopes, interleaved."""
    times = {d: [] for d in depths}
    cpu = {d: [] for d in depths}
    rss = {d: 0.0 for d in depths}
    for _ in range(rounds + 1):  # the first round is a warm-up
        for depth in depths:
            with contextlib.ExitStack() as stack:
                for _ in range(depth):
                    stack.enter_context(metaload.meta())
                assert torch.empty(1).is_meta
                before = rss_mib()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(n):
                    torch.empty(1)
                times[depth].append((time.perf_counter() - t0) / n)
                cpu[depth].append((time.process_time() - c0) / n)
                rss[depth] = max(rss[depth], rss_mib() - before)
    base = statistics.median(times[depths[0]][1:])
    cpu_base = statistics.median(cpu[depths[0]][1:])
    print(f"\nnested scopes: torch.empty(1) under N nested metaload.meta(), torch "
          f"{torch.__version__}, {n} calls, median of {rounds}")
    print("| scopes | us per call | x anchor | CPU us | x anchor (CPU) | peak RSS growth MiB |")
    print("|---|---|---|---|---|---|")
    for depth in depths:
        m, c = statistics.median(times[depth][1:]), statistics.median(cpu[depth][1:])
        name = f"{depth} (anchor)" if depth == depths[0] else str(depth)
        print(f"| {name} | {m * 1e6:.2f} | {m / base:.2f} | {c * 1e6:.2f} | {c / cpu_base:.2f} | "
              f"{rss[depth]:.1f} |")


if __name__ == "__main__":
    nested_only = "--nested" in sys.argv  # the second table alone
    sys.argv = [a for a in sys.argv if a != "--nested"]
    if not nested_only:
        main()
    nested_scopes(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
