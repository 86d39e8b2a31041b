"""No import circle in the Python package (issue 23).

Every import of a metaload module counts, wherever it is written: at module level, inside a
function, under try or if. A function-local import only hides a circle until the function runs.
The graph's nodes are modules ("metaload", "metaload._fake", "metaload.serve.app", ...):
- `import metaload._x` and `from metaload._x import y`: an edge to metaload._x (relative levels
  resolved against the importing module's package);
- `from . import x` (or `from .serve import x`): an edge to the submodule x where it is one, else to
  the package whose __init__ defines the name.
A package's __init__ importing its submodules is fine; an edge from a submodule back to the package
closes a circle through __init__ when __init__ reaches that submodule. The parents a submodule's
import runs first are no edges (every submodule would have one to metaload). Torch-free: reads the
files with ast, imports nothing of metaload.
"""
import ast
import os
import textwrap

from conftest import ROOT

PACKAGE_DIR = os.path.join(ROOT, "python", "metaload")


def _modules(package_dir, package):
    """{module name: path} for every .py under package_dir (a package's name is its __init__'s)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        rel = os.path.relpath(dirpath, package_dir)
        prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
        for f in sorted(filenames):
            if f.endswith(".py"):
                name = prefix if f == "__init__.py" else prefix + "." + f[:-3]
                out[name] = os.path.join(dirpath, f)
    return out


def _base(module, path, node):
    """The absolute module an ImportFrom names (its relative level resolved), or None."""
    if node.level == 0:
        return node.module
    parts = module.split(".")
    if not path.endswith("__init__.py"):
        parts = parts[:-1]  # a plain module's level 1 is its package
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _targets(module, path, tree, known):
    """The modules of `known` that one file imports."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            if base not in known:
                continue
            for a in node.names:
                sub = base + "." + a.name
                out.add(sub if sub in known else base)
    return out


def import_graph(package_dir, package):
    """{module: set of the package's modules it imports anywhere in its file}."""
    modules = _modules(package_dir, package)
    graph = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        graph[module] = _targets(module, path, tree, modules)
    return graph


def cycles(graph, limit=100):
    """The graph's elementary cycles, each as [a, b, ..., a] starting at its smallest module (at
    most `limit` of them)."""
    found = []

    def walk(start, path, on_path):
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in on_path and len(found) < limit:
                on_path.add(nxt)
                walk(start, path + [nxt], on_path)
                on_path.discard(nxt)

    for start in sorted(graph):
        if len(found) < limit:
            walk(start, [start], {start})
    return found[:limit]


def _shown(found):
    return "\n".join(" -> ".join(c) for c in found)


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE_DIR, "metaload")
    # The walk saw the package: its __init__, its submodules and serve's.
    assert {"metaload", "metaload._mode", "metaload.model", "metaload.serve",
            "metaload.serve.app"} <= set(graph), sorted(graph)
    assert "metaload._lib" in graph["metaload"], graph["metaload"]
    found = cycles(graph)
    assert not found, f"{len(found)} import circles in python/metaload:\n{_shown(found)}"


def _package(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


def test_the_checker_finds_circles_and_only_them(tmp_path):
    circular = _package(tmp_path / "circ", {
        "__init__.py": "from .a import f\nVERSION = 1\n",
        "a.py": "from . import b\n\ndef f():\n    pass\n",
        "b.py": "def g():\n    from .c import h  # hidden in a function: still an edge\n",
        "c.py": "import circ.a\n\ndef h():\n    pass\n",
        "d.py": "from . import VERSION  # a name of __init__: an edge to the package\n",
        "e.py": "from . import d\n",
        "sub/__init__.py": "",
        "sub/x.py": "from .. import e\n\ntry:\n    from ..sub import y\nexcept ImportError:\n"
                    "    pass\n",
        "sub/y.py": "from circ.sub import x\n",
    })
    graph = import_graph(circular, "circ")
    assert graph["circ.b"] == {"circ.c"} and graph["circ.c"] == {"circ.a"}
    assert graph["circ.d"] == {"circ"} and graph["circ.sub.x"] == {"circ.e", "circ.sub.y"}
    assert cycles(graph) == [["circ.a", "circ.b", "circ.c", "circ.a"],
                             ["circ.sub.x", "circ.sub.y", "circ.sub.x"]]
    assert _shown(cycles(graph)).splitlines()[0] == "circ.a -> circ.b -> circ.c -> circ.a"
    # d imports the package, whose __init__ reaches a, b, c but not d: no circle through d. With
    # __init__ importing e (e -> d -> circ), there is one.
    init = tmp_path / "circ" / "__init__.py"
    init.write_text(init.read_text() + "from . import e\n")
    assert ["circ", "circ.e", "circ.d", "circ"] in cycles(import_graph(circular, "circ"))

    dag = _package(tmp_path / "dag", {
        "__init__.py": "from ._low import base\nfrom ._high import top\nfrom . import _high\n",
        "_low.py": "import os\n\ndef base():\n    pass\n",
        "_mid.py": "from ._low import base\nimport dag._low\n",
        "_high.py": "from . import _mid, _low\n\ndef top():\n    from ._mid import base\n",
        "tool.py": "import dag\nfrom . import top\n",
    })
    graph = import_graph(dag, "dag")
    assert graph == {"dag": {"dag._low", "dag._high"}, "dag._low": set(), "dag._mid": {"dag._low"},
                     "dag._high": {"dag._mid", "dag._low"}, "dag.tool": {"dag"}}
    assert cycles(graph) == []
