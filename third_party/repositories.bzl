"""Repositories for the system's libraries, so that Bazel builds fully offline from Debian packages.

Nothing here downloads: each rule links files that Debian's packages installed into an external
repository and writes its BUILD file. The stand-ins at the end replace repositories that Bazel 4
would otherwise fetch from the network.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

def _link_all(ctx, src, dst):
    ctx.symlink(src, dst)

def _libtorch_impl(ctx):
    # METALOAD_TORCH_PREFIX: the libtorch to build against. /usr (Debian's libtorch-dev, the default)
    # or a torch wheel's folder (.../site-packages/torch, as tools/torch2_env's environment has).
    prefix = ctx.os.environ.get("METALOAD_TORCH_PREFIX", "/usr")
    inc = prefix + "/include"
    wheel = ctx.path(prefix + "/lib/libtorch.so").exists
    default_libdir = prefix + "/lib" if wheel else prefix + "/lib/x86_64-linux-gnu"
    libdir = ctx.os.environ.get("METALOAD_TORCH_LIBDIR", default_libdir)
    if not ctx.path(inc + "/torch/library.h").exists:
        fail("libtorch headers not found under %s: install libtorch-dev (tools/setup does) or set " % inc +
             "METALOAD_TORCH_PREFIX to a torch wheel's folder")

    # Only these folders: linking all of /usr/include would shadow the compiler's own headers and
    # break #include_next. torch 2.x wheels bundle {fmt} 11+ (fmt/base.h), which their headers
    # need: it comes along and is compiled header-only, whatever fmt the system has.
    dirs = ["torch", "ATen", "c10", "caffe2"]
    defines = ["_GLIBCXX_USE_CXX11_ABI=1"]
    if ctx.path(inc + "/fmt/base.h").exists:
        dirs.append("fmt")
        defines.append("FMT_HEADER_ONLY=1")
    for d in dirs:
        _link_all(ctx, inc + "/" + d, "include/" + d)
    libs = []

    # A wheel's libtorch.so needs libtorch_cuda.so & co. from its own folder; Bazel links a copy
    # under _solib, whose $ORIGIN is elsewhere. An old-style RPATH (unlike RUNPATH) also serves
    # those indirect dependencies.
    dtags = ["-Wl,--disable-new-dtags"] if wheel else []
    if wheel:
        # A wheel's libtorch exports crashing copies of some libstdc++ functions (std::filesystem):
        # the real libstdc++ goes first in every binary's needed list (as in CMakeLists.txt).
        for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]:
            if ctx.path(d + "/libstdc++.so.6").exists:
                _link_all(ctx, d + "/libstdc++.so.6", "lib/libstdc++.so.6")
                libs.append("lib/libstdc++.so.6")
                break
    for lib in ["libc10.so", "libtorch_cpu.so", "libtorch.so"]:
        _link_all(ctx, libdir + "/" + lib, "lib/" + lib)
        libs.append("lib/" + lib)
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "libtorch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = %s,
    srcs = %s,
    linkopts = ["-Wl,-rpath,%s", "-lpthread"] + %s,
)
""" % (repr(defines), repr(libs), libdir, repr(dtags)))

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    environ = ["METALOAD_TORCH_PREFIX", "METALOAD_TORCH_LIBDIR"],
    local = True,
)

def _cuda_impl(ctx):
    root = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    have = ctx.path(root + "/bin/nvcc").exists and ctx.path(root + "/include/cuda_runtime.h").exists
    if have:
        _link_all(ctx, root + "/include", "include")
        _link_all(ctx, root + "/lib64", "lib64")
        ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)
# The static runtime: binaries then run on machines without a CUDA install, and fail only
# when a CUDA call is made (the engines probe for a device first).
cc_library(
    name = "cuda_runtime",
    srcs = ["lib64/libcudart_static.a"],
    deps = [":cuda_headers"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    defines = ["METALOAD_WITH_CUDA=1"],
)
""")
        ctx.file("defs.bzl", "NVCC = %s\nHAVE_CUDA = True\n" % repr(root + "/bin/nvcc"))
    else:
        ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda_headers")
cc_library(name = "cuda_runtime")
""")
        ctx.file("defs.bzl", "NVCC = None\nHAVE_CUDA = False\n")

