"""Shared settings of the Bazel build: CMake's compile options and moesh_test()."""

# CMake: add_compile_options(...). -std=c++17 comes from .bazelrc.
MOESH_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
]

def moesh_test(name, src, deps = [], data = [], local_defines = [], binary_dir = "/tmp", size = "small", **kwargs):
    """CMake's moesh_test(name src): a gtest binary linked with moesh_engine.

    Tests run with their runfiles directory as the working directory, so
    MOESH_SOURCE_DIR is "." and every test gets tests/golden/** (//:golden_data)
    as data; other files they read go in `data`. MOESH_BINARY_DIR is "/tmp"
    unless `binary_dir` says otherwise; scratch files belong in
    ::testing::TempDir() ($TEST_TMPDIR).

    Args:
      name: test name, as in CMake.
      src: the test's source file.
      deps: libraries beyond //:moesh_engine and gtest (CMake: target_link_libraries).
      data: files beyond //:golden_data.
      local_defines: defines beyond MOESH_SOURCE_DIR and MOESH_BINARY_DIR.
      binary_dir: MOESH_BINARY_DIR, relative to the runfiles directory or absolute.
      size: bazel test size.
      **kwargs: passed to cc_test.
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = [src],
        copts = MOESH_COPTS,
        data = ["//:golden_data"] + data,
        local_defines = [
            "MOESH_SOURCE_DIR=\\\".\\\"",
            "MOESH_BINARY_DIR=\\\"%s\\\"" % binary_dir,
        ] + local_defines,
        deps = [
            "//:moesh_engine",
            "@system//:gmock",
            "@system//:gtest",
            "@system//:gtest_main",
        ] + deps,
        **kwargs
    )
