"""Builds the C extension rmsnorm._core; the metadata is in pyproject.toml."""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = Path("csrc")
SOURCES = sorted(str(p) for p in [*CSRC.glob("kernels/*.c"), *CSRC.glob("numpy/*.c")])

# -ffp-contract=off: the compensated sums rely on every product being rounded
# exactly where the source says. Wider instruction sets are compiled per file
# (csrc/kernels/isa_*.c) and chosen at run time, so the baseline stays
# portable; RMSNORM_NATIVE=1 tunes everything for the building machine.
# -g1: line tables only, which is what profilers and sanitizer reports read;
# the full debug information of Python's own -g took the AVX-512 kernels
# twice as long to compile (146 s against 73 s with gcc 12).
UNIX_FLAGS = [
    "-std=c11", "-O3", "-g1", "-Wall", "-Wextra", "-ffp-contract=off", "-fno-math-errno",
]


class BuildExt(build_ext):
    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            flags = list(UNIX_FLAGS)
            if os.environ.get("RMSNORM_NATIVE") == "1":
                flags.append("-march=native")
            flags += os.environ.get("RMSNORM_EXTRA_CFLAGS", "").split()
            for ext in self.extensions:
                ext.extra_compile_args = flags
                ext.extra_link_args = ["-pthread"] + os.environ.get(
                    "RMSNORM_EXTRA_LDFLAGS", ""
                ).split()
        self.compile_sources_in_parallel()
        super().build_extensions()

    def compile_sources_in_parallel(self):
        """One compiler process per CPU: each instruction set's kernels are a
        file of their own and take a minute or more to compile, and
        setuptools would compile one extension's sources one at a time."""
        compile_serially = self.compiler.compile

        def compile_each(sources, *args, **kwargs):
            def compile_one(source):
                return compile_serially([source], *args, **kwargs)

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                return [obj for objects in pool.map(compile_one, sources) for obj in objects]

        self.compiler.compile = compile_each


setup(
    ext_modules=[
        Extension(
            "rmsnorm._core",
            sources=SOURCES,
            include_dirs=[numpy.get_include()],
            depends=sorted(str(p) for p in CSRC.rglob("*.[hi]*")),
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
