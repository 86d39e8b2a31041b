"""No unit test compares times ("Hardening, round two"): a test asserting that something took less
than N seconds, or less than something else, fails for a user whose machine is busy
(FamilySpeed.Gpt2Generate16Tokens did: 4.2 s against 0.97 s). Timings belong in bench/ (tables of
ratios against an anchor of the same run, bench/RESULTS.md); unit tests assert behaviour.

This reads the sources of tests/ (C++ and Python; no build needed) and fails on every assertion
that compares a measured duration with anything but 0 (`report.seconds > 0` says a duration is
reported at all), unless its test is in ALLOWED: a hang guard, a bounded wait that only tells "the
error arrived" from "blocked for good", its bound several times the expected time and a comment
beside it saying so. Durations are found by a simple static check, not a proof:
  Python (ast): clock calls (time.time, perf_counter, monotonic, process_time, their _ns forms),
    names assigned from an expression that holds one (in the same function), functions returning
    one, and subscripts, attributes and names that say duration ("seconds", ["s"], "elapsed",
    "took", "*_s", "*_ms", ...). Checked: assert statements, and the test of an `if` whose body
    fails the test (pytest.fail, raise).
  C++ (text, comments and strings removed): std::chrono clocks' now(), now_s(), clock_gettime,
    the names assigned from an expression holding one of those, a std::chrono::duration or such a
    name, and `seconds` members and functions (`r.seconds`, `build_seconds()`). Checked: EXPECT_ /
    ASSERT_ LT, LE, GT, GE, NEAR, TRUE, FALSE, and `if` conditions followed by ADD_FAILURE / FAIL.
"""
import ast
import os
import re

import pytest

from conftest import ROOT

# (file, test) -> why its bound is a hang guard. Keep it small: a new entry needs a wait that can
# block for good without its bound, and a bound several times the expected time.
ALLOWED = {
    ("tests/distributed/collectives_test.cc",
     "Collectives.ARankThatNeverAnswersIsATimeoutNamingTheOperation"):
        "the 200 ms collective timeout must end a wait on a group that never answers; bound 10 s",
    ("tests/python/test_dist_load.py", "check_failed_everywhere"):
        "every survivor of a dead or failing rank raises instead of blocking; bound 10-30 s, the "
        "error arrives in hundredths of a second",
    ("tests/python/test_dist_load.py",
     "test_broadcast_feeds_a_tp_forward_on_ranks_without_the_checkpoint"):
        "the receivers are told at once, not after the 20 s timeout; bound 10 s",
    ("tests/python/test_dist_load.py",
     "test_a_silent_rank_is_an_error_on_the_others_after_the_timeout"):
        "the 3 s timeout ends the wait on a silent rank: it waited that long, and not for good "
        "(bound 30 s)",
    ("tests/python/test_tp_forward.py", "test_ranks_that_disagree_on_tp_size_fail_together"):
        "both ranks raise instead of blocking; bound 30 s (a second expected)",
    ("tests/python/test_tp_forward.py",
     "test_a_rank_lost_mid_forward_is_a_distributed_error_not_a_hang"):
        "the 8 s collective timeout ends the wait on a dead or silent rank; bound 45 s, under the "
        "process group's own 60 s",
    ("tests/python/test_tp_forward.py",
     "test_a_rank_that_never_dispatches_stops_the_others_within_the_timeout"):
        "the dispatch vote waits one 8 s collective timeout, not for good; bound 60 s",
}

PY_CLOCKS = {"time", "perf_counter", "monotonic", "process_time", "thread_time", "time_ns",
             "perf_counter_ns", "monotonic_ns", "process_time_ns", "thread_time_ns"}
# Names, attributes and string keys that hold a duration.
DURATION_NAME = re.compile(r"^(seconds|secs|elapsed\w*|took|duration|wall|\w+_(s|ms|us|ns|secs|"
                           r"seconds|elapsed|duration))$")
DURATION_KEY = re.compile(r"^(s|ms|seconds|secs|elapsed|took|duration|wall|\w+_(s|ms|us|ns|"
                          r"secs|seconds))$")
