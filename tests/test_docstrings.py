"""The public API documents itself, and its examples run.

``help(rmsnorm.forward)`` must explain the call: the arguments, the
signature, eps, and an example. Every public function, class and method has
a docstring, and every ``>>>`` example in them runs as a doctest.
"""

from __future__ import annotations

import doctest
import inspect
import pydoc
import re

import numpy as np
import pytest

import rmsnorm
import rmsnorm.functional
import rmsnorm.module
import rmsnorm.reference

PUBLIC = ["forward", "backward", "rms_norm", "rms_norm_backward", "RMSNorm",
          "set_num_threads", "get_num_threads"]

GUFUNC_ARGUMENTS = {
    "forward": ["x", "weight", "eps"],
    "backward": ["grad_output", "x", "weight", "eps"],
}

def rmsnorm_methods():
    params = []
    for name, member in inspect.getmembers(rmsnorm.RMSNorm, inspect.isfunction):
        if name.startswith("_"):
            continue
        params.append(pytest.param(name, id=f"RMSNorm.{name}"))
    return params


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_docstring(name):
    doc = inspect.getdoc(getattr(rmsnorm, name))
    assert doc and len(doc.splitlines()) >= 2, f"rmsnorm.{name} needs a docstring"


@pytest.mark.parametrize("method", rmsnorm_methods())
def test_rmsnorm_method_has_a_docstring(method):
    assert inspect.getdoc(getattr(rmsnorm.RMSNorm, method)), f"RMSNorm.{method} has no docstring"


@pytest.mark.parametrize("name", sorted(GUFUNC_ARGUMENTS))
def test_help_on_a_gufunc_explains_the_call(name):
    gufunc = getattr(rmsnorm, name)
    text = pydoc.render_doc(gufunc, renderer=pydoc.plaintext)
    assert gufunc.signature in text, f"help({name}) should give the signature {gufunc.signature}"
    for argument in GUFUNC_ARGUMENTS[name]:
        assert f"{argument}," in text or f"{argument} :" in text, (
            f"help({name}) should name its argument {argument!r}")
    assert "eps" in text and ("sqrt" in text or "inv_rms" in text), (
        f"help({name}) should say where eps goes")
    assert ">>> " in text, f"help({name}) should show an example"


def docstring_examples():
    """``(name, docstring)`` for every docstring of the package with a >>> example."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    for module in (rmsnorm.functional, rmsnorm.module, rmsnorm.reference):
        for test in finder.find(module):
            found[test.name] = test.docstring
    for name in ("forward", "backward", "set_num_threads", "get_num_threads"):
        found[f"rmsnorm.{name}"] = getattr(rmsnorm, name).__doc__
    return sorted((name, doc) for name, doc in found.items() if doc and ">>>" in doc)


DOCSTRING_EXAMPLES = docstring_examples()


def test_the_documented_functions_have_examples():
    documented = {name for name, _ in DOCSTRING_EXAMPLES}
    for name in ("rmsnorm.forward", "rmsnorm.backward", "rmsnorm.functional.rms_norm",
                 "rmsnorm.functional.rms_norm_backward", "rmsnorm.module.RMSNorm"):
        assert name in documented, f"{name} should have a >>> example"


@pytest.mark.parametrize("name, docstring", DOCSTRING_EXAMPLES,
                         ids=[name for name, _ in DOCSTRING_EXAMPLES])
def test_docstring_example_runs(name, docstring):
    test = doctest.DocTestParser().get_doctest(
        docstring, {"np": np, "rmsnorm": rmsnorm}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
    assert runner.tries > 0


LOOP_LINE = re.compile(r"^\s*(\w+) x: (\w+)(?: or (\w+))? weight, (\w+) eps\b", re.MULTILINE)


@pytest.mark.parametrize("name", sorted(GUFUNC_ARGUMENTS))
def test_help_on_a_gufunc_lists_every_loop(name):
    """The loop table in the docstring is the C extension's, bfloat16's included."""
    doc = getattr(rmsnorm, name).__doc__
    listed = []
    for x, weight, wider_weight, eps in LOOP_LINE.findall(doc):
        listed += [(x, weight, eps)] + ([(x, wider_weight, eps)] if wider_weight else [])
    assert listed == list(rmsnorm._core.dtype_pairs), (
        f"help({name}) lists the loops {listed}, the extension has {rmsnorm._core.dtype_pairs}")
    # .types cannot show bfloat16's loops, whatever is installed: the help says so.
    assert not any("bfloat16" in loop for loop in getattr(rmsnorm, name).types)
    assert f"{name}.types" in doc and "never show the bfloat16 loops" in doc


def test_help_on_the_package_says_where_the_loops_are_listed():
    doc = inspect.getdoc(rmsnorm)
    assert "help(rmsnorm.forward)" in doc and "forward.types" in doc and "bfloat16" in doc


def test_module_getattr_is_documented():
    """help(rmsnorm) shows __getattr__ among the functions: it must say what it is for."""
    doc = inspect.getdoc(rmsnorm.__getattr__)
    assert doc and "rmsnorm.bfloat16" in doc
