"""mhalab.stats: each exact test against scipy where scipy has it, and against hand examples where not."""

import math

import numpy as np
import pytest
from scipy import stats

from mhalab import stats as inf


def _scipy_perm_p(a, b=None):
    if b is None:
        r = stats.permutation_test((np.asarray(a),), np.mean, permutation_type="samples", n_resamples=np.inf,
                                   alternative="two-sided")
    else:
        # p = P(|T| >= |t|): scipy's "two-sided" doubles the smaller one-sided p, which differs for unequal arms
        r = stats.permutation_test((np.asarray(a), np.asarray(b)), lambda x, y: abs(np.mean(x) - np.mean(y)),
                                   permutation_type="independent", n_resamples=np.inf, alternative="greater")
    return r.pvalue


@pytest.mark.parametrize("d", [[0.3, 0.1, -0.05, 0.2, 0.4], [1, 1, 1, 1, -1], [0.5, -0.2, 0.1, 0.7, 0.0, 0.3, 0.2]])
def test_sign_flip_p_matches_scipy(d):
    c = inf.paired(d)
    assert c.p == pytest.approx(_scipy_perm_p(d), abs=1e-12)
    assert c.test == "exact sign-flip test (paired)"
    assert c.p_min == pytest.approx(2 / 2 ** len(d))


def test_five_seeds_cannot_go_below_their_smallest_p():
    """All five differences of one sign: p = 2/32 = 0.0625, the design's floor (REFERENCE section 9)."""
    c = inf.paired([-0.55, -0.7, -0.72, -0.73, -0.56])
    assert c.p == pytest.approx(0.0625)
    assert c.verdict == "not separated"


@pytest.mark.parametrize("a,b", [([0.99, 0.97, 0.96, 1.0, 0.81], [0.96, 0.26, 0.24, 0.27, 0.25]),
                                 ([0.1, 0.2, 0.3, 0.4], [0.15, 0.25, 0.35, 0.2]),
                                 ([1, 1, 0.25, 1, 0.25, 1], [0.25, 0.25, 1, 0.25, 0.25])])
def test_permutation_p_matches_scipy(a, b):
    c = inf.two_sample(a, b)
    assert c.p == pytest.approx(_scipy_perm_p(a, b), abs=1e-12)
    assert c.p_min == pytest.approx(2 / math.comb(len(a) + len(b), len(a)))


def test_intervals_stay_in_the_range_the_data_can_reach():
    """Values in [0, 1]: the inverted interval of a difference stays in [-1, 1]; the descriptive interval of a mean
    is Student's t (its coverage is the one it is labelled with; tests/report/test_report_defaults.py), which may leave it."""
    vals = [1.0, 0.25, 1.0, 0.25, 1.0]
    mean, lo, hi = inf.mean_ci(vals)
    assert (lo, hi) == pytest.approx(stats.t.interval(0.95, 4, loc=mean, scale=stats.sem(vals)))
    assert inf.mean_ci(vals) == (mean, lo, hi)
    c = inf.two_sample([1.0, 1.0, 1.0, 0.25, 1.0], [0.25, 0.25, 0.25, 1.0, 0.25])
    assert -0.75 - 1e-9 <= c.ci95_low <= c.mean <= c.ci95_high <= 0.75 + 1e-9


def test_a_design_that_cannot_reject_has_no_finite_interval():
    """Five positive paired differences: p >= 2/32 > 0.05 for every shift, so the interval is unbounded on both
    sides (not the data's range, which would exclude 0 while p says it cannot)."""
    c = inf.paired([0.04, 0.08, 0.1, 0.17, 0.05])
    assert c.p == pytest.approx(0.0625) and c.ci95_low is None and c.ci95_high is None
    c = inf.two_sample([1.0, 1.0], [0.2, 0.3])  # 2 vs 2: p >= 2/6
    assert c.ci95_low is None and c.ci95_high is None


def test_inverted_interval_agrees_with_the_test():
    """0 is inside the 95% interval exactly when p >= 0.05."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = rng.normal(0.3, 1, 6), rng.normal(0, 1, 6)
        c = inf.two_sample(a, b)
        assert (c.ci95_low <= 0 <= c.ci95_high) == (c.p > inf.ALPHA)
        d = rng.normal(0.5, 1, 8)
        c = inf.paired(d)
        assert (c.ci95_low <= 0 <= c.ci95_high) == (c.p > inf.ALPHA)


def test_degenerate_comparison_is_said_in_words():
    c = inf.paired([0.0, 0.0, 0.0])
    assert c.p is None and "no spread" in c.verdict
    c = inf.two_sample([1.0, 1.0], [1.0, 1.0, 1.0])
    assert c.p is None and "no spread" in c.verdict


def test_mde_is_the_noncentral_t_power():
    """At the MDE the two-sided t-test has exactly 80% power (checked by scipy's noncentral t)."""
    sd, n = 0.25, 4
    mde = inf.mde_t(sd, n)
    crit = stats.t.ppf(0.975, n - 1)
    ncp = mde / (sd / math.sqrt(n))
    assert stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp) == pytest.approx(0.8, abs=1e-9)
    normal = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    assert mde > normal  # the normal approximation was too small