# Functions through which a duration stays a duration.
PY_PASS_THROUGH = {"min", "max", "sum", "abs", "round", "float", "int", "median", "mean", "fsum",
                   "sorted"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


# ---------------------------------------------------------------------------------------------
# Python


class _PyScan:
    """Finds the comparisons of durations in one module's assertions: [(line, function)]."""

    def __init__(self, tree):
        self.tree = tree
        self.clock_names = set()  # `from time import perf_counter [as pc]`
        self.time_modules = {"time"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "time":
                self.clock_names |= {a.asname or a.name for a in node.names if a.name in PY_CLOCKS}
            elif isinstance(node, ast.Import):
                self.time_modules |= {a.asname for a in node.names if a.name == "time" and a.asname}
        self.tainted = {}  # scope node -> names holding a duration
        self.timing_functions = set()  # functions that return one
        self._propagate()

    def _scopes(self):
        yield self.tree
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield node

    @staticmethod
    def _own_nodes(scope):
        """The nodes of a scope, not those of the functions defined in it."""
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(node))

    def is_duration(self, node, names):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in PY_CLOCKS and \
                    isinstance(f.value, ast.Name) and f.value.id in self.time_modules:
                return True
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else None
            if name in self.clock_names or name in self.timing_functions:
                return True
            if name in PY_PASS_THROUGH:
                return any(self.is_duration(a, names) for a in node.args)
            return False
        if isinstance(node, ast.Name):
            return node.id in names or bool(DURATION_NAME.match(node.id))
        if isinstance(node, ast.Attribute):
            return bool(DURATION_NAME.match(node.attr))
        if isinstance(node, ast.Subscript):
            key = node.slice
            return isinstance(key, ast.Constant) and isinstance(key.value, str) and \
                bool(DURATION_KEY.match(key.value))
        if isinstance(node, ast.BinOp):
            return self.is_duration(node.left, names) or self.is_duration(node.right, names)
        if isinstance(node, ast.UnaryOp):
            return self.is_duration(node.operand, names)
        return False

    @staticmethod
    def _pairs(target, value):
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                yield from _PyScan._pairs(t, v)
        elif isinstance(target, ast.Name):
            yield target.id, value

    def _propagate(self):
        changed = True
        while changed:
            changed = False
            for scope in self._scopes():
                names = self.tainted.setdefault(scope, set())
                for node in self._own_nodes(scope):
                    pairs = []
                    if isinstance(node, ast.Assign):
                        for t in node.targets:
                            pairs.extend(self._pairs(t, node.value))
                    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and \
                            node.value is not None:
                        pairs.extend(self._pairs(node.target, node.value))
                    elif isinstance(node, ast.Return) and node.value is not None and \
                            isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                            scope.name not in self.timing_functions and \
                            self.is_duration(node.value, names):
                        self.timing_functions.add(scope.name)
                        changed = True
                    for name, value in pairs:
                        if name not in names and self.is_duration(value, names):
                            names.add(name)
                            changed = True

    def _compares_a_duration(self, test, names):
        for node in ast.walk(test):
            if not isinstance(node, ast.Compare) or \
                    not all(isinstance(o, ORDERING) for o in node.ops):
                continue
            sides = [node.left, *node.comparators]
            if not any(self.is_duration(s, names) for s in sides):
                continue
            others = [s for s in sides if not self.is_duration(s, names)]
            if others and all(isinstance(s, ast.Constant) and s.value == 0 for s in others):
                continue  # reported at all: >= 0, > 0
            return True
        return False

    @staticmethod
    def _fails(body):
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Raise):
                    return True
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "fail":
                    return True
        return False

    def findings(self):
        out = []
        for scope in self._scopes():
            names = self.tainted.get(scope, set())
            where = getattr(scope, "name", "<module>" if scope is self.tree else "<lambda>")
            for node in self._own_nodes(scope):
                test = None
                if isinstance(node, ast.Assert):
                    test = node.test
                elif isinstance(node, ast.If) and self._fails(node.body):
                    test = node.test
                if test is not None and self._compares_a_duration(test, names):
                    out.append((node.lineno, where))
        return sorted(out)


def python_findings(text):
    return _PyScan(ast.parse(text)).findings()


# ---------------------------------------------------------------------------------------------
# C++

CXX_CLOCK = re.compile(r"\b(steady_clock|high_resolution_clock|system_clock)::now\s*\(|"
                       r"\bnow_s\s*\(|\bclock_gettime\b|\bgettimeofday\b|\bduration\s*<|"
                       r"\bduration_cast\s*<")
