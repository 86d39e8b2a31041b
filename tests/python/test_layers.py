"""The layers of the tree (issue 23): layers.bzl is the one table of who may use whom; every
#include and every Bazel dependency of the library follows it, Bazel's visibility comes from it,
and CONTRIBUTING.md's table says the same. Torch-free: reads files only."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

NOT_LIBRARY = ("tests/", "bench/", "examples/", "third_party/", "docs/", "cmake/")


def load_layers(path=os.path.join(ROOT, "layers.bzl")):
    """layers.bzl's names, evaluated as Python (the file is Starlark's Python-compatible subset)."""
    scope = {}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), scope)  # noqa: S102 -- our own file
    return scope


LAYERS = load_layers()


def layer_of(package, layers=None):
    for name, packages, _ in (layers or LAYERS["LAYERS"]):
        if package in packages:
            return name
    return None


def may_use(layers):
    """{layer: every layer it may use, itself included}: what it names and, through them, below."""
    uses = {name: set(u) for name, _, u in layers}
    out = {}
    for name in uses:
        seen, todo = {name}, list(uses[name])
        while todo:
            u = todo.pop()
            if u not in seen:
                seen.add(u)
                todo += uses[u]
        out[name] = seen
    return out


def git_files(*patterns):
    r = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    return [f for f in r.stdout.split() if os.path.exists(os.path.join(ROOT, f))]


def package_of(path):
    """The Bazel package a file belongs to: its nearest folder with a BUILD.bazel."""
    d = os.path.dirname(path)
    while d and not os.path.exists(os.path.join(ROOT, d, "BUILD.bazel")):
        d = os.path.dirname(d)
    return d


def upward_includes(files, layers):
    """'file:line: includes header (layer a may not use layer b)' for each include that breaks
    the table; a file in no layer is itself reported."""
    allowed = may_use(layers)
    bad = []
    for f in files:
        src = layer_of(package_of(f), layers)
        if src is None:
            bad.append(f"{f}: its package '{package_of(f)}' is in no layer of layers.bzl")
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m or not os.path.exists(os.path.join(ROOT, m.group(1))):
                    continue  # a system or generated header
                dst = layer_of(package_of(m.group(1)), layers)
                if dst not in allowed[src]:
                    bad.append(f"{f}:{n}: includes {m.group(1)} ({src} may not use {dst})")
    return bad


def library_sources():
    return [f for f in git_files("*.h", "*.cc", "*.cu", "*.cuh") if not f.startswith(NOT_LIBRARY)]


def library_build_files():
    return [f for f in git_files("*BUILD.bazel") if not f.startswith(NOT_LIBRARY)]


def test_every_library_package_is_in_one_layer():
    packages = {os.path.dirname(b) for b in library_build_files()}
    listed = [p for _, ps, _ in LAYERS["LAYERS"] for p in ps]
    assert len(listed) == len(set(listed)), "a package in two layers"
    assert packages == set(listed), (f"packages in no layer: {sorted(packages - set(listed))}; "
                                     f"layers naming no package: {sorted(set(listed) - packages)}")


def test_layers_name_only_layers_listed_before_them():
    """Lowest first: a layer uses only rows above it, so the table has no circle by construction."""
    seen = set()
    for name, _, uses in LAYERS["LAYERS"]:
        assert set(uses) <= seen, f"{name} uses {sorted(set(uses) - seen)}, not listed before it"
        seen.add(name)


def test_no_include_runs_from_a_layer_up():
    bad = upward_includes(library_sources(), LAYERS["LAYERS"])
    assert bad == [], "includes that run up the layers (layers.bzl):\n  " + "\n  ".join(bad)


def test_the_include_check_finds_an_upward_include(tmp_path, monkeypatch):
    # In a small tree of three layers, a format header may include base but not the model layer.
    layers = [("base", ["base"], []), ("loader/format", ["loader/format"], ["base"]),
              ("model", ["model"], ["loader/format"])]
    for folder, header in [("base", "error.h"), ("loader/format", "ok.h"), ("model", "errors.h")]:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "BUILD.bazel").write_text("")
        (tmp_path / folder / header).write_text("")
    (tmp_path / "loader" / "format" / "ok.h").write_text('#include "base/error.h"\n#include <vector>\n')
    (tmp_path / "loader" / "format" / "up.h").write_text('// one\n#include "model/errors.h"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert upward_includes(["loader/format/ok.h", "model/errors.h"], layers) == []
    assert upward_includes(["loader/format/up.h"], layers) == [
        "loader/format/up.h:2: includes model/errors.h (loader/format may not use model)"]
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "BUILD.bazel").write_text("")
    (tmp_path / "stray" / "x.cc").write_text("")
    assert upward_includes(["stray/x.cc"], layers) == [
        "stray/x.cc: its package 'stray' is in no layer of layers.bzl"]


def bazel_deps(build_file):
    """[(target, dep label)] of a BUILD file's deps lists (our own packages only)."""
    with open(os.path.join(ROOT, build_file), encoding="utf-8") as f:
        text = f.read()
    out = []
    for block in re.finditer(r'name = "([^"]+)"(.*?)(?=\n\w|\Z)', text, re.S):
        for dep in re.findall(r'"(//[^"]*|:[^"]*)"', block.group(2)):
            if dep.startswith("//third_party") or dep.startswith("//visibility"):
                continue
            out.append((block.group(1), dep))
    return out


