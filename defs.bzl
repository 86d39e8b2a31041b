"""Macros every BUILD file uses, so that flags, libtorch and GoogleTest are set in one place."""

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
        copts = COPTS + kwargs.pop("copts", []),
        deps = deps + ["//third_party:gtest_main"],
        data = data,
        env = dict({"METALOAD_SOURCE_DIR": "."}, **env),
        **kwargs
    )

def metaload_cc_binary(name, srcs, deps = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = COPTS + kwargs.pop("copts", []),
        deps = deps,
        **kwargs
    )
