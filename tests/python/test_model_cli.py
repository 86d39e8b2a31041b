"""The metaload tool's model subcommands (make-checkpoint, scan, run) and their bad-input paths.

The tool links no libtorch; these subcommands run inside libmetaload.so, which it loads on demand
(METALOAD_LIB, or next to the tool as both builds lay it out). Bad input: exit 2, one line.
"""
import hashlib
import json
import os
import re

import torch

from conftest import run_cli
from metaload.model import TransformersModel


cli = run_cli


def sha256_tree(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def expect_usage_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_make_checkpoint_is_deterministic(tmp_path):
    for run in ("a", "b"):
        r = cli("make-checkpoint", "--arch", "llama", "--config", "qwen2-tiny", "--dtype",
                "bfloat16", "--shards", "2", "--seed", "4", tmp_path / run)
        assert r.returncode == 0, r.stderr
        assert "parameters" in r.stdout
    a, b = sha256_tree(tmp_path / "a"), sha256_tree(tmp_path / "b")
    assert a == b
    assert sorted(a) == ["config.json", "model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    r = cli("make-checkpoint", "--arch", "llama", "--config", "qwen2-tiny", "--dtype", "bfloat16",
            "--shards", "2", "--seed", "5", tmp_path / "c")
    assert sha256_tree(tmp_path / "c")["model-00001-of-00002.safetensors"] != \
        a["model-00001-of-00002.safetensors"]
    # A hub cache tree, as JSON: the snapshot resolves by repo id.
    r = cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", "--hf-cache",
            tmp_path / "hub", "--repo", "org/tiny", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert len(made["commit"]) == 40
    refs = tmp_path / "hub" / "models--org--tiny" / "refs" / "main"
    assert refs.read_text() == made["commit"]
    r = cli("describe", "org/tiny", "--json", env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["revision"] == made["commit"]


def test_scan_and_run_agree_with_the_python_model(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "llama", "--config", "llama-tiny", d).returncode == 0
    r = cli("scan", d, "--batch", "2", "--seq", "5", "--json")
    assert r.returncode == 0, r.stderr
    scan = json.loads(r.stdout)
    mods = {m["path"]: m for m in scan["modules"]}
    assert mods[""]["shape"] == [2, 5, 256]
    assert mods["model.layers.1.self_attn.k_proj"]["shape"] == [2, 5, 32]
    assert mods["model.layers.1.self_attn.k_proj"]["bytes"] == 2 * 5 * 32 * 4
    assert scan["total_bytes"] == sum(m["bytes"] for m in scan["modules"])
    model = TransformersModel(str(d), progress=False)
    assert {p: list(m.shape) for p, m in model.scan(batch=2, seq=5).modules.items()} == \
        {p: m["shape"] for p, m in mods.items()}
    table = cli("scan", d, "--batch", "2", "--seq", "5", "--device", "cuda:0", "--collapse")
    assert table.returncode == 0, table.stderr
    assert "cuda:0" in table.stdout and "total: " in table.stdout
    r = cli("run", d, "--ids", "3,1,4,1,5;9,2,6,5,3", "--new-tokens", "6", "--json")
    assert r.returncode == 0, r.stderr
    tokens = json.loads(r.stdout)["tokens"]
    want = model.generate(torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]), 6)[:, 5:].tolist()
    assert tokens == want
    human = cli("run", d, "--ids", "3,1,4", "--new-tokens", "2")
    assert human.returncode == 0 and "GB/s" in human.stdout


