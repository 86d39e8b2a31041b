"""No function over 80 lines in the library (issue 13), and tools/long_functions itself.

Tests and benchmarks are exempt.
"""
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

TOOL = os.path.join(ROOT, "tools", "long_functions")
# Every library folder at the root (a new one is checked without an edit here), and the CLI.
NOT_LIBRARY = {"bench", "cmake", "docs", "examples", "tests", "third_party", "tools"}
CHECKED = sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d))
                 and not d.startswith((".", "bazel-", "build")) and d not in NOT_LIBRARY) + ["tools/cli"]
EXCLUDED = []


def long_functions(*args, cwd=ROOT):
    return subprocess.run([sys.executable, TOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_no_library_function_is_over_80_lines():
    args = [a for e in EXCLUDED for a in ("--exclude", e)]
    r = long_functions(*args, *CHECKED)
    assert r.returncode == 0 and r.stdout == "", (
        "functions over 80 lines (break them into named steps):\n" + r.stdout + r.stderr)


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


def test_the_tool_finds_long_functions_and_only_them(tmp_path):
    cc = tmp_path / "a.cc"
    cc.write_text(textwrap.dedent("""\
        #define OPEN {
        namespace ns {
        // a comment with a brace {
        const char* s = "{{{";
        const char* raw = R"x( } { )x";
        char c = '{';
        int big_table[] = {
        %s};
        enum class E { kA, kB };
        struct S {
          int method() {
        %s    return 0;
          }
        };
        int short_one() { return 1; }
        int long_free(int a = 3) {
        %s  return a;
        }
        auto lambda = [](int v) {
        %s  return v;
        };
        }  // namespace ns
        """) % ("1,\n" * 100, body(85), body(77), body(80)))
    py = tmp_path / "b.py"
    py.write_text("def f():\n" + "    x = 1\n" * 81 + "\n\ndef g():\n    return 2\n")
    r = long_functions(str(tmp_path))
    assert r.returncode == 1, r.stderr
    found = sorted(line.split()[-1] for line in r.stdout.splitlines())
    # From the opening brace's line to the closing one's: method 88 lines, lambda 82, f 82 (its
    # def to its last line), long_free 80 (not over). The table, the enum, the struct and the
    # namespace are no functions; braces in comments, strings, chars, raw strings and the
    # preprocessor line count for nothing.
    assert found == ["f", "lambda", "method"], r.stdout
    assert f"{cc}:111-198 88 lines method" in r.stdout, r.stdout


def test_the_limit_and_the_exclusions(tmp_path):
    (tmp_path / "a.cc").write_text("void f() {\n" + body(10) + "}\n")
    assert long_functions("--max", "12", str(tmp_path)).returncode == 0
    r = long_functions("--max", "11", str(tmp_path))
    assert r.returncode == 1 and "12 lines f" in r.stdout
    r = long_functions("--max", "11", "--exclude", str(tmp_path / "*.cc"), str(tmp_path))
    assert r.returncode == 0 and r.stdout == ""
    r = long_functions(str(tmp_path / "missing"))
    assert r.returncode == 2 and "no such file or folder" in r.stderr
