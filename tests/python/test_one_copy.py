"""One copy of each small fact (issue 23): a helper every layer needs is defined once, in the header
named here, and nowhere else in the library, tests and benchmarks included; the dtype table is
spelled once, in loader/format/safetensors.cc. Torch-free."""
import ast
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


# The one table of the format's dtypes and their torch names (issue 23): each kDTypes row of this
# file holds a format name, its torch attribute and its c10 ScalarType name. Python reads it through
# torch.ops.metaload.safetensors_dtypes. Tests and benchmarks say what they expect on their own.
DTYPE_HOME = "loader/format/safetensors.cc"
DTYPE_ROW = re.compile(r'\{DType::(\w+), "(\w+)", \d+, "(\w+)", "(\w+)", \d+\}')


def dtype_rows():
    """(format name, torch attribute, ScalarType name) of each row of the table that has torch
    names."""
    with open(os.path.join(ROOT, DTYPE_HOME), encoding="utf-8") as fh:
        return [(name, attr, scalar) for enum, name, attr, scalar in DTYPE_ROW.findall(fh.read())
                if enum == name]


def code_lines(path):
    """(line number, code) of a C++ or Python file, comments cut off and Python docstrings left
    out (they may name a pair as an example)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        text = fh.read()
    skip = set()
    if path.endswith(".py"):
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    mark = "#" if path.endswith(".py") else "//"
    return [(n, line.split(mark, 1)[0]) for n, line in enumerate(text.split("\n"), 1)
            if n not in skip]


def dtype_pair_copies(rows, files):
    """'file:line: code' of each line that spells a row's format name ("F8_E4M3", DType::F8_E4M3)
    beside its torch name ("float8_e4m3fn", torch.float8_e4m3fn, "Float8_e4m3fn",
    at::kFloat8_e4m3fn)."""
    pairs = [(re.compile(r"([\"'])" + name + r"\1|DType::" + name + r"\b"),
              re.compile(r"([\"'])(?:" + attr + "|" + scalar + r")\1|\btorch\." + attr + r"\b|"
                         r"\b(?:at::k|c10::k|ScalarType::)" + scalar + r"\b"))
             for name, attr, scalar in rows]
    out = []
    for f in files:
        for n, code in code_lines(f):
            if any(fmt.search(code) and tor.search(code) for fmt, tor in pairs):
                out.append(f"{f}:{n}: {code.strip()}")
    return out


def library_files():
    r = subprocess.run(["git", "ls-files", "*.h", "*.cc", "*.cu", "*.cuh", "*.py"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    return [f for f in r.stdout.split() if os.path.exists(os.path.join(ROOT, f)) and f != DTYPE_HOME
            and not f.startswith(("third_party/", "examples/", "tests/", "bench/"))]


def test_the_dtype_table_is_spelled_once():
    rows = dtype_rows()
    assert len(rows) == 20 and ("F8_E4M3", "float8_e4m3fn", "Float8_e4m3fn") in rows, rows
    bad = dtype_pair_copies(rows, library_files())
    assert bad == [], (f"a second copy of {DTYPE_HOME}'s dtype table (use dtype_torch_attr, "
                       "dtype_scalar_name, dtype_from_scalar_name or, in Python, "
                       "_safetensors.format_dtypes()):\n  " + "\n  ".join(bad))


def test_the_dtype_check_finds_a_planted_copy(tmp_path, monkeypatch):
    import test_one_copy
    (tmp_path / "a.cc").write_text(
        "// F8_E4M3 is \"float8_e4m3fn\" (a comment)\n"
        "static const std::map<DType, std::string> names = {\n"
        "    {DType::F8_E4M3, \"Float8_e4m3fn\"},\n"
        "    {DType::BF16, \"float16\"}};\n"  # not a row's pair
        "  case DType::BF16: return at::kBFloat16;\n")
    (tmp_path / "b.py").write_text(
        '"""Names: ("F8_E4M3", "float8_e4m3fn") in a docstring."""\n'
        '_DTYPES = {"BF16": torch.bfloat16,\n'
        '           "F4": "float4_e2m1fn_x2"}  # and "U8": "uint8" in a comment\n'
        'x = "F32"\n')
    monkeypatch.setattr(test_one_copy, "ROOT", str(tmp_path))
    rows = [("F8_E4M3", "float8_e4m3fn", "Float8_e4m3fn"), ("BF16", "bfloat16", "BFloat16"),
            ("F4", "float4_e2m1fn_x2", "Float4_e2m1fn_x2"), ("U8", "uint8", "Byte"),
            ("F32", "float32", "Float")]
    assert [c.split(": ")[0] for c in dtype_pair_copies(rows, ["a.cc", "b.py"])] == [
        "a.cc:3", "a.cc:5", "b.py:2", "b.py:3"]


# The one reader of config.json (issue 23): identity/config_fields.h's ConfigFields, with one set of
# limits and one rule per refusal. Every library file reads a config's fields through it
# (f.positive_int("n_embd"), ...); none looks one up in the JSON by hand. The fields below are the
# ones the readers used to look up each on its own.
CONFIG_READER = "identity/config_fields.cc"
CONFIG_FIELDS = ("model_type", "architectures", "torch_dtype", "text_config",
                 "vocab_size", "hidden_size", "n_embd", "num_hidden_layers", "n_layer",
                 "num_attention_heads", "n_head", "num_heads", "num_key_value_heads",
                 "num_kv_heads", "head_dim", "intermediate_size", "n_inner", "ffn_dim",
                 "n_positions", "max_position_embeddings", "tie_word_embeddings",
                 "attention_bias", "mlp_bias", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "num_local_experts", "num_experts",
                 "n_routed_experts", "num_experts_per_tok", "experts_per_token",
                 "n_shared_experts")
# (file, field): loader/format lies below identity; find_quant_config looks up the
# quantization_config object (its own reader's, quant_scheme.h) in text_config, no field of it.
CONFIG_BY_HAND_ALLOWED = {("loader/format/quant_scheme.cc", "text_config")}
_FIELD_ALT = "|".join(CONFIG_FIELDS)
CONFIG_LOOKUP = re.compile(r'(?:\.|->)(?:find|contains|at|value|count)\(\s*"(' + _FIELD_ALT
                           + r')"|\[\s*"(' + _FIELD_ALT + r')"\s*\]')


def config_lookups(files):
    """'file:line: code' of each C++ line that looks a config.json field up by hand."""
    out = []
    for f in files:
        if f == CONFIG_READER or not f.endswith((".h", ".cc")):
            continue
        for n, code in code_lines(f):
            for m in CONFIG_LOOKUP.finditer(code):
                if (f, m.group(1) or m.group(2)) not in CONFIG_BY_HAND_ALLOWED:
                    out.append(f"{f}:{n}: {code.strip()}")
                    break
    return out


def test_config_fields_are_read_by_the_one_reader():
    bad = config_lookups(library_files() + [DTYPE_HOME])
    assert bad == [], ("config.json fields read by hand (use identity/config_fields.h's "
                       "ConfigFields):\n  " + "\n  ".join(bad))


def test_the_config_check_finds_a_lookup_by_hand(tmp_path, monkeypatch):
    import test_one_copy
    (tmp_path / "a.cc").write_text(
        "// c.find(\"n_embd\") in a comment\n"
        "auto it = c.find(\"num_attention_heads\");\n"
        "int64_t h = f.positive_int(\"hidden_size\");\n"  # through the reader
        "if (c.contains(\"text_config\")) x = c[\"text_config\"];\n"
        "auto q = config.find(\"quantization_config\");\n")  # no config field of the list
    (tmp_path / "b.h").write_text("return j->value(\"model_type\", \"\");\n")
    monkeypatch.setattr(test_one_copy, "ROOT", str(tmp_path))
    assert [c.split(": ")[0] for c in config_lookups(["a.cc", "b.h"])] == [
        "a.cc:2", "a.cc:4", "b.h:1"]