def test_run_places_the_model_by_device_and_dtype(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "llama", "--config", "llama-tiny", d).returncode == 0
    ids = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
    run = ["run", d, "--ids", "3,1,4,1,5;9,2,6,5,3", "--new-tokens", "6", "--json"]

    def tokens(*extra):
        r = cli(*run, *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    # --device cpu: the tokens of the default placement (float32 on cpu), here computed in process.
    on_cpu = tokens("--device", "cpu")
    f32 = TransformersModel(str(d), progress=False).generate(torch.tensor(ids), 6)[:, 5:]
    assert on_cpu["device"] == "cpu" and on_cpu["dtype"] == "float32"
    assert on_cpu["tokens"] == f32.tolist()
    # bfloat16: the same tokens as the Python model placed in bfloat16 (its own rounding, so the
    # comparison is with a bf16 model, not with the float32 tokens).
    bf16 = tokens("--dtype", "bfloat16")
    assert bf16["dtype"] == "bfloat16"
    bf16 = bf16["tokens"]
    model = TransformersModel(str(d), dtype=torch.bfloat16, progress=False)
    assert model.parameter("model.embed_tokens.weight").dtype == torch.bfloat16
    assert bf16 == model.generate(torch.tensor(ids), 6)[:, 5:].tolist()
    expect_usage_error(cli(*run, "--device", "tpu"), "--device", "tpu")
    expect_usage_error(cli(*run, "--dtype", "nf4"), "--dtype", "nf4")
    if not torch.cuda.is_available():
        expect_usage_error(cli(*run, "--device", "cuda:0"), "DeviceError", "CUDA")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", d).returncode == 0
    expect_usage_error(cli("make-checkpoint", "--arch", "bert", "--config", "gpt2-tiny",
                           tmp_path / "x"), "--arch")
    expect_usage_error(cli("make-checkpoint", "--arch", "llama", "--config", "gpt2-tiny",
                           tmp_path / "y"), "FixtureError", "--arch llama but")
    expect_usage_error(cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny",
                           "--dtype", "int8", tmp_path / "z"), "float32, float16 or bfloat16")
    expect_usage_error(cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", d),
                       "is not empty")
    expect_usage_error(cli("scan", tmp_path / "absent", "--seq", "4"), "ResolveError")
    expect_usage_error(cli("scan", d, "--seq", "0"), "--seq")
    expect_usage_error(cli("scan", d, "--seq", "99"), "FamilyError", "n_positions")
    expect_usage_error(cli("scan", d, "--seq", "4", "--device", "tpu"), "--device")
    expect_usage_error(cli("scan", d, "--seq", "4", "--dtype", "nf4"), "--dtype")
    expect_usage_error(cli("run", d, "--ids", "1,x"), "--ids", "'x'")
    expect_usage_error(cli("run", d, "--ids", "1,2;3"), "different lengths")
    expect_usage_error(cli("run", d, "--ids", "1,9999", "--new-tokens", "1"), "token id 9999")
    expect_usage_error(cli("run", d, "--ids", "1", "--new-tokens", "-1"), "--new-tokens")
    # Weights that do not fit the config: the MismatchError's lines become one line.
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    expect_usage_error(cli("run", d, "--ids", "1,2", "--new-tokens", "1"), "MismatchError",
                       "mismatched:")


def test_numbers_are_read_exactly_with_ranges_in_words(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", d).returncode == 0
    # Never clamped: 99999999999999999999 used to become 2^63-1 silently.
    line = expect_usage_error(cli("scan", d, "--batch", "99999999999999999999", "--seq", "1"),
                              "--batch")
    assert line.endswith("--batch: '99999999999999999999' is out of range: a whole number from 1 "
                         "to 2^63-1 (see metaload scan --help)"), line
    # The range in words, not 300 digits of a double.
    line = expect_usage_error(cli("scan", d, "--batch", "0", "--seq", "1"), "--batch")
    assert "'0' is out of range: a whole number from 1 to 2^63-1" in line and len(line) < 200
    for text in ("1.5", "0x10", "1e3", ""):
        expect_usage_error(cli("scan", d, "--batch", text, "--seq", "1"),
                           "is not a whole number from 1 to 2^63-1")
    # Decimal: 010 is ten (CLI11 alone reads it as octal eight).
    r = cli("scan", d, "--batch", "010", "--seq", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["batch"] == 10
    expect_usage_error(cli("scan", d, "--seq", "4", "--depth", "-2"), "--depth",
                       "from 0 to 2^31-1")
    expect_usage_error(cli("run", d, "--ids", "1", "--threads", "5000"), "--threads",
                       "'5000' is out of range: a whole number from 0 to 1024")
    expect_usage_error(cli("run", d, "--ids", "1", "--new-tokens", "99999999999999999999"),
                       "--new-tokens", "from 0 to 2^31-1")
    expect_usage_error(cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", "--seed",
                           "18446744073709551616", tmp_path / "s"), "--seed",
                       "from 0 to 2^64-1")
    expect_usage_error(cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny",
                           "--shards", "0", tmp_path / "s"), "--shards", "from 1 to 100000")
    expect_usage_error(cli("tp", d, "--want", "0"), "--want", "from 1 to 2^31-1")


