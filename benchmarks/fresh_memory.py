"""What a fresh output costs, right after memory was freed and after a pause.

    python benchmarks/fresh_memory.py

The functional API returns new arrays, so at 4096x8192 float32 each call
takes 128 MiB of memory that the kernel must map and zero before rmsnorm
writes a byte. On some virtual machines the host takes back memory the
guest has left free for a moment (virtio-balloon free page reporting), and
getting it back can cost far more than zeroing it. bench.py interleaves
candidates that run for a second or more, so its fresh-output timings fall
on either side of that. This script times the same calls both ways:

- "warm": repeated at once, so each call gets the pages the last one freed;
- "after a pause": each call after `--pause` seconds in which nothing was
  allocated or freed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import rmsnorm

ROWS, HIDDEN = 4096, 8192


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pause", type=float, default=3.0)
    args = parser.parse_args(argv)
    rmsnorm.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, HIDDEN), dtype=np.float32)
    w = rng.standard_normal(HIDDEN, dtype=np.float32)
    y = np.empty_like(x)
    candidates = {
        "np.empty_like(x).fill(1)": lambda: np.empty_like(x).fill(1),
        "rmsnorm.rms_norm (fresh y)": lambda: rmsnorm.rms_norm(x, [HIDDEN], w, 1e-6),
        "rmsnorm.forward(out=y)": lambda: rmsnorm.forward(x, w, np.float32(1e-6), out=y),
    }
    print(f"{ROWS}x{HIDDEN} float32, 1 thread; medians of {args.repeats}, in ms")
    print(f"{'call':<28} {'warm':>8} {'after a pause':>14}")
    for name, fn in candidates.items():
        fn()
        warm = statistics.median(timed_ms(fn) for _ in range(args.repeats))
        paused = []
        for _ in range(args.repeats):
            time.sleep(args.pause)
            paused.append(timed_ms(fn))
        print(f"{name:<28} {warm:>8.1f} {statistics.median(paused):>14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
