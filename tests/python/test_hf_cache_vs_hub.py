"""The Hugging Face cache trees `metaload make-checkpoint --hf-cache` writes, as huggingface_hub
itself sees them, and metaload's resolver against huggingface_hub's on the same trees.

One repo gets four revisions, each its own snapshot (other seeds and shard counts, so other
commits): the branch `main`, the tag `v1.0`, the pull-request ref `refs/pr/1` (the hub keeps it at
refs/refs/pr/1) and the branch `feature/x`; all written by the CLI's --branch. Then:
  - huggingface_hub.scan_cache_dir() lists the repo with those refs, commits, file names and
    sizes (each file's size as the hub reports it equals the size of the file metaload resolves);
  - for every revision (each ref, each commit hash, and none), every file name the hub's
    try_to_load_from_cache resolves is the file metaload resolves (open_checkpoint,
    describe_checkpoint, TransformersModel): the same path and the same real path;
  - a file missing from a snapshot (the hub: None, or _CACHED_NO_EXIST once .no_exist records
    it) and an unknown revision (the hub: None) are typed errors in metaload.

huggingface_hub is installed in the torch 2.x environment only (tools/requirements.txt): there the
hub comparisons run; the refs layout checks need only the metaload tool and run on both torches.
"""
import json
import os
import re

import pytest

import metaload
from metaload import _lib
from metaload.checkpoint import describe_checkpoint, open_checkpoint
from metaload.model import TransformersModel

from conftest import run_cli

REPO = "org/tiny"
# ref -> (seed, shards): distinct bytes, so each ref points at its own commit.
REVISIONS = {"main": (0, 1), "v1.0": (1, 2), "refs/pr/1": (2, 1), "feature/x": (3, 3)}


cli = run_cli


def make(cache, repo, ref, seed, shards):
    r = cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", "--hf-cache", cache,
            "--repo", repo, "--seed", seed, "--shards", shards, "--branch", ref, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    made = {ref: make(root, REPO, ref, seed, shards) for ref, (seed, shards) in REVISIONS.items()}
    return str(root), made


@pytest.fixture
def hub_cache(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", cache[0])  # where metaload looks (as huggingface_hub)
    return cache


def hub():
    return pytest.importorskip(
        "huggingface_hub", reason="huggingface_hub (tools/requirements.txt) is installed in the "
        "torch 2.x environment only")


# ---------------------------------------------------------------------------------------------
# The layout make-checkpoint writes (no huggingface_hub needed).

def test_refs_are_laid_out_as_the_hub_lays_them_out(cache):
    root, made = cache
    repo_dir = os.path.join(root, "models--org--tiny")
    commits = {ref: m["commit"] for ref, m in made.items()}
    assert len(set(commits.values())) == len(REVISIONS)
    for ref, commit in commits.items():
        with open(os.path.join(repo_dir, "refs", *ref.split("/"))) as f:
            assert f.read() == commit  # the hash without a newline, as the hub writes it
        assert made[ref]["dir"] == os.path.join(repo_dir, "snapshots", commit)
    assert os.path.isfile(os.path.join(repo_dir, "refs", "refs", "pr", "1"))


@pytest.mark.parametrize("ref", ["a/../b", "/x", "x/", "a//b", "..", "a b"])
def test_a_ref_name_that_could_leave_refs_is_refused(ref, tmp_path):
    r = cli("make-checkpoint", "--arch", "gpt2", "--config", "gpt2-tiny", "--hf-cache",
            tmp_path, "--repo", REPO, "--branch", ref)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "[metaload.FixtureError]" in r.stderr and "is not a ref name" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []  # nothing written


# ---------------------------------------------------------------------------------------------
# scan_cache_dir.

def test_scan_cache_dir_recognises_the_tree(hub_cache):
    h = hub()
    root, made = hub_cache
    info = h.scan_cache_dir(root)
    assert info.warnings == []
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "model")
    assert {ref: rev.commit_hash for ref, rev in repo.refs.items()} == \
        {ref: m["commit"] for ref, m in made.items()}
    assert {rev.commit_hash for rev in repo.revisions} == {m["commit"] for m in made.values()}
    for ref, m in made.items():
        rev = repo.refs[ref]
        assert str(rev.snapshot_path) == m["dir"]
        assert rev.refs == frozenset({ref})
        names = sorted(f.file_name for f in rev.files)
        assert names == sorted(os.path.basename(p) for p in m["files"])
        resolved = resolved_by_metaload(ref)
        for f in rev.files:
            assert str(f.file_path) == resolved[f.file_name]
            assert f.size_on_disk == os.path.getsize(resolved[f.file_name])
            assert str(f.blob_path) == os.path.realpath(resolved[f.file_name])
    # The repo's size counts each blob once (config.json is one blob shared by every revision).
    blobs = {os.path.realpath(p) for m in made.values() for p in m["files"]}
    assert repo.size_on_disk == sum(os.path.getsize(b) for b in blobs)
    assert repo.nb_files == len(blobs)


# ---------------------------------------------------------------------------------------------
# try_to_load_from_cache against metaload's resolver.

def resolved_by_metaload(revision):
    """{file name: path} of every file metaload resolves for REPO at `revision`, through the
    loader's resolver (open_checkpoint) and the model layer's (describe_checkpoint,
    TransformersModel), which must agree with each other."""
    ckpt = open_checkpoint(REPO, revision)
    out = {"config.json": ckpt["config_path"]}
    if ckpt.get("index_path"):
        out[os.path.basename(ckpt["index_path"])] = ckpt["index_path"]
    for path in ckpt["files"]:
        out[os.path.basename(path)] = path
    for path in out.values():
        assert os.path.dirname(path) == ckpt["dir"]
    assert describe_checkpoint(REPO, revision=revision).dir == ckpt["dir"]
    info = TransformersModel(REPO, revision=revision).info
    assert (info["checkpoint"], info["config_path"]) == (ckpt["dir"], out["config.json"])
    assert info["commit"] == os.path.basename(ckpt["dir"])
    return out


