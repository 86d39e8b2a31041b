"""The CMake and Bazel builds compile the same sources.

Both builds list their .cc/.cu files by hand (CMakeLists.txt / *.cmake, BUILD.bazel). Per component
(the folder a source lives in), the files one build compiles must be those the other compiles:
a file added to one list only fails here, not on the other build's next user. Torch-free; reads
the build files, runs neither build. tests/fuzz (a standalone sanitizer project) and examples/
(consumer projects) are not part of either build.
"""
import collections
import glob as globmod
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = ("build", "examples", os.path.join("tests", "fuzz"), ".git", "bazel-")
SOURCE = re.compile(r"\.(cc|cu)$")


def _skipped(rel):
    return any(rel == s or rel.startswith(s) for s in SKIP)


def _build_files(names):
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        if rel != "." and _skipped(rel):
            dirnames[:] = []
            continue
        out += [os.path.join(dirpath, f) for f in filenames if names(f)]
    return sorted(out)


def _by_component(paths):
    """{folder: {file name}} for repo-relative source paths."""
    out = collections.defaultdict(set)
    for p in paths:
        out[os.path.dirname(p)].add(os.path.basename(p))
    return dict(out)


# --- CMake ---------------------------------------------------------------------------------------

def _cmake_sources(path):
    """Repo-relative .cc/.cu files named in one CMake file. A *.cmake file is included from the
    CMakeLists.txt beside it, so relative names resolve against its own folder in both cases."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"#[^\n]*", "", text)  # comments (no CMake string here holds a '#')
    here = os.path.dirname(path)
    variables = {"CMAKE_CURRENT_SOURCE_DIR": here, "PROJECT_SOURCE_DIR": ROOT,
                 "CMAKE_SOURCE_DIR": ROOT}
    out = set()
    for token in re.findall(r"[^\s()\"]+", text):
        if not SOURCE.search(token):
            continue
        token = re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], token)
        full = os.path.normpath(token if os.path.isabs(token) else os.path.join(here, token))
        out.add(os.path.relpath(full, ROOT))
    return out


def cmake_sources():
    files = _build_files(lambda f: f == "CMakeLists.txt" or f.endswith(".cmake"))
    assert len(files) > 15, files
    out = set()
    for f in files:
        out |= _cmake_sources(f)
    return out


# --- Bazel ---------------------------------------------------------------------------------------

class _Recorder:
    """Stands for every rule and macro a BUILD file calls; keeps the .cc/.cu srcs it is given."""

    def __init__(self, package, sink):
        self.package, self.sink = package, sink

    def __call__(self, *args, **kwargs):
        for src in kwargs.get("srcs", []) or []:
            if isinstance(src, str) and SOURCE.search(src) and not src.startswith((":", "//", "@")):
                self.sink.add(os.path.normpath(os.path.join(self.package, src)))
        return None

    def __getattr__(self, name):  # native.cc_library and the like
        return self


def _bazel_sources(path):
    package = os.path.relpath(os.path.dirname(path), ROOT)
    sink = set()
    record = _Recorder(package, sink)

    def glob(include, exclude=(), **_):
        found = set()
        for pattern in include:
            found |= {os.path.relpath(p, os.path.join(ROOT, package))
                      for p in globmod.glob(os.path.join(ROOT, package, pattern), recursive=True)}
        for pattern in exclude:
            found -= {os.path.relpath(p, os.path.join(ROOT, package))
                      for p in globmod.glob(os.path.join(ROOT, package, pattern), recursive=True)}
        return sorted(found)

    with open(path) as f:
        text = f.read()
    env = {"glob": glob, "select": lambda d, **_: sum(d.values(), []), "native": record,
           "load": lambda *a, **k: None, "package": lambda **k: None, "True": True,
           "False": False, "None": None}
    # Starlark is close enough to Python for these files: every called name becomes a recorder.
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text)) - set(env):
        env[name] = record
    exec(compile(text, path, "exec"), env)
    return sink


def bazel_sources():
    files = _build_files(lambda f: f in ("BUILD.bazel", "BUILD"))
    assert len(files) > 15, files
    out = set()
    for f in files:
        out |= _bazel_sources(f)
    return out


# --- the tests -----------------------------------------------------------------------------------

def differences(cmake, bazel):
    """{folder: (only in CMake, only in Bazel)} for the folders whose file sets differ."""
    c, b = _by_component(cmake), _by_component(bazel)
    out = {}
    for folder in sorted(set(c) | set(b)):
        only_c = c.get(folder, set()) - b.get(folder, set())
        only_b = b.get(folder, set()) - c.get(folder, set())
        if only_c or only_b:
            out[folder] = (sorted(only_c), sorted(only_b))
    return out


def test_cmake_and_bazel_compile_the_same_sources_per_component():
    cmake, bazel = cmake_sources(), bazel_sources()
    # Both readers see the whole tree (not an empty parse that would agree trivially).
    assert len(cmake) > 100 and len(bazel) > 100, (len(cmake), len(bazel))
    for folder in ("base", "c10_ext", "kernels", "fake_mode", "loader", "loader/format",
                   "loader/engine", "loader/load", "model", "model/families",
                   "tools/cli", "tools/cli/torch", "tests/loader", "tests/model"):
        assert folder in _by_component(cmake), folder
    assert differences(cmake, bazel) == {}, (
        "the builds disagree (folder: (only in CMake, only in Bazel)); add each file to the other "
        "build's list")


def test_every_source_file_is_built():
    """A .cc/.cu file in the tree that neither build compiles is dead or forgotten."""
    built = cmake_sources() | bazel_sources()
    on_disk = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        if rel != "." and _skipped(rel):
            dirnames[:] = []
            continue
        on_disk |= {os.path.normpath(os.path.join(rel, f)) for f in filenames if SOURCE.search(f)}
    assert sorted(on_disk - built) == []


def test_a_file_missing_from_one_build_is_reported():
    cmake, bazel = cmake_sources(), bazel_sources()
    dropped = "loader/format/json_util.cc"
    assert dropped in cmake and dropped in bazel
    assert differences(cmake - {dropped}, bazel) == {"loader/format": ([], ["json_util.cc"])}
    assert differences(cmake, bazel - {dropped}) == {"loader/format": (["json_util.cc"], [])}


def test_module_bazel_has_the_version_of_base_version_h():
    with open(os.path.join(ROOT, "base", "version.h")) as f:
        version = re.search(r'#define METALOAD_VERSION "([^"]+)"', f.read()).group(1)
    with open(os.path.join(ROOT, "MODULE.bazel")) as f:
        module = f.read()
    assert re.search(r'module\(\s*name = "metaload",\s*version = "([^"]+)"', module).group(1) == version


# tests/fuzz builds the torch-free format and identity code on its own (clang, sanitizers): its
# source list must be exactly the sources of the CMake components it names, or a source added to
# them breaks only tools/fuzz's link (as the reference resolver's split once did).
FUZZ_COMPONENTS = {"base_error": "base", "loader_errors": "loader", "loader_format": "loader/format",
                   "loader_format_quant": "loader/format", "loader_tp_quant": "loader/tp",
                   "identity": "identity", "estimate": "estimate"}


def _component_sources(folder, name):
    with open(os.path.join(ROOT, folder, "CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"metaload_component\(\s*" + name + r"\b(.*?)\)", text, re.S)
    assert m, f"{folder}/CMakeLists.txt defines no component {name}"
    words = m.group(1).split()
    files = words[words.index("SOURCES") + 1:]
    files = files[:files.index("DEPS")] if "DEPS" in files else files
    return {os.path.join(folder, f) for f in files}


def test_the_fuzz_build_compiles_the_torch_free_components_it_names():
    with open(os.path.join(ROOT, "tests", "fuzz", "CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"set\(FORMAT_SOURCES(.*?)\)", text, re.S)
    assert m, "tests/fuzz/CMakeLists.txt has no FORMAT_SOURCES list"
    fuzz = {w.replace("${ROOT}/", "") for w in m.group(1).split()}
    for name in FUZZ_COMPONENTS:  # the comment above the list names them
        assert "metaload_" + name in text, name
    want = set().union(*(_component_sources(folder, name)
                         for name, folder in FUZZ_COMPONENTS.items()))
    assert fuzz == want, (f"only in tests/fuzz: {sorted(fuzz - want)}; "
                          f"missing there: {sorted(want - fuzz)}")
