"""Every python example of README.md and docs/*.md runs as written, alone.

Each ```python block is a program of its own: it runs in a fresh interpreter
(``sys.executable``), from a fresh temporary folder, with ``PYTHONPATH``
pointing at the rmsnorm under test and at nothing else of the checkout. So a
block has its own imports and its own data, and reads no file of the
repository: what a reader copies out of one block runs.

A block whose first line starts with ``>>>`` is a doctest session (the study
drill pages in docs/) and runs through ``python -m doctest``, which also
checks what it prints. Any other block is a script and runs as
``python example.py``; examples that start worker processes keep their work
under ``if __name__ == "__main__":``, since the workers import the script.

A block that needs an optional package names the extra that brings it in the
paragraph just above it (``pip install -e ".[dask]"`` from a clone, or
``rmsnorm[dask]``); the extras are read from pyproject.toml. Such a block is
skipped, naming the extra, when a package of that extra is not installed.
Nothing else is skipped, and a block that imports a package of an extra
without naming the extra fails.
"""

from __future__ import annotations

import ast
import doctest
import glob
import importlib.util
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

import rmsnorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PYPROJECT = os.path.join(ROOT, "pyproject.toml")

if not os.path.exists(README):  # an installed copy of the tests, without the sources
    pytest.skip("no README.md next to the tests", allow_module_level=True)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli before 3.11")

# The folder that holds the rmsnorm package under test: the examples run
# with it, and only it, on PYTHONPATH, and so do the worker processes that
# the dask.distributed example starts.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))

# Generous for the examples that start a dask cluster on a busy machine (they
# take seconds), and still an end for one that hangs.
TIMEOUT_SECONDS = 240

