"""bench/peers: metaload against every peer, side by side, in one run (issue 11).

Three tables, each a ratio against an anchor measured in the same run, peak RSS beside every time:
  1. meta build through transformers' AutoModelForCausalLM.from_config (Llama-2-70B, Llama-3.2-1B
     configs): metaload.meta(), torch.device("meta") (anchor), accelerate's init_empty_weights,
     nnsight's meta load (LanguageModel(dir, dispatch=False));
  2. scan, batch 8 x 1024 (GPT-2, Llama-3.2-1B configs): metaload.fake("cuda") forward and
     metaload.scan against torch's FakeTensorMode (anchor; op cache on, as torch ships it) and
     nnsight's scan. Target: metaload at least 10x faster than FakeTensorMode per forward;
  3. CPU load of one bf16 Llama-3.2-1B-shaped checkpoint (~2.5 GB; also written as a torch.save .pt
     and a tensorizer file, all cached under ~/.cache/metaload/bench-peers), warm and cold page
     cache: metaload.load_into copying and zero-copy, and metaload.load_file(mmap=True) (a dict,
     as safetensors' load_file), against safetensors, transformers,
     torch.load, fastsafetensors, runai-model-streamer and tensorizer. Every result's bytes are
     checked against the file.

Each case runs in a fresh process of its own (this file with --worker), so its peak RSS is its
own; rounds are interleaved across cases (the machine's noise hits every case alike) and the
figure is the median. Peak RSS growth is VmHWM after the case minus VmRSS before it, with the
high-water mark reset first (/proc/self/clear_refs). `--quick` runs tiny configs, one process per
table, for the smoke test. Needs torch 2.x and the peers (tools/requirements.txt).

    bench/run peers
    METALOAD_LIB=... PYTHONPATH=python $(tools/torch2_env)/bin/python bench/peers.py [--quick]
        [--chart bench/peers.png] [--rounds N] [--cache DIR] [--tables build,scan,load] [--no-cold]
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = os.path.join(ROOT, "model", "families", "configs")
MIB = 1024 * 1024
RESULT = "PEERS_RESULT "

# ---------------------------------------------------------------------------------------------
# Memory: per-case peak RSS from /proc/self/status, high-water mark reset before each case.


def _status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


class Rss:
    """Peak RSS growth of what runs between start() and stop(); also anonymous (fresh) memory."""

    def start(self):
        try:  # "5": reset the peak RSS to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        s = _status()
        self.base, self.anon = s["VmRSS"], s["RssAnon"]
        self.base_hwm = s["VmHWM"]

    def stop(self):
        s = _status()
        # Without the reset, the peak can be an earlier one (imports): then growth is a floor.
        self.peak = max(0, s["VmHWM"] - (self.base if self.reset else self.base_hwm))
        self.anon_growth = max(0, s["RssAnon"] - self.anon)
        return self.peak


# ---------------------------------------------------------------------------------------------
# Table 1: meta build through transformers.


def _silence():
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def nnsight_dir(cache, config_path):
    """A local model directory nnsight can open with no network: config.json and a tiny tokenizer
    (nnsight 0.8.1 builds a transformers pipeline around the meta model, which loads one)."""
    name = os.path.splitext(os.path.basename(config_path))[0]
    d = os.path.join(cache, "nnsight-" + name)
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    os.makedirs(d, exist_ok=True)
    with open(config_path) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="</s>").save_pretrained(d)
    return d


BUILD_ROUTES = ["metaload.meta()", 'torch.device("meta") (anchor)',
                "accelerate.init_empty_weights()", "nnsight LanguageModel(dispatch=False)"]


def case_build(spec):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    route = spec["route"]
    cfg = AutoConfig.from_pretrained(spec["config"])
    if route.startswith("nnsight"):
        import nnsight
        d = nnsight_dir(spec["cache"], spec["config"])

        def build():
            return nnsight.LanguageModel(d, dispatch=False)._module
    else:
        if route.startswith("metaload"):
            import metaload
            ctx = metaload.meta
        elif route.startswith("torch.device"):
            ctx = lambda: torch.device("meta")  # noqa: E731
        else:
            from accelerate import init_empty_weights as ctx

        def build():
            with ctx():
                return AutoModelForCausalLM.from_config(cfg)
    build()  # warm-up: imports and first-use costs excluded
    times, rss = [], Rss()
    rss.start()
    for _ in range(spec["reps"]):
        t0 = time.perf_counter()
        model = build()
        times.append(time.perf_counter() - t0)
        params = list(model.parameters())
        bad = [n for n, p in model.named_parameters() if not p.is_meta]
        if bad:
            raise SystemExit(f"{route}: {len(bad)} tensors not on meta, e.g. {bad[0]}")
        del model
    rss.stop()
    n_params = sum(p.numel() for p in params)
    return {"s": statistics.median(times), "rss": rss.peak, "params": n_params}


# ---------------------------------------------------------------------------------------------
# Table 2: scan.

SCAN_ROUTES = ["torch FakeTensorMode (anchor)", 'metaload.fake("cuda") forward',
               "metaload.scan (every module's output)", "nnsight scan"]


def case_scan(spec):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    route, b, s = spec["route"], spec["batch"], spec["seq"]
    cfg = AutoConfig.from_pretrained(spec["config"])
    d = nnsight_dir(spec["cache"], spec["config"]) if route.startswith("nnsight") else None
    rss = Rss()
    rss.start()
    if route.startswith("torch FakeTensorMode"):
        from torch._subclasses import FakeTensorMode
        with FakeTensorMode() as mode:  # as torch ships it: its op cache on
            model = AutoModelForCausalLM.from_config(cfg)
            ids = torch.zeros(b, s, dtype=torch.long)

        def run():
            with torch.no_grad(), mode:
                return model(ids).logits.shape
    elif route.startswith("nnsight"):
        import nnsight
        lm = nnsight.LanguageModel(d, dispatch=False)
        ids = torch.zeros(b, s, dtype=torch.long)

        def run():
            with lm.scan(ids):
                shape = nnsight.save(lm.lm_head.output.shape)
            return shape
    else:
        import metaload
        with metaload.meta():
            model = AutoModelForCausalLM.from_config(cfg)
        ids = torch.zeros(b, s, dtype=torch.long, device="meta")
        if route.startswith("metaload.fake"):
            def run():
                with torch.no_grad(), metaload.fake("cuda"):
                    out = model(ids).logits
                assert out.device.type == "cuda"
                return out.shape
        else:
            def run():
                sc = metaload.scan(model, ids, device="cuda")
                assert len(sc) > 10
                return sc["lm_head"].shape
    shape = run()  # warm-up
    if tuple(shape) != (b, s, cfg.vocab_size):
        raise SystemExit(f"{route}: logits {tuple(shape)}, expected {(b, s, cfg.vocab_size)}")
    times = []
    for _ in range(spec["reps"]):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    rss.stop()
    return {"s": statistics.median(times), "rss": rss.peak}


# ---------------------------------------------------------------------------------------------
# Table 3: CPU load. The checkpoint, its .pt and tensorizer copies, and the byte checks.


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def digest(data):
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_checks(path):
    """A few tensors' checksums read straight from the file: small ones whole, the largest by
    its first and last 4 MiB, across the file (first, middle, last tensors by offset)."""
    start, header = safetensors_header(path)
    by_offset = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    picks = {by_offset[0][0], by_offset[len(by_offset) // 2][0], by_offset[-1][0],
             max(header, key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])}
    picks |= {k for k in header if k.endswith("norm.weight")}
    checks = []
    with open(path, "rb") as f:
        for name in sorted(picks):
            a, b = header[name]["data_offsets"]
            spans = [(0, b - a)] if b - a <= 16 * MIB else [(0, 4 * MIB), (b - a - 4 * MIB, b - a)]
            for lo, hi in spans:
                f.seek(start + a + lo)
                checks.append([name, lo, hi, digest(f.read(hi - lo))])
    shapes = {k: [v["dtype"], v["shape"]] for k, v in header.items()}
    return {"checks": checks, "shapes": shapes, "bytes": sum(
        v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())}


ST_DTYPES = {"BF16": "torch.bfloat16", "F16": "torch.float16", "F32": "torch.float32"}


def verify(tensors, want):
    """The loaded tensors hold the file's bytes: names, dtypes, shapes, and the checksums."""
    import torch
    for name, (dt, shape) in want["shapes"].items():
        t = tensors.get(name)
        if t is None:
            return f"{name} missing"
        if str(t.dtype) != ST_DTYPES.get(dt, dt) or list(t.shape) != shape:
            return f"{name}: {t.dtype} {list(t.shape)}, file {dt} {shape}"
    for name, lo, hi, d in want["checks"]:
        raw = tensors[name].detach().contiguous().reshape(-1).view(torch.uint8)[lo:hi]
        if digest(raw.numpy().tobytes()) != d:
            return f"{name} bytes [{lo}, {hi}) differ from the file"
    return ""