# A `seconds` member or function (r.seconds, build_seconds()), not std::chrono::seconds.
CXX_SECONDS = re.compile(r"(?<!chrono::)\b\w*seconds\b(?!\s*[{(]\s*\d)")
CXX_ASSIGN = re.compile(r"\b(\w+)\s*=(?!=)\s*([^;]*)")
CXX_ASSERT = re.compile(r"\b(?:EXPECT|ASSERT)_(LT|LE|GT|GE|NEAR|TRUE|FALSE)\s*\(")
CXX_IF = re.compile(r"\bif\s*\(")
CXX_TEST = re.compile(r"\b(?:TYPED_)?TEST(?:_F|_P)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")


def strip_cxx(text):
    """Comments and string / character literals blanked (line numbers kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or
                                                          text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            j = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if j < 0 else j + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _balanced(text, open_at):
    """The text inside the parenthesis opening at text[open_at]."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:j]
    return text[open_at + 1:]


def _split_args(args):
    parts, depth, cur = [], 0, ""
    for c in args:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += c
    parts.append(cur.strip())
    return parts


def cxx_findings(text):
    code = strip_cxx(text)
    tainted = set()
    changed = True
    while changed:
        changed = False
        for m in CXX_ASSIGN.finditer(code):
            name, rhs = m.group(1), m.group(2)
            if name not in tainted and _cxx_duration(rhs, tainted):
                tainted.add(name)
                changed = True
    tests = [(m.start(), f"{m.group(1)}.{m.group(2)}") for m in CXX_TEST.finditer(code)]
    out = []
    for m in CXX_ASSERT.finditer(code):
        args = _split_args(_balanced(code, m.end() - 1))
        if not any(_cxx_duration(a, tainted) for a in args):
            continue
        kind = m.group(1)
        if kind in ("TRUE", "FALSE") and not re.search(r"[<>]", args[0]):
            continue
        if kind in ("GT", "GE") and len(args) > 1 and re.fullmatch(r"0(\.0*)?", args[1]):
            continue  # reported at all
        out.append(m.start())
    for m in CXX_IF.finditer(code):
        cond = _balanced(code, m.end() - 1)
        after = code[m.end() + len(cond):m.end() + len(cond) + 300]
        if re.search(r"[<>]", cond.replace("->", "")) and _cxx_duration(cond, tainted) and \
                re.match(r"\s*\)?\s*\{?[^;{}]*\b(ADD_FAILURE|FAIL|GTEST_FAIL)\b", after):
            out.append(m.start())
    found = []
    for pos in sorted(out):
        test = next((t for start, t in reversed(tests) if start < pos), "")
        found.append((code.count("\n", 0, pos) + 1, test))
    return found


def _cxx_duration(expr, tainted):
    if CXX_CLOCK.search(expr) or CXX_SECONDS.search(expr):
        return True
    return any(re.search(rf"\b{re.escape(t)}\b", expr) for t in tainted)


# ---------------------------------------------------------------------------------------------
# The tree


def scanned_files():
    for top, dirs, files in os.walk(os.path.join(ROOT, "tests")):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".cc", ".h")):
                yield os.path.relpath(os.path.join(top, name), ROOT)


def findings(rel, text):
    return python_findings(text) if rel.endswith(".py") else cxx_findings(text)


def tree_findings():
    out = []
    for rel in scanned_files():
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        out.extend((rel, line, test) for line, test in findings(rel, text))
    return out


def test_no_test_compares_a_measured_duration():
    found = tree_findings()
    bad = [f"{rel}:{line} ({test or 'outside a test'})" for rel, line, test in found
           if (rel, test) not in ALLOWED]
    assert not bad, (
        "tests that compare a measured duration (a busy machine fails them): move the timing to "
        "bench/ and assert behaviour; a hang guard with a generous bound goes in ALLOWED:\n  " +
        "\n  ".join(bad))


