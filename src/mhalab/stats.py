"""Statistics for claims: how the arms of an experiment are compared (docs/definitions.md, "Comparing arms").

The designs mhalab runs are small (3-20 runs an arm) and their outcomes often bimodal (a run stays on a plateau or
escapes it), so every test here is exact, needs no normality, and names itself in `Comparison.test`:

- `paired(d)`: per-seed differences of arms that share what pairing needs (the same source model, the same data):
  the exact sign-flip (randomisation) test; 2^n sign patterns, so its smallest two-sided p is 2 / 2^n.
- `two_sample(a, b)`: independent runs (arms whose initialisations differ): the exact permutation test of the
  difference in means; its smallest two-sided p is 2 / C(n + m, n).
- Both give the 95% interval of the shift by inverting the test (the shifts it does not reject at 5%), so the
  interval never leaves the range the data can reach, and the minimum detectable effect (MDE) at 80% power from the
  noncentral t distribution (the exact power of the t-test at the observed spread).
- Rates of runs that reached a threshold: `rate` (Clopper-Pearson interval), `compare_rates` (the exact
  unconditional score test, Barnard's at a difference of 0; the interval of the difference inverted from that test,
  so it excludes 0 exactly when p < 0.05; the smallest difference the design detects with 80% power).
- Steps to a threshold, censored at the budget: `kaplan_meier` (median and its interval, Brookmeyer-Crowley with
  the log-log Greenwood band) and `logrank` (the log-rank statistic with its exact permutation p).
- `mean_ci`: a descriptive interval of one arm's mean (Student's t: 95% for normal values at any n; a percentile
  bootstrap labelled 95% covered 75% at n=3 in a simulation of normal values).
- `holm`: Holm's step-down adjustment over every comparison of a report; `tost`: equivalence within a margin
  declared before the runs (two one-sided sign-flip tests).
Enumeration is exact up to ENUMERATE_MAX arrangements; larger designs use that many random ones (fixed seed), say so
in `test`, and give the Monte Carlo p (1 + count) / (1 + N), never 0, whose smallest value 1 / (1 + N) is their p_min.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

ALPHA = 0.05
ENUMERATE_MAX = 250_000
MEAN_CI_NAME = "95% t interval of the mean"  # what mean_ci gives, as figures and tables name it
KM_CI_MIN_RUNS = 5  # the Kaplan-Meier median's interval covers ~95% from 5 runs, ~75% at 3 (docs/definitions.md)
_EPS = 1e-12


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is better: losses and bits per byte (`val/loss`, `bpb`), not accuracy."""
    return metric.rsplit("/", 1)[-1] in ("loss", "bpb")


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with df degrees of freedom (nan for df < 1)."""
    if df < 1:
        return float("nan")
    from scipy.stats import t

    return float(t.ppf(q, df))


def _finite(xs) -> np.ndarray:
    return np.array([float(x) for x in xs if x is not None and math.isfinite(float(x))], dtype=np.float64)


# -- differences of means ------------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """One comparison of two arms: the difference (A - B), its 95% interval, p, MDE and the test that gave them."""

    test: str
    n: int  # pairs, or runs of arm A
    m: int | None  # runs of arm B (None when paired)
    mean: float  # the observed difference
    sd: float | None  # of the differences (paired) or pooled (two-sample)
    ci95_low: float | None
    ci95_high: float | None
    p: float | None
    p_min: float | None  # the smallest p this design can give: below ALPHA or the design cannot separate anything
    mde80: float | None
    degenerate: str | None = None  # why no test was possible, in words (e.g. every value identical)
    p_holm: float | None = None  # set by `holm` across a report

    @property
    def separated(self) -> bool | None:
        p = self.p_holm if self.p_holm is not None else self.p
        return None if p is None else p < ALPHA

    @property
    def verdict(self) -> str:
        if self.degenerate:
            return self.degenerate
        return {True: "separated", False: "not separated", None: "too few runs"}[self.separated]

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def paired(diffs) -> Comparison:
    """The exact sign-flip test of per-seed differences (non-finite values left out)."""
    d = _finite(diffs)
    n = len(d)
    if n == 0:
        raise ValueError("a paired comparison needs at least one finite difference")
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if n > 1 else None
    signs, exact = _sign_patterns(n)
    name = "exact sign-flip test (paired)" if exact else f"sign-flip test, {len(signs):,} random patterns (paired)"
    p_min = _p_min(len(signs), exact)
    if n < 2:
        return Comparison(name, n, None, mean, None, None, None, None, p_min, None, "one pair: no test")
    if np.all(d == d[0]):
        return Comparison(name, n, None, mean, 0.0, mean, mean, None, p_min, None,
                          f"every difference is {mean:.4g}: no spread, no test")

    def p_at(shift: float) -> float:
        x = d - shift
        stats = np.abs(signs @ x)
        return _p_of(int(np.sum(stats >= abs(x.sum()) - _EPS * (1 + abs(x).sum()))), len(signs), exact)

    lo, hi = _invert(p_at, mean, float(d.min()), float(d.max()))
    return Comparison(name, n, None, mean, sd, lo, hi, p_at(0.0), p_min, mde_t(sd, n))


def two_sample(a, b) -> Comparison:
    """The exact permutation test of mean(a) - mean(b) for independent runs (non-finite values left out)."""
    a, b = _finite(a), _finite(b)
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("a two-sample comparison needs a finite value in each arm")
    mean = float(a.mean() - b.mean())
    groups, exact = _group_patterns(n, m)
    name = "exact permutation test" if exact else f"permutation test, {len(groups):,} random permutations"
    p_min = _p_min(len(groups), exact)
    sd = _pooled_sd(a, b)
    if n + m < 3:
        return Comparison(name, n, m, mean, sd, None, None, None, p_min, None, "one run an arm: no test")
    if np.all(np.concatenate([a, b]) == a[0]):
        return Comparison(name, n, m, mean, 0.0, mean, mean, None, p_min, None,
                          f"every run gave {a[0]:.4g}: no spread, no test")

    def p_at(shift: float) -> float:
        z = np.concatenate([a - shift, b])
        sums = z[groups].sum(axis=1)
        diffs = sums / n - (z.sum() - sums) / m
        obs = (a - shift).mean() - b.mean()
        return _p_of(int(np.sum(np.abs(diffs) >= abs(obs) - _EPS * (1 + np.abs(z).sum()))), len(groups), exact)

    lo, hi = _invert(p_at, mean, float(a.min() - b.max()), float(a.max() - b.min()))
    return Comparison(name, n, m, mean, sd, lo, hi, p_at(0.0), p_min, mde_t(sd, n, m) if sd else None)


def mean_ci(values) -> tuple[float, float | None, float | None]:
    """(mean, 95% interval low, high) of independent runs' values: Student's t interval, exact for normal values at
    any n (a percentile bootstrap labelled 95% covered 75% at n=3). It is descriptive: verdicts rest on the
    exact tests, and with bimodal outcomes the interval can reach past the values' range."""
    v = _finite(values)
    if len(v) == 0:
        raise ValueError("no finite value")
    mean = float(v.mean())
    if len(v) < 2:
        return mean, None, None
    half = t_quantile(1 - ALPHA / 2, len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return mean, mean - half, mean + half


def mde_t(sd: float | None, n: int, m: int | None = None, power: float = 0.80) -> float | None:
    """The smallest true difference a t-test at ALPHA detects with `power`, from the noncentral t distribution:
    paired (m None: n differences of spread sd) or two-sample (n and m runs, pooled spread sd)."""
    if sd is None or not sd > 0 or n < 2 or (m is not None and n + m < 3):
        return None
    from scipy.optimize import brentq
    from scipy.stats import nct, t

    df = n - 1 if m is None else n + m - 2
    se = sd / math.sqrt(n) if m is None else sd * math.sqrt(1 / n + 1 / m)
    crit = t.ppf(1 - ALPHA / 2, df)

    def shortfall(effect: float) -> float:
        ncp = effect / se
        pw = float(nct.sf(crit, df, ncp) + nct.cdf(-crit, df, ncp))
        if math.isnan(pw):  # scipy's nct fails far in the tail at tiny df, where the power is ~1
            pw = 1.0 if ncp > crit else 0.0
        return pw - power

    high = 2 * se
    while shortfall(high) < 0:  # power grows with the effect; nct is exact well past 80% power
        high *= 2
    return float(brentq(shortfall, 0.0, high))


def seeds_for(mde: float, sd: float, power: float = 0.80, max_n: int = 1000) -> int | None:
    """Seeds a paired design needs to detect a true difference `mde` at ALPHA and `power` (None if > max_n)."""
    for n in range(2, max_n + 1):
        found = mde_t(sd, n, power=power)
        if found is not None and found <= mde:
            return n
    return None


def tost(diffs, margin: float) -> dict:
    """Equivalence of paired differences within +-margin (declared before the runs): two one-sided exact sign-flip
    tests; equivalent when both reject at ALPHA, i.e. the 90% interval lies inside the margin."""
    d = _finite(diffs)
    if len(d) < 2 or not margin > 0:
        raise ValueError("TOST needs at least two differences and a positive margin")
    signs, exact = _sign_patterns(len(d))

    def one_sided(shift: float, upper: bool) -> float:
        x = d - shift
        stats = signs @ x
        obs = x.sum()
        tol = _EPS * (1 + np.abs(x).sum())
        count = int(np.sum(stats <= obs + tol)) if upper else int(np.sum(stats >= obs - tol))
        return _p_of(count, len(signs), exact)

    p_low, p_high = one_sided(-margin, False), one_sided(margin, True)
    p = max(p_low, p_high)
    return {"test": "TOST, two one-sided exact sign-flip tests" + ("" if exact else " (random patterns)"),
            "margin": margin, "n": len(d), "mean": float(d.mean()), "p": p,
            "p_min": 1 / len(signs) if exact else 1 / (1 + len(signs)), "equivalent": p < ALPHA}


# -- rates ---------------------------------------------------------------------------------------------------------

def rate(k: int, n: int) -> tuple[float, float, float]:
    """k of n runs: (k/n, Clopper-Pearson 95% interval low, high)."""
    from scipy.stats import beta

    if n <= 0:
        raise ValueError("a rate needs at least one run")
    lo = 0.0 if k == 0 else float(beta.ppf(ALPHA / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - ALPHA / 2, k + 1, n - k))
    return k / n, lo, hi


def compare_rates(k1: int, n1: int, k2: int, n2: int) -> dict:
    """Rate 1 - rate 2: the exact unconditional score test (two-sided; at a difference of 0 it is Barnard's test with
    the pooled score statistic), the 95% interval of the difference inverted from the same test (so it excludes 0
    exactly when p < ALPHA), the smallest p the design can give, and the smallest difference from rate 2 it detects
    with 80% power."""
    if not (0 <= k1 <= n1 <= MAX_RUNS and 0 <= k2 <= n2 <= MAX_RUNS and n1 > 0 and n2 > 0):
        raise ValueError(f"rates need 0 <= k <= n and 0 < n <= {MAX_RUNS}, got {k1}/{n1} and {k2}/{n2}")
    at_zero = _rate_p_all(n1, n2, 0.0)  # (n1 + 1, n2 + 1): the p of every outcome
    lo, hi = _rate_interval(k1, n1, k2, n2)
    return {"test": "exact unconditional score test (Barnard)", "diff": k1 / n1 - k2 / n2, "ci95_low": lo,
            "ci95_high": hi, "p": float(at_zero[k1, k2]), "p_min": float(at_zero.min()),
            "detectable": _detectable_rate(at_zero < ALPHA, n1, n2, k2 / n2)}


_NUISANCE = 1001  # grid points of the common rate over which the exact unconditional p is maximised
MAX_RUNS = 1000  # runs an arm an exact rate test takes: C(n, k) stays a finite float


@functools.lru_cache(maxsize=4096)
def _rate_p_all(n1: int, n2: int, delta: float) -> np.ndarray:
    """(n1 + 1, n2 + 1): the two-sided exact unconditional p of H0 rate1 - rate2 = delta for every outcome (a, b):
    the largest, over the nuisance rate2, probability of an outcome whose |score| is at least as large. Kept (read
    only): a report's comparisons share their arms' sizes, so their intervals ask for the same grid of deltas."""
    z = np.abs(_rate_score(n1, n2, delta)).ravel()  # (outcomes,)
    p2 = np.linspace(max(0.0, -delta), min(1.0, 1.0 - delta), _NUISANCE)  # (G,)
    pmf = _binom_pmf(n1, np.clip(p2 + delta, 0, 1))[:, :, None] * _binom_pmf(n2, p2)[:, None, :]  # (G, n1+1, n2+1)
    order = np.argsort(-z, kind="stable")
    tail = np.cumsum(pmf.reshape(len(p2), -1)[:, order], axis=1)  # (G, outcomes): mass of the |score| >= each
    zs = z[order]
    last = np.searchsorted(-zs, -(zs - 1e-9 * (1 + np.where(np.isfinite(zs), zs, 0))), side="right") - 1
    p = np.empty_like(z)
    p[order] = tail[:, last].max(axis=0)
    p = np.minimum(p, 1.0).reshape(n1 + 1, n2 + 1)
    p.setflags(write=False)
    return p


def _binom_pmf(n: int, p: np.ndarray) -> np.ndarray:
    """(len(p), n + 1): the binomial probabilities of 0..n successes at each rate p (0 and 1 included), from the
    binomial coefficients and powers built by repeated multiplication: correctly rounded operations only, in a fixed
    order, so an exact p is the same number on every CPU (numpy's exp and log follow the CPU's vector instructions:
    with them, 1/3 against 3/3 gave p 0.21875000000000006 with AVX2 and 0.21875 with AVX-512). n <= MAX_RUNS
    (compare_rates checks it), so C(n, k) is a finite float."""
    comb = np.array([float(math.comb(n, k)) for k in range(n + 1)])  # (n+1,)
    return comb[None, :] * _powers(p, n) * _powers(1.0 - p, n)[:, ::-1]  # (G, n+1): C(n, k) p^k (1-p)^(n-k)


def _powers(x: np.ndarray, n: int) -> np.ndarray:
    """(len(x), n + 1): x^0 .. x^n, each the previous one times x."""
    out = np.empty((len(x), n + 1))
    out[:, 0] = 1.0
    for k in range(1, n + 1):
        out[:, k] = out[:, k - 1] * x
    return out


def _rate_score(n1: int, n2: int, delta: float) -> np.ndarray:
    """(n1 + 1, n2 + 1): the score statistic of rate1 - rate2 = delta for every outcome, its variance at the rates'
    maximum likelihood under that constraint (Miettinen-Nurminen without the n / (n - 1) factor)."""
    a = np.arange(n1 + 1, dtype=np.float64)[:, None]
    b = np.arange(n2 + 1, dtype=np.float64)[None, :]
    lo, hi = max(0.0, -delta), min(1.0, 1.0 - delta)
    left, right = np.full(a.shape[:1] + b.shape[1:], lo), np.full(a.shape[:1] + b.shape[1:], hi)
    for _ in range(60):  # the log-likelihood is concave in rate2: bisect its derivative
        q = (left + right) / 2
        r = q + delta
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = (np.where(a > 0, a / r, 0) - np.where(n1 - a > 0, (n1 - a) / (1 - r), 0)
                     + np.where(b > 0, b / q, 0) - np.where(n2 - b > 0, (n2 - b) / (1 - q), 0))
        up = slope > 0
        left, right = np.where(up, q, left), np.where(up, right, q)
    q = (left + right) / 2
    r = q + delta
    var = r * (1 - r) / n1 + q * (1 - q) / n2
    num = a / n1 - b / n2 - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 1e-15, num / np.sqrt(var), np.where(np.abs(num) < 1e-12, 0.0, np.sign(num) * np.inf))
    return z


