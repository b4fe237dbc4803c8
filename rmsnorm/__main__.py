"""``python -m rmsnorm``: RMSNorm forward and backward on a small batch, step by step.

Each step is printed, then checked against the float64 reference in
rmsnorm.reference and, when torch is installed, against torch.nn.RMSNorm and
torch autograd. Exits 1 if any check fails. ``--plot FILE`` also draws the
batch before and after normalisation (needs matplotlib).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import rmsnorm
from rmsnorm import reference

DESCRIPTION = """\
Runs RMSNorm forward and backward on a small float32 batch (2 sequences of
3 tokens, 8 features; one token a hundred times louder than the rest) and
prints each step: the input x, each row's RMS, the normalised rows, the
weight, the output y, a random grad_output and the gradients backward
returns for it. The results are then checked against the float64 reference
(rmsnorm.reference) and, when torch is installed, against torch.nn.RMSNorm
and torch autograd. Exits 0 when every check passes, 1 otherwise."""

PLOTS_MISSING = ('matplotlib is not installed: pip install "rmsnorm[plots]" '
                 "(or pip install matplotlib)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rmsnorm", description=DESCRIPTION)
    parser.add_argument(
        "--plot", metavar="FILE",
        help="also write a figure of the batch to FILE (PNG, or any format matplotlib "
             "infers from the extension): x and y as heatmaps of rows by features, and "
             "each row's RMS before and after normalisation. Needs matplotlib "
             '(pip install "rmsnorm[plots]")')
    return parser


def _show(title: str, array: np.ndarray) -> None:
    print(f"\n{title}  shape={array.shape} dtype={array.dtype}")
    print(np.array2string(np.asarray(array), precision=5, suppress_small=True, max_line_width=100))


def _check(name: str, ours, expected, rtol: float, atol: float) -> bool:
    ours64 = np.asarray(ours, np.float64)
    expected64 = np.asarray(expected, np.float64)
    diff = np.abs(ours64 - expected64)
    ok = bool(np.all(diff <= atol + rtol * np.abs(expected64)))
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<34} max |diff| = {diff.max():.3g}")
    return ok


def _torch_results(x, weight, eps, grad_output):
    try:
        import torch
    except ImportError:
        return None
    layer = torch.nn.RMSNorm(weight.shape, eps=eps)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
    tx = torch.from_numpy(x).requires_grad_()
    ty = layer(tx)
    ty.backward(torch.from_numpy(grad_output))
    return ty.detach().numpy(), tx.grad.numpy(), layer.weight.grad.numpy()


def _plot(path: str, x: np.ndarray, y: np.ndarray, weight: np.ndarray, eps: float) -> None:
    """x and y as heatmaps (rows by features), and each row's RMS before and after."""
    import matplotlib

    matplotlib.use("Agg")  # draws to a file: no display needed
    import matplotlib.pyplot as plt

    hidden = x.shape[-1]
    x_rows, y_rows = x.reshape(-1, hidden), y.reshape(-1, hidden)
    labels = [f"seq {b}, token {t}" for b in range(x.shape[0]) for t in range(x.shape[1])]
    x_hat_rows = rmsnorm.rms_norm(x_rows, hidden, None, eps)  # normalised, no weight

    def rms(rows):
        return np.sqrt(np.mean(rows.astype(np.float64) ** 2, axis=-1))

    fig, (ax_x, ax_y, ax_rms) = plt.subplots(
        1, 3, figsize=(15, 4.6), layout="constrained", gridspec_kw={"width_ratios": [1, 1, 1.2]})
    for ax, rows, title in ((ax_x, x_rows, "input x (one loud token sets the colour scale)"),
                            (ax_y, y_rows, "output y = x / RMS(x) * weight")):
        limit = float(np.max(np.abs(rows)))  # symmetric, so white is 0
        image = ax.imshow(rows, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_title(title)
        ax.set_xlabel("feature")
        ax.set_xticks(range(hidden))
        ax.set_yticks(range(len(labels)), labels)
        fig.colorbar(image, ax=ax, shrink=0.9)

    positions = np.arange(len(labels))
    width = 0.27
    for offset, values, name in (
        (-width, rms(x_rows), "x, before"),
        (0.0, rms(x_hat_rows), "x / RMS(x), after: 1"),
        (width, rms(y_rows), "y, after: scaled by the weight"),
    ):
        ax_rms.bar(positions + offset, values, width, label=name)
    ax_rms.axhline(float(rms(weight[None, :])[0]), color="0.3", ls=":", lw=1,
                   label="RMS of the weight")
    ax_rms.set_yscale("log")
    ax_rms.set_xticks(positions, labels, rotation=30, ha="right")
    ax_rms.set_ylabel("RMS over the row's features (log scale)")
    ax_rms.set_title("each row's RMS, before and after")
    ax_rms.legend(fontsize=8, loc="center left")
    ax_rms.grid(axis="y", which="both", alpha=0.3)
    fig.suptitle(f"rmsnorm {rmsnorm.__version__}: the demo batch, RMSNorm over the last "
                 f"axis ({hidden} features, eps = {eps:g})")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401 - checked before the demo runs, used by _plot
        except ImportError:
            print(f"--plot: {PLOTS_MISSING}", file=sys.stderr)
            return 1

    rng = np.random.default_rng(2024)
    batch, tokens, hidden = 2, 3, 8
    eps = 1e-6
    x = rng.standard_normal((batch, tokens, hidden)).astype(np.float32)
    x[1, 2] *= 100.0  # one token a hundred times louder than the rest

    layer = rmsnorm.RMSNorm(hidden, eps=eps)
    layer.weight[:] = np.linspace(0.5, 1.5, hidden, dtype=np.float32)
    print(f"rmsnorm {rmsnorm.__version__}: {layer}")
    _show("input x", x)

    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1) + np.float32(eps))
    _show("RMS of each row: sqrt(mean(x^2) + eps)", rms)
    _show("normalised rows x / RMS (each row now has RMS ~ 1)", x / rms[..., None])
    _show("weight (gamma)", layer.weight)

    y = layer(x)
    _show("output y = x / RMS * weight", y)

    grad_output = rng.standard_normal(y.shape).astype(np.float32)
    _show("grad_output (random, standing in for the gradient of a loss)", grad_output)
    grad_input = layer.backward(grad_output)
    _show("grad_input for this grad_output", grad_input)
    _show("grad_weight (summed over all rows)", layer.weight_grad)

    # float32 results against float64 references: float32 rounding, nothing more.
    rtol, atol = 1.3e-6, 1e-5
    print("\nChecks against the float64 reference (rmsnorm.reference):")
    ref_y = reference.rms_norm(x, hidden, layer.weight, eps)
    ref_gi, ref_gw = reference.rms_norm_backward(grad_output, x, hidden, layer.weight, eps)
    ok = _check("output", y, ref_y, rtol, atol)
    ok &= _check("grad_input", grad_input, ref_gi, rtol, atol)
    ok &= _check("grad_weight", layer.weight_grad, ref_gw, rtol, atol)

    torch_results = _torch_results(x, layer.weight, eps, grad_output)
    if torch_results is None:
        print("\ntorch is not installed: the torch comparison is skipped (pip install torch==2.13.0).")
    else:
        print("\nChecks against torch.nn.RMSNorm and torch autograd:")
        ok &= _check("output vs torch", y, torch_results[0], rtol, atol)
        ok &= _check("grad_input vs torch", grad_input, torch_results[1], rtol, atol)
        ok &= _check("grad_weight vs torch", layer.weight_grad, torch_results[2], rtol, atol)

    if args.plot is not None:
        _plot(args.plot, x, y, layer.weight, eps)
        print(f"\nfigure written to {args.plot}")

    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
