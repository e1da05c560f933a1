"""Report defaults (issue 27): intervals cover what they are labelled with at small n, the rate-difference interval
agrees with its test, a Monte Carlo p is never 0, and the Kaplan-Meier median tolerates rounding."""

import numpy as np
import pytest
from scipy import stats

from mhalab import stats as inf


@pytest.mark.parametrize("n", [3, 5])
def test_the_interval_labelled_95_covers_95_at_small_n(n):
    """Normal values, 4000 draws: the per-arm interval covers the true mean about 95% of the time (the percentile
    bootstrap it replaces covered 75% at n=3)."""
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
    lr = inf.logrank(list(range(1, 9)), [True] * 8, list(range(100, 108)), [True] * 8, arrangements=99)
    assert "random" in lr["test"] and lr["p"] >= 1 / 100 and lr["p_min"] == pytest.approx(1 / 100)  # a caller's N


def test_an_exact_p_keeps_its_share():
    """Enumerated designs are unchanged: the share of all patterns (the observed one among them)."""
    c = inf.paired([0.1, 0.2, 0.3])
    assert c.p == pytest.approx(2 / 8) and c.p_min == pytest.approx(2 / 8)


def test_the_kaplan_meier_interval_is_given_where_it_covers_95():
    """Exponential steps censored at a budget, 1000 draws: from 5 runs the median's interval covers the true median
    about 95% of the time; at 3 runs (where it covered ~75%) there is none."""
    rng = np.random.default_rng(5)
    true_median, hits = 1000 * np.log(2), 0
    for _ in range(1000):
        t = rng.exponential(1000, 5)
        km = inf.kaplan_meier(np.minimum(t, 2500).round(), t <= 2500)
        lo, hi = km["median_ci95_low"] or 0.0, km["median_ci95_high"] or np.inf
        hits += lo <= true_median <= hi
    assert hits / 1000 >= 0.92
    km = inf.kaplan_meier([100, 200, 300], [True] * 3)
    assert km["median"] == 200 and not km["has_ci"] and km["median_ci95_low"] is None


def test_the_kaplan_meier_median_at_a_rounded_half_is_reached():
    """0.8 x 0.875 x 5/7 is 0.5000000000000001 in floating point: the median is where the curve reaches 0.5."""
    km = inf.kaplan_meier([1, 1, 2, 3, 3, 10, 10, 10, 10, 10], [True] * 5 + [False] * 5)
    assert km["survival"][-1] == 0.5000000000000001
    assert km["median"] == 3.0


# -- the report: stages, the per-run data, a user's 3-seed sweep ----------------------------------------------------

def _run(g: int, seed: int, lr: float, step, acc: float, selection=None):
    from mhalab.runs.summary import RunSummary

    return RunSummary(
        status="ok", task="mqar", objective="clm",
        overrides=[f"attention.n_kv_heads={g}", f"seed={seed}", f"optim.lr={lr}", "experiment=kv_sweep"],
        config={"seed": seed},
        architecture={"model": {"d_model": 64, "d_ff": 256, "n_layers": 2},
                      "attention": {"n_heads": 8, "n_kv_heads": g, "d_head": 8}},
        metrics={"val/acc": acc, "val/loss": 1.0 - acc}, test_metrics={"test/acc": acc - 0.01 * (seed % 3)},
        cost={"params": 1000}, timings={"train_steps": step or 2000},
        endpoint={"metric": "val/acc", "threshold": 0.9, "stop_at_threshold": True, "tuned": ["optim.lr"],
                  "threshold_step": step, **({"selection_seeds": selection} if selection else {})},
        history={"step": [500, step or 2000], "val/acc": [0.25, acc]},
        environment={"torch": "2.x", "cpu_capability": "AVX512", "torch_threads": 2, "mkldnn": True})


def _write(root, runs) -> None:
    from mhalab.runs.summary import write_summary

    for job, s in enumerate(runs):
        (root / str(job)).mkdir(parents=True)
        write_summary(root / str(job), s)