def _rate_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """The differences the test does not reject at ALPHA (p >= ALPHA), from -1 to 1: a grid that holds 0 and the
    estimate, each end refined by bisection; the hull of that set, so 0 is inside whenever p(0) >= ALPHA."""
    est = k1 / n1 - k2 / n2
    accept = lambda d: _rate_p_all(n1, n2, d)[k1, k2] >= ALPHA  # noqa: E731
    grid = np.unique(np.r_[np.linspace(-1, 1, 41), 0.0, est])
    ok = [d for d in grid if accept(d)]
    if not ok:
        return est, est

    def edge(inside: float, outside: float) -> float:
        for _ in range(24):  # the 0.05 step to 3e-9
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if accept(mid) else (inside, mid)
        return inside

    below = [d for d in grid if d < ok[0]]
    above = [d for d in grid if d > ok[-1]]
    lo = edge(ok[0], below[-1]) if below else -1.0
    hi = edge(ok[-1], above[0]) if above else 1.0
    return float(lo), float(hi)


def _detectable_rate(reject: np.ndarray, n1: int, n2: int, p2: float, power: float = 0.80) -> float | None:
    """The smallest |rate 1 - p2| that the test detects with `power` when arm 2's rate is p2 (None: none); `reject`
    (n1 + 1, n2 + 1) says which outcomes the test rejects at ALPHA."""
    from scipy.stats import binom

    pmf2 = binom.pmf(np.arange(n2 + 1), n2, p2)
    best = None
    for p1 in np.linspace(0, 1, 401):
        pw = float(binom.pmf(np.arange(n1 + 1), n1, p1) @ reject.astype(float) @ pmf2)
        if pw >= power and (best is None or abs(p1 - p2) < best):
            best = abs(p1 - p2)
    return None if best is None else float(best)


