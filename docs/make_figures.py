"""Regenerates the figures (and the timing table) of the study-drill answers.

Run from the repository root, with rmsnorm importable and matplotlib installed
(``pip install -e ".[plots]"``)::

    python docs/make_figures.py                    # everything, about half a minute
    python docs/make_figures.py --skip-timing      # only the figures that do not time anything
    python docs/make_figures.py --out docs/figures # replace the figures the docs show

It writes into ``build/figures/`` unless ``--out`` names another folder, so
that a trial run leaves the tracked figures in ``docs/figures/`` alone:

- ``jacobian_singular_values.png`` (L3.3): the singular values of RMSNorm's
  Jacobian, built from ``rmsnorm.backward``, against ``||x||``.
- ``attention_ln_vs_rms.png`` (L3.2): softmax attention over LayerNorm- and
  RMSNorm-normalised tokens that share a constant offset.
- ``norm_timing.png`` and ``norm_timing.md`` (L2.2, L3.4): time per element of
  RMSNorm and LayerNorm written the same way (NumPy composites), of
  ``rmsnorm.forward`` and of a plain copy.

Everything random is seeded. The timings depend on the machine; the other
two figures do not. The helpers at the top need only NumPy and rmsnorm (no
matplotlib), so ``tests/test_docs_figures.py`` imports them and checks that
the figures show what the pages say.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

import numpy as np

try:
    import rmsnorm
except ImportError:  # run as `python docs/make_figures.py` from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import rmsnorm

DOCS_DIR = os.path.dirname(os.path.abspath(__file__))
# build/ is ignored by git: running the script changes nothing tracked unless --out says so.
DEFAULT_OUT = os.path.join(os.path.dirname(DOCS_DIR), "build", "figures")
PLOTS_MISSING = (
    'matplotlib is not installed: pip install "rmsnorm[plots]", or pip install -e ".[plots]" '
    "in a checkout (the plots extra; pip install matplotlib also does)"
)


# --- the two normalisations, written the same way -----------------------------------------


def rms_norm_numpy(x, weight, eps):
    """RMSNorm over the last axis as a NumPy composite: one reduction, no centring, no bias."""
    inv_rms = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv_rms * weight


def layer_norm_numpy(x, weight, bias, eps):
    """LayerNorm over the last axis, in the same style: two reductions, a centring and a bias."""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    inv_std = 1 / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return centred * inv_std * weight + bias


# --- L2.1 / L3.3: the Jacobian, from rmsnorm's own backward -------------------------------


def jacobian_from_backward(x, weight, eps):
    """J[j, i] = d y_j / d x_i for one row ``x``, from ``rmsnorm.backward``.

    The backward of a unit output gradient e_j is row j of J (the vector-Jacobian
    product e_j^T J). Stacking the n unit vectors as the m=n rows of one call
    gives all of J at once; x is broadcast to every row without a copy.
    """
    n = x.shape[-1]
    grad_input, _ = rmsnorm.backward(np.eye(n, dtype=x.dtype), np.broadcast_to(x, (n, n)), weight, eps)
    return grad_input


# --- L3.2: a tiny attention head -----------------------------------------------------------


def attention_setup(tokens=32, d_model=64, d_head=16, seed=7):
    """Token contents and the query/key projections of one random attention head."""
    rng = np.random.default_rng(seed)
    content = rng.standard_normal((tokens, d_model))
    w_query = rng.standard_normal((d_model, d_head)) / np.sqrt(d_model)
    w_key = rng.standard_normal((d_model, d_head)) / np.sqrt(d_model)
    return content, w_query, w_key


def attention_probs(h, w_query, w_key):
    """softmax(q k^T / sqrt(d_head)) over the keys, for normalised tokens ``h``."""
    scores = (h @ w_query) @ (h @ w_key).T / np.sqrt(w_query.shape[1])
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def normalised_tokens(x, which):
    """``x`` normalised over features by "rms" (rmsnorm.forward) or "layer" (LayerNorm); gamma = 1, eps = 0."""
    ones = np.ones(x.shape[-1])
    if which == "rms":
        return rmsnorm.forward(x, ones, 0.0)
    return layer_norm_numpy(x, ones, 0.0, 0.0)


def entropy(p):
    """Entropy in nats of each row of probabilities."""
    return -np.sum(p * np.log(p), axis=-1)


# --- the figures ---------------------------------------------------------------------------


def figure_jacobian(plt, path):
    d = 64
    direction = np.random.default_rng(3).standard_normal(d)
    direction /= np.linalg.norm(direction)
    norms = np.logspace(-6, 3, 37)
    curves = {}
    for eps in (0.0, 1e-6):
        values = np.array(
            [np.linalg.svd(jacobian_from_backward(s * direction, np.ones(d), eps), compute_uv=False) for s in norms]
        )
        curves[eps] = (values[:, 0], values[:, -1])  # largest, and the one along x
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.loglog(norms, np.sqrt(d) / norms, color="0.6", lw=4, alpha=0.5, label=r"$\sqrt{d}/\|x\|$")
    ax.loglog(norms, curves[0.0][0], "o", ms=4, color="C0", label=r"largest, $\epsilon=0$")
    ax.loglog(norms, curves[1e-6][0], "-", color="C1", label=r"largest, $\epsilon=10^{-6}$")
    ax.loglog(norms, curves[1e-6][1], "--", color="C2", label=r"along $x$, $\epsilon=10^{-6}$  ($\epsilon r^3$)")
    ax.axhline(1e3, color="0.3", lw=0.8, ls=":")
    ax.text(norms[0], 1.3e3, r"$1/\sqrt{\epsilon}$", fontsize=9)
    ax.axvline(np.sqrt(d * 1e-6), color="0.3", lw=0.8, ls=":")
    ax.text(np.sqrt(d * 1e-6) * 1.3, 1e-6, r"$\|x\| = \sqrt{d\,\epsilon}$", fontsize=9)
    ax.set_xlabel(r"$\|x\|_2$")
    ax.set_ylabel("singular value of the Jacobian")
    ax.set_title(f"RMSNorm Jacobian from rmsnorm.backward (d = {d}, gamma = 1)")
    ax.set_ylim(1e-9, 1e8)
    ax.legend(loc="lower left", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure_attention(plt, path):
    from matplotlib.colors import LogNorm

    content, w_query, w_key = attention_setup()
    offset = 3.0
    probs = {which: attention_probs(normalised_tokens(content + offset, which), w_query, w_key) for which in ("layer", "rms")}
    tokens = content.shape[0]
    fig, axes = plt.subplots(
        1, 3, figsize=(14, 4.4), layout="constrained", gridspec_kw={"width_ratios": [1, 1, 1.3]}
    )
    norm = LogNorm(vmin=1 / 16, vmax=16)  # probability relative to uniform attention, 1/T
    for ax, (which, title) in zip(axes[:2], (("layer", "LayerNorm"), ("rms", "RMSNorm"))):
        image = ax.imshow(probs[which] * tokens, cmap="RdBu_r", norm=norm)
        ax.set_title(f"{title}, tokens offset by {offset:g}")
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    colorbar = fig.colorbar(image, ax=axes[:2], shrink=0.9, pad=0.02)
    colorbar.set_label("attention x T  (1 = uniform)")
    bins = np.logspace(-3, 0, 40)
    for which, label, color in (("layer", "LayerNorm", "C0"), ("rms", "RMSNorm", "C3")):
        p = probs[which]
        axes[2].hist(
            p.ravel(), bins=bins, histtype="step", lw=2, color=color,
            label=f"{label}: mean entropy {entropy(p).mean():.2f} nats",
        )
    axes[2].axvline(1 / tokens, color="0.3", ls=":", lw=1, label=f"uniform, 1/T = 1/{tokens}")
    axes[2].set_xscale("log")
    axes[2].set_xlabel("attention probability")
    axes[2].set_ylabel("(query, key) pairs")
    axes[2].set_title(f"all {tokens * tokens} probabilities (max entropy log T = {np.log(tokens):.2f})")
    axes[2].legend(fontsize=9, loc="upper left")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _calls_for(fn, min_seconds):
    """How many back-to-back calls of ``fn`` last about ``min_seconds``."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or calls >= 1 << 16:
            return calls
        calls *= 2


