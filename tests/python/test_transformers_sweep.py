"""Every architecture transformers registers, built on meta from its config's defaults (real sizes).

For each model type of transformers' auto mappings (causal LM first; masked LM, seq2seq LM and
image classification as a second table), the config class's defaults are built with the auto
class's `from_config` three ways, each in the same worker process:
  (a) metaload.meta()            -- what is tested
  (b) with torch.device("meta")  -- torch 2.x's own way
  (c) accelerate's init_empty_weights()
One row per architecture: builds or the error, time, peak RSS growth (the process's high-water
mark, reset before each build through /proc/self/clear_refs), tensors not on meta. Asserted:
metaload builds every architecture that (b) or (c) builds, every parameter and buffer of each of
its builds is on meta, peak RSS growth under 64 MB each, and the count of builds never falls below
the floor.

transformers 5.x needs torch 2.x: on Debian's torch 1.13 this file is skipped (it says so).
transformers imports much at first use and keeps global state: the sweep runs in a subprocess,
this file run as a worker.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
AUTO_CLASS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}
ROUTES = ("metaload", "torch.device", "init_empty_weights")
RSS_LIMIT_MB = 64
BUILD_TIMEOUT_S = 10  # per build of a peer route; past it the build is recorded as failing
# (init_empty_weights makes raw nn.Parameters on the CPU first: Llama 4's experts take minutes). A
# peer's failure never fails the test, so the bound cannot turn a busy machine into a failure.
METALOAD_BUILD_TIMEOUT_S = 300  # metaload's own builds: a hang guard, not a speed claim (with the
# peers' 10 s, a build slowed down by a busy machine counted as an architecture metaload cannot
# build). How long the builds take is printed, not asserted; bench/peers keeps the figures.

# metaload's builds when this was written (transformers 5.17.0, torch 2.11), out of the
# architectures whose config class builds with its defaults: causal LM 162 of 176 (torch.device
# 162, init_empty_weights 155), masked LM 47 of 48, seq2seq LM 34 of 34, image classification 37
# of 42. Every failure there fails the other two routes as well (transformers' own defaults: a
# None that a constructor multiplies, a missing optional library). The count never falls.
FLOOR = {"causal-lm": 162, "masked-lm": 47, "seq2seq-lm": 34, "image-classification": 37}


# ---------------------------------------------------------------------------------------------
# The worker (a subprocess): builds each architecture three ways, writes one JSON row per build.

def _peak_rss_reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the high-water mark (VmHWM) to the current RSS


def _rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class _BuildTimeout(BaseException):  # not swallowed by a constructor's `except Exception`
    pass


def _limit(route):
    return METALOAD_BUILD_TIMEOUT_S if route == "metaload" else BUILD_TIMEOUT_S


def _alarm(limit):
    def on_alarm(signum, frame):
        raise _BuildTimeout(f"took over {limit} s")
    return on_alarm


def _worker(out_path, tasks):
    import signal
    import warnings
    warnings.filterwarnings("ignore")
    import logging
    import torch
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from accelerate import init_empty_weights
    import metaload
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)

    contexts = {"metaload": metaload.meta, "torch.device": lambda: torch.device("meta"),
                "init_empty_weights": init_empty_weights}
    rows = []
    for task in tasks:
        auto = getattr(transformers, AUTO_CLASS[task])
        names = getattr(modeling_auto, MAPPINGS[task])
        for model_type in sorted(names):
            row = {"task": task, "model_type": model_type}
            try:
                config = CONFIG_MAPPING[model_type]()
            except Exception as e:  # composite configs that need arguments, removed models
                row["config_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
                continue
            try:  # the model's module imported outside the timings (the first route would pay)
                auto._model_mapping[type(config)]
            except Exception:
                pass
            for route in ROUTES:
                model = None
                _peak_rss_reset()
                before = _rss_kb("VmRSS")
                start = time.perf_counter()
                signal.signal(signal.SIGALRM, _alarm(_limit(route)))
                signal.setitimer(signal.ITIMER_REAL, _limit(route))
                try:
                    with contexts[route]():
                        model = auto.from_config(config)
                    result = {"ok": True}
                except (Exception, _BuildTimeout) as e:
                    result = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                result["s"] = time.perf_counter() - start
                result["rss_mb"] = (_rss_kb("VmHWM") - before) / 1024
                if model is not None:
                    tensors = list(model.parameters()) + list(model.buffers())
                    result["tensors"] = len(tensors)
                    result["not_meta"] = sum(not t.is_meta for t in tensors)
                    result["params"] = sum(p.numel() for p in model.parameters())
                row[route] = result
                del model
            rows.append(row)
            sys.stderr.write(f"{task} {model_type}\n")
            sys.stderr.flush()
    with open(out_path, "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "rows": rows}, f)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2], sys.argv[3].split(","))
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# The test.

import pytest  # noqa: E402

from conftest import lib_path  # noqa: E402

transformers = pytest.importorskip(
    "transformers", reason="transformers 5.x (tools/requirements.txt) is installed in the torch "
    "2.x environment only: it needs torch >= 2")


def run_sweep(tasks, tmp_path):
    env = dict(os.environ)
    env["METALOAD_LIB"] = lib_path()
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HUB_OFFLINE"] = "1"  # no network at run time: configs come from their classes
    for k in ("METALOAD", "METALOAD_REPORT", "LD_PRELOAD"):
        env.pop(k, None)
    out = tmp_path / "sweep.json"
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(out),
                        ",".join(tasks)], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"the sweep worker failed (rc {r.returncode}):\n{r.stderr[-4000:]}"
    with open(out) as f:
        return json.load(f)


def report(data, task):
    rows = [r for r in data["rows"] if r["task"] == task and "config_error" not in r]
    print(f"\n{task}: transformers {data['transformers']}, torch {data['torch']}, "
          f"{len(rows)} architectures with default configs")
    print("| model_type | params | " + " | ".join(f"{r} (s, peak RSS MB, not on meta)"
                                                   for r in ROUTES) + " |")
    print("|---|---|" + "---|" * len(ROUTES))
    for row in rows:
        cells = []
        for route in ROUTES:
            res = row[route]
            cells.append(f"{res['s']:.2f} s, {res['rss_mb']:.1f}, {res['not_meta']}" if res["ok"]
                         else "fails: " + res["error"][:70].replace("|", "/"))
        params = next((row[r]["params"] for r in ROUTES if row[r]["ok"]), 0)
        print(f"| {row['model_type']} | {params / 1e9:.2f}B | " + " | ".join(cells) + " |")
    counts = {route: sum(r[route]["ok"] for r in rows) for route in ROUTES}
    print("builds: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return rows, counts


@pytest.mark.parametrize("task", list(MAPPINGS))
def test_every_architecture_builds_on_meta_under_metaload(task, tmp_path):
    data = run_sweep([task], tmp_path)
    rows, counts = report(data, task)
    behind = [r["model_type"] for r in rows if not r["metaload"]["ok"] and
              (r["torch.device"]["ok"] or r["init_empty_weights"]["ok"])]
    assert not behind, "built by torch.device('meta') or init_empty_weights, not by metaload: " + \
        "; ".join(f"{t}: {next(r for r in rows if r['model_type'] == t)['metaload']['error']}"
                  for t in behind)
    off_meta = [(r["model_type"], r["metaload"]["not_meta"]) for r in rows
                if r["metaload"]["ok"] and r["metaload"]["not_meta"]]
    assert not off_meta, f"tensors not on meta after a metaload build: {off_meta}"
    heavy = [(r["model_type"], round(r["metaload"]["rss_mb"], 1)) for r in rows
             if r["metaload"]["ok"] and r["metaload"]["rss_mb"] > RSS_LIMIT_MB]
    assert not heavy, f"peak RSS growth over {RSS_LIMIT_MB} MB: {heavy}"
    assert counts["metaload"] >= FLOOR[task], (counts, FLOOR[task])