def mapped_fraction(tensors, files):
    """Share of the tensors' bytes that lie in mappings of the checkpoint files (zero-copy)."""
    ranges = []
    real = {os.path.realpath(f) for f in files}
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split(maxsplit=5)
            if len(p) == 6 and p[5].strip() in real:
                a, b = (int(x, 16) for x in p[0].split("-"))
                ranges.append((a, b))
    total = inside = 0
    seen = set()
    for t in tensors.values():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        n = t.numel() * t.element_size()
        total += n
        if any(a <= t.data_ptr() < b for a, b in ranges):
            inside += n
    return inside / total if total else 0.0


def touch_pages(tensors):
    """Reads one byte of every 4 KiB page of every tensor: a lazily mapped load pays its page
    faults here, a copying one already has. Returns seconds."""
    import torch
    t0 = time.perf_counter()
    acc = 0
    for t in tensors.values():
        flat = t.detach().reshape(-1).view(torch.uint8)
        acc += int(flat[::4096].sum())
    return time.perf_counter() - t0


# name, result kind, the file it reads
LOAD_ROUTES = [
    ("metaload.load_into, copying (mmap=False)", "safetensors"),
    ("metaload.load_into, zero-copy (mmap=True)", "safetensors"),
    ("metaload.load_file, zero-copy (mmap=True)", "safetensors"),
    ("safetensors.torch.load_file", "safetensors"),
    ("safetensors.torch.load_model (into to_empty(cpu))", "safetensors"),
    ("safetensors.torch.load_file + load_state_dict(assign=True)", "safetensors"),
    ("transformers from_pretrained(dtype=bf16)", "safetensors"),
    ("torch.load(mmap=True)", "pt"),
    ("torch.load(mmap=True) + load_state_dict(assign=True)", "pt"),
    ("torch.load(mmap=False)", "pt"),
    ("fastsafetensors fastsafe_open(cpu, nogds=True)", "safetensors"),
    ("runai-model-streamer SafetensorsStreamer", "safetensors"),
    ("tensorizer TensorDeserializer(device=cpu)", "tensorizer"),
]
ZERO_COPY_ANCHOR = "safetensors.torch.load_file"
# The same mmap-backed load, into a model built on meta as metaload's rows build one.
ZERO_COPY_MODEL_ANCHOR = "safetensors.torch.load_file + load_state_dict(assign=True)"