def defined_tests(rel):
    """The test (and helper) names a file defines: Python functions, C++ Suite.Name."""
    path = os.path.join(ROOT, rel)
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if rel.endswith(".py"):
        return {n.name for n in ast.walk(ast.parse(text))
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {f"{m.group(1)}.{m.group(2)}" for m in CXX_TEST.finditer(strip_cxx(text))}


def test_no_allowed_entry_excuses_a_test_that_no_longer_needs_it():
    """An entry excusing a test that no longer compares a duration is removed; so is one whose
    file is gone. (An entry naming a test its file does not define is not checked: a guard may be
    listed in the commit before its test's.)"""
    used = {(rel, test) for rel, _, test in tree_findings()}
    stale = sorted((rel, test) for rel, test in ALLOWED if (rel, test) not in used and
                   (not os.path.exists(os.path.join(ROOT, rel)) or test in defined_tests(rel)))
    assert not stale, f"ALLOWED entries that match no bounded wait any more (remove them): {stale}"


# ---------------------------------------------------------------------------------------------
# The check itself, on snippets


@pytest.mark.parametrize("code", [
    "import time\ndef test_a():\n    t0 = time.perf_counter()\n    f()\n"
    "    assert time.perf_counter() - t0 < 1.0\n",
    "import time\ndef test_a():\n    t0 = time.time()\n    f()\n    took = time.time() - t0\n"
    "    assert took < LIMIT\n",
    "from time import monotonic as now\ndef test_a():\n    t = now()\n    assert now() - t <= 2\n",
    # a function returning a duration; one duration against another
    "import time\ndef per_call(n):\n    best = float('inf')\n    for _ in range(5):\n"
    "        t0 = time.perf_counter()\n        best = min(best, (time.perf_counter() - t0) / n)\n"
    "    return best\ndef test_a():\n    shallow, deep = per_call(1), per_call(64)\n"
    "    assert deep < 3 * shallow\n",
    # durations measured in another process, read back
    "def test_a():\n    e = run()\n    assert e['seconds'] < 10, e\n",
    "def test_a():\n    kind, seconds, message = errors()\n    assert seconds < 30\n",
    "def test_a(r):\n    assert 2.5 < r.wall_s < 15\n",
    "import time\nimport pytest\ndef test_a():\n    t0 = time.monotonic()\n    f()\n"
    "    if time.monotonic() - t0 > 5:\n        pytest.fail('slow')\n",
])
def test_python_comparisons_of_durations_are_found(code):
    assert len(python_findings(code)) == 1, code


@pytest.mark.parametrize("code", [
    "def test_a(s):\n    assert s.seconds >= 0\n",  # reported at all
    "def test_a(r):\n    assert r['seconds'] > 0 and r['rss_mb'] < 16\n",
    "import time\ndef test_a():\n    t0 = time.time()\n    print(time.time() - t0)\n"
    "    assert len(x) < 3\n",
    "def test_a(s):\n    assert s < 'b' and len(s) > 2\n",  # `s` is no duration by its name
    "import time\ndef test_a():\n    for _ in range(500):\n        if done():\n            break\n"
    "        time.sleep(0.01)\n    assert done()\n",  # a bounded wait without a clock
])
def test_python_code_without_a_timing_assertion_passes(code):
    assert python_findings(code) == [], code


@pytest.mark.parametrize("code", [
    "TEST(A, B) {\n  auto t0 = std::chrono::steady_clock::now();\n  f();\n"
    "  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)"
    ".count();\n  EXPECT_LT(s, 2.0) << name;\n}\n",
    "TEST(A, B) {\n  auto t2 = std::chrono::steady_clock::now();\n  auto t3 = t2;\n"
    "  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };\n"
    "  EXPECT_LT(secs(t2, t3), secs(t3, t2));\n}\n",
    "TEST(A, B) {\n  const auto t0 = std::chrono::steady_clock::now();\n  f();\n"
    "  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);\n}\n",
    "TEST(A, B) {\n  const double t = now_s();\n  f();\n  EXPECT_TRUE(now_s() - t < 1);\n}\n",
    "TEST(A, B) {\n  auto r = load();\n  ASSERT_LE(r.seconds, 30.0);\n}\n",
    "TEST(A, B) {\n  const double t = now_s();\n"
    "  if (now_s() - t > 3) ADD_FAILURE() << \"slow\";\n}\n",
])
def test_cxx_comparisons_of_durations_are_found(code):
    assert [t for _, t in cxx_findings(code)] == ["A.B"], code


@pytest.mark.parametrize("code", [
    "TEST(A, B) {\n  EXPECT_GT(m.build_seconds(), 0);\n  EXPECT_GT(r.seconds, 0);\n}\n",
    "TEST(A, B) {\n  // EXPECT_LT(elapsed_seconds, 2.0) in a comment\n"
    "  EXPECT_EQ(f(\"seconds < 3\"), 1);\n}\n",
    "TEST(A, B) {\n  auto done = std::async(std::launch::async, f);\n"
    "  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {\n"
    "    ADD_FAILURE() << \"blocked\";\n  }\n  EXPECT_LT(n, 3);\n}\n",
    "TEST(A, B) {\n  Collectives c(g, 10s);\n  EXPECT_TRUE(x < y);\n}\n",
])
def test_cxx_code_without_a_timing_assertion_passes(code):
    assert cxx_findings(code) == [], code