def every_revision(made):
    return list(made) + [m["commit"] for m in made.values()] + [None]


def test_every_revision_resolves_the_files_the_hub_resolves(hub_cache):
    h = hub()
    root, made = hub_cache
    # Every name any revision holds, and one that none does.
    names = sorted({os.path.basename(p) for m in made.values() for p in m["files"]})
    names.append("pytorch_model.bin")
    for revision in every_revision(made):
        ours = resolved_by_metaload(revision)
        theirs = {}
        for name in names:
            path = h.try_to_load_from_cache(REPO, name, cache_dir=root, revision=revision)
            assert path is None or isinstance(path, str), (revision, name, path)
            if path is not None:
                theirs[name] = path
        assert ours == theirs, revision  # the same names, the same paths
        for name, path in ours.items():
            assert os.path.realpath(path) == os.path.realpath(theirs[name])
        expected = made[revision] if revision in made else \
            made["main"] if revision is None else \
            next(m for m in made.values() if m["commit"] == revision)
        assert sorted(ours.values()) == sorted(expected["files"])


def typed(name):
    return _lib.error_class(name)


@pytest.mark.parametrize("revision", ["v9", "refs/pr/2", "feature", "0" * 40, "A" * 40])
def test_an_unknown_revision(revision, hub_cache):
    h = hub()
    root, _ = hub_cache
    for name in ("config.json", "model.safetensors"):
        assert h.try_to_load_from_cache(REPO, name, cache_dir=root, revision=revision) is None
    quoted = re.escape(f'"{revision}"')
    with pytest.raises(typed("ResolveError"), match=f"at revision {quoted}"):
        open_checkpoint(REPO, revision)
    with pytest.raises(typed("ResolveError"), match=f"at revision {quoted}"):
        describe_checkpoint(REPO, revision=revision)
    with pytest.raises(typed("ResolveError"), match=f"at revision {quoted}"):
        TransformersModel(REPO, revision=revision)


def test_a_file_missing_from_the_snapshot(tmp_path, monkeypatch):
    """A snapshot lacking its weights file (a partial download): the hub resolves None, then
    _CACHED_NO_EXIST once its .no_exist/<commit>/<name> records the absence; metaload refuses the
    checkpoint with a ResolveError naming the snapshot. Lacking config.json: the hub None,
    metaload a ResolveError naming the snapshot and config.json."""
    h = hub()
    root = str(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", root)
    made = make(root, REPO, "main", 0, 1)
    snapshot, commit = made["dir"], made["commit"]
    os.unlink(os.path.join(snapshot, "model.safetensors"))
    assert h.try_to_load_from_cache(REPO, "model.safetensors", cache_dir=root) is None
    no_exist = os.path.join(root, "models--org--tiny", ".no_exist", commit)
    os.makedirs(no_exist)
    open(os.path.join(no_exist, "model.safetensors"), "w").close()
    assert h.try_to_load_from_cache(REPO, "model.safetensors", cache_dir=root) is \
        h._CACHED_NO_EXIST
    assert h.try_to_load_from_cache(REPO, "config.json", cache_dir=root) == \
        os.path.join(snapshot, "config.json")
    for revision in (None, "main", commit):
        with pytest.raises(typed("ResolveError"), match=f"no safetensors weights in .*{commit}"):
            open_checkpoint(REPO, revision)
    with pytest.raises(metaload.Error, match="no safetensors weights"):
        describe_checkpoint(REPO)

    made = make(root, "org/noconfig", "main", 0, 1)
    os.unlink(os.path.join(made["dir"], "config.json"))
    assert h.try_to_load_from_cache("org/noconfig", "config.json", cache_dir=root) is None
    assert h.try_to_load_from_cache("org/noconfig", "model.safetensors", cache_dir=root) == \
        os.path.join(made["dir"], "model.safetensors")
    with pytest.raises(typed("ResolveError"), match=f"{made['commit']} has no config.json"):
        TransformersModel("org/noconfig")
    # open_checkpoint (the weights alone) has no config_path to give, as the hub has none.
    assert open_checkpoint("org/noconfig").get("config_path") is None


def test_a_ref_holding_more_than_the_hash(tmp_path, monkeypatch):
    """huggingface_hub reads refs/<name> without stripping it: a hash followed by a newline (as git
    would write it) resolves nothing, and scan_cache_dir calls the repo corrupted. metaload used to
    strip it and resolve the snapshot; now it refuses the ref as the hub does, naming it."""
    h = hub()
    root = str(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", root)
    made = make(root, REPO, "main", 0, 1)
    ref = os.path.join(root, "models--org--tiny", "refs", "main")
    with open(ref, "w") as f:
        f.write(made["commit"] + "\n")
    assert h.try_to_load_from_cache(REPO, "config.json", cache_dir=root) is None
    assert h.scan_cache_dir(root).warnings  # corrupted, as the hub sees it
    with pytest.raises(typed("ResolveError"),
                       match=re.escape(f"{ref}: does not hold exactly a 40-hex commit hash")):
        open_checkpoint(REPO)
    with pytest.raises(typed("ResolveError"), match="does not hold exactly a 40-hex commit hash"):
        TransformersModel(REPO)
    # The commit itself still resolves, through snapshots/, for both.
    assert h.try_to_load_from_cache(REPO, "config.json", cache_dir=root,
                                    revision=made["commit"]) == resolved_by_metaload(
                                        made["commit"])["config.json"]