# -- time to an event ----------------------------------------------------------------------------------------------

def kaplan_meier(times, events) -> dict:
    """Kaplan-Meier estimate of the steps to an event (events[i] False: censored at times[i]): the curve, the median
    and its 95% interval (Brookmeyer-Crowley with the log-log Greenwood band; None = not reached). Below
    KM_CI_MIN_RUNS runs there is no interval (has_ci False): it covered about 75% at 3 runs (docs/definitions.md)."""
    t, e = np.asarray(times, dtype=np.float64), np.asarray(events, dtype=bool)
    steps, surv, lo_band, hi_band = [0.0], [1.0], [1.0], [1.0]
    s, greenwood = 1.0, 0.0
    z = 1.959963984540054
    for tau in np.unique(t[e]):
        at_risk, d = int(np.sum(t >= tau)), int(np.sum((t == tau) & e))
        s *= 1 - d / at_risk
        greenwood += d / (at_risk * (at_risk - d)) if at_risk > d else math.inf
        steps.append(float(tau))
        surv.append(s)
        if 0 < s < 1 and math.isfinite(greenwood):
            se = math.sqrt(greenwood) / abs(math.log(s))
            c = math.log(-math.log(s))
            lo_band.append(math.exp(-math.exp(c + z * se)))
            hi_band.append(math.exp(-math.exp(c - z * se)))
        else:
            lo_band.append(s)
            hi_band.append(s)
    # a product of fractions lands beside 0.5 (0.8 x 0.875 x 5/7 = 0.5000000000000001): compare with a tolerance
    first_at = lambda curve: next((x for x, v in zip(steps, curve) if v <= 0.5 + 1e-9), None)  # noqa: E731
    # the lower band crosses 0.5 first: the interval's low end; the upper band last: its high end
    has_ci = len(t) >= KM_CI_MIN_RUNS
    return {"steps": steps, "survival": surv, "median": first_at(surv),
            "median_ci95_low": first_at(lo_band) if has_ci else None,
            "median_ci95_high": first_at(hi_band) if has_ci else None, "has_ci": has_ci, "events": int(e.sum()),
            "n": len(t)}


