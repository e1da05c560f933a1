"""Log-log least-squares fits: turn "quadratic" into a number with an error bar and the range it holds over.

    log y = log c + b log x   ->   y ~ c * x^b

`loglog_fit` fits b (the exponent) by ordinary least squares on (log x, log y) and returns it with its standard
error, a 95% confidence interval (Student t) and the x range actually used; `local_exponents` gives the slope
between consecutive points, which shows where a power law holds and where it bends (constant overheads at small
x, cache or memory-bandwidth effects at large x). numpy; the t quantile is `mhalab.stats.t_quantile`.
"""

from __future__ import annotations

import math

import numpy as np

from mhalab.stats import t_quantile


def loglog_fit(x, y, min_x: float | None = None, max_x: float | None = None) -> dict:
    """Least-squares fit of log y = log c + b log x over the points with min_x <= x <= max_x and y > 0.

    Returns {exponent, prefactor (c), stderr, ci95 (lo, hi), r2, points, x_min, x_max}. Non-positive or non-finite
    y (e.g. a memory growth below the measurement's resolution) are left out, and the range reported is the one
    actually fitted. Needs two distinct x; with exactly two points stderr and ci95 are nan.
    """
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if min_x is not None:
        keep &= x >= min_x
    if max_x is not None:
        keep &= x <= max_x
    lx, ly = np.log(x[keep]), np.log(y[keep])
    k = lx.size
    if k < 2 or np.ptp(lx) == 0:
        raise ValueError(f"a log-log fit needs at least two distinct positive x with positive y, got {k} point(s)")
    mx, my = lx.mean(), ly.mean()
    sxx = float(((lx - mx) ** 2).sum())
    b = float(((lx - mx) * (ly - my)).sum() / sxx)
    a = my - b * mx
    resid = ly - (a + b * lx)
    ss_res = float((resid ** 2).sum())
    ss_tot = float(((ly - my) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    if k > 2:
        se = math.sqrt(ss_res / (k - 2) / sxx)
        half = t_quantile(0.975, k - 2) * se
    else:
        se = half = float("nan")
    return {"exponent": b, "prefactor": float(math.exp(a)), "stderr": se, "ci95": (b - half, b + half), "r2": r2,
            "points": int(k), "x_min": float(x[keep].min()), "x_max": float(x[keep].max())}


def local_exponents(x, y) -> list[tuple[float, float, float]]:
    """Slopes d log y / d log x between consecutive points (sorted by x): [(x_lo, x_hi, slope)].

    Pairs with a non-positive y, or equal x, are skipped.
    """
    pts = sorted((float(a), float(b)) for a, b in zip(x, y) if a > 0 and b > 0 and math.isfinite(b))
    out = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x1 > x0:
            out.append((x0, x1, math.log(y1 / y0) / math.log(x1 / x0)))
    return out


def format_fit(fit: dict, var: str = "n") -> str:
    """'2.01 ± 0.03 (95% CI, 5 points, n in [256, 4096], R² 0.999)'."""
    lo, hi = fit["ci95"]
    pm = f" ± {(hi - lo) / 2:.2f}" if math.isfinite(lo) else ""
    return (f"{fit['exponent']:.2f}{pm} (95% CI, {fit['points']} points, {var} in [{fit['x_min']:g}, "
            f"{fit['x_max']:g}], R² {fit['r2']:.3f})")
