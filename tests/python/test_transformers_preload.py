"""An unmodified transformers program building Llama-2-70B from its config, switched onto meta from
outside (LD_PRELOAD + METALOAD=meta), against the same build inside torch.device("meta").

Asserted: every parameter and buffer on meta, the published parameter count, peak RSS growth of
the build under 16 MB. Printed (measured, not asserted: bench/peers keeps the figures): the time
of both routes, each in a fresh process.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, lib_path

pytest.importorskip("transformers", reason="transformers 5.x (tools/requirements.txt) is "
                    "installed in the torch 2.x environment only: it needs torch >= 2")

SCRIPT = os.path.join(ROOT, "tests", "python", "scripts", "build_from_config.py")
LLAMA_2_70B_PARAMS = 68_976_648_192  # ../shared/configs: the published count
ROUNDS = 1  # the figures with more rounds: bench/peers


def _run(config_dir, route, preload):
    env = {k: v for k, v in os.environ.items()
           if k not in ("METALOAD", "METALOAD_REPORT", "LD_PRELOAD", "PYTHONPATH")}
    env["HF_HUB_OFFLINE"] = "1"
    if preload:
        env.update(LD_PRELOAD=lib_path(), METALOAD="meta")
    r = subprocess.run([sys.executable, SCRIPT, config_dir, route], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_an_unmodified_program_builds_llama_2_70b_on_meta_under_ld_preload(tmp_path):
    shutil.copy(os.path.join(ROOT, "model", "families", "configs", "llama-2-70b.json"),
                tmp_path / "config.json")
    runs = {"LD_PRELOAD + METALOAD=meta": [], 'torch.device("meta")': []}
    for _ in range(ROUNDS):  # interleaved
        runs["LD_PRELOAD + METALOAD=meta"].append(_run(str(tmp_path), "none", preload=True))
        runs['torch.device("meta")'].append(_run(str(tmp_path), "torch.device", preload=False))
    for name, results in runs.items():
        for res in results:
            assert res["devices"] == ["meta"], (name, res)
            assert res["params"] == LLAMA_2_70B_PARAMS, (name, res)
    preload = runs["LD_PRELOAD + METALOAD=meta"]
    assert max(r["rss_mb"] for r in preload) < 16, preload
    anchor = min(r["s"] for r in runs['torch.device("meta")'])
    print(f"\nLlama-2-70B, AutoModelForCausalLM.from_config, best of {ROUNDS} (peak RSS growth, MB):")
    for name, results in runs.items():
        best = min(results, key=lambda r: r["s"])
        print(f"  {name}: {best['s'] * 1e3:.0f} ms ({best['s'] / anchor:.2f}x), "
              f"{max(r['rss_mb'] for r in results):.1f} MB")
