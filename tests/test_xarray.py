"""rmsnorm.forward under xarray.apply_ufunc, over a named dimension.

apply_ufunc moves the named core dimension last, so the gufunc sees rows of
the hidden dimension wherever it sits; with dask="parallelized" chunked data
stays lazy. Results must be the bytes of the plain NumPy call on the same
rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes
from supported_dtypes import WIDE_DTYPES

xr = pytest.importorskip("xarray", reason="xarray is optional")


@pytest.fixture(autouse=True)
def threaded_scheduler():
    try:
        import dask
    except ImportError:  # the numpy-backed tests still run
        yield
        return
    with dask.config.set(scheduler="threads"):
        yield


def needs_dask():
    return pytest.importorskip("dask.array", reason="dask[array] is optional (chunked xarray data)")


def activations(dtype, hidden_axis):
    """(hidden=32, batch=3, token=5) data, with "hidden" moved to ``hidden_axis``."""
    data = np.random.default_rng(7).standard_normal((32, 3, 5)).astype(dtype)
    dims = ["hidden", "batch", "token"]
    data = np.moveaxis(data, 0, hidden_axis)
    dims.insert(hidden_axis, dims.pop(0))
    return xr.DataArray(data, dims=dims, coords={"token": np.arange(5) * 10},
                        attrs={"units": "activation"})


def rms_norm_over(dim, data, weight, eps):
    return xr.apply_ufunc(
        rmsnorm.forward, data, weight, eps,
        input_core_dims=[[dim], [dim], []], output_core_dims=[[dim]],
        dask="parallelized", keep_attrs=True,
    ).transpose(*data.dims)


def expected_values(data, weight, eps):
    hidden_axis = data.dims.index("hidden")
    rows = np.moveaxis(data.values, hidden_axis, -1)
    return np.moveaxis(rmsnorm.forward(rows, weight.values, eps), -1, hidden_axis)


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("hidden_axis", [0, 1, 2], ids=lambda a: f"hidden-at-axis-{a}")
def test_apply_ufunc_normalises_over_the_named_dimension(hidden_axis, dtype):
    data = activations(dtype, hidden_axis)
    weight = xr.DataArray(np.linspace(0.5, 1.5, 32, dtype=dtype), dims="hidden")
    eps = dtype(1e-5)

    y = rms_norm_over("hidden", data, weight, eps)

    assert y.dims == data.dims and y.dtype == dtype
    assert (y.token == data.token).all() and y.attrs == data.attrs
    assert_same_bytes(y.values, expected_values(data, weight, eps),
                      what="apply_ufunc over hidden")


@pytest.mark.parametrize("chunks", [{"batch": 1}, {"batch": 2, "token": 2}], ids=str)
def test_apply_ufunc_on_chunked_data_is_lazy(chunks):
    da = needs_dask()
    data = activations(np.float32, 0)
    weight = xr.DataArray(np.ones(32, np.float32), dims="hidden")
    eps = np.float32(1e-6)

    y = rms_norm_over("hidden", data.chunk(chunks), weight, eps)

    assert isinstance(y.data, da.Array), "chunked data should stay a dask array"
    assert y.chunksizes["batch"] == data.chunk(chunks).chunksizes["batch"]
    assert_same_bytes(y.compute().values, expected_values(data, weight, eps),
                      what="apply_ufunc on dask-backed data")


def test_hidden_dimension_in_several_chunks_is_a_clear_error():
    needs_dask()
    data = activations(np.float32, 0).chunk({"hidden": 8})
    weight = xr.DataArray(np.ones(32, np.float32), dims="hidden")
    with pytest.raises(ValueError, match=r"hidden.*multiple chunks.*core dimension"):
        rms_norm_over("hidden", data, weight, np.float32(1e-6))


def test_calling_the_gufunc_on_a_dataarray_points_to_apply_ufunc():
    # xarray does not implement gufuncs itself; its message names the way out.
    data = activations(np.float32, 2)
    for call in (lambda: rmsnorm.forward(data, np.ones(32, np.float32), np.float32(1e-6)),
                 lambda: rmsnorm.rms_norm(data, 32)):
        with pytest.raises(NotImplementedError, match="apply_ufunc"):
            call()
