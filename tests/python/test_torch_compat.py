"""Every difference between libtorch versions lives in base/torch_compat.h.

Other C++/CUDA files use its named helpers (compat::kCpu..., METALOAD_SYMINTS, ...) and never test
the version themselves: no TORCH_VERSION_* or METALOAD_TORCH_AT_LEAST, in an #if or in code, and
no preprocessor conditional on a torch/c10 macro (a feature test such as
`#if defined(C10_AS_INTARRAYREF_SLOW)` is a version test too). The scan reads the source tree, so
it needs no build and runs the same on both torches.
"""
import os
import re

from conftest import ROOT

COMPAT = os.path.join("base", "torch_compat.h")
SOURCE_EXTS = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")

# Names that only the compat header may use.
VERSION_NAMES = re.compile(r"\b(TORCH_VERSION_(MAJOR|MINOR|PATCH)|METALOAD_TORCH_AT_LEAST)\b")
# A preprocessor conditional whose condition names a torch, ATen or c10 macro.
TORCH_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b.*\b(TORCH_|C10_|AT_)\w*")


def version_tests(text):
    """(line number, line) for each version test in one file's text."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("//", 1)[0]
        if VERSION_NAMES.search(code) or TORCH_CONDITIONAL.search(code):
            found.append((n, line.strip()))
    return found


def source_files():
    for top, dirs, files in os.walk(ROOT):
        # Build outputs and Bazel's convenience links hold copies of libtorch's own headers.
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "bazel-")) and d != "build" and
                         not os.path.exists(os.path.join(top, d, "CMakeCache.txt")))
        for name in sorted(files):
            if name.endswith(SOURCE_EXTS):
                yield os.path.relpath(os.path.join(top, name), ROOT)


def test_version_tests_live_in_torch_compat_only():
    files = list(source_files())
    assert COMPAT in files and os.path.join("kernels", "meta_conv_norm.cc") in files, files[:20]
    offenders = []
    for rel in files:
        if rel == COMPAT:
            continue
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            offenders += [f"{rel}:{n}: {line}" for n, line in version_tests(f.read())]
    assert not offenders, ("version tests outside base/torch_compat.h (give the difference a "
                           "name there):\n" + "\n".join(offenders))


def test_the_compat_header_is_where_the_versions_are_told_apart():
    with open(os.path.join(ROOT, COMPAT)) as f:
        assert version_tests(f.read())


def test_the_scan_recognises_each_form():
    caught = [
        "#if METALOAD_TORCH_AT_LEAST(2, 0)",
        "#if !METALOAD_TORCH_AT_LEAST(2, 0)",
        "  #  elif TORCH_VERSION_MINOR >= 1",
        "#if defined(C10_AS_INTARRAYREF_SLOW)",
        "#ifdef TORCH_API_INCLUDE_EXTENSION_H",
        "#ifndef AT_PER_OPERATOR_HEADERS",
        "const bool old = TORCH_VERSION_MAJOR < 2;",
    ]
    for line in caught:
        assert version_tests(line), line
    missed = [
        "#ifdef METALOAD_WITH_CUDA",
        "#if defined(__CUDACC__)",
        "#ifndef MADV_POPULATE_WRITE",
        "if (compat::kCpuGroupNormMixedDtype) {",
        "// 1.13's CPU kernel (was: #if METALOAD_TORCH_AT_LEAST(2, 0))",
    ]
    for line in missed:
        assert not version_tests(line), line
    assert version_tests("int a;\n#if METALOAD_TORCH_AT_LEAST(2, 0)\n#endif\n") == [
        (2, "#if METALOAD_TORCH_AT_LEAST(2, 0)")]