def _meta_model(d):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def case_load(spec):
    import torch
    route, d = spec["route"], spec["dir"]
    st, pt, tz = (spec["files"][k] for k in ("safetensors", "pt", "tensorizer"))
    if route.startswith("metaload"):
        import metaload
        from transformers import AutoConfig, AutoModelForCausalLM
        cfg = AutoConfig.from_pretrained(d)
    elif route.startswith("safetensors"):
        import safetensors.torch
    elif route.startswith("transformers"):
        from transformers import AutoModelForCausalLM
    elif route.startswith("fastsafetensors"):
        import fastsafetensors
    elif route.startswith("runai"):
        from runai_model_streamer import SafetensorsStreamer
    elif route.startswith("tensorizer"):
        from tensorizer import TensorDeserializer
    # Imports and first uses excluded, as for every peer: the model class's module, and
    # metaload's mode (its first scope registers it).
    if route.startswith(("metaload", "safetensors.torch.load_model", "torch.load(mmap=True) +",
                         "transformers", "safetensors.torch.load_file +")):
        _meta_model(d)
    if route.startswith("metaload"):
        with metaload.meta():
            AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # The page cache, just before the case: warm, the file it reads is wholly cached (read
    # again if another job pushed it out); cold, every file of the checkpoint evicted, and how
    # much of the one it reads is still cached measured (mincore) rather than assumed.
    path = spec["files"][dict(LOAD_ROUTES)[route]]
    resident = None
    if spec["cold"]:
        for f in spec["files"].values():
            evict(f)
        resident = resident_fraction(path)
    else:
        frac = resident_fraction(path)
        if frac is None or frac < 0.99:
            read_through(path)
    keep = []  # what must stay alive for the tensors (loaders, streamers)
    rss = Rss()
    rss.start()
    t0 = built = time.perf_counter()
    if route.startswith("metaload.load_file"):  # a dict of tensors, as safetensors' load_file
        sd = metaload.load_file(st, mmap=True)
    elif route.startswith("metaload"):
        with metaload.meta():
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        built = time.perf_counter()
        metaload.load_into(model, d, mmap="zero-copy" in route, progress=False)
        sd = model.state_dict()
    elif route == "safetensors.torch.load_file":
        sd = safetensors.torch.load_file(st)
    elif route.startswith("safetensors.torch.load_file +"):
        model = _meta_model(d)
        built = time.perf_counter()
        model.load_state_dict(safetensors.torch.load_file(st), assign=True, strict=False)
        model.tie_weights()  # lm_head is tied, not in the file
        sd = model.state_dict()
    elif route.startswith("safetensors.torch.load_model"):
        model = _meta_model(d).to_empty(device="cpu")
        built = time.perf_counter()
        safetensors.torch.load_model(model, st, strict=False)  # lm_head is tied, not in the file
        sd = model.state_dict()
    elif route.startswith("transformers"):
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        sd = model.state_dict()
    elif route == "torch.load(mmap=True)":
        sd = torch.load(pt, mmap=True, weights_only=True)
    elif route.startswith("torch.load(mmap=True) +"):
        model = _meta_model(d)
        built = time.perf_counter()
        model.load_state_dict(torch.load(pt, mmap=True, weights_only=True), assign=True,
                              strict=False)
        model.tie_weights()
        sd = model.state_dict()
    elif route == "torch.load(mmap=False)":
        sd = torch.load(pt, mmap=False, weights_only=True)
    elif route.startswith("fastsafetensors"):
        with fastsafetensors.fastsafe_open([st], device="cpu", nogds=True) as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}
    elif route.startswith("runai"):
        sd = {}
        with SafetensorsStreamer() as s:
            s.stream_file(st)
            for k, t in s.get_tensors():
                sd[k] = t
    elif route.startswith("tensorizer"):
        des = TensorDeserializer(tz, device="cpu")
        sd = dict(des.items())
        keep.append(des)
    else:
        raise SystemExit(f"unknown route {route!r}")
    seconds = time.perf_counter() - t0
    rss.stop()
    files = {"safetensors": [st], "pt": [pt], "tensorizer": [tz]}[dict(LOAD_ROUTES)[route]]
    mapped = mapped_fraction(sd, files)
    touch = touch_pages(sd)
    error = verify(sd, spec["want"])
    return {"s": seconds, "build": built - t0, "rss": rss.peak, "resident": resident,
            "anon": rss.anon_growth, "mapped": mapped,
            "touch": touch, "error": error}


