"""README.md's shell blocks run as written on a fresh clone.

The blocks run in README order in one fresh copy of the tree (the files `git ls-files` names,
tracked or not ignored, as they are in the working tree: a clone with the current edits), each in
its own `bash -e -o pipefail`, as a reader pasting it into a new terminal: files persist from one
block to the next, shell variables do not. The copy holds what the README's build step leaves:
`bazel-bin/libmetaload.so` and `bazel-bin/tools/metaload`, links to the build under test; the tool
is on PATH (as `pip install` puts it) and `python3` is this interpreter, with its torch. HOME is an
empty directory and no Hugging Face variable is set, so the default hub cache is empty and a block
that needs a cache must say where it is.

A block that cannot run here carries `<!-- readme-test: skip (why) -->` on the line above it, and
SKIPPED below lists it with the same reason; every other shell block must succeed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, cli_path, lib_path

SHELL_LANGS = {"sh", "bash", "shell", "console"}
# Blocks the README marks as not runnable in a test: first command -> the reason given there.
SKIPPED = {
    "tools/demo": "tools/setup installs Debian packages with sudo and PyPI wheels, then Bazel "
                  "builds everything; tools/test is the suite that runs this test",
    "pip install --no-build-isolation .": "a full build of the library, minutes long, installed "
                                          "into the running Python environment; tools/test runs "
                                          "pip install . and tests the installed package",
    "hf download openai-community/gpt2 config.json model.safetensors":
        "downloads from huggingface.co: needs the network, which tests never use",
}
BLOCK_TIMEOUT_S = 120

MARKER = re.compile(r"<!--\s*readme-test:(.*?)-->")
SKIP_MARKER = re.compile(r"^<!-- readme-test: skip \((.+)\) -->$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)\s*$")


class ReadmeError(Exception):
    pass


def shell_blocks(markdown):
    """[(line, code, skip reason or None)] for each shell block; ReadmeError for an unlabelled
    fence, an unclosed one, or a readme-test marker that is malformed or not above a shell block."""
    lines = markdown.splitlines()
    blocks, markers_used = [], set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, fence, lang = i, m.group(2), m.group(3).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ReadmeError(f"README.md:{start + 1}: code block never closed")
        if not lang:
            raise ReadmeError(f"README.md:{start + 1}: code block without a language (say sh if "
                              "it is meant to run)")
        if lang in SHELL_LANGS:
            prev = start - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            reason = None
            if prev >= 0 and MARKER.search(lines[prev]):
                skip = SKIP_MARKER.match(lines[prev].strip())
                if not skip:
                    raise ReadmeError(f"README.md:{prev + 1}: malformed marker {lines[prev]!r}; "
                                      "write <!-- readme-test: skip (reason) -->")
                reason = skip.group(1)
                markers_used.add(prev)
            code = "\n".join(lines[start + 1:end]) + "\n"
            if lang == "console":  # commands after "$ ", output lines dropped
                code = "".join(l[2:] + "\n" for l in code.splitlines() if l.startswith("$ "))
            blocks.append((start + 1, code, reason))
        i = end + 1
    for n, line in enumerate(lines):
        if MARKER.search(line) and n not in markers_used:
            raise ReadmeError(f"README.md:{n + 1}: readme-test marker not directly above a shell "
                              "block")
    return blocks


def first_command(code):
    """The block's first line without its comment."""
    return code.strip().splitlines()[0].split(" #", 1)[0].strip() if code.strip() else ""


