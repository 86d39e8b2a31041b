"""Untrusted keys, refs and names (the hardening probe, round two): a model key is never a path,
keys are byte-identical to json.dumps (nnsight's), a non-UTF-8 byte in a file reaches Python as
the typed error with its whole message, a hub ref is a commit hash whose content is never quoted,
and names that differ only in Unicode normalisation (or cannot be encoded) are shown apart.

Run: METALOAD_LIB=build/cmake/libmetaload.so /usr/bin/python3 -m pytest tests/python/test_untrusted_names.py -q
"""
import json
import os
import struct

import pytest
import torch

import metaload
from conftest import run_cli
from metaload import _lib
from metaload import checkpoint as ck
from metaload.model import TransformersModel, make_checkpoint

REPO = "openai-community/gpt2"
KEY = "metaload.TransformersModel:" + json.dumps({"repo_id": REPO, "revision": None})


# ---------------------------------------------------------------------------------------------
# 1. A model key is never a path


@pytest.fixture
def decoy(tmp_path, monkeypatch):
    """A working directory holding a folder named like REPO (a llama checkpoint), and a hub cache
    (HF_HUB_CACHE) holding REPO itself (gpt2) when `cached` is asked for."""
    cwd = tmp_path / "cwd"
    make_checkpoint(str(cwd / REPO), config="llama-tiny")
    monkeypatch.chdir(cwd)
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("HF_HOME", raising=False)

    def cache():
        return make_checkpoint(config="gpt2-tiny", hf_cache=str(hub), repo=REPO)
    return cache


def _gpt2_module():
    """The token embedding of the published gpt2-tiny layout ("wte.weight"): loaded strict=False."""
    module = torch.nn.Module()
    module.wte = torch.nn.Embedding(256, 64)
    return module


def test_a_key_reads_the_hub_cache_not_a_folder_of_the_working_directory(decoy):
    made = decoy()
    info = ck.describe(KEY)
    assert info.config["model_type"] == "gpt2" and info.repo_id == REPO, info
    assert info.revision == made["commit"]
    model = TransformersModel(KEY)
    assert model.info["class"] == "GPT2LMHeadModel", model.info
    assert model.info["checkpoint"].startswith(os.environ["HF_HUB_CACHE"]), model.info
    r = run_cli("describe", KEY, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["model_type"] == "gpt2", r.stdout
    r = run_cli("key", KEY)
    assert r.returncode == 0 and r.stdout.strip() == KEY, (r.stdout, r.stderr)


def test_load_into_takes_a_key_and_reads_the_hub_cache(decoy):
    decoy()
    module = _gpt2_module()
    report = metaload.load_into(module, KEY, strict=False, progress=False)
    assert report.slot_bytes > 0
    assert all(f.path.startswith(os.environ["HF_HUB_CACHE"]) for f in report.files), report.files
    # The key pins no revision; one asked for is joined with it, as TransformersModel does.
    other = "0" * 40
    with pytest.raises(metaload.ResolveError, match="cannot resolve"):
        metaload.load_into(_gpt2_module(), KEY, revision=other, strict=False, progress=False)


def test_a_key_without_a_cache_entry_never_opens_the_folder(decoy):
    for call in (lambda: ck.describe(KEY), lambda: TransformersModel(KEY),
                 lambda: metaload.load_into(torch.nn.Linear(2, 2), KEY, progress=False)):
        with pytest.raises(metaload.ResolveError) as e:
            call()
        assert "models--openai-community--gpt2" in str(e.value), e.value
    r = run_cli("describe", KEY)
    assert r.returncode != 0 and "ResolveError" in r.stderr, (r.stdout, r.stderr)
    # A key naming the folder by a path is refused by the key policy.
    path_key = "metaload.TransformersModel:" + json.dumps({"repo_id": "./" + REPO})
    with pytest.raises(metaload.RepoIdError):
        ck.describe(path_key)
    with pytest.raises(metaload.RepoIdError):
        metaload.load_into(torch.nn.Linear(2, 2), path_key, progress=False)


# ---------------------------------------------------------------------------------------------
# 2. Keys equal json.dumps's (nnsight's key is json.dumps of its fields)

EXTRA_VALUES = [
    2 ** 64 + 1, -(2 ** 64) - 1, 2 ** 63, -(2 ** 63) - 1, 10 ** 40, 0.1, 1e16, 1e15,
    123456789012345678.0, 1.5e-5, 1e-4, -0.0, 5e-324, 1.7976931348623157e308, 100.0, 2.5, 1e22,
    [1, [2.0, {"a": -3e-7, "b": [2 ** 70]}]], {"z": {"y": [None, True, False]}},
    "e\u0301\u00e9\U0001F600\x7f\"\\\n\t\u2028",
]


@pytest.mark.parametrize("value", EXTRA_VALUES, ids=lambda v: repr(v)[:30])
def test_every_extra_value_is_written_as_json_dumps_writes_it(value):
    cls = "nnsight.modeling.transformers.TransformersModel"
    key = ck.to_model_key(cls, "org/m", None, extra={"v": value, "task": "text-generation"})
    assert key == cls + ":" + json.dumps({"repo_id": "org/m", "revision": None, "v": value,
                                          "task": "text-generation"})
    back = ck.from_model_key(key)
    assert json.dumps(back.extra["v"]) == json.dumps(value)
    r = run_cli("key", key)  # the CLI writes a key back as it read it
    assert r.returncode == 0 and r.stdout.strip() == key, (r.stdout, r.stderr)


def test_random_floats_are_written_as_repr_writes_them():
    import random
    rng = random.Random(5)
    values = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    values = [v for v in values if v == v and abs(v) != float("inf")]
    values += [rng.random() * 10 ** rng.randint(-30, 30) for _ in range(3000)]
    key = ck.to_model_key("metaload.TransformersModel", "org/m", extra={"v": values})
    assert key == "metaload.TransformersModel:" + json.dumps(
        {"repo_id": "org/m", "revision": None, "v": values})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), object()])