def _best_seconds_per_call(contenders, min_seconds=0.004, repeats=31):
    """The best time per call of each function, the contenders timed in turn.

    Short batches, taken in turn and many times, with the minimum kept: on a
    shared machine some batches of every contender land in quiet moments, and
    a burst of other work slows whichever contender is running, not one of them
    systematically.
    """
    calls = {name: _calls_for(fn, min_seconds) for name, fn in contenders.items()}
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls[name])
    return best


def measure_timings(d=4096, row_counts=(1, 4, 16, 64, 256, 1024, 4096)):
    """Seconds per call of the four contenders on float32 (rows, d) inputs, on one thread."""
    threads = rmsnorm.get_num_threads()
    rmsnorm.set_num_threads(1)  # the NumPy composites run on one thread
    try:
        results = []
        for rows in row_counts:
            x = np.random.default_rng(rows).standard_normal((rows, d), dtype=np.float32)
            weight = np.ones(d, np.float32)
            bias = np.zeros(d, np.float32)
            eps = np.float32(1e-6)
            out = np.empty_like(x)
            best = _best_seconds_per_call(
                {
                    "RMSNorm (NumPy)": lambda: rms_norm_numpy(x, weight, eps),
                    "LayerNorm (NumPy)": lambda: layer_norm_numpy(x, weight, bias, eps),
                    "rmsnorm.forward (C)": lambda: rmsnorm.forward(x, weight, eps, out=out),
                    "copy (np.copyto)": lambda: np.copyto(out, x),
                }
            )
            results.append({"rows": rows, "elements": x.size, **best})
    finally:
        rmsnorm.set_num_threads(threads)
    return results


