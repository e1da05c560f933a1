"""Report defaults (issue 27): intervals cover what they are labelled with at small n, the rate-difference interval
agrees with its test, a Monte Carlo p is never 0, and the Kaplan-Meier median tolerates rounding."""

import numpy as np
import pytest
from scipy import stats

from mhalab.report import comparison as inf


@pytest.mark.parametrize("n", [3, 5])
def test_the_interval_labelled_95_covers_95_at_small_n(n):
    """Normal values, 4000 draws: the per-arm interval covers the true mean about 95% of the time (the percentile
    bootstrap it replaces covered about 78% at n=3)."""
    rng = np.random.default_rng(27)
    draws = rng.normal(0.7, 0.1, size=(4000, n))
    hits = 0
    for row in draws:
        _, lo, hi = inf.mean_ci(row)
        hits += lo <= 0.7 <= hi
    assert 0.93 <= hits / len(draws) <= 0.97


def test_the_rate_interval_excludes_0_exactly_when_its_test_rejects():
    """Every outcome of 3 runs an arm, and some of 4-10: the interval is the test inverted, so it excludes a
    difference of 0 iff p < 0.05; p is Barnard's exact unconditional test (scipy, pooled score statistic)."""
    cases = [(k1, 3, k2, 3) for k1 in range(4) for k2 in range(4)] + [(4, 4, 0, 4), (5, 5, 2, 5), (9, 10, 5, 10)]
    for k1, n1, k2, n2 in cases:
        r = inf.compare_rates(k1, n1, k2, n2)
        excludes = r["ci95_low"] > 0 or r["ci95_high"] < 0
        assert excludes == (r["p"] < inf.ALPHA), (k1, n1, k2, n2, r)
        assert r["ci95_low"] <= r["diff"] <= r["ci95_high"]
    for k1, n1, k2, n2 in [(0, 3, 2, 3), (0, 3, 1, 3), (5, 5, 1, 5), (5, 5, 2, 5), (9, 10, 5, 10), (2, 7, 6, 8)]:
        ref = stats.barnard_exact([[k1, k2], [n1 - k1, n2 - k2]], pooled=True, n=200).pvalue
        assert inf.compare_rates(k1, n1, k2, n2)["p"] == pytest.approx(ref, abs=1e-3)
    # 1/3 v 3/3 and 0/3 v 2/3 have the same |score| (sqrt 3): one p (scipy's rounding splits this tie: 0.155)
    assert inf.compare_rates(1, 3, 3, 3)["p"] == pytest.approx(inf.compare_rates(0, 3, 2, 3)["p"], abs=1e-12)
    assert inf.compare_rates(3, 3, 0, 3)["p_min"] == pytest.approx(1 / 32, abs=1e-3)  # 3 v 3: (1/2)^5 at best


def test_the_rate_interval_is_where_the_test_does_not_reject():
    """Just inside each end the test does not reject; just outside it does."""
    lo, hi = inf._rate_interval(9, 10, 5, 10)
    p = lambda d: inf._rate_p_all(10, 10, d)[9, 5]  # noqa: E731
    assert p(lo + 1e-6) >= inf.ALPHA > p(lo - 1e-3) and p(hi - 1e-6) >= inf.ALPHA > p(hi + 1e-3)


def test_a_monte_carlo_p_is_never_0(monkeypatch):
    """Past ENUMERATE_MAX arrangements the p of random ones is (1 + count) / (1 + N) and p_min is 1 / (1 + N): a
    clear effect gets that p, never 0, for every test that samples."""
    monkeypatch.setattr(inf, "ENUMERATE_MAX", 999)
    d = np.linspace(1.0, 2.0, 12)  # 2^12 sign patterns > 999: sampled
    c = inf.paired(d)  # the random patterns may hold the observed one or its mirror: then 2 or 3 of 1000
    assert "random" in c.test and 1 / 1000 <= c.p <= 3 / 1000 and c.p_min == pytest.approx(1 / 1000)
    c = inf.two_sample(np.linspace(5, 6, 8), np.linspace(0, 1, 8))  # C(16, 8) > 999
    assert "random" in c.test and 1 / 1000 <= c.p <= 3 / 1000 and c.p_min == pytest.approx(1 / 1000)
    lr = inf.logrank(list(range(1, 9)), [True] * 8, list(range(100, 108)), [True] * 8)
    assert "random" in lr["test"] and lr["p"] >= 1 / 1000
    t = inf.tost(np.full(12, 0.001) + np.linspace(0, 1e-4, 12), margin=0.02)
    assert 1 / 1000 <= t["p"] <= 2 / 1000 and t["p_min"] == pytest.approx(1 / 1000) and t["equivalent"]
    assert min(inf.holm([c.p, lr["p"]])) > 0


def test_an_exact_p_keeps_its_share():
    """Enumerated designs are unchanged: the share of all patterns (the observed one among them)."""
    c = inf.paired([0.1, 0.2, 0.3])
    assert c.p == pytest.approx(2 / 8) and c.p_min == pytest.approx(2 / 8)


def test_the_kaplan_meier_median_at_a_rounded_half_is_reached():
    """0.8 x 0.875 x 5/7 is 0.5000000000000001 in floating point: the median is where the curve reaches 0.5."""
    km = inf.kaplan_meier([1, 1, 2, 3, 3, 10, 10, 10, 10, 10], [True] * 5 + [False] * 5)
    assert km["survival"][-1] == 0.5000000000000001
    assert km["median"] == 3.0
