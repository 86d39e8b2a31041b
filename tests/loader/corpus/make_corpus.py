#!/usr/bin/env python3
"""Regenerates the malformed-input corpus and its MANIFEST (python3, no torch needed).

Each entry breaks exactly one rule. MANIFEST lines: <path> <kind> <rule> <tensor or -> # why
*.safetensors are read with read_safetensors_header, *.index.json with read_safetensors_index,
directories with open_checkpoint (tests/loader/corpus_test.cc).
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
entries = []

# Start from a clean directory: everything but this script and the MANIFEST is generated.
for _e in os.listdir(HERE):
    if _e not in ("make_corpus.py", "MANIFEST"):
        _p = os.path.join(HERE, _e)
        shutil.rmtree(_p) if os.path.isdir(_p) else os.remove(_p)


def st(header, data_len=None, pad=True):
    """A safetensors file: header str/bytes, padded with spaces to 8, then data_len zero bytes."""
    h = header.encode() if isinstance(header, str) else header
    if pad:
        h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    if data_len is None:
        data_len = 0
    return struct.pack("<Q", len(h)) + h + b"\0" * data_len


def T(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def add(name, content, kind, rule, tensor="-", why=""):
    path = os.path.join(HERE, name)
    with open(path, "wb") as f:
        f.write(content)
    entries.append((name, kind, rule, tensor, why))


def add_json(name, obj_or_text, kind, rule, tensor="-", why=""):
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    add(name, text.encode(), kind, rule, tensor, why)


def hdr(d):
    return json.dumps(d, separators=(",", ":"))


FE = "FormatError"
SE = "ShardError"

# --- safetensors: file level
add("empty.safetensors", b"", FE, "file-too-small", why="0 bytes")
add("seven-bytes.safetensors", b"\x02\0\0\0\0\0\0", FE, "file-too-small", why="shorter than the length prefix")
add("header-too-large.safetensors", struct.pack("<Q", 100_000_001) + b"{}", FE, "header-too-large",
    why="N one above the 100,000,000 limit")
add("header-huge-length.safetensors", b"\xff" * 8 + b"{}", FE, "header-too-large", why="N = 2^64-1")
add("header-truncated.safetensors", struct.pack("<Q", 64) + b"{}      ", FE, "header-truncated",
    why="N runs past the end of the file")
# --- header text
add("header-empty.safetensors", struct.pack("<Q", 0), FE, "header-not-object", why="N = 0")
add("header-leading-space.safetensors", st(" {}"), FE, "header-not-object", why="must begin with '{'")
add("header-array.safetensors", st("[]"), FE, "header-not-object", why="a JSON array")
add("header-latin1.safetensors", st(b'{"caf\xe9":1}'), FE, "header-not-utf8", why="Latin-1 byte")
add("header-overlong-utf8.safetensors", st(b'{"\xc0\xaf":1}'), FE, "header-not-utf8", why="overlong '/'")
add("header-surrogate-utf8.safetensors", st(b'{"\xed\xa0\x80":1}'), FE, "header-not-utf8",
    why="UTF-8-encoded UTF-16 surrogate")
add("json-unterminated.safetensors", st('{"a":{"dtype":"F32"'), FE, "invalid-json", "a",
    "cut short inside the entry of tensor a")
add("json-trailing-garbage.safetensors", st("{} x"), FE, "invalid-json", why="text after the object")
add("json-nul-padding.safetensors", struct.pack("<Q", 8) + b"{}\0\0\0\0\0\0", FE, "invalid-json",
    why="padded with NUL instead of spaces")
add("json-comment.safetensors", st("{/* c */}"), FE, "invalid-json", why="comments are not JSON")
# --- duplicates
add("duplicate-tensor.safetensors",
    st('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2),
    FE, "duplicate-tensor", "w", "the same name twice (safetensors#401 reported it as an offset error)")
add("duplicate-field.safetensors",
    st('{"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}', 1),
    FE, "duplicate-key", "w", "dtype given twice")
add("duplicate-metadata-key.safetensors", st('{"__metadata__":{"a":"1","a":"2"}}'), FE, "duplicate-key",
    why="metadata key twice")
add("duplicate-metadata-block.safetensors", st('{"__metadata__":{},"__metadata__":{}}'), FE, "duplicate-key",
    why="two __metadata__ blocks")
# --- entries
add("entry-not-object.safetensors", st(hdr({"w": [0, 1]})), FE, "entry-not-object", "w")
add("missing-dtype.safetensors", st(hdr({"w": {"shape": [1], "data_offsets": [0, 1]}}), 1), FE, "missing-field", "w")
add("missing-shape.safetensors", st(hdr({"w": {"dtype": "U8", "data_offsets": [0, 1]}}), 1), FE, "missing-field", "w")
add("missing-offsets.safetensors", st(hdr({"w": {"dtype": "U8", "shape": [1]}}), 1), FE, "missing-field", "w")
add("unknown-dtype.safetensors", st(hdr({"w": T("Q4_K", [1], 0, 1)}), 1), FE, "unknown-dtype", "w", "a GGUF type")
add("lowercase-dtype.safetensors", st(hdr({"w": T("f32", [1], 0, 4)}), 4), FE, "unknown-dtype", "w",
    "dtype names are case-sensitive")
add("dtype-number.safetensors", st(hdr({"w": T(4, [1], 0, 4)}), 4), FE, "unknown-dtype", "w")
add("negative-dim.safetensors", st(hdr({"w": T("U8", [-1], 0, 1)}), 1), FE, "invalid-shape", "w")
add("float-dim.safetensors", st(hdr({"w": T("U8", [1.0], 0, 1)}), 1), FE, "invalid-shape", "w")
add("nested-shape.safetensors", st(hdr({"w": T("U8", [[1]], 0, 1)}), 1), FE, "invalid-shape", "w")
add("deep-nested-shape.safetensors",
    st('{"w":{"dtype":"U8","shape":' + "[" * 5000 + "]" * 5000 + ',"data_offsets":[0,1]}}', 1),
    FE, "invalid-shape", "w", "5000 levels of nesting")
add("deep-unknown-field.safetensors",
    st('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + "[" * 1000 + "]" * 1000 + "}}", 1),
    FE, "json-too-deep", "w", "an ignored field still nests at most kMaxJsonDepth (128) levels")
add("dim-too-big.safetensors", st(hdr({"w": T("U8", [2**63], 0, 1)}), 1), FE, "invalid-shape", "w",
    "dimension above int64")
add("offsets-one-value.safetensors", st(hdr({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}), 1),
    FE, "invalid-offsets", "w")
add("offsets-three-values.safetensors", st(hdr({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}), 1),
    FE, "invalid-offsets", "w")
add("offsets-beyond-u64.safetensors", st(hdr({"w": T("U8", [1], 0, 2**64)}), 1), FE, "invalid-offsets", "w")
add("offsets-string.safetensors", st(hdr({"w": {"dtype": "U8", "shape": [1], "data_offsets": "0,1"}}), 1),
    FE, "invalid-offsets", "w")
# --- sizes and offsets
add("offsets-reversed.safetensors", st(hdr({"w": T("U8", [1], 1, 0)}), 1), FE, "offsets-reversed", "w")
add("size-mismatch.safetensors", st(hdr({"w": T("F32", [2, 2], 0, 12)}), 12), FE, "size-mismatch", "w",
    "4 elements of F32 need 16 bytes")
add("size-overflow-numel.safetensors", st(hdr({"w": T("U8", [2**32, 2**32], 0, 1)}), 1), FE, "size-overflow", "w")
add("size-overflow-bits.safetensors", st(hdr({"w": T("F64", [2**62], 0, 1)}), 1), FE, "size-overflow", "w")
add("f4-odd-count.safetensors", st(hdr({"w": T("F4", [3], 0, 2)}), 2), FE, "misaligned-size", "w",
    "12 bits are not whole bytes")
add("f6-odd-count.safetensors", st(hdr({"w": T("F6_E3M2", [2], 0, 2)}), 2), FE, "misaligned-size", "w")
add("gap.safetensors", st(hdr({"a": T("U8", [2], 0, 2), "b": T("U8", [2], 4, 6)}), 6), FE,
    "offsets-not-contiguous", "b", "2 bytes nobody owns")
add("overlap.safetensors", st(hdr({"a": T("U8", [4], 0, 4), "b": T("U8", [4], 2, 6)}), 6), FE,
    "offsets-not-contiguous", "b")
add("not-from-zero.safetensors", st(hdr({"a": T("U8", [4], 4, 8)}), 8), FE, "offsets-not-contiguous", "a")
add("trailing-bytes.safetensors", st(hdr({"a": T("U8", [4], 0, 4)}), 5), FE, "trailing-bytes", why="1 extra byte")
add("data-truncated.safetensors", st(hdr({"a": T("U8", [4], 0, 4)}), 3), FE, "data-truncated", why="1 byte short")
# --- metadata
add("metadata-array.safetensors", st(hdr({"__metadata__": ["a"]})), FE, "invalid-metadata")
add("metadata-int-value.safetensors", st(hdr({"__metadata__": {"step": 5}})), FE, "invalid-metadata")
add("metadata-nested.safetensors", st(hdr({"__metadata__": {"k": {"a": "b"}}})), FE, "invalid-metadata")

# --- index files
add_json("bad.index.json", '{"weight_map": {', SE, "invalid-json")
add_json("nul-tail.index.json", '{"weight_map": {"w": "a"}}\0garbage', SE, "invalid-json",
         why="nlohmann alone would stop at the NUL")
add("latin1.index.json", b'{"weight_map": {"caf\xe9": "a.safetensors"}}', SE, "json-not-utf8",
    why="a byte that is not UTF-8: named with its offset, never quoted raw")
add_json("array.index.json", [], SE, "index-not-object")
add_json("no-weight-map.index.json", {"metadata": {}}, SE, "missing-weight-map")
add_json("weight-map-array.index.json", {"weight_map": ["a.safetensors"]}, SE, "invalid-weight-map")
add_json("empty-weight-map.index.json", {"weight_map": {}}, SE, "empty-weight-map")
add_json("shard-not-string.index.json", {"weight_map": {"w": 1}}, SE, "invalid-weight-map", "w")
add_json("duplicate-tensor.index.json", '{"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}}', SE,
         "duplicate-tensor", "w")
add_json("duplicate-weight-map.index.json", '{"weight_map": {"w": "a"}, "weight_map": {"w": "a"}}', SE,
         "duplicate-key")
add_json("parent-dir-shard.index.json", {"weight_map": {"w": "../model.safetensors"}}, SE, "invalid-shard-name", "w")
add_json("absolute-shard.index.json", {"weight_map": {"w": "/etc/passwd"}}, SE, "invalid-shard-name", "w")
add_json("subdir-shard.index.json", {"weight_map": {"w": "sub/a.safetensors"}}, SE, "invalid-shard-name", "w")
add_json("dotdot-shard.index.json", {"weight_map": {"w": ".."}}, SE, "invalid-shard-name", "w")
add_json("deep-metadata.index.json",
         '{"metadata": {"x": ' + "[" * 1000 + "]" * 1000 + '}, "weight_map": {"w": "a"}}', SE,
         "json-too-deep", why="1,000 levels; 100,000 overflowed the stack when the index was copied")
add_json("metadata-string.index.json", {"metadata": "x", "weight_map": {"w": "a"}}, SE, "invalid-metadata")
add_json("total-size-negative.index.json", {"metadata": {"total_size": -1}, "weight_map": {"w": "a"}}, SE,
         "invalid-metadata")


# --- checkpoint directories
def shard(names):
    d, off = {}, 0
    for n in names:
        d[n] = T("F32", [2], off, off + 8)
        off += 8
    return st(hdr(d), off)


def add_dir(name, files, kind, rule, tensor="-", why=""):
    path = os.path.join(HERE, name)
    os.makedirs(path)
    for fname, content in files.items():
        with open(os.path.join(path, fname), "wb") as f:
            f.write(content if isinstance(content, bytes) else json.dumps(content).encode())
    entries.append((name, kind, rule, tensor, why))


add_dir("dir-missing-shard", {"a.safetensors": shard(["x"]),
                              "model.safetensors.index.json": {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}},
        SE, "missing-shard", "y", "b.safetensors is not there")
add_dir("dir-index-mismatch", {"a.safetensors": shard(["x"]), "b.safetensors": shard(["y"]),
                               "model.safetensors.index.json": {"weight_map": {"x": "b.safetensors", "y": "b.safetensors"}}},
        SE, "index-mismatch", "x", "x is in a.safetensors, the index says b")
add_dir("dir-tensor-not-in-index", {"a.safetensors": shard(["x", "extra"]),
                                    "model.safetensors.index.json": {"weight_map": {"x": "a.safetensors"}}},
        SE, "tensor-not-in-index", "extra")
add_dir("dir-duplicate-across-shards", {"a.safetensors": shard(["x", "y"]), "b.safetensors": shard(["y"]),
                                        "model.safetensors.index.json": {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}},
        SE, "duplicate-tensor", "y", "y stored in both shards")
add_dir("dir-bad-shard-inside", {"a.safetensors": st(hdr({"x": T("F32", [2], 0, 4)}), 4),
                                 "model.safetensors.index.json": {"weight_map": {"x": "a.safetensors"}}},
        FE, "size-mismatch", "x", "a shard's own header is checked too")


with open(os.path.join(HERE, "MANIFEST"), "w") as f:
    f.write("# <path> <kind> <rule> <tensor or -> # why -- generated by make_corpus.py\n")
    for name, kind, rule, tensor, why in entries:
        f.write(f"{name} {kind} {rule} {tensor}" + (f" # {why}" if why else "") + "\n")
print(f"{len(entries)} corpus entries")
