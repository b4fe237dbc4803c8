"""The package metadata is complete and says what the code needs, and the
README and docs/ link into the repository by relative paths only.

These read pyproject.toml, MANIFEST.in and the Markdown pages and take
milliseconds. Building
the sdist and the wheel, and installing the wheel into a fresh environment
outside the repository, is .ci/packaging.sh (about a minute, and it needs a
package index); set RMSNORM_TEST_PACKAGING=1 to run it from here too.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")

if not os.path.exists(PYPROJECT):  # an installed copy of the tests, without the sources
    pytest.skip("no pyproject.toml next to the tests", allow_module_level=True)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli before 3.11")


@pytest.fixture(scope="module")
def pyproject():
    with open(PYPROJECT, "rb") as file:
        return tomllib.load(file)


@pytest.fixture(scope="module")
def project(pyproject):
    return pyproject["project"]


def requirement_names(requirements):
    return [re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements]


def test_summary_licence_and_python_are_declared(project):
    assert project["description"].strip()
    assert project["license"] == "MIT", "an SPDX licence expression"
    for name in project["license-files"]:
        assert os.path.isfile(os.path.join(ROOT, name)), f"licence file {name} is missing"
    assert re.fullmatch(r">=3\.\d+", project["requires-python"])


def test_classifiers_agree_with_requires_python(project):
    classifiers = project["classifiers"]
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], (
        "with an SPDX licence expression, licence classifiers are an error")
    minimum = int(project["requires-python"].split(".")[1])
    versions = sorted(int(c.rsplit(".", 1)[1]) for c in classifiers
                      if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert versions and versions[0] == minimum, (
        f"the oldest Python classifier (3.{versions[0] if versions else '?'}) should be "
        f"requires-python's 3.{minimum}")


# No repository address exists yet, so nothing may link into the repository
# by an absolute address: README.md and docs/ link within the checkout by
# relative paths (which a package index's page cannot follow, and that is
# accepted), and pyproject.toml names no project URLs.
INTO_THE_REPOSITORY = re.compile(
    r"https?://(?:www\.)?(?:github\.com|raw\.githubusercontent\.com)/[^/\s)]+/rmsnorm\b",
    re.IGNORECASE)
PLACEHOLDER = re.compile(r"\bOWNER\b")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")


def documents():
    """README.md and docs/*.md, relative to the repository root."""
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return ["README.md"] + [os.path.relpath(page, ROOT) for page in pages]


def heading_anchors(path):
    """The anchors GitHub gives the headings of the Markdown file at ``path``."""
    with open(path, encoding="utf-8") as file:
        text = re.sub(r"^(`{3,}).*?^\1", "", file.read(), flags=re.DOTALL | re.MULTILINE)
    titles = re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


@pytest.mark.parametrize("document", documents() + ["pyproject.toml"])
def test_nothing_links_into_the_repository_by_an_absolute_address(document):
    with open(os.path.join(ROOT, document), encoding="utf-8") as file:
        text = file.read()
    found = PLACEHOLDER.findall(text) + INTO_THE_REPOSITORY.findall(text)
    assert not found, f"{document}: an OWNER placeholder or an absolute link into the repository: {found}"


@pytest.mark.parametrize("document", documents())
def test_relative_links_lead_to_files_and_headings_that_exist(document):
    # Sections move between the README and docs/; a link left behind would
    # lead nowhere on GitHub, where relative links resolve.
    with open(os.path.join(ROOT, document), encoding="utf-8") as file:
        targets = LINK_TARGET.findall(file.read())
    broken = []
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        path = path or os.path.basename(document)   # "#heading": a heading of this page
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), path))
        if not os.path.exists(resolved):
            broken.append(target)
        elif fragment and not (resolved.endswith(".md")
                               and fragment in heading_anchors(resolved)):
            broken.append(target)
    assert not broken, f"{document} links to files or headings that do not exist: {broken}"


def test_numpy_is_the_only_runtime_requirement(project):
    assert project["dependencies"] == ["numpy>=1.23"]


def test_torch_is_only_pinned_in_the_test_and_torch_extras(project):
    # An unpinned torch would pull the multi-GB CUDA build; rmsnorm.torch's
    # ImportError names the torch extra.
    extras = project["optional-dependencies"]
    assert "torch" not in requirement_names(project["dependencies"])
    assert "torch==2.13.0" in extras["test"]
    assert extras["torch"] == ["torch==2.13.0"]
    for extra, requirements in extras.items():
        if extra not in ("test", "torch"):
            assert "torch" not in requirement_names(requirements), f"torch in the {extra} extra"


def test_optional_extras(project):
    extras = project["optional-dependencies"]
    assert requirement_names(extras["bfloat16"]) == ["ml_dtypes"]
    assert requirement_names(extras["dask"]) == ["dask", "zarr"]
    # distributed through dask's own extra, which keeps the two on one
    # version; a bare "distributed" could resolve to one that cannot import
    for extra in ("dask", "test"):
        assert "dask[array,distributed]" in extras[extra], f"the {extra} extra's dask"
    assert requirement_names(extras["xarray"]) == ["xarray", "dask"]
    assert requirement_names(extras["hf"]) == ["transformers"]
    # The test extra has what the suite's optional tests import.
    needed_names = ["pytest", "hypothesis", "dask", "xarray", "zarr", "mypy", "build", "transformers"]
    for needed in needed_names:
        assert needed in requirement_names(extras["test"]), f"{needed} missing from the test extra"


def test_the_test_extra_runs_every_example(project):
    # The suite runs the examples of the README and docs/, each of which
    # names the extra it needs, and the demo's and the docs' figures need
    # the plots extra; all but the benchmark's peers come with the test extra.
    extras = project["optional-dependencies"]
    for extra, requirements in extras.items():
        if extra not in ("test", "bench"):
            for name in requirement_names(requirements):
                assert name in requirement_names(extras["test"]), (
                    f"{name}, of the {extra} extra, is missing from the test extra")


def test_build_uses_numpy_2_headers(pyproject):
    requires = pyproject["build-system"]["requires"]
    assert "numpy>=2.0" in requires
    assert "setuptools" in requirement_names(requires)


def test_wheel_and_sdist_carry_the_type_information(pyproject):
    package_data = pyproject["tool"]["setuptools"]["package-data"]["rmsnorm"]
    assert "py.typed" in package_data and "*.pyi" in package_data
    for name in ["py.typed", "__init__.pyi", "_core.pyi", "functional.pyi", "module.pyi",
                 "reference.pyi"]:
        assert os.path.isfile(os.path.join(ROOT, "rmsnorm", name)), f"rmsnorm/{name} is missing"


def test_sdist_manifest_takes_all_of_csrc():
    with open(os.path.join(ROOT, "MANIFEST.in")) as file:
        lines = [line.split("#")[0].split() for line in file]
    assert ["graft", "csrc"] in lines, "the sdist needs every header and .inc file under csrc/"


@pytest.mark.skipif(os.environ.get("RMSNORM_TEST_PACKAGING") != "1",
                    reason="builds and installs the package (about a minute, needs a package "
                           "index): set RMSNORM_TEST_PACKAGING=1, or run .ci/packaging.sh")
def test_packaging_script_builds_and_installs_the_wheel():
    result = subprocess.run(["bash", os.path.join(ROOT, ".ci", "packaging.sh")],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
