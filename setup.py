"""Builds the C extension rmsnorm._core; the metadata is in pyproject.toml."""

import os
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
UNIX_FLAGS = ["-std=c11", "-O3", "-Wall", "-Wextra", "-ffp-contract=off", "-fno-math-errno"]


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
        super().build_extensions()


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