def _rows(path) -> list[dict]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_three_seed_sweep_reports_no_p_of_0_no_contradicting_interval_and_says_it_needs_seeds(tmp_path):
    from mhalab.report.command import report

    plan = {(8, 1e-3): [800, 900, 700], (8, 1e-2): [None, 1500, None],
            (1, 1e-3): [None, None, None], (1, 1e-2): [1200, None, 1400]}
    _write(tmp_path, [_run(g, seed, lr, step, 0.95 if step else 0.3 + 0.01 * seed)
                      for (g, lr), steps in plan.items() for seed, step in enumerate(steps)])
    r = report([tmp_path], baseline="attention.n_kv_heads=8", plots=False)
    for c in r["comparisons"]:
        assert c["p"] is None or c["p"] > 0
        if c["ci95_low"] is not None and c["ci95_high"] is not None and c["p"] is not None:
            assert (c["ci95_low"] > 0 or c["ci95_high"] < 0) == (c["p"] < inf.ALPHA), c
        assert c["verdict"].endswith("it needs more seeds"), c  # 3 + 3 runs, Holm over 3: nothing can separate
    md = r["markdown"]
    assert "Selection re-used" in md and "95% t" in md and "needs more seeds" in md and "no interval below 5 runs" in md
    rows = _rows(tmp_path / "report" / "runs.csv")
    assert len(rows) == 12 and {"seed", "stage", "val/acc", "test/acc", "steps", "reached", "env_cpu_capability",
                                "env_mkldnn"} <= set(rows[0])
    assert {row["stage"] for row in rows} == {"A+B"}


def test_stage_a_chooses_and_freezes_stage_b_alone_is_tested(tmp_path):
    """Seeds 0-2 (stage A) choose lr 1e-3 for MHA; fresh seeds 3-7 (stage B) are the only runs in a verdict, and a
    stage-B run at the other lr that looks better does not change the choice. The per-run CSV recomputes the p."""
    from mhalab.report.command import report

    sel = [0, 1, 2]
    runs = [_run(8, s, 1e-3, 800 + 50 * s, 0.95, sel) for s in range(8)]
    runs += [_run(8, s, 1e-2, None if s < 3 else 300, 0.3 if s < 3 else 0.99, sel) for s in range(5)]
    runs += [_run(1, s, 1e-2, 1200 + 100 * s if s % 2 else None, 0.92 if s % 2 else 0.4, sel) for s in range(8)]
    _write(tmp_path, runs)
    r = report([tmp_path], baseline="attention.n_kv_heads=8", plots=False)
    assert {a.label: a.chosen.label for a in r["arms"]} == {"attention.n_kv_heads=8": "optim.lr=0.001",
                                                            "attention.n_kv_heads=1": "optim.lr=0.01"}
    by = {c["endpoint"].split(" ")[0]: c for c in r["comparisons"]}
    assert by["rate"]["arm_value"] == "3/5" and by["rate"]["baseline_value"] == "5/5"  # seeds 3-7 only
    assert "seeds 0-2 (stage A)" in r["markdown"] and "fresh seeds 3-7 (stage B)" in r["markdown"]
    rows = _rows(tmp_path / "report" / "runs.csv")
    tested = [row for row in rows if row["in_verdicts"] == "True"]
    assert {int(row["seed"]) for row in tested} == {3, 4, 5, 6, 7}
    assert all(row["stage"] == "B" for row in tested)
    final = [v for v in by["final"]["test"].split(";")]
    assert final[0].startswith("exact permutation test")
    a = [float(row["test/acc"]) for row in tested if row["arm"] == "attention.n_kv_heads=1"]
    b = [float(row["test/acc"]) for row in tested if row["arm"] == "attention.n_kv_heads=8"]
    assert inf.two_sample(a, b).p == pytest.approx(by["final"]["p"], abs=1e-12)
    k_a = sum(row["reached"] == "True" for row in tested if row["arm"] == "attention.n_kv_heads=1")
    assert inf.compare_rates(k_a, 5, 5, 5)["p"] == pytest.approx(by["rate"]["p"], abs=1e-12)


def test_a_stage_a_alone_says_nothing_is_tested_yet(tmp_path):
    """A declared design after stage A only (every seed a selection seed): each arm's value is chosen, no comparison
    is tested, and the stages sentence says no fresh seed has run, not "the fresh seeds none"."""
    from mhalab.report.command import report

    sel = [0, 1, 2]
    _write(tmp_path, [_run(g, s, 1e-3, 800 + 50 * s, 0.95, sel) for g in (8, 1) for s in sel])
    r = report([tmp_path], baseline="attention.n_kv_heads=8", plots=False)
    assert "seeds 0-2 (stage A)" in r["markdown"]
    assert "which use only fresh (stage B) seeds: none has run yet, so nothing is tested." in r["markdown"]
    assert "seeds none" not in r["markdown"]
    assert all(c["p"] is None and "no test" in c["verdict"] for c in r["comparisons"])