def test_clopper_pearson_matches_scipy():
    for k, n in [(0, 10), (3, 10), (10, 10), (1, 5)]:
        r, lo, hi = inf.rate(k, n)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert (lo, hi) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))


def test_barnard_and_the_rates_of_reference_section_9():
    r = inf.compare_rates(5, 5, 1, 5)
    assert r["p"] == pytest.approx(stats.barnard_exact([[5, 1], [0, 4]], pooled=True, n=200).pvalue, abs=1e-4)
    assert inf.compare_rates(5, 5, 2, 5)["p"] == pytest.approx(0.0618, abs=1e-3)
    assert -1 <= r["ci95_low"] < r["diff"] < r["ci95_high"] <= 1
    # detecting 0.9 vs 0.5 at 80% power needs about 20 runs an arm: with 10 an arm it is not detectable
    assert inf.compare_rates(9, 10, 5, 10)["detectable"] > 0.4
    assert inf.compare_rates(18, 20, 10, 20)["detectable"] <= 0.45


RATES = """import json, sys
from mhalab import stats
print(json.dumps([stats.compare_rates(k1, n1, k2, n2) for n1, n2 in [(3, 3), (5, 5), (3, 10)]
                  for k1 in range(n1 + 1) for k2 in range(0, n2 + 1, 2)]))
"""


@pytest.mark.proc
@pytest.mark.slow
def test_an_exact_rate_test_gives_the_same_bits_whatever_vector_instructions_numpy_uses():
    """The p, interval and detectable difference of every outcome of three designs, computed with numpy's widest
    kernels for this CPU and with them disabled (NPY_DISABLE_CPU_FEATURES): equal to the last bit, as on another
    CPU (numpy's exp gave 1/3 against 3/3 p 0.21875000000000006 with AVX2 and 0.21875 with AVX-512)."""
    import os
    import subprocess
    import sys

    umath = pytest.importorskip("numpy._core._multiarray_umath")
    wide = [f for f in getattr(umath, "__cpu_dispatch__", []) if umath.__cpu_features__.get(f)]
    if not wide:
        pytest.skip("numpy dispatches no wider kernels on this CPU: nothing to disable")
    runs = [subprocess.run([sys.executable, "-c", RATES], capture_output=True, text=True, check=True,
                           env={**os.environ, **extra}).stdout
            for extra in ({}, {"NPY_DISABLE_CPU_FEATURES": ",".join(wide)})]
    assert runs[0] == runs[1] and len(runs[0]) > 1000


def test_kaplan_meier_by_hand():
    """Times 2, 3+, 4, 5 (+ censored): S = 3/4 after 2, 3/4 * 1/2 after 4, 0 after 5; median 4."""
    km = inf.kaplan_meier([2, 3, 4, 5], [True, False, True, True])
    assert km["steps"] == [0.0, 2.0, 4.0, 5.0]
    assert km["survival"] == pytest.approx([1.0, 0.75, 0.375, 0.0])
    assert km["median"] == 4.0
    km = inf.kaplan_meier([100, 200, 300, 400, 500, 600, 700, 800, 900, 1000] * 2, [True] * 20)
    assert km["median_ci95_low"] <= km["median"] == 500 <= km["median_ci95_high"]
    assert inf.kaplan_meier([1, 2], [False, False])["median"] is None  # never reached


def test_logrank_by_hand():
    """Arm A events at 1, 2; arm B at 3, 4: O1 = 2, E1 = 1/2 + 2/3 ... the chi-square formula by hand."""
    r = inf.logrank([1, 2], [True, True], [3, 4], [True, True])
    # times 1,2,3,4 each one event; at risk (A, all): (2,4), (1,3), (0,2), (0,1)
    e1 = 2 / 4 + 1 / 3
    v = (2 / 4) * (2 / 4) + (1 / 3) * (2 / 3)
    assert r["chi2"] == pytest.approx((2 - e1) ** 2 / v)
    assert r["p_chi2"] == pytest.approx(stats.chi2.sf((2 - e1) ** 2 / v, 1))
    assert r["p"] == pytest.approx(2 / 6)  # the two extreme of the 6 assignments
    assert r["excess"] == pytest.approx(2 - e1) and 2 - e1 > 0  # A reaches the event sooner than expected
    assert inf.logrank([3, 4], [True, True], [1, 2], [True, True])["excess"] == pytest.approx(-(2 - e1))
    assert inf.logrank([5], [False], [5], [False])["p"] is None


def test_holm_by_hand():
    assert inf.holm([0.01, 0.04, 0.03, None]) == [pytest.approx(0.03), pytest.approx(0.06), pytest.approx(0.06), None]


def test_tost():
    assert inf.tost([0.001, -0.002, 0.0005, 0.001, -0.001, 0.0, 0.002, -0.0005], margin=0.01)["equivalent"]
    assert not inf.tost([0.001, -0.002, 0.0005, 0.001], margin=0.01)["equivalent"]  # 4 pairs: p >= 1/16
    assert not inf.tost([0.05, 0.04, 0.06, 0.05, 0.04, 0.05, 0.06, 0.05], margin=0.01)["equivalent"]