def logrank(times_a, events_a, times_b, events_b, arrangements: int | None = None) -> dict:
    """The log-rank test of two arms' times to an event: the chi-square statistic and its exact permutation p (every
    assignment of the runs to the two arms, or `arrangements` (ENUMERATE_MAX) random ones when there are more),
    beside the chi-square(1) approximation; `excess` is arm a's observed minus expected events (> 0: a reaches the
    event sooner than b)."""
    from scipy.stats import chi2

    t = np.concatenate([np.asarray(times_a, float), np.asarray(times_b, float)])
    e = np.concatenate([np.asarray(events_a, bool), np.asarray(events_b, bool)])
    n, m = len(times_a), len(times_b)
    taus = np.unique(t[e])
    if len(taus) == 0:
        return {"test": "log-rank", "chi2": None, "p": None, "p_chi2": None, "p_min": None, "excess": None,
                "degenerate": "no run reached the threshold in either arm: no test"}
    at_risk = (t[:, None] >= taus[None, :]).astype(float)  # (runs, times)
    died = ((t[:, None] == taus[None, :]) & e[:, None]).astype(float)
    n_all, d_all = at_risk.sum(0), died.sum(0)
    groups, exact = _group_patterns(n, m, arrangements)
    mask = np.zeros((len(groups), n + m))
    np.put_along_axis(mask, groups, 1.0, axis=1)
    mask = np.vstack([np.r_[np.ones(n), np.zeros(m)], mask])  # row 0: the observed assignment

    n1, o1 = mask @ at_risk, mask @ died  # (perms, times)
    frac = n1 / n_all
    expected = (d_all * frac).sum(1)
    var = (d_all * frac * (1 - frac) * (n_all - d_all) / np.maximum(n_all - 1, 1)).sum(1)
    stat = np.where(var > 0, (o1.sum(1) - expected) ** 2 / np.where(var > 0, var, 1), 0.0)
    obs = stat[0]
    p = _p_of(int(np.sum(stat[1:] >= obs - 1e-9 * (1 + obs))), len(groups), exact)
    return {"test": "log-rank, exact permutation p" if exact else "log-rank, permutation p (random)",
            "chi2": float(obs), "p": p, "p_chi2": float(chi2.sf(obs, 1)), "degenerate": None,
            "excess": float(o1[0].sum() - expected[0]),
            "p_min": 1 / len(groups) if exact else 1 / (1 + len(groups))}  # a bound: the observed one counts