cuda_repository = repository_rule(
    implementation = _cuda_impl,
    environ = ["CUDA_HOME"],
    local = True,
)

def _stub_impl(ctx):
    for path, content in ctx.attr.files.items():
        ctx.file(path, content)

stub_repository = repository_rule(
    implementation = _stub_impl,
    attrs = {"files": attr.string_dict()},
    local = True,
)

# Bazel 4 always loads @rules_cc (through @bazel_tools) and @rules_java (through @bazel_tools//tools/jdk) and gives every *_test an
# implicit dependency on @remote_coverage_tools; both are downloads. These stand-ins keep the
# build offline (the price: `bazel coverage` is not available).
_RULES_JAVA_DEFS = """
def java_binary(**kwargs):
    native.java_binary(**kwargs)
def java_import(**kwargs):
    native.java_import(**kwargs)
def java_library(**kwargs):
    native.java_library(**kwargs)
def java_lite_proto_library(**kwargs):
    native.java_lite_proto_library(**kwargs)
def java_proto_library(**kwargs):
    native.java_proto_library(**kwargs)
def java_test(**kwargs):
    native.java_test(**kwargs)
def java_plugin(**kwargs):
    native.java_plugin(**kwargs)
def java_runtime(**kwargs):
    native.java_runtime(**kwargs)
def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
"""

_COVERAGE_BUILD = """
package(default_visibility = ["//visibility:public"])
filegroup(name = "coverage_report_generator", srcs = ["noop.sh"])
filegroup(name = "lcov_merger", srcs = ["noop.sh"])
sh_binary(name = "Main", srcs = ["noop.sh"])
"""

# Debian's bazel-rules-cc needs Bazel 5: Bazel 4's cc rules are native, so this re-exports them.
_RULES_CC_DEFS = """
def cc_binary(**attrs):
    native.cc_binary(**attrs)
def cc_import(**attrs):
    native.cc_import(**attrs)
def cc_library(**attrs):
    native.cc_library(**attrs)
def cc_test(**attrs):
    native.cc_test(**attrs)
def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)
def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)
def fdo_profile(**attrs):
    native.fdo_profile(**attrs)
def objc_library(**attrs):
    native.objc_library(**attrs)
def objc_import(**attrs):
    native.objc_import(**attrs)
def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)
def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)
"""

def metaload_dependencies():
    """Declares every repository metaload's BUILD files use; call it from your WORKSPACE.

    maybe(): a repository the WORKSPACE declared before this call (a consumer's own rules_cc,
    rules_java or remote_coverage_tools) wins over the offline stand-ins below.
    """
    maybe(
        stub_repository,
        name = "rules_cc",
        files = {
            "WORKSPACE": "workspace(name = \"rules_cc\")\n",
            "BUILD.bazel": "",
            "cc/BUILD.bazel": "package(default_visibility = [\"//visibility:public\"])\n",
            "cc/defs.bzl": _RULES_CC_DEFS,
        },
    )
    maybe(
        stub_repository,
        name = "rules_java",
        files = {
            "WORKSPACE": "workspace(name = \"rules_java\")\n",
            "BUILD.bazel": "",
            "java/BUILD.bazel": "",
            "java/defs.bzl": _RULES_JAVA_DEFS,
        },
    )
    maybe(
        stub_repository,
        name = "remote_coverage_tools",
        files = {
            "WORKSPACE": "",
            "BUILD.bazel": _COVERAGE_BUILD,
            "noop.sh": "#!/bin/sh\nexit 0\n",
        },
    )
    maybe(libtorch_repository, name = "libtorch")
    maybe(cuda_repository, name = "cuda")
