"""docs/make_figures.py draws what the study drill pages describe.

The pages' examples stand alone, so they cannot import the script; here its
helpers are checked against the claims and the set-ups that the pages make.
They need only NumPy and rmsnorm (matplotlib is imported by ``main`` alone).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import rmsnorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "docs", "make_figures.py")

if not os.path.exists(SCRIPT):  # an installed copy of the tests, without the sources
    pytest.skip("no docs/make_figures.py next to the tests", allow_module_level=True)


@pytest.fixture(scope="module")
def make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timed_composites_compute_rmsnorm_and_layernorm(make_figures):
    # L2.2: the two NumPy composites the timing figure compares.
    x = np.random.default_rng(0).standard_normal((16, 4096), dtype=np.float32)
    weight, bias, eps = np.ones(4096, np.float32), np.zeros(4096, np.float32), np.float32(1e-6)
    np.testing.assert_allclose(make_figures.rms_norm_numpy(x, weight, eps),
                               rmsnorm.forward(x, weight, eps), rtol=1e-5, atol=1e-6)
    centred = x - x.mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(make_figures.layer_norm_numpy(x, weight, bias, eps),
                               rmsnorm.forward(centred, weight, eps), rtol=1e-5, atol=1e-5)


def test_attention_figure_is_the_experiment_of_l3_2(make_figures):
    # docs/L3-deep.md, L3.2: 32 tokens of 64 features and a head of 16 from
    # default_rng(7), in this order; gamma = 1, eps = 0, a shared offset of 3.
    rng = np.random.default_rng(7)
    content = rng.standard_normal((32, 64))
    w_query = rng.standard_normal((64, 16)) / np.sqrt(64)
    w_key = rng.standard_normal((64, 16)) / np.sqrt(64)
    fig_content, fig_query, fig_key = make_figures.attention_setup()
    np.testing.assert_array_equal(fig_content, content)
    np.testing.assert_array_equal(fig_query, w_query)
    np.testing.assert_array_equal(fig_key, w_key)

    h = rmsnorm.forward(content + 3.0, np.ones(64), 0.0)
    scores = (h @ w_query) @ (h @ w_key).T / np.sqrt(16)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    probs = make_figures.attention_probs(make_figures.normalised_tokens(content + 3.0, "rms"),
                                         fig_query, fig_key)
    np.testing.assert_allclose(probs, p, rtol=1e-12)
