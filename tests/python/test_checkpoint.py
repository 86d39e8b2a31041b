"""Checkpoints and remote identity from Python, and the `metaload` CLI.

Run: METALOAD_LIB=build/dev/libmetaload.so PYTHONPATH=python /usr/bin/python3 -m pytest \
     tests/python/test_checkpoint.py -q
The CLI tests use METALOAD_CLI, else the CLI beside METALOAD_LIB (skipped if absent).
"""
import json
import os
import struct
import subprocess

import pytest
import torch

from metaload import _lib
from metaload import checkpoint as ck

from conftest import cli_path, run_cli

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "model", "families", "configs")


def err(kind):
    return _lib.error_class(kind)


def read_raw(path):
    """An independent safetensors reader (struct + json), to check the writer against the format."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return n, header, data[8 + n:]


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    return bytes(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.lin = torch.nn.Linear(4, 3).to(torch.bfloat16)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: stored once
        self.register_buffer("steps", torch.tensor([1, 2, 3], dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False]))


# ---------------------------------------------------------------------------------------------
# writer + header


def test_save_module_matches_format_and_round_trips(tmp_path):
    torch.manual_seed(0)
    m = Tied()
    path = tmp_path / "m.safetensors"
    h = ck.save_safetensors(path, m, metadata={"format": "pt", "note": "é"})
    n, header, data = read_raw(path)
    assert (8 + n) % 8 == 0
    assert header["__metadata__"] == {"format": "pt", "note": "é"}
    names = [k for k in header if k != "__metadata__"]
    assert "head.weight" not in names and "emb.weight" in names
    sd = m.state_dict()
    for name in names:
        e = header[name]
        b, end = e["data_offsets"]
        assert data[b:end] == tensor_bytes(sd[name]), name
        assert e["shape"] == list(sd[name].shape)
    assert header["lin.weight"]["dtype"] == "BF16"
    assert header["steps"]["dtype"] == "I64"
    assert header["mask"]["dtype"] == "BOOL"
    # Order: element size descending, then name.
    order = sorted(names, key=lambda k: header[k]["data_offsets"][0])
    assert order == ["steps", "emb.weight", "lin.bias", "lin.weight", "mask"]
    # The C++ reader agrees.
    assert [t["name"] for t in h["tensors"]] == order
    assert h["metadata"]["note"] == "é"
    # Data can be read back into equal tensors.
    for name in names:
        t = sd[name].contiguous()
        b, end = header[name]["data_offsets"]
        back = torch.frombuffer(bytearray(data[b:end]), dtype=t.dtype).reshape(t.shape) if t.numel() else t
        assert torch.equal(back, t), name


def test_non_contiguous_and_views_are_written_as_their_values(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {"t": base.t(), "slice": base[1:3, ::2], "empty": torch.zeros(0, 3)}
    ck.save_safetensors(tmp_path / "v.safetensors", tensors)
    _, header, data = read_raw(tmp_path / "v.safetensors")
    for name, t in tensors.items():
        b, e = header[name]["data_offsets"]
        assert data[b:e] == tensor_bytes(t)


def test_save_errors_are_typed(tmp_path):
    with pytest.raises(err("FormatError"), match="meta device"):
        ck.save_safetensors(tmp_path / "x.safetensors", {"w": torch.empty(2, device="meta")})
    with pytest.raises(err("FormatError"), match="not a string"):
        ck.save_safetensors(tmp_path / "x.safetensors", {"w": torch.zeros(2)}, metadata={"n": 1})
    with pytest.raises(err("FormatError"), match="no safetensors equivalent"):
        ck.save_safetensors(tmp_path / "x.safetensors", {"w": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(err("FormatError"), match="reserved"):
        ck.save_safetensors(tmp_path / "x.safetensors", {"__metadata__": torch.zeros(2)})
    assert not (tmp_path / "x.safetensors").exists()
    assert issubclass(err("FormatError"), _lib.Error)


def test_sharded_save_and_open(tmp_path):
    sd = {f"layer.{i}.weight": torch.full((64,), float(i)) for i in range(10)}  # 256 bytes each
    out = ck.save_safetensors(tmp_path, sd, max_shard_size=600, metadata={"format": "pt"})
    assert len(out["files"]) == 5
    assert out["index_path"].endswith("model.safetensors.index.json")
    assert out["total_size"] == 2560
    with open(out["index_path"]) as f:
        index = json.load(f)
    assert index["metadata"]["total_size"] == 2560
    assert index["weight_map"]["layer.9.weight"] == "model-00005-of-00005.safetensors"
    c = ck.open_checkpoint(str(tmp_path))
    assert c["num_tensors"] == 10 and len(c["files"]) == 5 and c["data_bytes"] == 2560
    d = tmp_path / "three"
    d.mkdir()
    assert len(ck.save_safetensors(d, sd, num_shards=3)["files"]) == 3
    with pytest.raises(err("ShardError"), match="only 10 tensors"):
        ck.save_safetensors(d, sd, num_shards=11)
    assert ck.parse_size("5GB") == 5 * 10**9 and ck.parse_size("2MiB") == 2 << 20


def test_read_header_rejects_with_rule(tmp_path):
    p = tmp_path / "bad.safetensors"
    hdr = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 4)
    with pytest.raises(err("FormatError"), match=r"tensor 'a'.*\(rule size-mismatch\)"):
        ck.read_safetensors_header(p)


# ---------------------------------------------------------------------------------------------
# describe, model keys, TP, dtypes


def make_hub(root, repo_id, commit, sd, config):
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    blobs = repo / "blobs"
    for d in (snap, blobs, repo / "refs"):
        d.mkdir(parents=True)
    ck.save_safetensors(blobs / "weights", sd)
    (blobs / "config").write_text(json.dumps(config))
    os.symlink("../../blobs/weights", snap / "model.safetensors")
    os.symlink("../../blobs/config", snap / "config.json")
    (repo / "refs" / "main").write_text(commit)
    return snap


def test_describe_counts_exactly_and_sizes_by_dtype(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ck.save_safetensors(tmp_path / "model.safetensors", m)
    cfg = {"num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    n = sum(p.numel() for p in m.parameters())
    ck.reset_io_bytes_read()
    info = ck.describe_checkpoint(str(tmp_path))
    assert ck.io_bytes_read() < 4096  # headers + config, no data
    assert info.n_params == n
    assert info.size_bytes == n * 4
    assert info.config == cfg
    assert info.revision is None
    assert info.max_tp_size == 8
    assert ck.describe_checkpoint(str(tmp_path), torch.bfloat16).size_bytes == n * 2
    assert ck.describe_checkpoint(str(tmp_path), "nf4").size_bytes == (n + 1) // 2
    with pytest.raises(err("DTypeError"), match="accepted"):
        ck.describe_checkpoint(str(tmp_path), "fp5")
    with pytest.raises(err("ResolveError"), match="looked at"):
        ck.describe_checkpoint(str(tmp_path / "missing"))


def test_nnsight_minted_key_resolves_and_describes(tmp_path, monkeypatch):
    # A class living where nnsight's does, minting the key the way nnsight mints it.
    LanguageModel = type("LanguageModel", (), {"__module__": "nnsight.modeling.language"})
    repo_id = "openai-community/gpt2"
    nnsight_key = f"{LanguageModel.__module__}.{LanguageModel.__name__}:" + json.dumps(
        {"repo_id": repo_id, "revision": None})
    commit = "0123456789abcdef0123456789abcdef01234567"
    sd = {"w": torch.ones(3, 5), "b": torch.zeros(5)}
    make_hub(tmp_path, repo_id, commit, sd, {"num_attention_heads": 12})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))

    k = ck.from_model_key(nnsight_key)
    assert k.class_path == "nnsight.modeling.language.LanguageModel"
    assert k.canonical_class == "metaload.TransformersModel"
    assert (k.repo_id, k.revision) == (repo_id, None)
    assert ck.to_model_key(LanguageModel, repo_id) == nnsight_key
    info = ck.describe_checkpoint(nnsight_key)
    assert info.n_params == 20 and info.revision == commit and info.repo_id == repo_id
    pinned = ck.to_model_key("metaload.TransformersModel", repo_id, commit)
    assert ck.describe_checkpoint(pinned).revision == commit
    assert "nnsight.modeling.transformers.TransformersModel" in ck.model_classes()


@pytest.mark.parametrize("repo_id,revision", [
    ("openai-community/gpt2", None),
    ('we"ird\\name', "v1.0"),
    ("tab\tnl\n\x7f\x01", None),
    ("café/日本語", "ブランチ"),
    ("emoji😀/x", None),
])
def test_model_key_is_exactly_json_dumps(repo_id, revision):
    # Most of these are no Hub repo ids: the encoding is checked with local paths allowed.
    expected = "metaload.TransformersModel:" + json.dumps({"repo_id": repo_id, "revision": revision})
    key = ck.to_model_key("metaload.TransformersModel", repo_id, revision, allow_local_paths=True)
    assert key == expected
    back = ck.from_model_key(key, allow_local_paths=True)
    assert (back.repo_id, back.revision) == (repo_id, revision)


def test_model_key_extra_fields_follow_revision_in_their_order():
    # nnsight's TransformersModel writes {"repo_id", "revision", "task"} (and trust_remote_code
    # before task when set): the same text from metaload, and the fields back from the parse.
    extra = {"trust_remote_code": True, "task": "text-génération", "n": [1, 2.5, None]}
    key = ck.to_model_key("nnsight.modeling.transformers.TransformersModel", "org/m", "main",
                          extra=extra)
    assert key == "nnsight.modeling.transformers.TransformersModel:" + json.dumps(
        {"repo_id": "org/m", "revision": "main", **extra})
    back = ck.from_model_key(key)
    assert back.extra == extra and list(back.extra) == list(extra)
    assert back.canonical_class == "metaload.TransformersModel"


@pytest.mark.parametrize("extra,says", [
    ({"revision": "v2"}, "main field"),
    ({"repo_id": "x/y"}, "main field"),
    (["task"], "must be a JSON object"),
])
def test_model_key_extra_fields_that_are_not_extra(extra, says):
    with pytest.raises(_lib.ModelKeyError, match=says):
        ck.to_model_key("metaload.TransformersModel", "org/m", None, extra=extra)


# The hostile keys and the rest of the Hub's rules.
HOSTILE_REPO_IDS = [
    ("/etc/passwd", "repo-id-absolute-path"),
    ("../x", "repo-id-parent-dir"),
    ("org/..", "repo-id-parent-dir"),
    ("a/b/c", "repo-id-parts"),
    ("./x", "repo-id-edge"),
    ("a b", "repo-id-character"),
    ("we\"ird", "repo-id-character"),
    ("a\u0000b", "repo-id-character"),
    ("a--b", "repo-id-double-dash"),
    ("x" * 97, "repo-id-length"),
    ("org/m.git", "repo-id-git-suffix"),
]


def key_of(repo_id):
    return "metaload.TransformersModel:" + json.dumps({"repo_id": repo_id, "revision": None})


@pytest.mark.parametrize("repo_id,rule", HOSTILE_REPO_IDS)
def test_keys_are_remote_identities_hub_repo_ids_only(repo_id, rule):
    key = key_of(repo_id)
    with pytest.raises(err("RepoIdError")) as e:
        ck.from_model_key(key)
    assert e.value.rule == rule and isinstance(e.value, err("ModelKeyError"))
    assert json.dumps(key)[1:-1][:60] in str(e.value)  # names the key (escaped as JSON) ...
    assert f"(rule {rule})" in str(e.value) and "allow_local_paths" in str(e.value)
    with pytest.raises(err("RepoIdError"), match=rule):
        ck.to_model_key("metaload.TransformersModel", repo_id)
    with pytest.raises(err("RepoIdError"), match=rule):
        ck.describe_checkpoint(key)
    if "\0" not in repo_id:  # no path holds a NUL byte, trusted or not
        assert ck.from_model_key(key, allow_local_paths=True).repo_id == repo_id
        assert ck.to_model_key("metaload.TransformersModel", repo_id,
                               allow_local_paths=True) == key
    else:
        with pytest.raises(err("RepoIdError"), match="repo-id-nul"):
            ck.from_model_key(key, allow_local_paths=True)


def test_describe_of_a_key_naming_a_file_reads_it_only_when_allowed():
    ck.reset_io_bytes_read()
    with pytest.raises(err("RepoIdError"), match="absolute-path"):
        ck.describe_checkpoint(key_of("/etc/passwd"))
    assert ck.io_bytes_read() == 0
    with pytest.raises(err("FormatError")):  # opened as asked, and no checkpoint
        ck.describe_checkpoint(key_of("/etc/passwd"), allow_local_paths=True)


def test_a_key_never_names_a_directory_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "tiny").mkdir()
    ck.save_safetensors(tmp_path / "tiny" / "model.safetensors", {"w": torch.ones(2)})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(err("ResolveError")):
        ck.describe_checkpoint(key_of("tiny"))
    assert ck.describe_checkpoint(key_of("tiny"), allow_local_paths=True).n_params == 2
    assert ck.describe_checkpoint("tiny").n_params == 2  # a plain reference is a path, as before


@pytest.mark.parametrize("key,says", [
    ("metaload.TransformersModel", "no ':'"),
    ('unknown.Thing:{"repo_id": "x"}', "unknown class"),
    ("metaload.TransformersModel:{repo_id}", "bad JSON"),
    ('metaload.TransformersModel:{"revision": null}', "no \"repo_id\""),
])
def test_malformed_keys(key, says):
    with pytest.raises(err("ModelKeyError"), match=says.replace('"', '.')):
        ck.from_model_key(key)


def test_max_tp_size_cases():
    def cfg(h, kv, i):
        return {"num_attention_heads": h, "num_key_value_heads": kv, "intermediate_size": i}
    assert ck.max_tp_size(cfg(24, 8, 8192)) == 8
    assert ck.max_tp_size(cfg(14, 2, 4864)) == 2
    assert ck.max_tp_size(cfg(3, 1, 11)) is None
    assert ck.max_tp_size(cfg(64, 8, 28672)) == 8
    with open(os.path.join(CONFIGS, "qwen2.5-0.5b.json")) as f:
        assert ck.max_tp_size(json.load(f)) == 2
    assert ck.tp_degree_for(cfg(24, 8, 8192), 3) == 4
    with pytest.raises(err("TPError"), match="1, 2, 4, 8"):
        ck.tp_degree_for(cfg(24, 8, 8192), 16)


def test_a_broken_config_field_is_one_config_error_for_every_reader(tmp_path):
    # Issue 23: describe, the TP degree and the families' parser read config.json through one
    # reader (identity/config_fields.h), so a field is refused by one rule in one message.
    import metaload
    with open(os.path.join(CONFIGS, "llama-tiny.json")) as f:
        config = json.load(f)
    config["num_attention_heads"] = 4.0  # sizes are JSON integers, for every reader
    (tmp_path / "config.json").write_text(json.dumps(config))
    header = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [1],
                                               "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                                 + b"\0" * 4)
    said = ("field 'num_attention_heads' must be a positive integer, got 4.0 "
            "(rule config-not-integer)")
    info = ck.describe_checkpoint(str(tmp_path))  # describe still succeeds, and says why
    assert info.max_tp_size is None
    assert info.config_error["kind"] == "ConfigError"
    assert (info.config_error["rule"], info.config_error["field"]) == (
        "config-not-integer", "num_attention_heads")
    assert info.config_error["message"].endswith(said), info.config_error
    with pytest.raises(err("ConfigError")) as tp:
        ck.max_tp_size(config)
    with pytest.raises(err("ConfigError")) as family:
        metaload.TransformersModel(str(tmp_path))
    for e in (tp, family):
        assert str(e.value).endswith(said), str(e.value)
        assert (e.value.rule, e.value.field) == ("config-not-integer", "num_attention_heads")
    assert family.value.file == str(tmp_path / "config.json") and tp.value.file == "config.json"
    # The CLI: `tp` fails naming the file, `describe` shows why the TP degree is unknown.
    r = run_cli("tp", tmp_path / "config.json")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        f"[metaload.ConfigError] {tmp_path / 'config.json'}: {said}"), r.stderr
    r = run_cli("describe", tmp_path)
    assert r.returncode == 0 and f"unreadable   {tmp_path / 'config.json'}: {said}" in r.stdout, (
        r.stdout, r.stderr)
    config["num_attention_heads"] = 4
    assert ck.max_tp_size(config) == 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ck.describe_checkpoint(str(tmp_path)).config_error is None


def test_bytes_per_element_and_quantizations():
    assert ck.bytes_per_element(torch.bfloat16) == 2
    assert ck.bytes_per_element("torch.float32") == 4
    assert ck.bytes_per_element("NF4") == 0.5
    assert ck.bytes_per_element("fp8") == 1.0
    assert ck.QUANTIZATIONS == {"nf4": 0.5, "int4": 0.5, "4bit": 0.5, "fp4": 0.5,
                                "int8": 1.0, "8bit": 1.0, "fp8": 1.0}
    with pytest.raises(err("DTypeError"), match="sub-byte.*accepted.*bfloat16"):
        ck.bytes_per_element("torch.uint4")
    with pytest.raises(err("DTypeError"), match="bfloat16"):
        ck.bytes_per_element("bfloat17")
    # The table agrees with torch's element sizes for every torch dtype it names.
    for row in ck.dtype_table():
        if row["kind"] == "torch" and hasattr(torch, row["name"]) and row["torch_name"] != "complex32":
            assert row["bytes_per_element"] == torch.empty(0, dtype=getattr(torch, row["name"])).element_size(), row


# ---------------------------------------------------------------------------------------------
# the CLI




def test_cli_links_no_libtorch():
    # describe / key / tp must start in milliseconds: the torch subcommands are loaded on demand.
    out = subprocess.run(["ldd", cli_path()], capture_output=True, text=True).stdout
    assert "libtorch" not in out and "libc10" not in out, out


@pytest.fixture
def gpt2_like(tmp_path):
    sd = {"wte.weight": torch.zeros(50, 8), "h.0.attn.bias": torch.zeros(1, 1, 4, 4), "ln_f.bias": torch.zeros(8)}
    ck.save_safetensors(tmp_path / "model.safetensors", sd)
    with open(os.path.join(CONFIGS, "gpt2.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    return tmp_path


def test_cli_describe_table_and_json(gpt2_like):
    r = run_cli("describe", gpt2_like)
    assert r.returncode == 0, r.stderr
    assert "parameters     408" in r.stdout
    assert "F32 (as stored)" in r.stdout
    assert "0.00 GiB (1,632 bytes)" in r.stdout
    assert "gpt2 (GPT2LMHeadModel), 12 layers, hidden 768" in r.stdout
    r = run_cli("describe", gpt2_like, "--dtype", "bfloat16", "--json")
    j = json.loads(r.stdout)
    assert j["n_params"] == 408 and j["size_bytes"] == 816 and j["n_buffer_elements"] == 16
    assert j["config"]["model_type"] == "gpt2" and j["revision"] is None


def test_cli_key_and_tp(gpt2_like, tmp_path):
    r = run_cli("key", "openai-community/gpt2")
    assert r.stdout == 'metaload.TransformersModel:{"repo_id": "openai-community/gpt2", "revision": null}\n'
    r = run_cli("key", "org/m", "--revision", "main", "--json")
    assert json.loads(r.stdout)["key"] == 'metaload.TransformersModel:{"repo_id": "org/m", "revision": "main"}'
    r = run_cli("tp", os.path.join(CONFIGS, "llama-2-70b.json"), "--want", "3")
    assert r.returncode == 0
    assert "degrees that work  1, 2, 4, 8" in r.stdout and "degree for 3       4" in r.stdout
    j = json.loads(run_cli("tp", gpt2_like, "--json").stdout)
    assert j["max_tp_size"] == 12 and j["degrees"] == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize("args,kind", [
    (["describe", "/nonexistent/x"], "ResolveError"),
    (["describe", "{gpt2}", "--dtype", "fp5"], "DTypeError"),
    (["key", "not a repo"], "ModelKeyError"),
    (["key", 'x.Y:{"repo_id": "a"}'], "ModelKeyError"),
    (["key", key_of("/etc/passwd")], "RepoIdError"),
    (["key", key_of("../x")], "RepoIdError"),
    (["key", key_of("org/..")], "RepoIdError"),
    (["describe", key_of("/etc/passwd")], "RepoIdError"),
    (["tp", key_of("/etc/passwd")], "RepoIdError"),
    (["tp", os.path.join(CONFIGS, "llama-2-70b.json"), "--want", "16"], "TPError"),
    (["describe"], None),
    (["describe", "{gpt2}", "--bogus"], None),
])
def test_cli_bad_input_is_exit_2_and_one_line(args, kind, gpt2_like):
    args = [str(gpt2_like) if a == "{gpt2}" else a for a in args]
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("metaload")
    if kind:
        assert f"[metaload.{kind}]" in lines[0]


def test_cli_key_commands_take_local_paths_only_when_allowed(gpt2_like):
    key = key_of(str(gpt2_like))
    r = run_cli("key", key, "--allow-local-paths")
    assert r.returncode == 0 and r.stdout == key + "\n", r.stderr
    r = run_cli("key", str(gpt2_like), "--allow-local-paths")
    assert r.returncode == 0 and r.stdout == key + "\n", r.stderr
    r = run_cli("describe", key, "--allow-local-paths", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["n_params"] == 408, r.stderr
    r = run_cli("tp", key, "--allow-local-paths", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["max_tp_size"] == 12, r.stderr
    r = run_cli("describe", key)
    assert r.returncode == 2 and "RepoIdError" in r.stderr and "repo-id-absolute-path" in r.stderr


def test_cli_bad_checkpoint_names_file_and_rule(tmp_path):
    hdr = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}'
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16)
    r = run_cli("describe", tmp_path)
    assert r.returncode == 2
    assert "model.safetensors: tensor 'a'" in r.stderr and "(rule duplicate-tensor)" in r.stderr


def test_cli_help_exits_zero():
    r = run_cli("--help")
    assert r.returncode == 0 and "describe" in r.stdout and "tp" in r.stdout
