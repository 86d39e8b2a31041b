"""Macros every BUILD file uses, so that flags, libtorch and GoogleTest are set in one place."""

load("@cuda//:defs.bzl", "HAVE_CUDA", "NVCC")

# Ampere and Hopper code, plus PTX for newer chips.
NVCC_GENCODE = [
    "arch=compute_80,code=sm_80",
    "arch=compute_90,code=sm_90",
    "arch=compute_90,code=compute_90",
]

COPTS = [
    "-std=c++17",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-fPIC",
    "-O2",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
]

def metaload_cc_library(name, srcs = [], hdrs = [], deps = [], torch = True, alwayslink = False, **kwargs):
    """A component library. torch=False for code that must build without libtorch (parsers, fuzzers).

    alwayslink=True for libraries that register operators or fallbacks in static initializers
    (TORCH_LIBRARY, TORCH_LIBRARY_IMPL): without it the linker drops them from binaries.
    """
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        copts = COPTS + kwargs.pop("copts", []),
        deps = deps + (["//third_party:libtorch"] if torch else []),
        alwayslink = alwayslink,
        **kwargs
    )

def metaload_cc_test(name, srcs, deps = [], data = [], env = {}, **kwargs):
    """A GoogleTest binary; runs under `bazel test`."""
    native.cc_test(
        name = name,
        srcs = srcs,
        # Test code itself is light (the libraries it calls are optimised): -O0 compiles ~20% faster.
        copts = COPTS + ["-O0"] + kwargs.pop("copts", []),
        deps = deps + ["//third_party:gtest_main"],
        data = data,
        env = dict({"METALOAD_SOURCE_DIR": "."}, **env),
        # Our libraries go into the test binary itself (libtorch stays shared): with per-library
        # .so files the static CUDA runtime would not be linked into the .so that needs it.
        linkstatic = kwargs.pop("linkstatic", True),
        **kwargs
    )

def metaload_cc_binary(name, srcs = [], deps = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = COPTS + kwargs.pop("copts", []),
        deps = deps,
        **kwargs
    )

def metaload_cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    """Compiles .cu files with nvcc (by absolute path, from @cuda) into a cc_library.

    Where no CUDA toolkit exists the library has no objects, and callers see METALOAD_WITH_CUDA
    undefined (it comes from //third_party:cuda_runtime), so they build their CPU path only.
    """
    objs = []
    if HAVE_CUDA:
        for src in srcs:
            obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
            native.genrule(
                name = obj.replace(".", "_") + "_nvcc",
                srcs = [src] + hdrs,
                outs = [obj],
                cmd = (NVCC + " -c -std=c++17 -O3 -Xcompiler -fPIC -DMETALOAD_WITH_CUDA=1 " +
                       " ".join(["-gencode " + g for g in NVCC_GENCODE]) +
                       " -I. -o $@ $(location " + src + ")"),
            )
            objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        **kwargs
    )

def _cc_headers_impl(ctx):
    merged = cc_common.merge_cc_infos(cc_infos = [dep[CcInfo] for dep in ctx.attr.deps])
    return [CcInfo(compilation_context = merged.compilation_context)]

# The headers (with their include paths and defines) of `deps`, without their objects or link
# flags: for a library that compiles against them but finds their code in libmetaload.so at run
# time (the test operators' library), so that no second copy of the code is linked in.
metaload_cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
