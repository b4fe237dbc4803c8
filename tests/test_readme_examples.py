"""Every ```python block of the README runs, as written.

Blocks are grouped by their ``## `` section and each section runs in a fresh
namespace, in a fresh temporary directory, so a block may use the names of
the blocks above it in its section. A section whose code imports an optional
package that is not installed (dask, distributed, xarray, zarr, torch) is
skipped, naming the package.

The README's dask and xarray examples are proposed in
docs_proposed_readme_ecosystem.md until they are merged into README.md;
while that file exists its blocks run too. Once merged, delete the file:
nothing here needs to change.
"""

from __future__ import annotations

import os
import re

import pytest

import rmsnorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PROPOSED = os.path.join(ROOT, "docs_proposed_readme_ecosystem.md")
OPTIONAL_PACKAGES = {"dask", "distributed", "xarray", "zarr", "torch", "ml_dtypes"}

if not os.path.exists(README):  # an installed copy of the tests, without the sources
    pytest.skip("no README.md next to the tests", allow_module_level=True)

# The directory that holds the rmsnorm package under test: the README's
# dask.distributed example starts worker processes, which must import it too.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# HTML comments hold text that is not (yet) part of the document.
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def python_sections(path):
    """``[(section title, [code, ...]), ...]`` for the ```python blocks of ``path``."""
    with open(path, encoding="utf-8") as file:
        text = COMMENT.sub("", file.read())
    sections = []
    for part in re.split(r"^(?=## )", text, flags=re.MULTILINE):
        title = part.splitlines()[0][3:].strip() if part.startswith("## ") else "(top)"
        blocks = [code for lang, code in FENCE.findall(part) if lang == "python"]
        if blocks:
            sections.append((title, blocks))
    return sections


def documents():
    return [path for path in (README, PROPOSED) if os.path.exists(path)]


def all_examples():
    return [(os.path.basename(path), title, blocks)
            for path in documents() for title, blocks in python_sections(path)]


EXAMPLES = all_examples()


@pytest.fixture
def importable_by_workers(monkeypatch):
    """Worker processes (dask.distributed) find this rmsnorm whatever their cwd."""
    monkeypatch.syspath_prepend(PACKAGE_PARENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("document, section, blocks",
                         EXAMPLES, ids=[f"{doc}-{title}" for doc, title, _ in EXAMPLES])
def test_readme_section_runs(document, section, blocks, tmp_path, monkeypatch,
                             importable_by_workers):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for number, code in enumerate(blocks, 1):
        where = f"{document}, section {section!r}, python block {number}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except ModuleNotFoundError as error:
            package = (error.name or "").split(".")[0]
            if package in OPTIONAL_PACKAGES:
                pytest.skip(f"{where} needs {package}, which is optional and not installed")
            raise


def test_readme_has_the_examples_the_project_promises():
    code = "\n".join(block for _, _, blocks in EXAMPLES for block in blocks)
    promised = {
        "the API": "rmsnorm.RMSNorm(",
        "dask on a chunked array from disk": "da.from_zarr(",
        "the same code on a dask.distributed LocalCluster": "LocalCluster(",
        "xarray.apply_ufunc over a named dimension": "xr.apply_ufunc(",
    }
    missing = [what for what, needle in promised.items() if needle not in code]
    assert not missing, f"no README python example shows: {', '.join(missing)}"


def test_section_splitting_finds_blocks_and_skips_comments(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text(
        "intro\n```python\na = 1\n```\n"
        "## One\n```python\nb = 2\n```\n```sh\nls\n```\n"
        "<!--\n```python\nraise SystemExit\n```\n-->\n"
        "## Two\n```python\nc = 3\n```\n")
    assert python_sections(str(document)) == [
        ("(top)", ["a = 1\n"]), ("One", ["b = 2\n"]), ("Two", ["c = 3\n"])]


@pytest.mark.parametrize("path", documents(), ids=os.path.basename)
def test_markdown_has_no_unclosed_fence_or_comment(path):
    # An unmatched ``` turns the rest of a rendered page into code, and a
    # stray --> shows as text; neither stops the examples above from running.
    with open(path, encoding="utf-8") as file:
        text = file.read()
    fences = [line for line in text.splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0, f"{len(fences)} fence lines: one is unclosed"
    assert text.count("<!--") == text.count("-->"), "an HTML comment is not closed or not opened"