def fresh_clone(dest):
    """Copies the files of a clone (with the working tree's current edits) into dest."""
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"the README test copies the tree through git ls-files, which failed in "
                    f"{ROOT}: {r.stderr.decode(errors='replace').strip()}")
    for rel in filter(None, r.stdout.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src):  # deleted in the working tree
            continue
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def user_env(home, tool_dir):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METALOAD", "HF_", "HUGGINGFACE_"))
           and k not in ("LD_PRELOAD", "PYTHONPATH", "XDG_CACHE_HOME", "VIRTUAL_ENV")}
    env["HOME"] = home
    env["PATH"] = os.pathsep.join([tool_dir, os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def run_block(code, cwd, env, timeout=BLOCK_TIMEOUT_S):
    """Runs one block; past the timeout its whole process group is killed and it counts as failed
    (exit code None)."""
    p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, None, out, err + f"\n(killed after {timeout} s)")


@pytest.fixture(scope="module")
def blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return shell_blocks(f.read())


@pytest.fixture(scope="module")
def user_tree(tmp_path_factory):
    """(clone, env): the fresh copy after the README's build step, and a user's environment."""
    top = tmp_path_factory.mktemp("readme")
    clone, home = str(top / "metaload"), str(top / "home")
    os.makedirs(home)
    fresh_clone(clone)
    assert not os.path.exists(os.path.join(clone, "bazel-bin")), "the copy holds a build output"
    os.makedirs(os.path.join(clone, "bazel-bin", "tools"))
    os.symlink(lib_path(), os.path.join(clone, "bazel-bin", "libmetaload.so"))
    os.symlink(os.path.abspath(cli_path()), os.path.join(clone, "bazel-bin", "tools", "metaload"))
    yield clone, user_env(home, os.path.join(clone, "bazel-bin", "tools"))
    shutil.rmtree(top, ignore_errors=True)  # the blocks write a 0.5 GB checkpoint


def test_skipped_blocks_are_the_listed_ones(blocks):
    marked = {first_command(code): reason for _, code, reason in blocks if reason is not None}
    assert marked == SKIPPED
    assert len(blocks) > len(SKIPPED), "no shell block left to run"


def test_shell_blocks_run_as_written(blocks, user_tree):
    clone, env = user_tree
    failures, ran = [], 0
    for line, code, reason in blocks:
        if reason is not None:
            print(f"README.md:{line}: not run ({reason})")
            continue
        r = run_block(code, clone, env)
        ran += 1
        if r.returncode != 0:
            status = "timed out" if r.returncode is None else f"exit {r.returncode}"
            failures.append(f"README.md:{line}: {status}\n{code}--- stdout\n"
                            f"{r.stdout[-2000:]}--- stderr\n{r.stderr[-2000:]}")
    assert ran > 0
    assert not failures, "README shell blocks that fail as written:\n\n" + "\n\n".join(failures)


def test_the_blocks_run_where_a_user_runs_them(user_tree):
    # The tool and python3 of the build under test; a hub cache only where a block sets one.
    clone, env = user_tree
    r = run_block("command -v metaload; command -v python3", clone, env)
    assert r.returncode == 0, r.stderr
    tool, python = r.stdout.splitlines()
    assert os.path.realpath(tool) == os.path.realpath(cli_path())
    assert os.path.dirname(python) == os.path.dirname(sys.executable)
    assert not [k for k in env if k.startswith(("HF_", "HUGGINGFACE_", "METALOAD"))]
    assert "XDG_CACHE_HOME" not in env and env["HOME"] != os.environ.get("HOME")


def test_a_failing_block_fails(tmp_path):
    env = user_env(str(tmp_path), str(tmp_path))
    assert run_block("echo one\ntrue\n", str(tmp_path), env).returncode == 0
    r = run_block("false\necho after\n", str(tmp_path), env)
    assert r.returncode != 0 and "after" not in r.stdout
    r = run_block("false | cat\necho after\n", str(tmp_path), env)
    assert r.returncode != 0 and "after" not in r.stdout
    # A block that outlives its time is stopped with everything it started. The 5 s only has to
    # let bash start its child and write its pid (milliseconds, so 5 s is no speed claim even on a
    # loaded machine); the block itself would run 60 s.
    r = run_block("sleep 60 & echo $! > child\nwait\n", str(tmp_path), env, timeout=5)
    assert r.returncode is None and "killed after 5 s" in r.stderr
    child = int((tmp_path / "child").read_text())
    for _ in range(200):  # SIGKILL is delivered asynchronously (a hang guard: up to 20 s)
        if not running(child):
            break
        time.sleep(0.1)
    assert not running(child)


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_markers_are_checked():
    ok = "text\n\n<!-- readme-test: skip (needs a GPU) -->\n```sh\nnvidia-smi\n```\n" \
         "```python\nx = 1\n```\n```bash\necho hi\n```\n"
    assert shell_blocks(ok) == [(4, "nvidia-smi\n", "needs a GPU"), (10, "echo hi\n", None)]
    assert shell_blocks("```console\n$ echo a\na\n$ echo b\n```\n") == [
        (1, "echo a\necho b\n", None)]
    bad = {
        "```\nls\n```\n": "without a language",
        "```sh\nls\n": "never closed",
        "<!-- readme-test: skip -->\n```sh\nls\n```\n": "malformed marker",
        "<!-- readme-test: skip (why) -->\n```python\nx = 1\n```\n": "not directly above",
        "<!-- readme-test: skip (why) -->\n\ntext\n```sh\nls\n```\n": "not directly above",
    }
    for text, message in bad.items():
        with pytest.raises(ReadmeError, match=message):
            shell_blocks(text)