def test_a_report_of_stage_b_runs_alone_says_their_values_were_chosen_elsewhere(tmp_path):
    """A report of fresh runs only (a design's stage B, its stage-A sweep not given): each arm's one value is
    tested, and the stages sentence says where the value came from, not "seeds none (stage A)"."""
    from mhalab.report.command import report

    _write(tmp_path, [_run(g, s, lr, 800 + 50 * s + (300 if g == 1 else 0), 0.95, [0, 1, 2])
                      for g, lr in ((8, 1e-3), (1, 1e-2)) for s in range(10, 16)])
    r = report([tmp_path], baseline="attention.n_kv_heads=8", plots=False)
    assert ("Stages: each arm's value was chosen on stage-A seeds not among these runs, frozen before the "
            "comparisons, which use only the fresh seeds 10-15 (stage B).") in r["markdown"]
    assert all(c["p"] is not None for c in r["comparisons"] if not c["endpoint"].startswith("rate"))


def test_selection_seeds_are_integers_in_one_sentence():
    from mhalab.config.schema import EndpointConfig
    from mhalab.errors import ConfigError

    with pytest.raises(ConfigError, match="endpoint.selection_seeds entry 'a'"):
        EndpointConfig(selection_seeds=["a"])


@pytest.mark.proc
@pytest.mark.slow
def test_a_real_sweep_records_its_stages_and_mhalab_report_publishes_every_run(train, tmp_path):
    """A real tiny sweep declares seed 0 as stage A (endpoint.selection_seeds, recorded in summary.json with the
    environment); the `mhalab report` command, in its own process, tests seeds 1-2 only and writes runs.csv beside
    the report with every run, its stage and whether it is in a verdict."""
    import json
    import subprocess
    import sys

    r = train("attention.n_kv_heads=2,1", "seed=0,1,2", "endpoint.selection_seeds=[0]", multirun=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sweep = next((tmp_path / "logs" / "train" / "multiruns").iterdir())
    done = subprocess.run([sys.executable, "-m", "mhalab", "report", str(sweep), "--no-plots",
                           "--baseline", "attention.n_kv_heads=2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "runs.csv" in done.stdout and "seeds 0 (stage A)" in done.stdout
    rows = _rows(sweep / "report" / "runs.csv")
    assert sorted((row["arm"], row["seed"], row["stage"], row["in_verdicts"]) for row in rows) == sorted(
        (arm, str(s), "A" if s == 0 else "B", str(s != 0))
        for arm in ("attention.n_kv_heads=2", "attention.n_kv_heads=1") for s in range(3))
    assert all(row["test/acc"] and row["env_cpu_capability"] and row["env_blas"] for row in rows)
    (c,) = json.loads((sweep / "report" / "report.json").read_text())["comparisons"]
    a = [float(row["test/acc"]) for row in rows if row["in_verdicts"] == "True" and row["arm"].endswith("=1")]
    b = [float(row["test/acc"]) for row in rows if row["in_verdicts"] == "True" and row["arm"].endswith("=2")]
    ref = inf.two_sample(a, b)  # tiny runs may tie: then both say so in words and give no p
    assert len(a) == len(b) == 2 and c["degenerate"] == ref.degenerate
    assert (c["p"] is None and ref.p is None) or (c["p"] == pytest.approx(ref.p) and c["p"] > 0)


def test_the_experiments_table_marks_a_recorded_newcombe_interval(tmp_path):
    """Reports written before the exact unconditional test printed Newcombe's interval beside Fisher's test; the
    README table says so where the interval may exclude 0 while the test does not reject (head_dim_sweep d_head 32)."""
    import json

    from mhalab.report.command import experiments_table

    row = {"arm": "a", "baseline": "b", "endpoint": "rate reaching val/acc >= 0.9", "arm_value": "6/10",
           "baseline_value": "10/10", "estimate": -0.4, "ci95_low": -0.687, "ci95_high": -0.038, "p": 0.087,
           "p_holm": 0.087, "verdict": "not separated"}
    recorded = tmp_path / "old" / "results" / "report.json"
    now = tmp_path / "new" / "results" / "report.json"
    for f, test in ((recorded, "Fisher's exact test"), (now, "exact unconditional score test (Barnard)")):
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"comparisons": [{**row, "test": test}]}))
    old_line, new_line = experiments_table([recorded, now], base=tmp_path).splitlines()[2:]
    assert old_line.startswith("| [old](old/) |") and new_line.startswith("| [new](new/) |")
    assert "-0.400 \\[-0.687, -0.038\\] Newcombe, not from the test | Fisher's exact test" in old_line
    assert "Newcombe" not in new_line and "-0.400 \\[-0.687, -0.038\\] |" in new_line