def test_every_bazel_dependency_follows_the_layers():
    allowed = may_use(LAYERS["LAYERS"])
    bad = []
    for b in library_build_files():
        pkg = os.path.dirname(b)
        for target, dep in bazel_deps(b):
            dst = pkg if dep.startswith(":") else dep[2:].split(":")[0]
            if layer_of(dst) not in allowed[layer_of(pkg)]:
                bad.append(f"//{pkg}:{target} -> {dep}")
    assert bad == [], "Bazel dependencies that run up the layers:\n  " + "\n  ".join(bad)


def test_visibility_comes_from_the_layers_and_only_the_api_is_public():
    public, bad = [], []
    for b in library_build_files():
        pkg = os.path.dirname(b)
        with open(os.path.join(ROOT, b), encoding="utf-8") as f:
            text = f.read()
        assert 'package(default_visibility = ["//visibility:private"])' in text, b
        name = None
        for line in text.splitlines():
            m = re.match(r'\s*name = "([^"]+)"', line)
            name = m.group(1) if m else name
            m = re.match(r"\s*visibility = (.*),$", line)
            if not m:
                continue
            if m.group(1) == '["//visibility:public"]':
                public.append(f"//{pkg}:{name}")
            elif m.group(1) != "layer_users()":
                bad.append(f"//{pkg}:{name}: visibility = {m.group(1)}")
    assert bad == [], "visibility not from layers.bzl's layer_users():\n  " + "\n  ".join(bad)
    assert sorted(public) == sorted(LAYERS["PUBLIC"]), (
        "public targets must be exactly layers.bzl's PUBLIC (the API other workspaces use)")


class FakeNative:
    def __init__(self, package):
        self._package = package

    def package_name(self):
        return self._package


@pytest.mark.parametrize("package,sees,hidden", [
    ("loader/format", ["//identity:__pkg__", "//loader/load:__pkg__", "//model/families:__pkg__"],
     ["//loader/engine:__pkg__", "//kernels:__pkg__", "//distributed:__pkg__"]),
    ("model", ["//model/families:__pkg__", "//tools:__pkg__", "//:__pkg__"],
     ["//identity:__pkg__", "//estimate:__pkg__"]),
    ("base", ["//kernels:__pkg__", "//model:__pkg__"], []),
])
def test_layer_users_is_each_layer_and_those_above(package, sees, hidden):
    scope = load_layers()
    scope["native"] = FakeNative(package)
    users = scope["layer_users"]()
    assert set(sees) <= set(users) and not set(hidden) & set(users), users
    assert set(scope["ANY_LAYER"]) <= set(users)


def contributing_table():
    """{folder: set of layers it may use} from CONTRIBUTING.md's layout table."""
    with open(os.path.join(ROOT, "CONTRIBUTING.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| layer | folders |"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = {u for u in re.findall(r"`([^`]+)`", cells[-1])}
    return rows


def test_contributing_lists_every_layer_with_what_it_uses():
    want = {name: set(uses) for name, _, uses in LAYERS["LAYERS"]}
    assert contributing_table() == want
