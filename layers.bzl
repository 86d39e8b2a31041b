"""The layers of the tree, lowest first: the one table of who may use whom.

Each row: (layer, its Bazel packages, the layers it uses directly). A layer may use what it names
and, through them, everything below them; nothing runs up. CONTRIBUTING.md's layout table says the
same in words, and tests/python/test_layers.py checks that the two agree, that every #include and
every Python-side arrow follows this table, and that BUILD files take their visibility from it
(layer_users) rather than making targets public.
"""

LAYERS = [
    ("base", ["base"], []),
    ("c10_ext", ["c10_ext"], ["base"]),
    ("kernels", ["kernels"], ["base"]),
    ("fake_mode", ["fake_mode"], ["c10_ext", "kernels"]),
    ("loader", ["loader"], ["base"]),  # loader/errors.h: every loader error kind
    ("loader/format", ["loader/format"], ["loader"]),
    ("loader/engine", ["loader/engine"], ["loader", "kernels"]),
    ("loader/tp", ["loader/tp"], ["loader/engine", "loader/format"]),
    ("loader/load", ["loader/load"], ["loader/format", "loader/tp"]),
    ("identity", ["identity"], ["loader/format", "loader/tp"]),
    ("estimate", ["estimate"], ["identity"]),
    ("distributed", ["distributed"], ["base"]),
    ("model", ["model", "model/families"], ["fake_mode", "loader/load", "identity", "distributed"]),
    ("tools", ["tools"], ["model", "estimate"]),
    ("root", [""], ["tools"]),  # //:libmetaload.so, every component in one library
]

# Tests and benchmarks may use any layer.
ANY_LAYER = ["//tests:__subpackages__", "//bench:__subpackages__"]

# The targets other Bazel workspaces build against (examples/bazel_consumer): the product's API.
PUBLIC = ["//:libmetaload.so", "//c10_ext:c10_ext", "//tools:metaload",
          "//distributed:libmetaload_c10d.so"]

def _layer_of(package):
    for name, packages, _ in LAYERS:
        if package in packages:
            return name
    fail("package '%s' is in no layer of layers.bzl: add it to a row" % package)

def _users(layer):
    """Every layer that may use `layer`, directly or through others (a fixed point: no recursion)."""
    users = {layer: True}
    for _ in LAYERS:
        for name, _, uses in LAYERS:
            for used in uses:
                if used in users:
                    users[name] = True
    return users

def layer_users():
    """The visibility of a target other layers use: its own layer's packages and every layer above."""
    users = _users(_layer_of(native.package_name()))
    out = []
    for name, packages, _ in LAYERS:
        if name in users:
            out += ["//%s:__pkg__" % p for p in packages]
    return out + ANY_LAYER