def test_id_lists_are_parsed_one_way(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", d).returncode == 0
    # Every separator separates: a trailing one leaves an empty sequence or item, as a doubled one
    # does ("1,2;" was accepted while "1;;2" was not).
    for ids, where in (("1,2;", "sequence 2 is empty"), ("1;;2", "sequence 2 is empty"),
                       ("1,,2", "item 2 is empty"), ("1,2,", "item 3 is empty"),
                       (";", "sequence 1 is empty")):
        expect_usage_error(cli("run", d, "--ids", ids, "--new-tokens", "1"), "--ids", where)
    # Too large is out of range, not "not a non-negative integer".
    expect_usage_error(cli("run", d, "--ids", "1,99999999999999999999", "--new-tokens", "1"),
                       "--ids: token id '99999999999999999999' is out of range: a whole number "
                       "from 0 to 2^63-1")
    expect_usage_error(cli("run", d, "--ids", "-1", "--new-tokens", "1"),
                       "'-1' is not a token id (a whole number from 0 to 2^63-1)")
    r = cli("run", d, "--ids", " 1, 2 ;3,4 ", "--new-tokens", "1", "--json")  # spaces are fine
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 2
    expect_usage_error(cli("demo", "--data", tmp_path / "data", "--prompt", "1,2;3"), "--prompt",
                       "takes one sequence")


def test_scan_sizes_past_64_bits_are_one_line_errors(tmp_path):
    from conftest import ROOT
    d = tmp_path / "gpt2"
    d.mkdir()
    with open(os.path.join(ROOT, "model", "families", "configs", "gpt2.json")) as f:
        (d / "config.json").write_text(f.read())
    # The total wrapped: less than lm_head alone.
    line = expect_usage_error(cli("scan", d, "--batch", "44000000000", "--seq", "1024"),
                              "SizeOverflowError", "total output bytes of the scan")
    # Larger: an "internal error" with a 4.6 KB C++ backtrace before.
    line = expect_usage_error(cli("scan", d, "--batch", "440000000000", "--seq", "1024"),
                              "SizeOverflowError", "[440000000000, 1024]")
    assert len(line) < 500 and "Exception raised from" not in line


def test_the_library_is_loaded_only_for_torch_subcommands(tmp_path):
    d = tmp_path / "ckpt"
    assert cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", d).returncode == 0
    missing = {"METALOAD_LIB": str(tmp_path / "nowhere.so")}
    # describe never loads it: a wrong METALOAD_LIB does not matter.
    r = cli("describe", d, env=missing)
    assert r.returncode == 0, r.stderr
    line = expect_usage_error(cli("scan", d, "--seq", "2", env=missing), "METALOAD_LIB",
                              "nowhere.so")
    assert "libmetaload.so" in line
    helped = cli("--help")
    assert helped.returncode == 0
    for sub in ("make-checkpoint", "scan", "run", "demo", "describe"):
        assert sub in helped.stdout
    assert cli("scan", "--help").returncode == 0


def test_demo_runs_the_main_job_on_a_small_default(tmp_path):
    args = ["demo", "--data", tmp_path / "data", "--repo", "org/gpt2-tiny", "--config",
            "gpt2-tiny", "--batch", "2", "--seq", "8", "--new-tokens", "4", "--prompt", "1,2,3"]
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "Creating the embedded default once" in out
    for section in ("== describe org/gpt2-tiny", "== model key", "== tensor parallelism",
                    "== meta build", "== scan of a [2, 8] batch", "== dispatch to cpu",
                    "== greedy generation of 4 tokens", "== summary"):
        assert section in out, section
    assert 'metaload.TransformersModel:{"repo_id": "org/gpt2-tiny", "revision": null}' in out
    assert "all on meta" in out and "GB/s" in out and "now on cpu, real" in out
    # The hub cache checkpoint dispatches zero-copy, and the dispatch line says so. No terminal
    # here: no bar unless forced.
    dispatch = next(line for line in out.splitlines() if line.startswith("loaded "))
    assert "zero-copy" in dispatch and "+mapped engine" in dispatch, dispatch
    assert "metaload [" not in first.stderr
    # The second run reuses the checkpoint; --progress draws the bar, which counts the mapped
    # bytes as they are populated and ends full, at the byte count of the load.
    again = cli(*args, "--progress")
    assert again.returncode == 0, again.stderr
    assert "Creating" not in again.stdout
    final = again.stderr.strip().split("\r")[-1]
    m = re.match(r"metaload \[(#{24})\] (\d+\.\d\d)/\2 GB  \d+\.\d\d GB/s  ETA 0\.0 s  (\d+) "
                 r"bytes in ", final)
    assert m, again.stderr
    snapshot, = (tmp_path / "data" / "hf-cache" / "models--org--gpt2-tiny" / "snapshots").iterdir()
    report = TransformersModel(str(snapshot), progress=False).dispatch()
    assert report.mapped_bytes == report.bytes == int(m.group(3))
    expect_usage_error(cli(*args[:-1], "1,x"), "--prompt", "'x'")


def test_version_flag_prints_the_package_version():
    import metaload
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"metaload {metaload.__version__}"