def prepare_checkpoint(cache, config):
    """The bf16 checkpoint (metaload's make-checkpoint), a torch.save .pt and a tensorizer file
    of the same tensors; written once and reused while the safetensors file is unchanged."""
    import torch
    import metaload
    d = os.path.join(cache, f"{config}-bf16")
    st = os.path.join(d, "model.safetensors")
    if not os.path.exists(st):
        print(f"writing {d} (metaload make-checkpoint --arch llama --config {config} "
              "--dtype bfloat16) ...", file=sys.stderr, flush=True)
        metaload.make_checkpoint(d, config=config, arch="llama", dtype="bfloat16")
    stamp = f"{os.path.getsize(st)}:{os.stat(st).st_mtime_ns}"
    pt, tz = os.path.join(cache, f"{config}-bf16.pt"), os.path.join(cache, f"{config}-bf16.tensors")
    marker = os.path.join(cache, f"{config}-bf16.stamp")
    old = open(marker).read() if os.path.exists(marker) else ""
    if old != stamp or not (os.path.exists(pt) and os.path.exists(tz)):
        import safetensors.torch
        from tensorizer import TensorSerializer
        print(f"writing {pt} and {tz} ...", file=sys.stderr, flush=True)
        sd = safetensors.torch.load_file(st)
        torch.save(sd, pt + ".part")
        os.replace(pt + ".part", pt)
        ser = TensorSerializer(tz + ".part")
        ser.write_state_dict(sd)
        ser.close()
        os.replace(tz + ".part", tz)
        with open(marker, "w") as f:
            f.write(stamp)
    return d, {"safetensors": st, "pt": pt, "tensorizer": tz}


def resident_fraction(path):
    """Share of the file in the page cache, from mincore (util-linux fincore); None if unknown."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", path],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return int(out.split()[0]) / max(1, os.path.getsize(path))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_through(path):
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 * MIB)
        while f.readinto(buf):
            pass


# ---------------------------------------------------------------------------------------------
# Table 4: nnsight's life of a model -- meta build, scan, dispatch -- on its own, with
# metaload.enable_nnsight(), and metaload's own TransformersModel, on the table-3 checkpoint.

NN_ROUTES = ["nnsight LanguageModel (anchor)", "nnsight + metaload.enable_nnsight()",
             "metaload.TransformersModel"]


def nnsight_checkpoint(cache, d, config_path):
    """The table-3 checkpoint with the tiny tokenizer nnsight's pipeline needs beside it."""
    tok = nnsight_dir(cache, config_path)
    for f in os.listdir(tok):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            if not os.path.exists(os.path.join(d, f)):
                shutil.copy(os.path.join(tok, f), os.path.join(d, f))
    return d


def case_nnsight(spec):
    import torch
    route, b, s = spec["route"], spec["batch"], spec["seq"]
    d = spec["dir"]
    rss = Rss()
    rss.start()
    t0 = time.perf_counter()
    if route.startswith("metaload.TransformersModel"):
        import metaload
        model = metaload.TransformersModel(d, progress=False, dtype=torch.bfloat16)  # as stored
        built = time.perf_counter()
        model.scan(batch=b, seq=s)
        scanned = time.perf_counter()
        model.dispatch()
        module_params = model.named_parameters()
    else:
        import nnsight
        if "enable_nnsight" in route:
            import metaload
            metaload.enable_nnsight()
        lm = nnsight.LanguageModel(d, dispatch=False)
        built = time.perf_counter()
        ids = torch.zeros(b, s, dtype=torch.long)
        with lm.scan(ids):
            nnsight.save(lm.lm_head.output.shape)
        scanned = time.perf_counter()
        lm.dispatch()
        module_params = dict(lm._module.named_parameters())
        if "enable_nnsight" in route:
            metaload.disable_nnsight()  # --quick runs every case in one process
    done = time.perf_counter()
    rss.stop()
    on_meta = [n for n, p in module_params.items() if p.is_meta]
    if on_meta:
        raise SystemExit(f"{route}: {len(on_meta)} parameters still on meta, e.g. {on_meta[0]}")
    return {"s": done - t0, "build": built - t0, "scan": scanned - built, "dispatch": done - scanned,
            "rss": rss.peak, "anon": rss.anon_growth}


# ---------------------------------------------------------------------------------------------
# Driver: fresh processes, interleaved rounds, tables, chart.

CASES = {"build": case_build, "scan": case_scan, "load": case_load, "nnsight": case_nnsight}


def worker(specs):
    _silence()
    for spec in specs:
        try:
            out = CASES[spec["table"]](spec)
        except BaseException as e:  # a peer that fails is a row with its error, not a crash
            out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]}
        print(RESULT + json.dumps({"id": spec["id"], **out}), flush=True)