def test_values_json_cannot_hold_are_a_model_key_error(value):
    with pytest.raises(metaload.ModelKeyError, match="extra"):
        ck.to_model_key("metaload.TransformersModel", "org/m", extra={"v": value})


# ---------------------------------------------------------------------------------------------
# 3. One byte that is not UTF-8: the typed error, its message whole


def _expect(kind, call, *fragments):
    with pytest.raises(kind) as e:
        call()
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    return e.value


def test_a_bad_byte_in_index_json(tmp_path):
    d = make_checkpoint(str(tmp_path / "ck"), config="gpt2-tiny", shards=2)["dir"]
    index = os.path.join(d, "model.safetensors.index.json")
    text = open(index, "rb").read()
    at = text.index(b"wte")
    with open(index, "wb") as f:
        f.write(text[:at] + b"\xff" + text[at:])
    e = _expect(metaload.ShardError, lambda: ck.describe(d), index,
                f"byte 0xff at offset {at} is not UTF-8")
    assert e.rule == "json-not-utf8"


def test_a_bad_byte_in_config_json(tmp_path):
    d = make_checkpoint(str(tmp_path / "ck"), config="gpt2-tiny")["dir"]
    config = os.path.join(d, "config.json")
    text = open(config, "rb").read()
    at = text.index(b"model_type")
    with open(config, "wb") as f:
        f.write(text[:at] + b"caf\xe9" + text[at:])
    for call in (lambda: ck.describe(d), lambda: TransformersModel(d)):
        e = _expect(metaload.FormatError, call, config, f"byte 0xe9 at offset {at + 3}")
        assert e.rule == "json-not-utf8"


def _safetensors(path, header: bytes):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)


def test_a_bad_byte_in_a_safetensors_header_or_tensor_name(tmp_path):
    for name, header in (("meta", b'{"__metadata__": {"k": "\xc0\xaf"}}'),
                         ("name", b'{"w\xff": {"dtype": "F32", "shape": [0], '
                                  b'"data_offsets": [0, 0]}}')):
        path = str(tmp_path / f"{name}.safetensors")
        _safetensors(path, header)
        bad = header.index(b"\xc0" if name == "meta" else b"\xff")
        for call in (lambda: ck.describe(path), lambda: metaload.load_file(path)):
            e = _expect(metaload.FormatError, call, path, f"header offset {bad}")
            assert e.rule == "header-not-utf8"