def _machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, NumPy {np.__version__}, one thread"


def timing_table(results, d):
    lines = [
        f"Measured {datetime.date.today().isoformat()} on {_machine()}; float32, d = {d}, "
        "microseconds per call (best of 31 interleaved batches).",
        "",
        "| rows | MiB | RMSNorm (NumPy) | LayerNorm (NumPy) | LayerNorm / RMSNorm | rmsnorm.forward (C) | copy | C / copy |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        rms, layer = r["RMSNorm (NumPy)"], r["LayerNorm (NumPy)"]
        c, copy = r["rmsnorm.forward (C)"], r["copy (np.copyto)"]
        lines.append(
            f"| {r['rows']} | {r['elements'] * 4 / 2**20:.3g} | {rms * 1e6:.1f} | {layer * 1e6:.1f} | "
            f"{layer / rms:.2f} | {c * 1e6:.1f} | {copy * 1e6:.1f} | {c / copy:.2f} |"
        )
    return "\n".join(lines) + "\n"


def figure_timing(plt, path, table_path, d=4096):
    results = measure_timings(d)
    elements = np.array([r["elements"] for r in results])
    seconds = {name: np.array([r[name] for r in results]) for name in results[0] if name not in ("rows", "elements")}
    fig, (ax, ratio_ax) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    for name, style in (
        ("LayerNorm (NumPy)", "s-"),
        ("RMSNorm (NumPy)", "o-"),
        ("rmsnorm.forward (C)", "^-"),
        ("copy (np.copyto)", "v--"),
    ):
        ax.loglog(elements, seconds[name] / elements * 1e9, style, label=name)
    ax.set_xlabel(f"elements (rows x {d}, float32)")
    ax.set_ylabel("nanoseconds per element")
    ax.set_title("time per element, one thread")
    ax.set_ylim(bottom=0.01)  # room for the legend below the copy line
    ax.legend(fontsize=9, loc="lower right", ncol=2)
    ax.grid(True, which="major", alpha=0.3)
    ratio_ax.semilogx(elements, seconds["LayerNorm (NumPy)"] / seconds["RMSNorm (NumPy)"], "s-", color="C0",
                      label="LayerNorm / RMSNorm (both NumPy)")
    ratio_ax.axhline(12 / 7, color="C0", ls=":", label="12 / 7 memory passes")
    ratio_ax.semilogx(elements, seconds["rmsnorm.forward (C)"] / seconds["copy (np.copyto)"], "^-", color="C2",
                      label="rmsnorm.forward / copy")
    ratio_ax.axhline(1, color="0.3", lw=0.8)
    ratio_ax.set_ylim(0, None)
    ratio_ax.set_xlabel(f"elements (rows x {d}, float32)")
    ratio_ax.set_ylabel("ratio of times")
    ratio_ax.set_title("ratios")
    ratio_ax.legend(fontsize=9)
    ratio_ax.grid(True, which="major", alpha=0.3)
    fig.suptitle("RMSNorm and LayerNorm written the same way")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    table = timing_table(results, d)
    with open(table_path, "w") as f:
        f.write(table)
    print(table)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python docs/make_figures.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help="folder for the PNGs and norm_timing.md, created if need be "
                             f"(default: {os.path.relpath(DEFAULT_OUT, os.path.dirname(DOCS_DIR))}, "
                             "which git ignores; docs/figures replaces the figures the docs show)")
    parser.add_argument("--skip-timing", action="store_true", help="skip the timing figure and table")
    args = parser.parse_args(argv)

    try:
        import matplotlib
    except ImportError:
        print(f"make_figures.py: {PLOTS_MISSING}", file=sys.stderr)
        return 1

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    figure_jacobian(plt, os.path.join(args.out, "jacobian_singular_values.png"))
    figure_attention(plt, os.path.join(args.out, "attention_ln_vs_rms.png"))
    if not args.skip_timing:
        figure_timing(plt, os.path.join(args.out, "norm_timing.png"), os.path.join(args.out, "norm_timing.md"))
    print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
