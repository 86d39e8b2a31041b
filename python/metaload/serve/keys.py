"""Which deployment a model key names: each REF given to `metaload serve` becomes a deployment,
and a request's key finds it by identity, not by its text.

Two keys name the same deployment when they name the same checkpoint at the same revision for
the same task, whatever class path spells them (nnsight's `TransformersModel`, its
`LanguageModel` alias, `metaload.TransformersModel`): the revision defaults to "main" (as NDIF's
does), and a branch or tag is compared by the commit the hub cache's refs give it, so "main",
null and main's commit are one deployment.
"""
import json
import os
import re
from typing import Any, Dict, NamedTuple, Optional, Tuple

# The key nnsight's LanguageModel mints (its canonical class), which the deployment is built by.
NNSIGHT_CLASS = "nnsight.modeling.transformers.TransformersModel"
DEFAULT_TASK = "text-generation"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class Identity(NamedTuple):
    repo_id: str
    revision: str  # a commit where the hub cache resolves it, else as written ("main" default)
    task: str


class Spec(NamedTuple):
    """A deployment, as the command line named it."""

    ref: str
    repo_id: str  # a Hub repo id, or an absolute directory
    revision: Optional[str]
    key: str  # the key nnsight's client mints for it
    identity: Identity


def _hub_cache():
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


def _commit_of(repo_id: str, revision: str) -> str:
    """revision as the hub cache's refs resolve it (a commit), or as written."""
    if _COMMIT.match(revision) or os.path.isabs(repo_id):
        return revision
    ref = os.path.join(_hub_cache(), "models--" + repo_id.replace("/", "--"), "refs", revision)
    try:
        with open(ref) as f:
            commit = f.read().strip()
    except OSError:
        return revision
    return commit if _COMMIT.match(commit) else revision


def identity(repo_id: str, revision: Optional[str], extra: Dict[str, Any]) -> Identity:
    task = extra.get("task") or DEFAULT_TASK
    if os.path.isabs(repo_id):
        return Identity(os.path.normpath(repo_id), "main", str(task))
    return Identity(repo_id, _commit_of(repo_id, revision or "main"), str(task))


def looks_like_key(ref: str) -> bool:
    return ":" in ref and ref.split(":", 1)[1].lstrip().startswith("{")


def parse_key(key: str) -> Tuple[str, Optional[str], Dict[str, Any]]:
    """(repo_id, revision, extra) of a model key; metaload.ModelKeyError when it is none (a class
    metaload does not know, JSON that is not a key's)."""
    import metaload
    parsed = metaload.from_model_key(key, allow_local_paths=True)
    if parsed.canonical_class != "metaload.TransformersModel":
        raise metaload.ModelKeyError(
            f"model key {key!r}: class {parsed.class_path} is not a transformers model "
            f"(metaload serve deploys transformers models only)")
    return parsed.repo_id, parsed.revision, dict(parsed.extra)


def spec(ref: str, revision: Optional[str] = None) -> Spec:
    """The deployment a command-line REF names: a model key, a repo id in the hub cache, or a
    checkpoint directory. metaload.ResolveError when the checkpoint is not here."""
    import metaload
    if looks_like_key(ref):
        repo_id, key_revision, extra = parse_key(ref)
        revision = revision or key_revision
    elif os.path.isdir(ref):
        repo_id, extra = os.path.abspath(ref), {}
    else:
        repo_id, extra = ref, {}
    # Fails now, naming the ref, rather than in the executor.
    metaload.describe_checkpoint(repo_id, revision=revision, allow_local_paths=True)
    extra = {"task": extra.get("task") or DEFAULT_TASK}
    key = metaload.to_model_key(NNSIGHT_CLASS, repo_id, revision, allow_local_paths=True,
                                extra=extra)
    return Spec(ref, repo_id, revision, key, identity(repo_id, revision, extra))


def find(key: str, held: Dict[Identity, Any]):
    """The deployment `key` names, or None (also for a key that does not parse)."""
    try:
        repo_id, revision, extra = parse_key(key)
    except Exception:  # noqa: BLE001 - any malformed key is simply not held
        return None
    return held.get(identity(repo_id, revision, extra))


def describe(s: Spec) -> Dict[str, Any]:
    """What /status reports of a deployment, from its headers and config.json."""
    import metaload
    info = metaload.describe_checkpoint(s.repo_id, revision=s.revision, allow_local_paths=True)
    return {"model_key": s.key, "repo_id": s.repo_id, "revision": s.revision or "main",
            "task": s.identity.task, "n_params": info.n_params, "size_bytes": info.size_bytes,
            "dtype": info.dtype, "max_tp_size": info.max_tp_size,
            "config": json.loads(json.dumps(info.config or {}))}