def test_a_file_name_with_a_bad_byte(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    name = os.fsdecode(b"w\xff.safetensors")  # as os.listdir names it: "w\udcff.safetensors"
    with open(os.path.join(os.fsencode(str(d)), b"w\xff.safetensors"), "wb") as f:
        f.write(b"\x05")  # too short to be a safetensors file
    e = _expect(metaload.FormatError, lambda: ck.describe(str(d)), "w\\xff.safetensors")
    assert e.rule == "file-too-small", e
    # A path holding the byte, as Python spells it (a lone surrogate), is refused by name.
    for call in (lambda: ck.describe(os.path.join(str(d), name)),
                 lambda: TransformersModel(os.path.join(str(d), name)),
                 lambda: metaload.load_into(torch.nn.Linear(2, 2), os.path.join(str(d), name))):
        _expect(metaload.ResolveError, call, "\\udcff", "cannot be encoded as UTF-8")


# ---------------------------------------------------------------------------------------------
# 4. refs/<name> is a commit hash; its content is never quoted


@pytest.fixture
def hub_repo(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    made = make_checkpoint(config="gpt2-tiny", hf_cache=str(hub), repo="org/tiny")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-TOKEN-1234\n")
    return {"ref": str(hub / "models--org--tiny" / "refs" / "main"), "commit": made["commit"],
            "secret": str(secret)}


@pytest.mark.parametrize("content,says", [
    ("../../../secret.txt", 'byte 0 is "." (a path is no commit)'),
    ("SECRET", 'byte 0 is "S", not a lowercase hex digit'),
    ("{secret}", 'byte 0 is "/" (a path is no commit)'),
    ("{commit}\n", 'byte 40 is "\\n" after the hash (41 bytes in all)'),
    ("{commit}SECRET-TOKEN", 'byte 40 is "S" after the hash (52 bytes in all)'),
    ("{huge}", 'byte 40 is "x" after the hash (10485800 bytes in all)'),
])
def test_a_ref_that_is_no_commit_hash(hub_repo, content, says):
    text = content.format(secret=hub_repo["secret"], commit=hub_repo["commit"],
                          huge=hub_repo["commit"] + "x" * (10 << 20))
    with open(hub_repo["ref"], "w") as f:
        f.write(text)
    for call in (lambda: ck.describe("org/tiny"), lambda: TransformersModel("org/tiny"),
                 lambda: ck.describe("metaload.TransformersModel:" + json.dumps(
                     {"repo_id": "org/tiny", "revision": None}))):
        e = _expect(metaload.ResolveError, call,
                    f"{hub_repo['ref']}: does not hold exactly a 40-hex commit hash: {says}",
                    "(rule ref-not-commit)")
        assert "SECRET" not in str(e) and "secret.txt" not in str(e), e
        assert len(str(e)) < 3000


def test_a_ref_linking_out_of_the_repo_is_never_read(hub_repo):
    with open(hub_repo["secret"], "w") as f:
        f.write(hub_repo["commit"])  # even a commit hash there is not followed
    os.unlink(hub_repo["ref"])
    os.symlink(hub_repo["secret"], hub_repo["ref"])
    e = _expect(metaload.FormatError, lambda: ck.describe("org/tiny"),
                "refs file is a symbolic link to")
    assert e.rule == "link-outside-repo"
    assert hub_repo["commit"] not in str(e), e


# ---------------------------------------------------------------------------------------------
# 5. Names shown apart; names that cannot be encoded refused by name


class _Named(torch.nn.Module):
    def __init__(self, *names):
        super().__init__()
        for n in names:
            self.register_parameter(n, torch.nn.Parameter(torch.zeros(2)))


def test_names_that_differ_only_in_normalisation_print_apart(tmp_path):
    path = str(tmp_path / "w.safetensors")
    ck.save_safetensors(path, {"caf\u00e9": torch.zeros(2)})  # precomposed
    e = _expect(metaload.MismatchError,
                lambda: metaload.load_into(_Named("cafe\u0301"), path, progress=False),
                "cafe\\u0301", "caf\\u00e9")
    assert e.missing == ["cafe\u0301"] and e.unexpected == ["caf\u00e9"]
    # Python's own messages quote names the same way.
    assert _lib.quote("cafe\u0301") != _lib.quote("caf\u00e9")
    assert _lib.quote("\u212a") == "'\\u212a'"


@pytest.mark.parametrize("where", ["state_dict", "key_mapping", "key_mapping value"])
def test_a_name_that_cannot_be_encoded(tmp_path, where):
    path = str(tmp_path / "w.safetensors")
    ck.save_safetensors(path, {"w": torch.zeros(2)})
    bad = "w\ud800x"
    module = _Named(bad if where == "state_dict" else "w")
    mapping = {bad: "w"} if where == "key_mapping" else {"w": bad} if where != "state_dict" else None
    arg = "state_dict" if where == "state_dict" else "key_mapping"
    _expect(metaload.PlanError,
            lambda: metaload.load_into(module, path, key_mapping=mapping, progress=False),
            arg, "'w\\ud800x'", "cannot be encoded as UTF-8")
    with pytest.raises(metaload.FormatError, match="name-not-utf8"):
        ck.save_safetensors(str(tmp_path / "x.safetensors"), {bad: torch.zeros(1)})
    with pytest.raises(metaload.ModelKeyError, match="ud800"):
        ck.to_model_key("metaload.TransformersModel", bad)
