"""Statistics for claims: paired comparisons over seeds with Student-t confidence intervals, p-values and the
minimum detectable effect (docs/definitions.md, "Comparing arms").

For arms A and B run on the same seeds, d_s = metric_A(s) - metric_B(s), mean d̄, sample sd s_d, n seeds:
    95% CI      d̄ ± t(0.975, n-1) s_d / sqrt(n)
    p           two-sided, from t = d̄ / (s_d / sqrt(n)) with n-1 degrees of freedom
    MDE (80%)   (t(0.975, n-1) + t(0.80, n-1)) s_d / sqrt(n): the smallest true difference this design detects
                with 80% power at the observed spread
A difference is "separated" when its 95% CI excludes 0.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with df degrees of freedom (nan for df < 1)."""
    if df < 1:
        return float("nan")
    from scipy.stats import t

    return float(t.ppf(q, df))


@dataclass
class Paired:
    """A paired comparison over n seeds."""

    n: int
    mean: float
    sd: float | None
    ci95_low: float | None
    ci95_high: float | None
    p: float | None
    mde80: float | None

    @property
    def separated(self) -> bool | None:
        """True when the 95% CI excludes 0; None when it cannot be computed (fewer than 2 seeds)."""
        if self.ci95_low is None:
            return None
        return self.ci95_low > 0 or self.ci95_high < 0

    @property
    def verdict(self) -> str:
        return {True: "separated", False: "not separated", None: "n < 2"}[self.separated]

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def paired(diffs: list[float]) -> Paired:
    """The paired comparison of per-seed differences (non-finite values left out)."""
    d = [float(x) for x in diffs if x is not None and math.isfinite(float(x))]
    n = len(d)
    if n == 0:
        raise ValueError("a paired comparison needs at least one finite difference")
    mean = statistics.fmean(d)
    if n < 2:
        return Paired(n, mean, None, None, None, None, None)
    sd = statistics.stdev(d)
    se = sd / math.sqrt(n)
    t975 = t_quantile(0.975, n - 1)
    if se == 0:
        p = 0.0 if mean != 0 else 1.0
    else:
        from scipy.stats import t

        p = float(2 * t.sf(abs(mean / se), n - 1))
    return Paired(n, mean, sd, mean - t975 * se, mean + t975 * se, p, (t975 + t_quantile(0.80, n - 1)) * se)


def mean_ci(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, 95% CI low, high) of independent values (a one-sample t interval)."""
    p = paired(values)
    return p.mean, p.ci95_low, p.ci95_high


def seeds_for(mde: float, sd: float, power: float = 0.80, max_n: int = 1000) -> int | None:
    """Seeds a paired design needs to detect a true difference `mde` at 95% confidence and `power`, for a paired
    sd of `sd` (None if more than max_n)."""
    for n in range(2, max_n + 1):
        if (t_quantile(0.975, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n) <= mde:
            return n
    return None


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is better: losses and bits per byte (`val/loss`, `bpb`), not accuracy."""
    return metric.rsplit("/", 1)[-1] in ("loss", "bpb")
