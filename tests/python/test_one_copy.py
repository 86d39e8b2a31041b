"""One copy of each small fact (issue 23): a helper every layer needs is defined once, in the header
named here, and nowhere else in the library, tests and benchmarks included. Torch-free."""
import os
import re
import subprocess

from conftest import ROOT

# helper -> the one header that defines it
ONE_HOME = {"ends_with": "base/text.h", "shape_str": "base/text.h"}


def definitions(name, files):
    """'file:line' of each C++ definition of a function `name` (a declaration with a body)."""
    pattern = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(?:static\s+|inline\s+)*"
                         r"(?:std::)?[\w:<>]+\s+" + name + r"\s*\([^;]*?\)\s*(?:const\s*)?\{",
                         re.M | re.S)
    out = []
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            text = fh.read()
        out += [f"{f}:{text.count(chr(10), 0, m.start()) + 1}" for m in pattern.finditer(text)]
    return out


def cpp_files():
    r = subprocess.run(["git", "ls-files", "*.h", "*.cc", "*.cu", "*.cuh"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    return [f for f in r.stdout.split() if os.path.exists(os.path.join(ROOT, f))
            and not f.startswith(("third_party/", "examples/"))]


def test_each_helper_is_defined_once_in_its_home():
    files = cpp_files()
    bad = {}
    for name, home in ONE_HOME.items():
        found = definitions(name, files)
        if [f.split(":")[0] for f in found] != [home]:
            bad[name] = found
    assert bad == {}, f"defined elsewhere than {ONE_HOME}: {bad}"


def test_the_check_finds_a_second_definition(tmp_path, monkeypatch):
    import test_one_copy
    (tmp_path / "a.cc").write_text("namespace {\nbool ends_with(const std::string& s,\n"
                                   "               const std::string& x) {\n  return true;\n}\n}\n")
    (tmp_path / "b.h").write_text("bool ends_with(std::string_view s, std::string_view x);\n"
                                  "template <typename T>\nstd::string shape_str(const T& s) {\n}\n")
    monkeypatch.setattr(test_one_copy, "ROOT", str(tmp_path))
    assert definitions("ends_with", ["a.cc", "b.h"]) == ["a.cc:2"]  # b.h only declares it
    assert definitions("shape_str", ["a.cc", "b.h"]) == ["b.h:2"]  # its template line


# The one owner of a file descriptor is base/unique_fd.h's UniqueFd; FileMapping keeps its leased
# descriptor as a member because a lease must be released (F_UNLCK) before the close.
CLOSE_ALLOWED = {"base/unique_fd.h", "loader/engine/file_mapping.cc"}


def test_every_descriptor_the_library_opens_is_held_by_a_unique_fd():
    bad = []
    for f in cpp_files():
        if f.startswith(("tests/", "bench/")):
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                code = line.split("//", 1)[0]
                held = re.search(r"UniqueFd|\.reset\(", code)
                if re.search(r"(?<![\w>])::open\(", code) and not held:
                    bad.append(f"{f}:{n}: {line.strip()}")
                if "::close(" in code and f not in CLOSE_ALLOWED:
                    bad.append(f"{f}:{n}: {line.strip()}")
    assert bad == [], "descriptors opened or closed by hand (use UniqueFd):\n  " + "\n  ".join(bad)