def launch(specs):
    """Runs the specs in one fresh process of this file; returns {id: result}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(specs)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    got = {}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT):
            r = json.loads(line[len(RESULT):])
            got[r.pop("id")] = r
    for s in specs:
        if s["id"] not in got:
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            got[s["id"]] = {"error": f"worker exited {p.returncode}: {tail}"[:160]}
    return got


def run_cases(specs, rounds, quick):
    """Every spec `rounds` times, interleaved (the specs' order, round after round), each in a
    fresh process; in quick mode one process runs them all (imports paid once)."""
    results = {s["id"]: [] for s in specs}
    for _ in range(rounds):
        if quick:
            for k, v in launch(specs).items():
                results[k].append(v)
            continue
        for s in specs:
            results[s["id"]].append(launch([s])[s["id"]])
    return results


def summarize(runs):
    """Median time and peak RSS over the rounds; the first error if any round failed."""
    errors = [r["error"] for r in runs if r.get("error")]
    ok = [r for r in runs if not r.get("error") and "s" in r]
    if not ok:
        return {"error": errors[0] if errors else "no result"}
    out = {k: statistics.median(r[k] for r in ok) for k in ok[0]
           if isinstance(ok[0][k], (int, float)) and not isinstance(ok[0][k], bool)
           and k != "resident"}
    out["rss"] = max(r["rss"] for r in ok)
    known = [r["resident"] for r in ok if r.get("resident") is not None]
    if known:
        out["resident"] = max(known)
    if errors:
        out["error"] = errors[0]
    return out


def fmt_ms(s):
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


def specs_build(args, cfgs):
    return [{"table": "build", "id": f"build|{cfg}|{route}",
             "config": os.path.join(CONFIGS, cfg + ".json"), "cache": args.cache, "route": route,
             "reps": args.reps} for cfg in cfgs for route in BUILD_ROUTES]


def render_build(args, cfgs, res):
    rows = []
    lines = [f"### 1. Meta build: AutoModelForCausalLM.from_config, median of {args.rounds} "
             f"process(es) x {args.reps} build(s)", "",
             "| config | route | ms | x anchor | peak RSS growth MiB |", "|---|---|---|---|---|"]
    for cfg in cfgs:
        sums = {r: summarize(res[f"build|{cfg}|{r}"]) for r in BUILD_ROUTES}
        anchor = sums[BUILD_ROUTES[1]].get("s")
        for r in BUILD_ROUTES:
            s = sums[r]
            if "s" not in s:
                lines.append(f"| {cfg} | {r} | failed: {s['error']} | | |")
                rows.append((cfg, r, None, None, None))
                continue
            ratio = s["s"] / anchor if anchor else float("nan")
            lines.append(f"| {cfg} | {r} | {fmt_ms(s['s'])} | {ratio:.2f} | {s['rss'] / MIB:.1f} |")
            rows.append((cfg, r, s["s"], ratio, s["rss"]))
    lines.append("")
    lines.append("nnsight's row is its whole meta load: reading config.json and the tokenizer "
                 "from the directory and wrapping the meta model in a pipeline; the other rows are "
                 "given the config object.")
    return lines, rows


def specs_scan(args, cfgs, batch, seq):
    return [{"table": "scan", "id": f"scan|{cfg}|{route}",
             "config": os.path.join(CONFIGS, cfg + ".json"), "cache": args.cache, "route": route,
             "reps": args.reps, "batch": batch, "seq": seq}
            for cfg in cfgs for route in SCAN_ROUTES]


def render_scan(args, cfgs, batch, seq, res):
    rows, missed = [], []
    lines = [f"### 2. Scan, batch {batch} x {seq}, per forward, median of {args.rounds} "
             f"process(es) x {args.reps} forward(s)", "",
             "| config | route | ms | x anchor | speed-up | peak RSS growth MiB |",
             "|---|---|---|---|---|---|"]
    for cfg in cfgs:
        sums = {r: summarize(res[f"scan|{cfg}|{r}"]) for r in SCAN_ROUTES}
        anchor = sums[SCAN_ROUTES[0]].get("s")
        for r in SCAN_ROUTES:
            s = sums[r]
            if "s" not in s:
                lines.append(f"| {cfg} | {r} | failed: {s['error']} | | | |")
                rows.append((cfg, r, None, None, None))
                continue
            ratio = s["s"] / anchor if anchor else float("nan")
            lines.append(f"| {cfg} | {r} | {fmt_ms(s['s'])} | {ratio:.3f} | {1 / ratio:.1f}x | "
                         f"{s['rss'] / MIB:.1f} |")
            rows.append((cfg, r, s["s"], ratio, s["rss"]))
            if r.startswith("metaload") and not ratio <= 0.1:
                missed.append(f"{cfg}: {r} {1 / ratio:.1f}x")
    lines.append("")
    lines.append("Target: metaload at least 10x faster than FakeTensorMode per forward" +
                 (" (stated for the full sizes; --quick runs tiny ones)" if args.quick else "") +
                 ": " + ("met" if not missed else "MISSED (" + "; ".join(missed) + ")") + ". "
                 "FakeTensorMode fakes cpu (model built under it); metaload fakes cuda (model "
                 "built under metaload.meta()); nnsight's row is a whole `with model.scan(ids)` "
                 "block reading lm_head's output shape.")
    return lines, rows


def specs_load(args, config):
    d, files = prepare_checkpoint(args.cache, config)
    want = file_checks(files["safetensors"])
    for f in files.values():  # warm: every file read once first
        read_through(f)
    modes = ["warm"] + ([] if args.no_cold else ["cold"])
    # warm rounds first (interleaved over routes), then cold ones: the specs' order
    return [{"table": "load", "id": f"load|{m}|{r}", "route": r, "dir": d, "files": files,
             "want": want, "cold": m == "cold", "mode": m} for m in modes for r, _ in LOAD_ROUTES]


def render_load(args, config, specs, res):
    want = specs[0]["want"]
    gb = want["bytes"] / 1e9
    modes = ["warm"] + ([] if args.no_cold else ["cold"])
    lines = [f"### 3. CPU load of one bf16 {config}-shaped checkpoint ({gb:.2f} GB, "
             f"{len(want['shapes'])} tensors), median of {args.rounds} fresh process(es)", "",
             "| cache | route | backing | s | of which model build s | GB/s | x anchor | anchor | "
             "peak RSS growth MiB | fresh (anon) MiB | then touch every page, s | "
             "load + touch s | x anchor (load + touch) | bytes checked |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows, targets, notes = [], [], []
    for m in modes:
        sums = {r: summarize(res[f"load|{m}|{r}"]) for r, _ in LOAD_ROUTES}
        backing = {}
        for r, s in sums.items():
            if "mapped" in s:
                backing[r] = ("zero-copy (mmap)" if s["mapped"] > 0.99 else
                              "copy" if s["mapped"] < 0.01 else f"{s['mapped'] * 100:.0f}% mapped")
            if m == "cold" and "s" in s:
                if s.get("resident") is None:
                    notes.append(f"cold {r}: residency unknown (fincore failed): "
                                 "eviction unchecked")
                elif s["resident"] > 0.05:
                    notes.append(f"cold {r}: eviction did not take ({s['resident'] * 100:.0f}% of "
                                 "the file still in the page cache)")
        copy_peers = [r for r in sums if backing.get(r) == "copy" and not r.startswith("metaload")
                      and "s" in sums[r] and not sums[r].get("error")]
        fastest = min(copy_peers, key=lambda r: sums[r]["s"]) if copy_peers else None
        for r, _ in LOAD_ROUTES:
            s = sums[r]
            if "s" not in s:
                lines.append(f"| {m} | {r} | | failed: {s['error']} | | | | | | | | | | |")
                rows.append((m, r, None, None, None))
                continue
            anchor = ZERO_COPY_ANCHOR if backing[r] != "copy" else fastest
            a = sums.get(anchor, {}).get("s") if anchor else None
            ratio = s["s"] / a if a else float("nan")
            a_t = a + sums[anchor]["touch"] if a else None
            ratio_t = (s["s"] + s["touch"]) / a_t if a_t else float("nan")
            check = "ok" if not s.get("error") else "WRONG: " + s["error"]
            build = f"{s['build']:.3f}" if s["build"] > 0 else "-"
            lines.append(f"| {m} | {r} | {backing[r]} | {s['s']:.3f} | {build} | "
                         f"{gb / s['s']:.2f} | {ratio:.2f} | {anchor or '-'} | "
                         f"{s['rss'] / MIB:.0f} | {s['anon'] / MIB:.0f} | {s['touch']:.3f} | "
                         f"{s['s'] + s['touch']:.3f} | {ratio_t:.2f} | {check} |")
            rows.append((m, r, s["s"], ratio, s["rss"]))
            if r.startswith("metaload"):
                ok = not s.get("error")
                verdict = f"{ratio:.2f}x ({'met' if ok and ratio <= 1.0 else 'MISSED'})"
                if backing[r] != "copy":  # a lazy mapping pays at first touch: both figures
                    verdict += (f", load + touch {ratio_t:.2f}x "
                                f"({'met' if ok and ratio_t <= 1.0 else 'MISSED'})")
                    b = sums.get(ZERO_COPY_MODEL_ANCHOR, {})
                    if "s" in b and "load_into" in r:  # into a model: the build on both sides
                        r_m = s["s"] / b["s"]
                        r_mt = (s["s"] + s["touch"]) / (b["s"] + b["touch"])
                        verdict += (f"; against {ZERO_COPY_MODEL_ANCHOR} (into a model built on "
                                    f"meta, as this row): {r_m:.2f}x "
                                    f"({'met' if ok and r_m <= 1.0 else 'MISSED'}), load + touch "
                                    f"{r_mt:.2f}x ({'met' if ok and r_mt <= 1.0 else 'MISSED'})")
                targets.append(f"{m}: {r} against {anchor}: {verdict}")
        if m == "cold" and not any("eviction" in n for n in notes):
            notes.append("cold: eviction took for every case (mincore: at most 5% of the file "
                         "cached after posix_fadvise(DONTNEED))")
    lines.append("")
    lines.append("Targets: the copying load at least as fast as the fastest copying peer (anchor "
                 "of the copy rows); the zero-copy load at least as fast as safetensors' own "
                 "mmap-backed load, load_file (safe_open maps the file with "
                 "torch.UntypedStorage.from_file, copy-on-write, and its tensors are views of "
                 "that mapping: anchor of the mapped rows). " + "; ".join(targets) + ".")
    lines.append("A zero-copy load that maps lazily does no I/O in the call and pays its page "
                 "faults at first use; one that populates its mapping pays them in the call: "
                 "'then touch every page' (one byte per 4 KiB page of every tensor, after the "
                 "load) and 'load + touch' compare what each costs until every byte is usable. "
                 "Peak RSS counts mapped file pages once touched (shared with the page cache, no "
                 "fresh memory); 'fresh (anon)' is the anonymous memory the load added.")
    lines.append("Backing is measured: the share of the result's bytes inside mappings of the "
                 "file (/proc/self/maps). Rows that return a model include building it (on meta); "
                 "load_model's includes to_empty(cpu). No peer lacks a CPU path: fastsafetensors "
                 "without GDS (nogds=True) reads with pread into a bounce buffer; "
                 "runai-model-streamer and tensorizer deliver CPU tensors.")
    lines += notes
    return lines, rows


def specs_nnsight(args, config, batch, seq):
    d, files = prepare_checkpoint(args.cache, config)
    d = nnsight_checkpoint(args.cache, d, os.path.join(CONFIGS, config + ".json"))
    read_through(files["safetensors"])  # warm page cache, as table 3's warm rows
    return [{"table": "nnsight", "id": f"nnsight|{r}", "route": r, "dir": d, "batch": batch,
             "seq": seq} for r in NN_ROUTES]


def render_nnsight(args, config, batch, seq, res):
    lines = [f"### 4. nnsight's life of a model on the table-3 checkpoint ({config}, bf16): meta "
             f"build, scan ({batch} x {seq}), dispatch to cpu; one fresh process per route, median "
             f"of {args.rounds}", "",
             "| config | route | s | x anchor | build ms | scan ms | dispatch s | "
             "peak RSS growth MiB | fresh (anon) MiB |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    sums = {r: summarize(res[f"nnsight|{r}"]) for r in NN_ROUTES}
    anchor = sums[NN_ROUTES[0]].get("s")
    for r in NN_ROUTES:
        x = sums[r]
        if "s" not in x:
            lines.append(f"| {config} | {r} | failed: {x['error']} | | | | | | |")
            rows.append((config, r, None, None, None))
            continue
        ratio = x["s"] / anchor if anchor else float("nan")
        lines.append(f"| {config} | {r} | {x['s']:.3f} | {ratio:.2f} | {fmt_ms(x['build'])} | "
                     f"{fmt_ms(x['scan'])} | {x['dispatch']:.3f} | {x['rss'] / MIB:.0f} | "
                     f"{x['anon'] / MIB:.0f} |")
        rows.append((config, r, x["s"], ratio, x["rss"]))
    lines.append("")
    lines.append("nnsight's own dispatch builds the model a second time with from_pretrained (which "
                 "maps the file when the dtype matches, lazily: its pages are read at first use); "
                 "with metaload.enable_nnsight() the skeleton built under metaload.meta() "
                 "receives the weights by load_into, mapped too (mmap=True, its default: the "
                 "pages the page cache lacks are read during the call, the rest mapped), and its "
                 "scan runs on metaload.fake(). TransformersModel is metaload's own model "
                 "layer on the same directory (bf16 as stored; its scan runs in C++; a local "
                 "directory's weights are copied). Build times of the nnsight rows include "
                 "transformers' pipeline imports (each route runs in a fresh process).")
    return lines, rows


def chart(path, tables):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [t for t in tables if t[1]]
    height = 2.2 + sum(0.2 * len(t[1]) for t in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, height),
                             squeeze=False,
                             gridspec_kw={"height_ratios": [max(3, len(t[1])) for t in panels]})
    for ax, (title, rows) in zip(axes[:, 0], panels):
        labels = [f"{a} | {b}" if len(b) < 44 else f"{a} | {b[:42]}..." for a, b, *_ in rows]
        vals = [r[3] if r[3] and r[3] == r[3] else 0 for r in rows]
        colors = ["#d62728" if "metaload" in b else "#7f7f7f" for _, b, *_ in rows]
        y = range(len(rows))
        ax.barh(list(y), vals, color=colors)
        ax.set_yticks(list(y))
        ax.set_yticklabels(labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_title(title, fontsize=8)
        ax.tick_params(axis="x", labelsize=6)
        for i, r in enumerate(rows):
            if r[2] is not None:
                ax.text(vals[i], i, f" {r[2] * 1e3:.0f} ms, {r[4] / MIB:.0f} MiB" if r[2] < 100
                        else "", va="center", fontsize=5)
    axes[-1, 0].set_xlabel("time x anchor (log; < 1 is faster than the anchor; red: metaload)",
                           fontsize=7)
    fig.tight_layout()
    fig.subplots_adjust(left=0.36)  # the long route names: tight_layout cuts them off
    fig.savefig(path, dpi=90)
    plt.close(fig)


TITLES = {"### 1.": "1. meta build (x torch.device(\"meta\"))",
          "### 2.": "2. scan per forward (x FakeTensorMode)",
          "### 3.": "3. CPU load (copy rows x fastest copying peer; mapped rows x load_file)",
          "### 4.": "4. nnsight: build + scan + dispatch (x nnsight's own)"}


def rows_from_output(text):
    """The chart's rows read back from this benchmark's printed tables (for --replot)."""
    tables, title, head = [], None, None
    for line in text.splitlines():
        if line[:6] in TITLES:
            title, head = TITLES[line[:6]], None
            tables.append((title, []))
        elif title and line.startswith("| ") and head is None:
            head = [c.strip() for c in line.strip("|").split("|")]
        elif title and line.startswith("| ") and not line.startswith("|---"):
            c = dict(zip(head, (x.strip() for x in line.strip("|").split("|"))))
            a, b = c[head[0]], c["route"]
            try:
                sec = float(c["s"]) if "s" in c else float(c["ms"]) / 1e3
                rss = float(c.get("peak RSS growth MiB")) * MIB
                tables[-1][1].append((a, b, sec, float(c["x anchor"]), rss))
            except (TypeError, ValueError):
                tables[-1][1].append((a, b, None, None, None))
    return tables


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny configs, one process per table")
    ap.add_argument("--chart", default=os.path.join(HERE, "peers.png"))
    ap.add_argument("--rounds", type=int, default=None, help="fresh processes per case")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per process")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/metaload/bench-peers"))
    ap.add_argument("--tables", default="build,scan,load,nnsight")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold page cache cases")
    ap.add_argument("--replot", metavar="OUTPUT",
                    help="draw the chart again from a saved run's printed output; runs nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.replot:
        with open(args.replot) as f:
            chart(args.chart, rows_from_output(f.read()))
        print(f"chart: {args.chart} ({os.path.getsize(args.chart) // 1024} KiB)")
        return 0
    import torch
    if not hasattr(torch, "get_default_device"):
        print(f"bench/peers: the peers need the torch 2.x environment (tools/setup); this is torch "
              f"{torch.__version__}: skipped")
        return 0
    _silence()
    os.makedirs(args.cache, exist_ok=True)
    if args.quick:
        args.cache = os.path.join(args.cache, "quick")
        os.makedirs(args.cache, exist_ok=True)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.reps = args.reps or (1 if args.quick else 5)
    want = set(args.tables.split(","))
    build_cfgs = ["llama-tiny", "gpt2-tiny"] if args.quick else ["llama-2-70b", "llama-3.2-1b"]
    scan_cfgs = ["gpt2-tiny", "llama-tiny"] if args.quick else ["gpt2", "llama-3.2-1b"]
    batch, seq = (2, 32) if args.quick else (8, 1024)
    load_cfg = "llama-tiny" if args.quick else "llama-3.2-1b"
    import metaload
    print(f"bench/peers ({'quick' if args.quick else 'full'}), torch {torch.__version__}, "
          f"metaload {metaload.__version__}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, "
          f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    versions = []
    for mod in ("transformers", "accelerate", "nnsight", "safetensors", "fastsafetensors",
                "runai_model_streamer", "tensorizer"):
        try:
            from importlib.metadata import version
            versions.append(f"{mod} {version(mod.replace('_', '-'))}")
        except Exception:  # noqa: BLE001 (not installed: its rows say so)
            versions.append(f"{mod} (not installed)")
    print(", ".join(versions) + "\n", flush=True)
    plan = []  # (name, specs, render)
    if "build" in want:
        plan.append(("1. meta build (x torch.device(\"meta\"))", specs_build(args, build_cfgs),
                     lambda res: render_build(args, build_cfgs, res)))
    if "scan" in want:
        plan.append(("2. scan per forward (x FakeTensorMode)",
                     specs_scan(args, scan_cfgs, batch, seq),
                     lambda res: render_scan(args, scan_cfgs, batch, seq, res)))
    if "load" in want:
        load_specs = specs_load(args, load_cfg)
        plan.append(("3. CPU load (copy rows x fastest copying peer; mapped rows x load_file)",
                     load_specs, lambda res: render_load(args, load_cfg, load_specs, res)))
    if "nnsight" in want:
        nn_batch, nn_seq = (1, 16) if args.quick else (1, 128)
        plan.append(("4. nnsight: build + scan + dispatch (x nnsight's own)",
                     specs_nnsight(args, load_cfg, nn_batch, nn_seq),
                     lambda res: render_nnsight(args, load_cfg, nn_batch, nn_seq, res)))
    res = {}
    if args.quick:  # one process for every case of every table: the smoke test's minute
        res = run_cases([s for _, specs, _ in plan for s in specs], args.rounds, True)
    tables = []
    for title, specs, render in plan:
        if not args.quick:
            res.update(run_cases(specs, args.rounds, False))
        lines, rows = render(res)
        print("\n".join(lines) + "\n", flush=True)
        tables.append((title, rows))
    if args.chart:
        chart(args.chart, tables)
        print(f"chart: {args.chart} ({os.path.getsize(args.chart) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