# -- many comparisons ----------------------------------------------------------------------------------------------

def holm(ps: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None): reject where the adjusted p < ALPHA."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    out: list[float | None] = [None] * len(ps)
    running, k = 0.0, len(idx)
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (k - rank) * ps[i]))
        out[i] = running
    return out


# -- enumeration ---------------------------------------------------------------------------------------------------

def _sign_patterns(n: int) -> tuple[np.ndarray, bool]:
    """(patterns, n) of +-1 signs: all 2^n, or ENUMERATE_MAX random ones; and whether it is all of them."""
    if 2 ** n <= ENUMERATE_MAX:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n))), True
    return np.random.default_rng(0).choice((1.0, -1.0), size=(ENUMERATE_MAX, n)), False


def _group_patterns(n: int, m: int, most: int | None = None) -> tuple[np.ndarray, bool]:
    """(patterns, n): the indices of arm A among n + m runs, for every assignment or `most` (ENUMERATE_MAX) random
    ones."""
    most = most or ENUMERATE_MAX
    if math.comb(n + m, n) <= most:
        return np.array(list(itertools.combinations(range(n + m), n)), dtype=np.int64).reshape(-1, n), True
    rng = np.random.default_rng(0)
    return np.argsort(rng.random((most, n + m)), axis=1)[:, :n], False


