"""What the placement of the output relative to the input costs (4K aliasing).

    python benchmarks/aliasing.py

x is page-aligned; y starts `offset` bytes further into its page. A CPU tells
a load from an earlier store by the low 12 bits of their addresses first, so
where y's stores and x's later loads share those bits, the loads wait on
stores they do not depend on. That happens when y lies a little past x in
the page, for the kernels and np.copyto alike. bench.py page-aligns all its
arrays (offset 0), so that its figures do not move with the heap's state;
this table shows what other placements cost. float32, 32x4096 (in cache),
one thread, medians of per-call times over interleaved rounds.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import rmsnorm
from bench import at_page_offset  # benchmarks/bench.py, beside this script

ROWS, HIDDEN = 32, 4096
OFFSETS = [0, 16, 48, 64, 128, 256, 512, 2048, 4080]
ROUNDS = 5


def median_microseconds(fn, calls: int = 500) -> float:
    for _ in range(calls // 10):  # warm-up
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    rmsnorm.set_num_threads(1)
    rng = np.random.default_rng(0)
    x, dy = (at_page_offset((ROWS, HIDDEN), np.float32, 0) for _ in range(2))
    x[...], dy[...] = rng.standard_normal((2, ROWS, HIDDEN))
    w = rng.standard_normal(HIDDEN).astype(np.float32)
    grad_weight = np.empty_like(w)
    eps = np.float32(1e-6)
    outputs = {offset: at_page_offset((ROWS, HIDDEN), np.float32, offset) for offset in OFFSETS}
    samples: dict[int, list[tuple[float, float, float]]] = {offset: [] for offset in OFFSETS}
    for _ in range(ROUNDS):  # interleaved, so that a noisy spell hits every offset alike
        for offset, y in outputs.items():
            samples[offset].append((
                median_microseconds(lambda: np.copyto(y, x)),
                median_microseconds(lambda: rmsnorm.forward(x, w, eps, out=y)),
                median_microseconds(lambda: rmsnorm.backward(dy, x, w, eps, out=(y, grad_weight))),
            ))
    print(f"float32 {ROWS}x{HIDDEN}, 1 thread, microseconds per call (median)\n")
    print("| y's offset past x (bytes) | np.copyto | forward | backward |")
    print("| --- | --- | --- | --- |")
    for offset, rounds in samples.items():
        copy, forward, backward = (statistics.median(column) for column in zip(*rounds))
        print(f"| {offset} | {copy:.1f} | {forward:.1f} | {backward:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
