"""Dask arrays over a source that counts its reads, for the laziness tests.

A test wraps an array with ``lazy``, builds its dask graph, and checks that
the source was read only once ``compute`` ran.
"""

from __future__ import annotations


class CountingSource:
    """An array source that dask reads block by block; it counts the reads
    that return data, so a test can see that nothing is read until compute."""

    def __init__(self, array):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.ndim = array.ndim
        self.reads = 0

    def __getitem__(self, index):
        block = self.array[index]
        if block.size:  # dask slices zero-size blocks to learn the array type
            self.reads += 1
        return block


def lazy(array, chunks):
    """A dask array over ``array``, in ``chunks``, and its counting source."""
    import dask.array as da  # optional: only the laziness tests need it

    source = CountingSource(array)
    return da.from_array(source, chunks=chunks), source