def _p_of(count: int, total: int, exact: bool) -> float:
    """p from `count` of `total` arrangements at least as extreme: their share when they are all of them (the
    observed one among them); of random ones, (1 + count) / (1 + total), so a Monte Carlo p is never 0."""
    return count / total if exact else (1 + count) / (1 + total)


def _p_min(count: int, exact: bool) -> float:
    """The smallest two-sided p: 2 / count when enumerated (the observed pattern and its mirror); 1 / (1 + count)
    for random arrangements."""
    return 2 / count if exact else 1 / (1 + count)


def _pooled_sd(a: np.ndarray, b: np.ndarray) -> float | None:
    n, m = len(a), len(b)
    if n + m < 3:
        return None
    ss = ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()
    return float(math.sqrt(ss / (n + m - 2)))


def _invert(p_at, estimate: float, low: float, high: float) -> tuple[float | None, float | None]:
    """The 95% interval of a shift: the shifts whose p exceeds ALPHA, found by bisection on each side of the
    estimate. A side is None (unbounded) when the test cannot reject even beyond the shifts the data can reach
    [low, high]: then the design cannot exclude any difference in that direction."""
    span = max(high - low, abs(estimate), 1e-12)

    def edge(inside: float, outside: float) -> float | None:
        if p_at(outside) > ALPHA:
            return None
        for _ in range(60):
            mid = (inside + outside) / 2
            if p_at(mid) > ALPHA:
                inside = mid
            else:
                outside = mid
            if abs(outside - inside) < 1e-9 * span:
                break
        return inside

    lo, hi = edge(estimate, low - 1e-6 * span), edge(estimate, high + 1e-6 * span)
    return (None if lo is None else max(low, lo)), (None if hi is None else min(high, hi))