FENCE_OPEN = re.compile(r"^(`{3,})(\w*)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
# HTML comments hold text that is not (yet) part of the document.
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
EXTRA_NAMED = re.compile(r"(?:rmsnorm|\.)\[([\w,-]+)\]")   # rmsnorm[dask] or ".[dask]"


def documents():
    """README.md, then docs/*.md, as paths relative to the repository root."""
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return ["README.md"] + [os.path.relpath(page, ROOT) for page in pages]


def anchor(title):
    """The heading's anchor as GitHub makes it: 'L1.2 What eps does' -> 'l12-what-eps-does'."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


@dataclass(frozen=True)
class Example:
    document: str  # relative to the repository root
    section: str   # the nearest heading above the block
    number: int    # counts the python blocks of that section, from 1
    code: str
    extras: tuple  # the extras named in the paragraph just above the block

    @property
    def id(self):
        return f"{self.document}:{anchor(self.section)}:{self.number}"

    @property
    def is_doctest(self):
        return self.code.lstrip().startswith(">>>")

    def imported_packages(self):
        """The top-level names of the packages the block imports, anywhere in it."""
        if self.is_doctest:
            examples = doctest.DocTestParser().get_examples(self.code)
            source = "".join(example.source for example in examples)
        else:
            source = self.code
        packages = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                packages.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                packages.add(node.module.split(".")[0])
        return packages


def last_paragraph(lines):
    """The last paragraph of ``lines``, the text just above a block."""
    text = "".join(lines).rstrip()
    return re.split(r"\n[ \t]*\n", text)[-1] if text else ""


def read_examples(document):
    """The ```python blocks of ``document``, in order."""
    with open(os.path.join(ROOT, document), encoding="utf-8") as file:
        text = COMMENT.sub("", file.read())
    examples, counts = [], {}
    section, prose, fence, language, code = "(top)", [], None, "", []
    for line in text.splitlines(keepends=True):
        if fence is None:
            opening = FENCE_OPEN.match(line)
            if opening:
                fence, language, code = opening.group(1), opening.group(2), []
                continue
            heading = HEADING.match(line)
            if heading:
                section = heading.group(1)
            prose.append(line)
        elif line.strip() == fence:
            if language == "python":
                counts[section] = counts.get(section, 0) + 1
                named = EXTRA_NAMED.findall(last_paragraph(prose))
                extras = tuple(extra for group in named for extra in group.split(","))
                examples.append(Example(document, section, counts[section], "".join(code), extras))
            prose, fence = [], None
        else:
            code.append(line)
    return examples


def requirement_name(requirement):
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("-", "_")


def read_extras():
    """``{extra: [the importable name of each of its packages]}`` from pyproject.toml."""
    with open(PYPROJECT, "rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    return {extra: [requirement_name(r) for r in requirements] for extra, requirements in extras.items()}


EXAMPLES = [example for document in documents() for example in read_examples(document)]
EXTRAS = read_extras()


def run_in_fresh_interpreter(example, folder):
    """Runs ``example`` alone from ``folder``; returns (exit status, output)."""
    if example.is_doctest:
        program, command = "example.txt", [sys.executable, "-m", "doctest", "example.txt"]
    else:
        program, command = "example.py", [sys.executable, "example.py"]
    with open(os.path.join(folder, program), "w", encoding="utf-8") as file:
        file.write(example.code)
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT}
    # A session of its own, so that on a timeout the example goes together
    # with any worker processes it started.
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{example.id} ran past {TIMEOUT_SECONDS} s; its output:\n{output[-6000:]}")
    finally:
        try:  # workers the example left behind
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return process.returncode, output


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.id for example in EXAMPLES])
def test_example_runs_alone_in_a_fresh_interpreter(example, tmp_path):
    for extra in example.extras:
        missing = [name for name in EXTRAS.get(extra, []) if importlib.util.find_spec(name) is None]
        if missing:
            pytest.skip(f'{example.id} needs the {extra} extra, pip install -e ".[{extra}]" '
                        f"({', '.join(missing)} not installed)")
    status, output = run_in_fresh_interpreter(example, str(tmp_path))
    assert status == 0, f"{example.id} exited with status {status}; its output:\n{output[-6000:]}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.id for example in EXAMPLES])
def test_example_names_the_extras_its_imports_need(example):
    unknown = [extra for extra in example.extras if extra not in EXTRAS]
    assert not unknown, f"{example.id} names extras pyproject.toml does not have: {unknown}"
    optional = {name for names in EXTRAS.values() for name in names}
    brought = {name for extra in example.extras for name in EXTRAS[extra]}
    unnamed = sorted((example.imported_packages() & optional) - brought - {"numpy"})
    assert not unnamed, (
        f"{example.id} imports {', '.join(unnamed)}: the paragraph above it should name the "
        f'extra that installs them, as in pip install -e ".[EXTRA]"')


def test_readme_has_the_examples_the_project_promises():
    code = "\n".join(example.code for example in EXAMPLES if example.document == "README.md")
    promised = {
        "the API": "rmsnorm.RMSNorm(",
        "dask on a chunked array from disk": "da.from_zarr(",
        "the same code on a dask.distributed LocalCluster": "LocalCluster(",
        "xarray.apply_ufunc over a named dimension": "xr.apply_ufunc(",
    }
    missing = [what for what, needle in promised.items() if needle not in code]
    assert not missing, f"no README python example shows: {', '.join(missing)}"


def test_examples_that_start_processes_work_under_a_main_guard():
    # The cluster's worker processes import the script as their main module;
    # work done at import time would run again in every one of them.
    for example in EXAMPLES:
        if "LocalCluster(" in example.code:
            tree = ast.parse(example.code)
            top_level_calls = [node for node in tree.body
                               if isinstance(node, (ast.Expr, ast.Assign, ast.With))]
            assert not top_level_calls, f"{example.id} does work outside `if __name__ == \"__main__\":`"


def test_reading_finds_blocks_sections_and_extras(tmp_path, monkeypatch):
    (tmp_path / "doc.md").write_text(
        "intro\n```python\na = 1\n```\n"
        "## One\nNeeds `rmsnorm[dask]`.\n\nJust above, `pip install -e \".[bfloat16]\"`:\n"
        "```python\n# not a heading\nb = 2\n```\n"
        "```sh\nls\n```\n"
        "<!--\n```python\nraise SystemExit\n```\n-->\n"
        "### Two, again\nWith `pip install \"rmsnorm[dask,xarray]\"`:\n"
        "```python\n>>> c = 3\n\n```\n```python\nd = 4\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    examples = read_examples("doc.md")
    assert [(e.section, e.number, e.code, e.extras) for e in examples] == [
        ("(top)", 1, "a = 1\n", ()),
        ("One", 1, "# not a heading\nb = 2\n", ("bfloat16",)),
        ("Two, again", 1, ">>> c = 3\n\n", ("dask", "xarray")),
        ("Two, again", 2, "d = 4\n", ()),
    ]
    assert [e.id for e in examples] == ["doc.md:top:1", "doc.md:one:1",
                                        "doc.md:two-again:1", "doc.md:two-again:2"]
    assert [e.is_doctest for e in examples] == [False, False, True, False]


@pytest.mark.parametrize("document", documents())
def test_markdown_has_no_unclosed_fence_or_comment(document):
    # An unmatched ``` turns the rest of a rendered page into code, and a
    # stray --> shows as text; neither stops the examples above from running.
    with open(os.path.join(ROOT, document), encoding="utf-8") as file:
        text = file.read()
    fences = [line for line in text.splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0, f"{len(fences)} fence lines: one is unclosed"
    assert text.count("<!--") == text.count("-->"), "an HTML comment is not closed or not opened"
