"""The largest differences from torch over a grid of parity cases, per dtype.

    python benchmarks/torch_parity.py

For the forward, the absolute difference and the distance in ULPs of the
dtype; for each gradient, the absolute difference and that difference over
max(1, the largest |element| of torch's gradient). The tests assert that all
of these stay within torch.testing.assert_close's tolerances; this script
prints how close they come.
"""

import itertools, numpy as np, torch, rmsnorm, warnings
warnings.filterwarnings("ignore")
rng = np.random.default_rng(0)
res = {}
for dt in [np.float32, np.float64]:
    worst = dict(fwd_abs=0, fwd_ulp=0, gi_abs=0, gi_rel=0, gw_abs=0, gw_rel=0)
    for shape, k in [((7,), 1), ((3, 5), 1), ((2, 3, 64), 1), ((2, 2, 3, 1000), 1), ((4, 8192), 1), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 3), ((5, 1), 1), ((3, 127), 1)]:
        for eps, affine in itertools.product([None, 1e-6, 1e-5, 0.5, -0.5], [True, False]):
            x = rng.standard_normal(shape).astype(dt) * (3 if eps == -0.5 else 1)
            ns = list(shape[-k:])
            w = rng.uniform(0.5, 1.5, ns).astype(dt) if affine else None
            dy = rng.standard_normal(shape).astype(dt)
            tx = torch.from_numpy(x).requires_grad_(); tw = torch.from_numpy(w).requires_grad_() if affine else None
            ty = torch.nn.functional.rms_norm(tx, ns, tw, eps); ty.backward(torch.from_numpy(dy))
            y = rmsnorm.rms_norm(x, ns, w, eps); gi, gw = rmsnorm.rms_norm_backward(dy, x, ns, w, eps)
            t = ty.detach().numpy(); ok = np.isfinite(t)
            d = np.abs(y[ok].astype(np.float64) - t[ok]); worst['fwd_abs'] = max(worst['fwd_abs'], d.max())
            worst['fwd_ulp'] = max(worst['fwd_ulp'], (d / np.spacing(np.abs(t[ok]).astype(dt))).max())
            for name, ours, theirs in [('gi', gi, tx.grad.numpy())] + ([('gw', gw, tw.grad.numpy())] if affine else []):
                d = np.abs(ours.astype(np.float64) - theirs)
                worst[name + '_abs'] = max(worst[name + '_abs'], d.max())
                worst[name + '_rel'] = max(worst[name + '_rel'], d.max() / max(1.0, np.abs(theirs).max()))
    res[np.dtype(dt).name] = worst
for k, v in res.items():
    print(k, ' '.join(f'{a}={b:.3g}' for a, b in v.items()))
