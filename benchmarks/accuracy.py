"""Accuracy of rmsnorm and torch against an exact reference, case by case.

    python benchmarks/accuracy.py          # prints the Markdown table

The corpus, the exact reference and the error measures are in
tests/accuracy_corpus.py, which tests/test_dtypes_accuracy.py asserts the
goals on; this prints them as the README's table. Its "Gemma" rows take
weight_offset=1.0 with weights near 0, against torch's Gemma formula, which
rounds 1 + weight in float32.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from accuracy_corpus import cases, measure  # noqa: E402  (tests/accuracy_corpus.py)


def fmt(value: float, ulps: bool) -> str:
    if math.isinf(value):
        return "inf (overflow/NaN)"
    return f"{value:.2f}" if ulps else f"{value:.1e}"


def table() -> str:
    lines = [
        "| dtype | case | forward max ULP: ours | torch | grad_input error: ours | torch "
        "| grad_weight error: ours | torch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in cases():
        ours, theirs, _ = measure(case)
        theirs = theirs or (math.nan,) * 3
        lines.append(
            f"| {case.dtype} | {case.name} | {fmt(ours[0], True)} | {fmt(theirs[0], True)} "
            f"| {fmt(ours[1], False)} | {fmt(theirs[1], False)} "
            f"| {fmt(ours[2], False)} | {fmt(theirs[2], False)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
