"""Builds the C extension rmsnorm._core; the metadata is in pyproject.toml."""

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
LINE_MARKER_FOLDER = re.compile(rb'^(# \d+ ")[^"\n]*/', re.MULTILINE)
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
        if self.compiler.compiler_type == "unix":
            self.reuse_objects_compiled_before()
        self.compile_sources_in_parallel()
        super().build_extensions()

    def reuse_objects_compiled_before(self):
        """An object file is kept under the hash of everything that decides its
        bytes, and copied back when that hash comes round again. pip builds
        each install in a fresh temporary folder and setuptools recompiles
        every file there, so without this each `pip install` of an unchanged
        tree (the Quick start's second command is one) spends the same
        compiler runs again. The hash covers the compiler's
        version, its command line less the include paths (which name pip's
        temporary environments), and the preprocessed source, which holds
        every header's text: an edit anywhere, or another NumPy, is a new key.

        The cache lives in build/object-cache beside setup.py, or in
        $RMSNORM_OBJECT_CACHE; an empty value turns it off."""
        cache = os.environ.get("RMSNORM_OBJECT_CACHE", str(HERE / "build" / "object-cache"))
        if not cache:
            return
        cache = Path(cache)
        compile_uncached = self.compiler._compile
        compiler_so = list(self.compiler.compiler_so)
        version = subprocess.run(
            [compiler_so[0], "--version"], capture_output=True, check=True
        ).stdout

        def object_key(src, cc_args, extra_postargs):
            preprocess = [a for a in cc_args if a != "-c"]
            source_text = subprocess.run(
                [*compiler_so, *preprocess, *extra_postargs, "-E", src],
                capture_output=True, check=True,
            ).stdout
            # Line markers stay (the line tables of -g1 follow them), each
            # reduced to the file's name.
            source_text = LINE_MARKER_FOLDER.sub(rb'\1"', source_text)
            command = [a for a in [*compiler_so, *cc_args, *extra_postargs]
                       if not a.startswith("-I")]
            digest = hashlib.sha256(version)
            for part in [*command, src]:
                digest.update(part.encode() + b"\0")
            digest.update(source_text)
            return digest.hexdigest()

        def compile_cached(obj, src, ext, cc_args, extra_postargs, pp_opts):
            try:
                key = object_key(src, cc_args, extra_postargs)
            except (OSError, subprocess.CalledProcessError):
                # The compiler will report the same problem with its own words.
                return compile_uncached(obj, src, ext, cc_args, extra_postargs, pp_opts)
            cached = cache / f"{key}.o"
            if cached.is_file():
                shutil.copyfile(cached, obj)
                return
            compile_uncached(obj, src, ext, cc_args, extra_postargs, pp_opts)
            # Written beside, then renamed: builds running side by side (CI
            # does) never see half an object.
            cache.mkdir(parents=True, exist_ok=True)
            with open(obj, "rb") as built, tempfile.NamedTemporaryFile(
                dir=cache, delete=False
            ) as partial:
                shutil.copyfileobj(built, partial)
            os.replace(partial.name, cached)

        self.compiler._compile = compile_cached

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
